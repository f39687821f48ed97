#include "sluice/runtime/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "sluice/common/check.h"
#include "sluice/common/logging.h"
#include "sluice/common/strings.h"

extern char** environ;

namespace sluice::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Exit code of a child whose set-up before exec failed (as a shell does for
// "command not found"); the parent learns the errno through the report pipe.
constexpr int kSetupFailedExit = 127;
// How long Start waits for the child to exec (it only makes a few syscalls).
constexpr milliseconds kExecReportTimeout{10000};
// How long StopAll waits for the kernel to finish SIGKILLed children.
constexpr milliseconds kReapTimeout{5000};

Clock::time_point DeadlineAfter(milliseconds timeout) {
  const Clock::time_point now = Clock::now();
  if (timeout <= milliseconds::zero()) return now;
  // milliseconds::max() does not fit in the clock's nanoseconds.
  if (timeout >= std::chrono::duration_cast<milliseconds>(Clock::time_point::max() - now)) {
    return Clock::time_point::max();
  }
  return now + timeout;
}

void SleepUntilNextPoll(milliseconds interval, Clock::time_point deadline) {
  const Clock::time_point now = Clock::now();
  if (now >= deadline) return;
  std::this_thread::sleep_for(std::min<Clock::duration>(interval, deadline - now));
}

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  std::string text = "signal " + std::to_string(sig);
  if (abbrev != nullptr) text += std::string(" (SIG") + abbrev + ")";
  return text;
}

// Signals the child's process group, so helpers it forked get the signal too.
// The group id is the child's pid; that id cannot be reused while the child
// is unreaped, which is why exits are observed with WNOWAIT until StopAll.
void SignalGroup(pid_t pid, int sig) {
  if (::kill(-pid, sig) != 0 && errno == ESRCH) ::kill(pid, sig);
}

Status ValidateSpec(const ChildSpec& spec) {
  if (spec.name.empty()) return Status::InvalidArgument("child spec has an empty name");
  const std::string who = "child " + Quoted(spec.name);
  if (spec.path.empty()) return Status::InvalidArgument(who + ": empty executable path");
  if (spec.max_restarts < 0) return Status::InvalidArgument(who + ": max_restarts must be >= 0");
  if (HasNul(spec.name) || HasNul(spec.path)) return Status::InvalidArgument(who + ": NUL byte in name or path");
  for (const std::string& arg : spec.args) {
    if (HasNul(arg)) return Status::InvalidArgument(who + ": NUL byte in an argument");
  }
  for (const auto& [key, value] : spec.env) {
    if (key.empty() || key.find('=') != std::string::npos || HasNul(key) || HasNul(value)) {
      return Status::InvalidArgument(who + ": bad environment variable name '" + key +
                                     "' (must be non-empty, without '=' or NUL)");
    }
  }
  struct stat st {};
  if (::stat(spec.path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return Status::NotFound(who + ": executable '" + spec.path + "' does not exist");
    }
    return Status::InvalidArgument(who + ": cannot stat executable '" + spec.path + "': " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode) || ::access(spec.path.c_str(), X_OK) != 0) {
    return Status::InvalidArgument(who + ": '" + spec.path + "' is not an executable file");
  }
  return Status::Ok();
}

// The launcher's environment with `overrides` applied, as KEY=VALUE strings.
std::vector<std::string> ChildEnvironment(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> entries;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    if (overrides.count(entry.substr(0, entry.find('='))) == 0) entries.push_back(entry);
  }
  for (const auto& [key, value] : overrides) entries.push_back(key + "=" + value);
  return entries;
}

std::vector<char*> NullTerminated(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

[[noreturn]] void ReportAndExit(int report_fd, int err) {
  // Nothing to do if the write fails: the parent then sees exit 127.
  [[maybe_unused]] const ssize_t n = ::write(report_fd, &err, sizeof(err));
  ::_exit(kSetupFailedExit);
}

// Runs in the forked child. The parent may have other threads, so only
// async-signal-safe calls are allowed here: everything was allocated before
// fork. Signals are blocked on entry (the parent blocked them around fork).
[[noreturn]] void ExecChild(int report_fd, pid_t parent, const char* path, char* const* argv, char* const* envp) {
  ::setpgid(0, 0);
  // The launcher's own handlers (StopOnSignals) must not run in the child.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  ::sigaction(SIGINT, &default_action, nullptr);
  ::sigaction(SIGTERM, &default_action, nullptr);
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) ReportAndExit(report_fd, errno);
  // The launcher may have died before prctl took effect; then nobody would
  // ever send the death signal.
  if (::getppid() != parent) ::_exit(kSetupFailedExit);
  // Descriptors the launcher did not mark close-on-exec (sockets, pipes) must
  // not stay open in the roles. Best effort: older kernels lack close_range.
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(path, argv, envp);
  ReportAndExit(report_fd, errno);
}

// Reads the child's exec report: 0 once exec succeeded (the close-on-exec
// pipe reached end of file), the child's errno if set-up or exec failed, or
// -1 if no report came in time.
int ReadExecReport(int fd) {
  const Clock::time_point deadline = DeadlineAfter(kExecReportTimeout);
  int err = 0;
  size_t got = 0;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return -1;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return -1;
    const ssize_t n = ::read(fd, reinterpret_cast<char*>(&err) + got, sizeof(err) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return got == 0 ? 0 : EIO;  // end of file: exec succeeded (or a torn report)
    got += static_cast<size_t>(n);
    if (got == sizeof(err)) return err == 0 ? EIO : err;
  }
}

}  // namespace

struct Supervisor::Child {
  std::string name;
  ChildSpec spec;  // to start it again (spec.max_restarts)
  pid_t pid = -1;
  bool exited = false;  // seen by PollExits; still a zombie until reaped
  bool reaped = false;
  int32_t restarts = 0;
  std::optional<Clock::time_point> restart_at;  // set while it waits to be started again
  int how = 0;                                  // CLD_EXITED, CLD_KILLED or CLD_DUMPED once exited
  int code = 0;                                 // the exit status or the signal number

  bool succeeded() const { return how == CLD_EXITED && code == 0; }
  std::string Describe() const {
    const std::string who = "child " + Quoted(name) + " (pid " + std::to_string(pid) + ")";
    switch (how) {
      case CLD_EXITED:
        return who + " exited with exit status " + std::to_string(code);
      case CLD_KILLED:
        return who + " was killed by " + SignalName(code);
      case CLD_DUMPED:
        return who + " was killed by " + SignalName(code) + " (core dumped)";
      default:
        return who + " ended with an unknown status (it was reaped outside the supervisor)";
    }
  }
};

Result<std::unique_ptr<Supervisor>> Supervisor::Create(SupervisorOptions options) {
  if (options.stop_grace < milliseconds::zero()) {
    return Status::InvalidArgument("supervisor stop_grace must not be negative, got " +
                                   std::to_string(options.stop_grace.count()) + " ms");
  }
  if (options.poll_interval < milliseconds(1) || options.poll_interval > milliseconds(1000)) {
    return Status::InvalidArgument("supervisor poll_interval must be 1..1000 ms, got " +
                                   std::to_string(options.poll_interval.count()) + " ms");
  }
  if (options.restart_backoff < milliseconds::zero() || options.max_restart_backoff < options.restart_backoff) {
    return Status::InvalidArgument("supervisor restart_backoff must be >= 0 and <= max_restart_backoff");
  }
  return std::unique_ptr<Supervisor>(new Supervisor(options));
}

Supervisor::Supervisor(SupervisorOptions options) : options_(options) {}

Supervisor::~Supervisor() { StopAll(); }

Status Supervisor::Start(const ChildSpec& spec) {
  if (stopped_) {
    return Status::FailedPrecondition("cannot start child " + Quoted(spec.name) + ": the supervisor was stopped");
  }
  SLUICE_RETURN_IF_ERROR(ValidateSpec(spec));
  for (const Child& child : children_) {
    if (child.name == spec.name) return Status::InvalidArgument("duplicate child name " + Quoted(spec.name));
  }
  SLUICE_ASSIGN_OR_RETURN(const pid_t pid, Spawn(spec));
  Child child;
  child.name = spec.name;
  child.spec = spec;
  child.pid = pid;
  children_.push_back(std::move(child));
  return Status::Ok();
}

Result<pid_t> Supervisor::Spawn(const ChildSpec& spec) {
  // Everything the child needs is built now: it must not allocate after fork.
  std::vector<std::string> arg_strings = {spec.path};
  arg_strings.insert(arg_strings.end(), spec.args.begin(), spec.args.end());
  std::vector<std::string> env_strings = ChildEnvironment(spec.env);
  const std::vector<char*> argv = NullTerminated(arg_strings);
  const std::vector<char*> envp = NullTerminated(env_strings);

  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    return Status::Unavailable("cannot start child " + Quoted(spec.name) + ": pipe: " + std::strerror(errno));
  }
  // Blocked across fork so that no handler of the launcher runs in the child
  // before it has reset them.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &previous);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(report[0]);
    ExecChild(report[1], parent, spec.path.c_str(), argv.data(), envp.data());
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    return Status::Unavailable("cannot start child " + Quoted(spec.name) + ": fork: " + std::strerror(fork_errno));
  }
  // The child does the same; doing it here too means the group exists before
  // Start returns, whichever of the two runs first.
  ::setpgid(pid, pid);
  const int exec_errno = ReadExecReport(report[0]);
  ::close(report[0]);
  if (exec_errno != 0) {
    if (exec_errno < 0) ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);  // it has exited (or been killed) by now
    return Status::Unavailable(
        "cannot start child " + Quoted(spec.name) + ": exec " + spec.path + ": " +
        (exec_errno < 0 ? std::string("no report from the child in time") : std::string(std::strerror(exec_errno))));
  }
  return pid;
}

void Supervisor::PlanRestart(Child& child) {
  // Its whole group goes (helpers it left), then it is reaped: its pid is free.
  if (!child.reaped) {
    SignalGroup(child.pid, SIGKILL);
    ::waitpid(child.pid, nullptr, 0);
    child.reaped = true;  // never signalled again under this pid
  }
  const milliseconds backoff = std::min(
      options_.max_restart_backoff, options_.restart_backoff * (int64_t{1} << std::min<int32_t>(child.restarts, 20)));
  SLUICE_LOG(WARNING) << child.Describe() << "; starting it again in " << backoff.count() << " ms (restart "
                      << child.restarts + 1 << " of " << child.spec.max_restarts << ")";
  child.restart_at = Clock::now() + backoff;
  child.pid = -1;
}

Status Supervisor::RestartDue() {
  for (Child& child : children_) {
    if (!child.restart_at || Clock::now() < *child.restart_at) continue;
    child.restart_at.reset();
    ++child.restarts;
    Result<pid_t> pid = Spawn(child.spec);
    if (!pid.ok()) {
      child.exited = child.reaped = true;  // nothing of it is left to stop
      return pid.status().WithContext("restarting child " + Quoted(child.name));
    }
    child.pid = *pid;
    child.exited = child.reaped = false;
    child.how = child.code = 0;
    SLUICE_LOG(INFO) << "child " << Quoted(child.name) << " started again (pid " << child.pid << ")";
  }
  return Status::Ok();
}

bool Supervisor::HasExited(const std::string& name) const {
  for (const Child& child : children_) {
    if (child.name == name) return child.exited && !child.restart_at;
  }
  return false;
}

pid_t Supervisor::PidOf(const std::string& name) const {
  for (const Child& child : children_) {
    if (child.name == name) return child.restart_at || child.reaped ? -1 : child.pid;
  }
  return -1;
}

int32_t Supervisor::Restarts(const std::string& name) const {
  for (const Child& child : children_) {
    if (child.name == name) return child.restarts;
  }
  return 0;
}

void Supervisor::PollExits() {
  for (Child& child : children_) {
    if (child.exited || child.reaped || child.restart_at) continue;
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(child.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == ECHILD) {
        // Someone else reaped it (a waitpid(-1) elsewhere, or SIGCHLD ignored):
        // its pid may be reused, so it is never signalled again.
        child.exited = true;
        child.reaped = true;
        child.how = 0;
      }
      continue;
    }
    if (info.si_pid == 0) continue;  // still running
    child.exited = true;
    child.how = info.si_code;
    child.code = info.si_status;
  }
}

Status Supervisor::Wait(milliseconds timeout, const std::atomic<bool>* stop, const std::function<Status()>& watch) {
  if (outcome_.has_value()) return *outcome_;
  if (stopped_) return Status::FailedPrecondition("Wait after StopAll: the children were already stopped");
  if (children_.empty()) return Status::FailedPrecondition("Wait: no child was started");

  auto finish = [this](Status status) {
    StopAll();
    outcome_ = status;
    return status;
  };
  const Clock::time_point deadline = DeadlineAfter(timeout);
  for (;;) {
    if (stop != nullptr && stop->load(std::memory_order_acquire)) {
      return finish(Status::Aborted("stop requested; stopped all " + std::to_string(children_.size()) + " children"));
    }
    PollExits();
    if (Status restarted = RestartDue(); !restarted.ok()) {
      return finish(Status::Unavailable(restarted.message() + "; stopped the other children"));
    }
    std::string running;
    for (Child& child : children_) {
      if (child.restart_at) {
        running += (running.empty() ? "" : ", ") + Quoted(child.name) + " (restarting)";
      } else if (!child.exited) {
        running += (running.empty() ? "" : ", ") + Quoted(child.name);
      } else if (!child.succeeded() && child.restarts < child.spec.max_restarts) {
        PlanRestart(child);
        running += (running.empty() ? "" : ", ") + Quoted(child.name) + " (restarting)";
      } else if (!child.succeeded()) {
        return finish(Status::Unavailable(child.Describe() + "; stopped the other children"));
      }
    }
    if (running.empty()) return finish(Status::Ok());
    if (watch) {
      Status watched = watch();
      if (!watched.ok()) return finish(std::move(watched));
    }
    if (Clock::now() >= deadline) {
      return finish(Status::Timeout("children still running after " + std::to_string(timeout.count()) +
                                    " ms: " + running + "; stopped them"));
    }
    SleepUntilNextPoll(options_.poll_interval, deadline);
  }
}

void Supervisor::StopAll() {
  stopped_ = true;
  if (children_.empty()) return;

  for (const Child& child : children_) {
    if (!child.reaped) {
      SignalGroup(child.pid, SIGTERM);
      SignalGroup(child.pid, SIGCONT);  // a stopped (SIGSTOP) child acts on SIGTERM only once continued
    }
  }
  const Clock::time_point grace_end = DeadlineAfter(options_.stop_grace);
  for (;;) {
    PollExits();
    const bool all_exited = std::all_of(children_.begin(), children_.end(), [](const Child& c) { return c.exited; });
    if (all_exited || Clock::now() >= grace_end) break;
    SleepUntilNextPoll(options_.poll_interval, grace_end);
  }
  for (const Child& child : children_) {
    if (!child.exited) {
      SLUICE_LOG(WARNING) << "child " << Quoted(child.name) << " (pid " << child.pid << ") still running "
                          << options_.stop_grace.count() << " ms after SIGTERM; sending SIGKILL";
    }
  }
  // Every group, including those whose leader exited: helpers a role left
  // behind go too. Safe because no leader has been reaped yet.
  for (const Child& child : children_) {
    if (!child.reaped) SignalGroup(child.pid, SIGKILL);
  }

  const Clock::time_point reap_end = DeadlineAfter(kReapTimeout);
  for (;;) {
    bool all_reaped = true;
    for (Child& child : children_) {
      if (child.reaped) continue;
      const pid_t done = ::waitpid(child.pid, nullptr, WNOHANG);
      if (done == child.pid || (done < 0 && errno == ECHILD)) {
        child.reaped = true;
      } else {
        all_reaped = false;
      }
    }
    if (all_reaped || Clock::now() >= reap_end) break;
    SleepUntilNextPoll(options_.poll_interval, reap_end);
  }
  for (const Child& child : children_) {
    if (!child.reaped) {
      SLUICE_LOG(ERROR) << "child " << Quoted(child.name) << " (pid " << child.pid << ") did not exit within "
                        << kReapTimeout.count() << " ms of SIGKILL (stuck in the kernel?); leaving it behind";
    }
  }
  children_.clear();
}

std::vector<pid_t> Supervisor::pids() const {
  std::vector<pid_t> result;
  for (const Child& child : children_) {
    if (!child.reaped) result.push_back(child.pid);
  }
  return result;
}

// ------------------------------------------------------------ StopOnSignals

namespace {

// Signal handlers cannot carry state, so the one live StopOnSignals uses these.
std::atomic<bool> g_stop_requested{false};
std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_stop_handler_installed{false};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "a signal handler may only touch lock-free atomics");

void OnStopSignal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);
  g_stop_requested.store(true, std::memory_order_release);
}

}  // namespace

StopOnSignals::StopOnSignals() {
  SLUICE_CHECK(!g_stop_handler_installed.exchange(true)) << "only one StopOnSignals may be alive at a time";
  g_stop_requested.store(false);
  g_stop_signal.store(0);
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  // SA_RESETHAND: the second signal takes the default action (terminates).
  action.sa_flags = SA_RESTART | SA_RESETHAND;
  SLUICE_CHECK(::sigaction(SIGINT, &action, &previous_int_) == 0);
  SLUICE_CHECK(::sigaction(SIGTERM, &action, &previous_term_) == 0);
}

StopOnSignals::~StopOnSignals() {
  ::sigaction(SIGINT, &previous_int_, nullptr);
  ::sigaction(SIGTERM, &previous_term_, nullptr);
  g_stop_handler_installed.store(false);
}

const std::atomic<bool>* StopOnSignals::flag() const { return &g_stop_requested; }

int StopOnSignals::received_signal() const { return g_stop_signal.load(); }

}  // namespace sluice::runtime
