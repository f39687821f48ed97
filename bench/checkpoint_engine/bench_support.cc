#include "bench_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace sluice::bench::ce {

Layout LayoutForBytes(size_t bytes) {
  constexpr size_t kNorm = 4096;
  constexpr size_t kMaxMatrix = size_t{16} << 20;
  Layout layout;
  size_t left = bytes;
  for (int i = 0; left > 0; ++i) {
    size_t norm = left > 2 * kNorm ? kNorm : 0;
    size_t matrix = std::min(kMaxMatrix, left - norm);
    layout.push_back({"layer" + std::to_string(i) + ".w", DType::kF32, {static_cast<int64_t>(matrix / 4)}});
    left -= matrix;
    if (norm > 0) {
      layout.push_back({"layer" + std::to_string(i) + ".norm", DType::kF32, {static_cast<int64_t>(norm / 4)}});
      left -= norm;
    }
  }
  return layout;
}

Weights::Weights(const Layout& layout) {
  for (const auto& spec : layout) {
    const size_t n = static_cast<size_t>(spec.shape[0]) * DTypeSize(spec.dtype);
    std::shared_ptr<std::byte[]> buffer(new std::byte[n]);
    for (size_t i = 0; i < n; i += 4096) buffer[i] = static_cast<std::byte>(i * 31 + 7);
    HostTensor t;
    t.dtype = spec.dtype;
    t.shape = spec.shape;
    t.data = buffer.get();
    t.nbytes = n;
    t.owner = buffer;
    tensors_[spec.name] = t;
    buffers_.push_back(buffer);
    sizes_.push_back(n);
    bytes_ += n;
  }
}

void Weights::Stamp(int64_t version) {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    std::memcpy(buffers_[i].get(), &version, std::min(sizes_[i], sizeof(version)));
  }
}

std::unique_ptr<std::byte[]> AllocateTouched(size_t n) {
  std::unique_ptr<std::byte[]> p(new std::byte[std::max<size_t>(n, 1)]);
  std::memset(p.get(), 0, n);
  return p;
}

size_t MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t value = 0;
  std::string unit;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

std::string HumanBytes(size_t bytes) {
  char buf[32];
  if (bytes >= 1000000000 && bytes % 1000000000 == 0) {
    std::snprintf(buf, sizeof(buf), "%zu GB", bytes / 1000000000);
  } else if (bytes >= 1000000 && bytes % 1000000 == 0) {
    std::snprintf(buf, sizeof(buf), "%zu MB", bytes / 1000000);
  } else {
    std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  }
  return buf;
}

Result<size_t> ParseBytes(const std::string& text) {
  if (text.empty()) return Status::InvalidArgument("empty size");
  size_t mult = 1;
  std::string digits = text;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
  if (last == 'K' || last == 'M' || last == 'G') {
    mult = last == 'K' ? 1000 : last == 'M' ? 1000000 : 1000000000;
    digits.pop_back();
  }
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(digits, &pos);
  } catch (...) {
    pos = 0;
  }
  if (pos != digits.size() || v == 0) return Status::InvalidArgument("bad size '" + text + "' (e.g. 10M, 1G)");
  const size_t bytes = static_cast<size_t>(v) * mult;
  if (bytes % 4 != 0) return Status::InvalidArgument("size '" + text + "' is not a multiple of 4 bytes");
  return bytes;
}

Result<std::vector<int64_t>> ParseIntList(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t pos = 0;
      out.push_back(std::stoll(item, &pos));
      if (pos != item.size()) throw std::invalid_argument(item);
    } catch (...) {
      return Status::InvalidArgument("bad number '" + item + "' in '" + text + "'");
    }
  }
  if (out.empty()) return Status::InvalidArgument("empty list");
  return out;
}

// ------------------------------------------------------------------ Child

Result<Child> Child::Spawn(const std::vector<std::string>& argv, bool capture_stdout, bool signal_pipe) {
  int out[2] = {-1, -1};
  int sig[2] = {-1, -1};
  if (capture_stdout && ::pipe2(out, O_CLOEXEC) != 0) return Status::Unavailable("pipe2 failed");
  if (signal_pipe && ::pipe2(sig, O_CLOEXEC) != 0) return Status::Unavailable("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (capture_stdout) posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  if (signal_pipe) posix_spawn_file_actions_adddup2(&actions, sig[1], 3);
  // Children start with no signal blocked (the parent blocks some for its
  // cleanup thread).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int err = ::posix_spawnp(&pid, cargv[0], &actions, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (capture_stdout) ::close(out[1]);
  if (signal_pipe) ::close(sig[1]);
  if (err != 0) {
    if (capture_stdout) ::close(out[0]);
    if (signal_pipe) ::close(sig[0]);
    return Status::Unavailable("cannot spawn " + argv[0] + ": " + std::strerror(err));
  }
  return Child(pid, out[0], sig[0]);
}

Child::Child(Child&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      out_fd_(std::exchange(other.out_fd_, -1)),
      signal_fd_(std::exchange(other.signal_fd_, -1)),
      reaped_(std::exchange(other.reaped_, true)),
      output_(std::move(other.output_)) {}

Child::~Child() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (signal_fd_ >= 0) ::close(signal_fd_);
}

Result<int64_t> Child::ReadSignal(Clock::time_point deadline) {
  if (signal_fd_ < 0) return Status::FailedPrecondition("no signal pipe");
  int64_t value = 0;
  size_t got = 0;
  while (got < sizeof(value)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Status::Timeout("child " + std::to_string(pid_) + " did not report in time");
    pollfd p{signal_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000))) <= 0) continue;
    const ssize_t r = ::read(signal_fd_, reinterpret_cast<char*>(&value) + got, sizeof(value) - got);
    if (r == 0) return Status::Unavailable("child " + std::to_string(pid_) + " closed its signal pipe (exited?)");
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::Unavailable(std::string("read: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(r);
  }
  return value;
}

void Child::DrainOutput(int timeout_ms) {
  if (out_fd_ < 0) return;
  char buf[4096];
  pollfd p{out_fd_, POLLIN, 0};
  while (::poll(&p, 1, timeout_ms) > 0) {
    const ssize_t r = ::read(out_fd_, buf, sizeof(buf));
    if (r <= 0) {
      ::close(out_fd_);
      out_fd_ = -1;
      return;
    }
    output_.append(buf, static_cast<size_t>(r));
  }
}

Status Child::Wait(Clock::time_point deadline) {
  if (pid_ <= 0 || reaped_) return Status::FailedPrecondition("no child");
  int status = 0;
  while (true) {
    DrainOutput(5);
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (Clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
      return Status::Timeout("child " + std::to_string(pid_) + " did not finish in time; killed");
    }
  }
  reaped_ = true;
  DrainOutput(50);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  if (WIFEXITED(status)) return Status::Internal("child exited with status " + std::to_string(WEXITSTATUS(status)));
  return Status::Internal("child died of signal " + std::to_string(WTERMSIG(status)));
}

void SignalParent(int64_t value) {
  if (::write(3, &value, sizeof(value)) != sizeof(value)) std::perror("SignalParent");
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("/proc/self/exe");
}

}  // namespace sluice::bench::ce
