#include "net/net_test_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "test_util.h"

extern char** environ;

namespace sluice::transfer_queue::testing {
namespace {

using Steady = std::chrono::steady_clock;

int RemainingMs(Steady::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Steady::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

}  // namespace

Result<ChildProcess> ChildProcess::Spawn(const std::string& path, const std::vector<std::string>& args,
                                         const std::map<std::string, std::string>& env, bool capture_stderr) {
  int out[2];
  int err[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0) return Status::Unavailable("pipe failed");
  if (capture_stderr && pipe2(err, O_CLOEXEC) != 0) return Status::Unavailable("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  if (capture_stderr) posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);

  std::vector<std::string> argv_s = {path};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (env.count(name) == 0) env_s.push_back(entry);
  }
  for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  ChildProcess child;
  const int rc = posix_spawn(&child.pid_, path.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (capture_stderr) close(err[1]);
  if (rc != 0) {
    close(out[0]);
    if (capture_stderr) close(err[0]);
    child.pid_ = -1;
    return Status::Unavailable("posix_spawn " + path + ": " + std::strerror(rc));
  }
  child.stdout_fd_ = out[0];
  child.stderr_fd_ = err[0];
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_),
      stdout_fd_(other.stdout_fd_),
      stderr_fd_(other.stderr_fd_),
      buffered_(std::move(other.buffered_)) {
  other.pid_ = -1;
  other.stdout_fd_ = -1;
  other.stderr_fd_ = -1;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
  if (stderr_fd_ >= 0) close(stderr_fd_);
}

Result<std::string> ChildProcess::ReadLine(std::chrono::milliseconds timeout) {
  const Steady::time_point deadline = Steady::now() + timeout;
  for (;;) {
    const size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    const int ready = poll(&p, 1, RemainingMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return Status::Timeout("no line from child " + std::to_string(pid_));
    char buf[4096];
    const ssize_t n = read(stdout_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Unavailable("child " + std::to_string(pid_) + " closed stdout");
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

std::string ChildProcess::ReadAllStderr(std::chrono::milliseconds timeout) {
  std::string out;
  if (stderr_fd_ < 0) return out;
  const Steady::time_point deadline = Steady::now() + timeout;
  for (;;) {
    pollfd p{stderr_fd_, POLLIN, 0};
    const int ready = poll(&p, 1, RemainingMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return out;
    char buf[4096];
    const ssize_t n = read(stderr_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

Result<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  const Steady::time_point deadline = Steady::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      pid_ = -1;
      return status;
    }
    if (done < 0 && errno != EINTR) return Status::Internal("waitpid failed");
    if (Steady::now() >= deadline) return Status::Timeout("child " + std::to_string(pid_) + " did not exit");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Result<ServerProcess> ServerProcess::Start(const std::vector<std::string>& args) {
  ServerProcess server;
  SLUICE_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(SLUICE_QUEUE_SERVER_PATH, args));
  server.process_.emplace(std::move(child));
  // Sanitizer builds start slowly; the line comes as soon as the bind is done.
  SLUICE_ASSIGN_OR_RETURN(server.endpoint_, server.process_->ReadLine(std::chrono::seconds(20)));
  return server;
}

Result<int> ServerProcess::Stop() {
  process_->Signal(SIGTERM);
  return process_->Wait(std::chrono::seconds(20));
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string TempDir() {
  std::string templ = "/tmp/sluice-tq-net-XXXXXX";
  const char* made = mkdtemp(templ.data());
  return made ? std::string(made) : std::string("/tmp");
}

void WriteFile(const std::string& path, const std::string& text, int mode) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  chmod(path.c_str(), static_cast<mode_t>(mode));
}

WriteId ExpectOnlyDeclaredCellsStored(Controller& controller, StorageUnit& unit, RowId row) {
  // No open write: refused, nothing stored.
  StorageWriteRequest rogue;
  rogue.write_id = 12345;
  rogue.items = {{row, "response", I64(std::vector<int64_t>(1000, 1))}};
  TQ_EXPECT_ERROR(unit.Write(rogue), kNotFound, "write 12345 is not open on this server");
  // An open write: only its declared cells, with the declared metadata.
  BeginWriteRequest begin;
  begin.rows = {row};
  begin.columns = {{"response", {TensorMeta{DType::kI64, {2}, 16}}}};
  Result<BeginWriteResponse> write = controller.BeginWrite(begin);
  EXPECT_TRUE(write.ok()) << write.status().ToString();
  if (!write.ok()) return 0;
  rogue.write_id = write->write_id;
  TQ_EXPECT_ERROR(unit.Write(rogue), kInvalidArgument, "differs from the declared [2] I64 (16 bytes)");
  rogue.items = {{row, "reward", F32Scalar(1)}};
  TQ_EXPECT_ERROR(unit.Write(rogue), kInvalidArgument, "was not declared");
  rogue.items = {{row, "response", I64({1, 2})}};
  TQ_EXPECT_OK(unit.Write(rogue));
  return write->write_id;
}

void TakeAndAckEachTask(TransferQueueClient& client, size_t n, int64_t offset) {
  using namespace std::chrono_literals;
  for (const std::string task : {"reward", "train"}) {
    GetMetaRequest get;
    get.task = task;
    get.partition = "p";
    get.columns = {"prompt"};
    get.n = static_cast<uint32_t>(n);
    get.timeout = 2s;
    Result<TakenBatch> taken = client.Take(get, {"prompt"});
    ASSERT_TRUE(taken.ok()) << task << ": " << taken.status().ToString();
    ASSERT_EQ(taken->data.rows.size(), n) << task;
    for (size_t i = 0; i < n; ++i) {
      const std::vector<int64_t> v = ToI64(taken->data.columns.at("prompt")[i]);
      ASSERT_EQ(v.size(), 2u);
      EXPECT_EQ(v[1], v[0] + offset);
    }
    TQ_ASSERT_OK(client.Ack(taken->meta.lease_id).status());
  }
}

}  // namespace sluice::transfer_queue::testing
