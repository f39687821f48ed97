// Helpers for the TransferQueue network tests: child processes (the real
// sluice_queue_server binary, or this test binary re-executed in a child
// mode) with their stdout on a pipe, and a raw ZeroMQ peer.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_NET_TEST_UTIL_H_
#define SLUICE_SRC_TRANSFER_QUEUE_NET_TEST_UTIL_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/transfer_queue/client.h"
#include "sluice/transfer_queue/controller.h"
#include "sluice/transfer_queue/storage.h"

namespace sluice::transfer_queue::testing {

// A child process; killed (SIGKILL) and reaped by the destructor if still running.
class ChildProcess {
 public:
  // posix_spawn of `path` with `args` (argv[1..]) and the current environment
  // plus `env`. stdout goes to a pipe read by ReadLine; stderr is inherited
  // unless capture_stderr, then it goes to a second pipe (ReadAllStderr).
  static Result<ChildProcess> Spawn(const std::string& path, const std::vector<std::string>& args,
                                    const std::map<std::string, std::string>& env = {}, bool capture_stderr = false);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ~ChildProcess();

  // The next line of stdout, without the newline; Timeout if none in time,
  // Unavailable at end of file.
  Result<std::string> ReadLine(std::chrono::milliseconds timeout);
  // All of stderr until the child closes it (or `timeout`).
  std::string ReadAllStderr(std::chrono::milliseconds timeout);
  void Signal(int sig);
  // Waits for the child to exit; its wait status, or Timeout.
  Result<int> Wait(std::chrono::milliseconds timeout);
  pid_t pid() const { return pid_; }

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  std::string buffered_;
};

// The sluice_queue_server binary (built alongside the test), started with
// `args`; Start reads the endpoint it prints.
class ServerProcess {
 public:
  static Result<ServerProcess> Start(const std::vector<std::string>& args);
  const std::string& endpoint() const { return endpoint_; }
  // SIGTERM, then the exit status (expected 0: a clean shutdown).
  Result<int> Stop();
  ChildProcess& process() { return *process_; }

 private:
  std::optional<ChildProcess> process_;
  std::string endpoint_;
};

// Path of this test binary (for child modes).
std::string SelfExe();
// A fresh directory under /tmp, for ipc sockets and token files.
std::string TempDir();
void WriteFile(const std::string& path, const std::string& text, int mode = 0600);

// The checks a server makes of remote storage writes, on `unit` (the unit
// that holds `row`): a write never begun is refused; then a write of row's
// "response" ([2] I64) is begun at `controller` and only that cell, with
// that metadata, is stored (failures are gtest failures). Returns the begun
// write's id, its cell stored (0 if it could not be begun).
WriteId ExpectOnlyDeclaredCellsStored(Controller& controller, StorageUnit& unit, RowId row);

// Tasks "reward" and "train" each take the `n` rows of partition "p" (one
// Take each) and ack them, after checking that every row's "prompt" is a pair
// {v, v + offset} (failures are gtest failures).
void TakeAndAckEachTask(TransferQueueClient& client, size_t n, int64_t offset);

}  // namespace sluice::transfer_queue::testing

#endif  // SLUICE_SRC_TRANSFER_QUEUE_NET_TEST_UTIL_H_
