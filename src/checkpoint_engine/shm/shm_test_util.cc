#include "shm/shm_test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "sluice/common/shm.h"

extern char** environ;

namespace sluice::checkpoint_engine::testing {

std::string UniquePrefix() {
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "slt%dx%08x", static_cast<int>(::getpid()), rd());
  return buf;
}

std::vector<std::string> SegmentsWithPrefix(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  const std::string head = prefix + ".";
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name.compare(0, head.size(), head) == 0) out.push_back(name);
  }
  ::closedir(dir);
  return out;
}

size_t SegmentBytesWithPrefix(const std::string& prefix) {
  size_t total = 0;
  for (const std::string& name : SegmentsWithPrefix(prefix)) {
    struct stat st;
    if (::stat(("/dev/shm/" + name).c_str(), &st) == 0) total += static_cast<size_t>(st.st_size);
  }
  return total;
}

void RemoveSegmentsWithPrefix(const std::string& prefix) {
  for (const std::string& name : SegmentsWithPrefix(prefix)) ::shm_unlink(("/" + name).c_str());
}

Layout TestLayout() {
  return {{"embed", DType::kF32, {32, 512}},
          {"w_i64", DType::kI64, {4096}},
          {"w_i32", DType::kI32, {64, 128}},
          {"norm", DType::kF32, {4096}}};
}

namespace {

float F32Value(int64_t v, size_t t, size_t i) {
  return static_cast<float>(v * 4096 + static_cast<int64_t>((i + t * 37) % 4096));
}
int64_t I64Value(int64_t v, size_t t, size_t i) {
  return (v << 32) | (static_cast<int64_t>(t) << 24) | static_cast<int64_t>(i);
}
int32_t I32Value(int64_t v, size_t t, size_t i) {
  return static_cast<int32_t>(v * 1000000 + static_cast<int64_t>(t) * 100000 + static_cast<int64_t>(i % 100000));
}

}  // namespace

HostTensor MakeTensor(const TensorSpec& spec, size_t t, int64_t version) {
  const size_t numel = CheckedNumel(spec.shape).value();
  std::vector<std::byte> bytes(numel * DTypeSize(spec.dtype));
  for (size_t i = 0; i < numel; ++i) {
    switch (spec.dtype) {
      case DType::kF32: {
        float x = F32Value(version, t, i);
        std::memcpy(&bytes[i * 4], &x, 4);
        break;
      }
      case DType::kI64: {
        int64_t x = I64Value(version, t, i);
        std::memcpy(&bytes[i * 8], &x, 8);
        break;
      }
      case DType::kI32: {
        int32_t x = I32Value(version, t, i);
        std::memcpy(&bytes[i * 4], &x, 4);
        break;
      }
      default:
        ADD_FAILURE() << "unsupported test dtype";
        return {};
    }
  }
  return HostTensor::Copy(spec.dtype, spec.shape, bytes.data(), bytes.size());
}

TensorMap MakeVersion(const Layout& layout, int64_t version) {
  TensorMap map;
  for (size_t t = 0; t < layout.size(); ++t) map[layout[t].name] = MakeTensor(layout[t], t, version);
  return map;
}

std::string CheckTensorBytes(const TensorSpec& spec, size_t t, int64_t version, const std::byte* bytes, size_t nbytes) {
  const size_t numel = CheckedNumel(spec.shape).value();
  if (nbytes != numel * DTypeSize(spec.dtype)) return spec.name + ": " + std::to_string(nbytes) + " bytes";
  auto bad = [&](size_t i, const std::string& got) {
    return "version " + std::to_string(version) + " tensor " + spec.name + "[" + std::to_string(i) + "] = " + got;
  };
  for (size_t i = 0; i < numel; ++i) {
    switch (spec.dtype) {
      case DType::kF32: {
        float x;
        std::memcpy(&x, bytes + i * 4, 4);
        if (x != F32Value(version, t, i)) return bad(i, std::to_string(x));
        break;
      }
      case DType::kI64: {
        int64_t x;
        std::memcpy(&x, bytes + i * 8, 8);
        if (x != I64Value(version, t, i)) return bad(i, std::to_string(x));
        break;
      }
      case DType::kI32: {
        int32_t x;
        std::memcpy(&x, bytes + i * 4, 4);
        if (x != I32Value(version, t, i)) return bad(i, std::to_string(x));
        break;
      }
      default:
        return "unsupported dtype";
    }
  }
  return "";
}

std::string CheckSnapshot(const ShmVersionHandle& handle, const Layout& layout) {
  for (size_t t = 0; t < layout.size(); ++t) {
    Result<HostTensor> view = handle.tensor(layout[t].name);
    if (!view.ok()) return view.status().ToString();
    if (view->dtype != layout[t].dtype || view->shape != layout[t].shape) return layout[t].name + ": wrong dtype/shape";
    std::string bad = CheckTensorBytes(layout[t], t, handle.version(), view->data, view->nbytes);
    if (!bad.empty()) return bad;
  }
  return "";
}

// ------------------------------------------------------------- ChildProcess

ChildProcess ChildProcess::Spawn(const std::string& mode, const std::map<std::string, std::string>& env,
                                 const std::string& suite) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return ChildProcess(-1, -1);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 onto fd 3 clears close-on-exec for the child's copy.
  posix_spawn_file_actions_adddup2(&actions, fds[1], 3);

  std::vector<std::string> args = {"/proc/self/exe", "--gtest_also_run_disabled_tests",
                                   "--gtest_filter=" + suite + ".DISABLED_" + mode, "--gtest_brief=1"};
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) vars.emplace_back(*e);
  for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);

  pid_t pid = -1;
  int err = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (err != 0) {
    ::close(fds[0]);
    ADD_FAILURE() << "posix_spawn: " << std::strerror(err);
    return ChildProcess(-1, -1);
  }
  return ChildProcess(pid, fds[0]);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      signal_fd_(std::exchange(other.signal_fd_, -1)),
      reaped_(std::exchange(other.reaped_, false)) {}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
  if (signal_fd_ >= 0) ::close(signal_fd_);
}

bool ChildProcess::WaitForSignal(std::chrono::milliseconds timeout) {
  if (signal_fd_ < 0) return false;
  pollfd p{signal_fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
  char byte;
  return ::read(signal_fd_, &byte, 1) == 1;
}

void ChildProcess::Kill() {
  if (pid_ > 0 && !reaped_) ::kill(pid_, SIGKILL);
}

int ChildProcess::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0 || reaped_) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      ADD_FAILURE() << "child " << pid_ << " did not exit within " << timeout.count() << " ms; killing it";
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  reaped_ = true;
  return status;
}

bool ChildProcess::WaitUntilZombie(std::chrono::milliseconds timeout) {
  if (pid_ <= 0 || reaped_) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

std::string ChildEnv(const char* name) {
  const char* v = std::getenv(name);
  EXPECT_NE(v, nullptr) << "child environment lacks " << name;
  return v != nullptr ? v : "";
}

void SignalParent() {
  char byte = 1;
  if (::write(3, &byte, 1) != 1) std::perror("SignalParent");
}

}  // namespace sluice::checkpoint_engine::testing
