#include "python_worker.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>
#include <vector>

#include "sluice/common/logging.h"

extern char** environ;

namespace sluice::reward::internal {
namespace {

using Clock = PythonWorker::Clock;
using nlohmann::json;
using std::chrono::milliseconds;

// The worker's end of the socketpair, as the program expects it.
constexpr int kProtocolFd = 3;
// How long a worker that closed its end may take to exit before it is killed,
// and how long a killed one may take to be reaped before it is given up on.
constexpr milliseconds kExitGrace{1000};
constexpr milliseconds kReapTimeout{5000};
// How long a worker asked to end (SIGTERM) may take to end its function's
// processes (python_worker_program.cc: end_descendants) before SIGKILL.
constexpr milliseconds kTerminateGrace{2000};

int MillisecondsLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1000 * 1000));
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + (abbrev != nullptr ? std::string(" (SIG") + abbrev + ")" : "");
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by " + SignalName(WTERMSIG(status));
  return "ended with wait status " + std::to_string(status);
}

// Waits up to `timeout` for `pid` to end, without reaping it (so its pid,
// and with it its process group id, stays reserved). True once it has ended
// (or was reaped by someone else).
bool WaitEnded(pid_t pid, milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  for (milliseconds pause{1};; pause = std::min(pause * 2, milliseconds(20))) {
    siginfo_t info{};
    const int got = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    if (got == 0 && info.si_pid == pid) return true;
    if (got < 0 && errno != EINTR) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
  }
}

// Reaps `pid`, waiting up to `timeout`; its wait status, or -1 if it has
// not ended (or -2 if someone else reaped it).
int WaitForExit(pid_t pid, milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  for (milliseconds pause{1};; pause = std::min(pause * 2, milliseconds(20))) {
    int status = 0;
    const pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) return status;
    if (got < 0 && errno != EINTR) return -2;
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(pause);
  }
}

// The start of `text`, printable, for messages about what a worker sent.
std::string Excerpt(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 120)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return "'" + out + (text.size() > 120 ? "...'" : "'");
}

// Moves `fd` to a descriptor >= 10 (close-on-exec), so that the child's
// dup2 onto kProtocolFd can never collide with it.
int MoveHigh(int fd) {
  const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  if (high >= 0) ::close(fd);
  return high;
}

Status SendAll(int fd, const std::string& data, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = ::poll(&p, 1, MillisecondsLeft(deadline));
      if (ready == 0) return Status::Timeout("the worker did not read its request in time");
      continue;
    }
    return Status::Unavailable(std::string("cannot send to the worker: ") + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<PythonWorker>> PythonWorker::Start(const std::string& executable,
                                                          const std::vector<std::string>& mode_args,
                                                          Clock::time_point deadline,
                                                          const std::string& executable_key) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status::Unavailable(std::string("cannot create the worker's socket: ") + std::strerror(errno));
  }
  const int ours = MoveHigh(sv[0]);
  const int theirs = MoveHigh(sv[1]);
  if (ours < 0 || theirs < 0) {
    const int err = errno;
    for (int fd : {ours, theirs, sv[0], sv[1]}) {
      if (fd >= 0) ::close(fd);
    }
    return Status::Unavailable(std::string("cannot create the worker's socket: ") + std::strerror(err));
  }

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawnattr_init(&attr);
  ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, theirs, kProtocolFd);
  ::posix_spawn_file_actions_addclosefrom_np(&actions, kProtocolFd + 1);
  // Nothing blocked, every signal at its default action (ignored ones would
  // survive exec): the worker program sets what it needs itself.
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  ::posix_spawnattr_setsigmask(&attr, &none);
  ::posix_spawnattr_setsigdefault(&attr, &all);
  // A process group of its own: killing the group also ends helpers the
  // user's function started (a sandbox, a subprocess) when the worker is.
  ::posix_spawnattr_setpgroup(&attr, 0);
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);

  std::vector<std::string> args = {executable, "-c", kWorkerProgram};
  args.insert(args.end(), mode_args.begin(), mode_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int err = ::posix_spawnp(&pid, executable.c_str(), &actions, &attr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  ::close(theirs);
  if (err != 0) {
    ::close(ours);
    const std::string who = "the Python interpreter '" + executable + "'";
    if (err == ENOENT || err == ENOTDIR) {
      return Status::NotFound(who +
                              (executable.find('/') == std::string::npos ? " is not on PATH" : " does not exist") +
                              " (" + executable_key + ")");
    }
    return Status::Unavailable("cannot start " + who + ": " + std::strerror(err));
  }
  std::unique_ptr<PythonWorker> worker(new PythonWorker(pid, ours));

  Result<std::string> line = worker->ReadLine(deadline);
  if (!line.ok()) {
    if (line.status().code() == StatusCode::kTimeout) {
      return Status::Timeout("the worker (pid " + std::to_string(pid) +
                             ") did not finish importing the module in time (it was killed)");
    }
    return Status::Unavailable("the worker (pid " + std::to_string(pid) + ") failed before it was ready: " +
                               line.status().message() + " (its stderr, above, may say why)");
  }
  const json hello = json::parse(*line, nullptr, /*allow_exceptions=*/false);
  if (hello.is_object() && hello.contains("ready") && hello["ready"].is_boolean()) {
    if (hello["ready"].get<bool>()) return worker;
    if (hello.contains("error") && hello["error"].is_string()) {
      return Status::InvalidArgument(hello["error"].get<std::string>());
    }
  }
  return Status::Unavailable("the worker (pid " + std::to_string(pid) + ") sent " + Excerpt(*line) +
                             " instead of its ready report");
}

PythonWorker::~PythonWorker() {
  static_cast<void>(KillAndReap());
  if (fd_ >= 0) ::close(fd_);
}

int PythonWorker::KillAndReap() {
  if (pid_ < 0) return -2;
  // SIGTERM first: the worker ends every process its function started,
  // those that left its process group (setsid) too, which it adopted as
  // their subreaper and which the group kill below would miss. A worker
  // stuck in C code past the grace is killed all the same.
  ::kill(pid_, SIGTERM);
  static_cast<void>(WaitEnded(pid_, kTerminateGrace));
  // The group, while the unreaped worker keeps its id from being reused.
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  const int status = WaitForExit(pid_, kReapTimeout);
  if (status == -1) {
    SLUICE_LOG(WARNING) << "reward.python: worker pid " << pid_ << " did not end within " << kReapTimeout.count() / 1000
                        << " s of SIGKILL; left behind";
  }
  pid_ = -1;
  return status;
}

std::string PythonWorker::Ended() {
  const std::string who = "the worker (pid " + std::to_string(pid_) + ")";
  const bool ended = WaitEnded(pid_, kExitGrace);
  const int status = KillAndReap();
  if (!ended) return who + " closed its socket and was killed";
  if (status < 0) return who + " ended";
  return who + " " + DescribeWaitStatus(status);
}

Result<std::string> PythonWorker::ReadLine(Clock::time_point deadline) {
  for (;;) {
    const size_t newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    if (buffer_.size() > kMaxLineBytes) {
      return Status::DataLoss("the worker sent a line over " + std::to_string(kMaxLineBytes) +
                              " bytes: " + Excerpt(buffer_));
    }
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, MillisecondsLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Status::Unavailable(std::string("poll: ") + std::strerror(errno));
    if (ready == 0) return Status::Timeout("no reply in time");
    char chunk[1 << 16];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) {
      if (n < 0 && errno != ECONNRESET) return Status::Unavailable(std::string("recv: ") + std::strerror(errno));
      return Status::Unavailable(Ended());
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

Result<nlohmann::json> PythonWorker::Exchange(uint64_t id, json message, Clock::time_point deadline) {
  if (pid_ < 0) return Status::Unavailable("the worker has ended");
  message["id"] = id;
  // A model's bytes need not be UTF-8: invalid sequences become U+FFFD, as a
  // tokenizer's decode with errors="replace" gives them.
  std::string line = message.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace) + "\n";
  if (Status sent = SendAll(fd_, line, deadline); !sent.ok()) {
    if (sent.code() == StatusCode::kTimeout) return sent;
    return Status::Unavailable(sent.message() + "; " + Ended());
  }
  SLUICE_ASSIGN_OR_RETURN(std::string reply_line, ReadLine(deadline));
  if (!buffer_.empty()) {
    return Status::DataLoss("the worker sent more than one line for request " + std::to_string(id) + ": " +
                            Excerpt(reply_line) + " then " + Excerpt(buffer_));
  }
  json reply = json::parse(reply_line, nullptr, /*allow_exceptions=*/false);
  if (!reply.is_object()) {
    return Status::DataLoss("the worker's reply to request " + std::to_string(id) +
                            " is not a JSON object: " + Excerpt(reply_line));
  }
  if (!reply.contains("id") || !reply["id"].is_number_unsigned() || reply["id"].get<uint64_t>() != id) {
    return Status::DataLoss("the worker's reply to request " + std::to_string(id) +
                            " does not carry its id: " + Excerpt(reply_line));
  }
  return reply;
}

Result<ScoreReply> PythonWorker::Call(uint64_t id, const ScoreRequest& request, Clock::time_point deadline) {
  json extra = {{"index", request.index}, {"split", request.split}};
  if (!request.prompt.empty()) extra["prompt"] = request.prompt;
  const json message = {{"data_source", request.data_source},
                        {"solution_str", request.solution_str},
                        {"ground_truth", request.ground_truth},
                        {"extra_info", std::move(extra)}};
  SLUICE_ASSIGN_OR_RETURN(const json reply, Exchange(id, message, deadline));
  const auto malformed = [&](const std::string& why) {
    return Status::DataLoss("the worker's reply to request " + std::to_string(id) + " " + why + ": " +
                            Excerpt(reply.dump()));
  };
  const bool has_score = reply.contains("score"), has_error = reply.contains("error");
  if (has_score == has_error) return malformed("has neither or both of 'score' and 'error'");
  ScoreReply out;
  if (has_error) {
    if (!reply["error"].is_string()) return malformed("has an 'error' that is not a string");
    out.error = reply["error"].get<std::string>();
    return out;
  }
  if (!reply["score"].is_number()) return malformed("has a 'score' that is not a number");
  out.score = reply["score"].get<double>();
  if (!std::isfinite(out.score)) return malformed("has a 'score' that is not finite");
  out.ok = true;
  return out;
}

}  // namespace sluice::reward::internal
