// Statistics, sizes, stamps, memory readings and the child processes of the
// TransferQueue benchmark; see tq_support.h.
#include "tq_support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace sluice::bench::tq {

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(q * static_cast<double>(v.size()));
  return v[std::min(rank, v.size() - 1)];
}

std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB"};
  int unit = 0;
  uint64_t value = bytes;
  while (unit < 3 && value >= 1024 && value % 1024 == 0) {
    value /= 1024;
    ++unit;
  }
  return std::to_string(value) + " " + kUnits[unit];
}

Result<uint64_t> ParseBytes(const std::string& text) {
  if (text.empty()) return Status::InvalidArgument("empty size");
  std::string digits = text;
  uint64_t mult = 1;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
  if (last == 'K' || last == 'M' || last == 'G') {
    mult = last == 'K' ? (uint64_t{1} << 10) : last == 'M' ? (uint64_t{1} << 20) : (uint64_t{1} << 30);
    digits.pop_back();
  }
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    return Status::InvalidArgument("bad size '" + text + "' (e.g. 64, 4K, 16M)");
  }
  return std::stoull(digits) * mult;
}

Result<std::vector<std::string>> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) return Status::InvalidArgument("empty item in '" + text + "'");
    out.push_back(item);
  }
  if (out.empty()) return Status::InvalidArgument("empty list");
  return out;
}

void StampRow(std::byte* row, size_t row_bytes, uint64_t stamp) {
  std::memcpy(row, &stamp, sizeof(stamp));
  std::memcpy(row + row_bytes - sizeof(stamp), &stamp, sizeof(stamp));
}

uint64_t LoadStamp(const std::byte* row) {
  uint64_t stamp = 0;
  std::memcpy(&stamp, row, sizeof(stamp));
  return stamp;
}

bool RowHasStamp(const std::byte* row, size_t row_bytes, uint64_t stamp) {
  uint64_t head = 0, tail = 0;
  std::memcpy(&head, row, sizeof(head));
  std::memcpy(&tail, row + row_bytes - sizeof(tail), sizeof(tail));
  return head == stamp && tail == stamp;
}

std::shared_ptr<std::byte[]> AllocateTouched(size_t n) {
  std::shared_ptr<std::byte[]> p(new std::byte[std::max<size_t>(n, 1)]);
  std::memset(p.get(), 0x5a, n);
  return p;
}

uint64_t ResidentBytes(pid_t pid) {
  std::ifstream in(pid == 0 ? "/proc/self/status" : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  uint64_t kib = 0;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0 || line.rfind("RssFile:", 0) == 0) {
      kib += std::strtoull(line.c_str() + 8, nullptr, 10);
    }
  }
  return kib * 1024;
}

uint64_t ShmSegmentBytes(const std::string& name) {
  struct stat st {};
  if (name.empty() || ::stat(("/dev/shm" + name).c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

uint64_t MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t value = 0;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

namespace {

// Waits up to `timeout` for `pid` to exit, then SIGKILLs and reaps it.
Status Reap(pid_t pid, std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return Status::Internal(what + ": waitpid: " + std::strerror(errno));
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return Status::Timeout(what + " did not exit in time; killed");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  if (WIFEXITED(status)) return Status::Internal(what + " exited with status " + std::to_string(WEXITSTATUS(status)));
  return Status::Internal(what + " died of signal " + std::to_string(WTERMSIG(status)));
}

// Closes every descriptor >= 3 except `keep_a` and `keep_b`, so a forked
// child does not hold the pipes of its siblings open.
void CloseOtherFds(int keep_a, int keep_b) {
  const unsigned lo = static_cast<unsigned>(std::min(keep_a, keep_b));
  const unsigned hi = static_cast<unsigned>(std::max(keep_a, keep_b));
  auto close_span = [](unsigned first, unsigned last) {
    if (first > last) return;
    if (::close_range(first, last, 0) == 0) return;
    for (unsigned fd = first; fd <= std::min(last, 65535U); ++fd) ::close(static_cast<int>(fd));
  };
  if (lo > 3) close_span(3, lo - 1);
  close_span(lo + 1, hi - 1);
  close_span(hi + 1, ~0U);
}

void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    done += static_cast<size_t>(w);
  }
}

// The forked child: serve until the parent closes `lifetime_fd`.
[[noreturn]] void ServerChildMain(const transfer_queue::ServerOptions& options, int report_fd, int lifetime_fd) {
  CloseOtherFds(report_fd, lifetime_fd);
  Result<std::unique_ptr<transfer_queue::TransferQueueServer>> server =
      transfer_queue::TransferQueueServer::Start(options);
  if (!server.ok()) {
    WriteAll(report_fd, "ERR " + server.status().ToString() + "\n");
    ::_exit(1);
  }
  WriteAll(report_fd, "OK " + (*server)->endpoint() + "\n");
  ::close(report_fd);
  char byte;
  while (true) {
    const ssize_t r = ::read(lifetime_fd, &byte, 1);
    if (r == 0 || (r < 0 && errno != EINTR)) break;
  }
  (*server)->Stop();
  server->reset();
  ::_exit(0);
}

}  // namespace

// ------------------------------------------------------------------ ServerChild

Result<std::unique_ptr<ServerChild>> ServerChild::Fork(const transfer_queue::ServerOptions& options,
                                                       std::chrono::milliseconds timeout) {
  int report[2] = {-1, -1}, lifetime[2] = {-1, -1};
  if (::pipe2(report, O_CLOEXEC) != 0) return Status::Unavailable(std::string("pipe2: ") + std::strerror(errno));
  if (::pipe2(lifetime, O_CLOEXEC) != 0) {
    ::close(report[0]);
    ::close(report[1]);
    return Status::Unavailable(std::string("pipe2: ") + std::strerror(errno));
  }
  std::fflush(nullptr);  // the child must not flush our buffered output again
  const pid_t pid = ::fork();
  if (pid == 0) ServerChildMain(options, report[1], lifetime[0]);
  ::close(report[1]);
  ::close(lifetime[0]);
  if (pid < 0) {
    ::close(report[0]);
    ::close(lifetime[1]);
    return Status::Unavailable(std::string("fork: ") + std::strerror(errno));
  }
  std::unique_ptr<ServerChild> child(new ServerChild());
  child->pid_ = pid;
  child->lifetime_fd_ = lifetime[1];

  // One line: "OK <endpoint>" or "ERR <status>".
  std::string line;
  const auto deadline = Clock::now() + timeout;
  while (line.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{report[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200))) <= 0) continue;
    char buf[512];
    const ssize_t r = ::read(report[0], buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    line.append(buf, static_cast<size_t>(r));
  }
  ::close(report[0]);
  if (line.rfind("OK ", 0) == 0 && line.back() == '\n') {
    child->endpoint_ = line.substr(3, line.size() - 4);
    return child;
  }
  const Status stopped = child->Stop(std::chrono::milliseconds(2000));
  if (line.rfind("ERR ", 0) == 0) return Status::Unavailable("server child: " + line.substr(4));
  return Status::Unavailable("server child did not report its endpoint in time (" + stopped.ToString() + ")");
}

ServerChild::~ServerChild() {
  const Status s = Stop(std::chrono::milliseconds(5000));
  if (!s.ok()) std::fprintf(stderr, "server child %d: %s\n", static_cast<int>(pid_), s.ToString().c_str());
}

Status ServerChild::Stop(std::chrono::milliseconds timeout) {
  if (lifetime_fd_ >= 0) {
    ::close(lifetime_fd_);
    lifetime_fd_ = -1;
  }
  if (pid_ <= 0 || reaped_) return Status::Ok();
  reaped_ = true;
  return Reap(pid_, timeout, "server child " + std::to_string(pid_));
}

// ------------------------------------------------------------------ RedisChild

namespace {

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream in(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(in, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A port that was free a moment ago (bind to 127.0.0.1:0, read it, close).
Result<int> FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) return Status::Unavailable(std::string("cannot bind 127.0.0.1:0: ") + std::strerror(errno));
  return static_cast<int>(ntohs(addr.sin_port));
}

// One PING on a fresh connection; true on "+PONG".
bool PingRedis(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  timeval tv{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool pong = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6) {
    char buf[16] = {};
    const ssize_t r = ::recv(fd, buf, sizeof(buf) - 1, 0);
    pong = r >= 5 && std::strncmp(buf, "+PONG", 5) == 0;
  }
  ::close(fd);
  return pong;
}

}  // namespace

Result<std::unique_ptr<RedisChild>> RedisChild::Start(std::chrono::milliseconds timeout) {
  const std::string exe = FindOnPath("redis-server");
  if (exe.empty()) return Status::NotFound("redis-server is not on PATH");
  SLUICE_ASSIGN_OR_RETURN(int port, FreeLoopbackPort());
  // Loopback only, no persistence: a scratch server for this run.
  std::vector<std::string> args = {exe, "--port", std::to_string(port), "--bind", "127.0.0.1"};
  args.insert(args.end(), {"--save", "", "--appendonly", "no", "--protected-mode", "yes"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int err = ::posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return Status::Unavailable("cannot start " + exe + ": " + std::strerror(err));
  std::unique_ptr<RedisChild> child(new RedisChild());
  child->pid_ = pid;
  child->port_ = port;

  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (PingRedis(port)) return child;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      child->reaped_ = true;
      return Status::Unavailable("redis-server exited before answering PING (port " + std::to_string(port) +
                                 " taken meanwhile?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::Unavailable("redis-server did not answer PING on 127.0.0.1:" + std::to_string(port) + " within " +
                             std::to_string(timeout.count()) + " ms");
}

RedisChild::~RedisChild() {
  const Status s = Stop(std::chrono::milliseconds(5000));
  if (!s.ok()) std::fprintf(stderr, "redis-server %d: %s\n", static_cast<int>(pid_), s.ToString().c_str());
}

Status RedisChild::Stop(std::chrono::milliseconds timeout) {
  if (pid_ <= 0 || reaped_) return Status::Ok();
  reaped_ = true;
  ::kill(pid_, SIGTERM);
  return Reap(pid_, timeout, "redis-server " + std::to_string(pid_));
}

}  // namespace sluice::bench::tq
