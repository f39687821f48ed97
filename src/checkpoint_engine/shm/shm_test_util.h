// Helpers for the shared-memory store tests: unique segment prefixes, a
// /dev/shm census, weight versions whose every element encodes (version,
// tensor, index), and child processes that are this test binary re-executed
// to run one DISABLED_ test (posix_spawn + exec: no fork of a threaded
// process).
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_SHM_TEST_UTIL_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_SHM_TEST_UTIL_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/host_tensor.h"

namespace sluice::checkpoint_engine::testing {

// "slt<pid>x<random>": unique per test, so parallel runs never collide.
std::string UniquePrefix();

// Segments whose name starts with "<prefix>." (without the leading '/'),
// and their total size in bytes.
std::vector<std::string> SegmentsWithPrefix(const std::string& prefix);
size_t SegmentBytesWithPrefix(const std::string& prefix);
// Unlinks them (test cleanup after a failure).
void RemoveSegmentsWithPrefix(const std::string& prefix);

// Four tensors of 16 KiB..64 KiB in F32, I64, I32 and F32.
Layout TestLayout();

// Element i of tensor t in version v. F32 elements are v * 4096 + (i % 4096)
// (exact in float for v < 4096); integer elements also encode t.
HostTensor MakeTensor(const TensorSpec& spec, size_t tensor_index, int64_t version);
TensorMap MakeVersion(const Layout& layout, int64_t version);
// "" if `bytes` is tensor `t` of `version`, whole; else the first bad element.
std::string CheckTensorBytes(const TensorSpec& spec, size_t tensor_index, int64_t version, const std::byte* bytes,
                             size_t nbytes);
// "" if every tensor of the handle is intact version handle.version().
std::string CheckSnapshot(const ShmVersionHandle& handle, const Layout& layout);

// One child process running <suite>.DISABLED_<mode> of this binary with
// `env` added to its environment. The child may write single bytes to fd 3
// ("I reached the point you wait for"), read by WaitForSignal.
class ChildProcess {
 public:
  // Aborts the test (returns an invalid child) if spawning fails.
  static ChildProcess Spawn(const std::string& mode, const std::map<std::string, std::string>& env,
                            const std::string& suite = "ShmChild");
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ~ChildProcess();  // SIGKILLs and reaps a child still running

  pid_t pid() const { return pid_; }
  // True once the child wrote a byte to fd 3 within `timeout`.
  bool WaitForSignal(std::chrono::milliseconds timeout);
  // SIGKILL, without reaping (the child stays a zombie until Wait).
  void Kill();
  // Blocks until the child exits (it must within `timeout`, else it is
  // killed): the raw wait status, or -1.
  int Wait(std::chrono::milliseconds timeout);
  // Waits until the child has exited but leaves it unreaped (a zombie).
  bool WaitUntilZombie(std::chrono::milliseconds timeout);

 private:
  ChildProcess(pid_t pid, int signal_fd) : pid_(pid), signal_fd_(signal_fd) {}
  pid_t pid_ = -1;
  int signal_fd_ = -1;
  bool reaped_ = false;
};

// In a child: the environment value `name` (test fails if absent).
std::string ChildEnv(const char* name);
// In a child: writes one byte to fd 3.
void SignalParent();

}  // namespace sluice::checkpoint_engine::testing

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_SHM_TEST_UTIL_H_
