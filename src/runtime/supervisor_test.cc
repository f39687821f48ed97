#include "sluice/runtime/supervisor.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <thread>

#include "sluice/common/file_util.h"

namespace sluice::runtime {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

ChildSpec Shell(std::string name, std::string script, std::vector<std::string> extra_args = {}) {
  ChildSpec spec{std::move(name), "/bin/sh", {"-c", std::move(script)}, {}};
  spec.args.insert(spec.args.end(), extra_args.begin(), extra_args.end());
  return spec;
}

ChildSpec Sleep(std::string name, std::string seconds = "30") {
  return ChildSpec{std::move(name), "/bin/sleep", {std::move(seconds)}, {}};
}

std::unique_ptr<Supervisor> MakeSupervisor(std::chrono::milliseconds grace = 200ms) {
  auto supervisor = Supervisor::Create({.stop_grace = grace});
  EXPECT_TRUE(supervisor.ok()) << supervisor.status().ToString();
  return std::move(supervisor).value();
}

// True once `pid` no longer exists: exited *and* reaped.
bool Gone(pid_t pid) { return ::kill(pid, 0) == -1 && errno == ESRCH; }

template <typename Pred>
bool Eventually(std::chrono::milliseconds timeout, Pred pred) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!pred()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::string TempPath(const std::string& tag) {
  return (std::filesystem::temp_directory_path() / ("sluice_supervisor_" + std::to_string(::getpid()) + "_" + tag))
      .string();
}

// Reads one pid from `fd` within `timeout`; -1 if none came.
pid_t ReadPid(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return -1;
  pid_t pid = -1;
  return ::read(fd, &pid, sizeof(pid)) == sizeof(pid) ? pid : -1;
}

// While alive, orphaned descendants are re-parented to this process (not to
// init), so a test can reap them and see how they died.
class SubreaperScope {
 public:
  SubreaperScope() { ok_ = ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0; }
  ~SubreaperScope() { ::prctl(PR_SET_CHILD_SUBREAPER, 0); }
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
};

TEST(SupervisorTest, ChildrenThatAllExitZeroSucceed) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Shell("reward", "exit 0")).ok());
  ASSERT_TRUE(supervisor->Start(Sleep("rollout", "0.2")).ok());
  const std::vector<pid_t> pids = supervisor->pids();
  ASSERT_EQ(pids.size(), 2u);

  const Status status = supervisor->Wait(5s);
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(supervisor->pids().empty());
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid;
  EXPECT_EQ(supervisor->Wait(5s), status) << "the outcome is final";
}

TEST(SupervisorTest, ArgumentsAndEnvironmentReachTheChild) {
  auto supervisor = MakeSupervisor();
  ChildSpec spec = Shell("trainer", "test \"$SLUICE_ROLE\" = trainer && test \"$1\" = one && test \"$2\" = 'two words'",
                         {"argv0", "one", "two words"});
  spec.env["SLUICE_ROLE"] = "trainer";
  ASSERT_TRUE(supervisor->Start(spec).ok());
  const Status status = supervisor->Wait(5s);
  EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST(SupervisorTest, AFailingChildStopsTheOthersPromptly) {
  auto supervisor = MakeSupervisor(2000ms);
  ASSERT_TRUE(supervisor->Start(Sleep("rollout")).ok());
  ASSERT_TRUE(supervisor->Start(Shell("trainer", "sleep 0.1; exit 3")).ok());
  const std::vector<pid_t> pids = supervisor->pids();

  const Clock::time_point start = Clock::now();
  const Status status = supervisor->Wait(20s);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
  EXPECT_NE(status.message().find("'trainer'"), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find("exit status 3"), std::string::npos) << status.ToString();
  EXPECT_EQ(status.message().find("'rollout'"), std::string::npos) << "only the failed child is blamed";
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid << " was not killed and reaped";

  EXPECT_EQ(supervisor->Wait(1s), status) << "the failure is sticky";
  EXPECT_EQ(supervisor->Start(Sleep("late")).code(), StatusCode::kFailedPrecondition);
}

// A child with restarts left is started again alone (its siblings keep
// running, the same pid never signalled twice); one that keeps failing past
// its restarts ends Wait naming it.
TEST(SupervisorTest, AFailedChildWithRestartsLeftIsStartedAgainAlone) {
  const std::string dir = ::testing::TempDir() + "/supervisor_restarts." + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  for (int32_t budget : {2, 1}) {
    SCOPED_TRACE("max_restarts " + std::to_string(budget));
    const std::string count = dir + "/count" + std::to_string(budget);
    auto created = Supervisor::Create({.stop_grace = 200ms, .restart_backoff = 20ms, .max_restart_backoff = 40ms});
    ASSERT_TRUE(created.ok());
    auto supervisor = std::move(created).value();
    ASSERT_TRUE(supervisor->Start(Sleep("trainer", "3")).ok());
    // Fails its first two lives (killed by SIGKILL, then exit 5), then exits 0.
    ChildSpec flaky = Shell("rollout", "echo x >> " + count + "; n=$(wc -l < " + count +
                                           "); if [ $n -eq 1 ]; then kill -9 $$; fi; if [ $n -eq 2 ]; then exit 5; fi");
    flaky.max_restarts = budget;
    ASSERT_TRUE(supervisor->Start(flaky).ok());
    const pid_t trainer = supervisor->PidOf("trainer");
    int32_t restarts = 0;
    const Status status = supervisor->Wait(20s, nullptr, [&] {
      EXPECT_EQ(supervisor->PidOf("trainer"), trainer) << "the sibling was never restarted";
      restarts = supervisor->Restarts("rollout");
      return Status::Ok();
    });
    if (budget == 2) {
      EXPECT_TRUE(status.ok()) << status.ToString();
      EXPECT_EQ(restarts, 2);
    } else {
      EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
      EXPECT_NE(status.message().find("'rollout'"), std::string::npos) << status.ToString();
      EXPECT_NE(status.message().find("exit status 5"), std::string::npos) << status.ToString();
      EXPECT_TRUE(Gone(trainer));
    }
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
  ChildSpec bad = Sleep("bad");
  bad.max_restarts = -1;
  EXPECT_EQ(MakeSupervisor()->Start(bad).code(), StatusCode::kInvalidArgument);
}

TEST(SupervisorTest, AChildKilledBySignalIsReportedWithTheSignal) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Sleep("reward")).ok());
  ASSERT_TRUE(supervisor->Start(Sleep("rollout")).ok());
  const std::vector<pid_t> pids = supervisor->pids();
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);

  const Status status = supervisor->Wait(10s);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
  EXPECT_NE(status.message().find("'rollout'"), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find("signal 9 (SIGKILL)"), std::string::npos) << status.ToString();
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid;
}

TEST(SupervisorTest, StopFlagFromAnotherThreadAbortsAndStopsEveryChild) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Sleep("trainer")).ok());
  ASSERT_TRUE(supervisor->Start(Sleep("rollout")).ok());
  const std::vector<pid_t> pids = supervisor->pids();
  std::atomic<bool> stop{false};
  std::jthread stopper([&stop] {
    std::this_thread::sleep_for(100ms);
    stop.store(true);
  });

  const Clock::time_point start = Clock::now();
  const Status status = supervisor->Wait(20s, &stop);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_EQ(status.code(), StatusCode::kAborted) << status.ToString();
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid;
}

TEST(SupervisorTest, TimeoutStopsTheChildrenAndNamesThem) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Shell("reward", "exit 0")).ok());
  ASSERT_TRUE(supervisor->Start(Sleep("rollout")).ok());
  const std::vector<pid_t> pids = supervisor->pids();

  const Status status = supervisor->Wait(300ms);
  EXPECT_EQ(status.code(), StatusCode::kTimeout) << status.ToString();
  EXPECT_NE(status.message().find("'rollout'"), std::string::npos) << status.ToString();
  EXPECT_EQ(status.message().find("'reward'"), std::string::npos) << "reward had finished";
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid;
}

TEST(SupervisorTest, AWatchdogErrorStopsEveryChildIncludingAStoppedOne) {
  // A long grace: a stopped child must go on SIGTERM (with SIGCONT), not wait for SIGKILL.
  auto supervisor = MakeSupervisor(10s);
  ASSERT_TRUE(supervisor->Start(Sleep("rollout")).ok());
  ASSERT_TRUE(supervisor->Start(Sleep("trainer")).ok());
  const std::vector<pid_t> pids = supervisor->pids();
  ASSERT_EQ(::kill(pids[0], SIGSTOP), 0);
  int calls = 0;
  const Clock::time_point start = Clock::now();
  const Status status = supervisor->Wait(30s, nullptr, [&] {
    return ++calls < 5 ? Status::Ok() : Status::Timeout("the rollout role has made no progress");
  });
  EXPECT_EQ(status.code(), StatusCode::kTimeout) << status.ToString();
  EXPECT_EQ(status.message(), "the rollout role has made no progress");
  EXPECT_EQ(calls, 5);
  EXPECT_LT(Clock::now() - start, 5s) << "the stopped child waited for the SIGKILL grace";
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid;
  EXPECT_EQ(supervisor->Wait(1s).message(), status.message()) << "the outcome is final";
}

TEST(SupervisorTest, AChildIgnoringSigtermIsKilledAfterTheGrace) {
  const std::string ready = TempPath("trap_ready");
  std::filesystem::remove(ready);
  auto supervisor = MakeSupervisor(200ms);
  // The ignored disposition survives exec, so the sleep ignores SIGTERM too.
  ASSERT_TRUE(supervisor->Start(Shell("stubborn", "trap '' TERM; : > \"$1\"; exec /bin/sleep 30", {"sh", ready})).ok());
  const pid_t pid = supervisor->pids().at(0);
  ASSERT_TRUE(Eventually(2s, [&] { return std::filesystem::exists(ready); })) << "the trap was never set";

  const Clock::time_point start = Clock::now();
  supervisor->StopAll();
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, 200ms) << "SIGTERM alone should not have stopped it";
  EXPECT_LT(elapsed, 2s);
  EXPECT_TRUE(Gone(pid));
  EXPECT_TRUE(supervisor->pids().empty());
  supervisor->StopAll();  // idempotent
  std::filesystem::remove(ready);
}

TEST(SupervisorTest, HelpersInAChildsProcessGroupAreStoppedWithIt) {
  SubreaperScope subreaper;
  ASSERT_TRUE(subreaper.ok());
  const std::string helper_file = TempPath("helper_pid");
  std::filesystem::remove(helper_file);
  auto supervisor = MakeSupervisor();
  // The shell forks a helper, publishes its pid, and waits for it.
  const char* script = "/bin/sleep 30 & echo $! > \"$1.tmp\"; mv \"$1.tmp\" \"$1\"; wait";
  ASSERT_TRUE(supervisor->Start(Shell("rollout", script, {"sh", helper_file})).ok());
  ASSERT_TRUE(Eventually(2s, [&] { return std::filesystem::exists(helper_file); }));
  pid_t helper = -1;
  std::ifstream(helper_file) >> helper;
  ASSERT_GT(helper, 0);

  supervisor->StopAll();
  // Orphaned by the role's shell, the helper is re-parented to this process.
  int helper_status = 0;
  const bool reaped = Eventually(2s, [&] { return ::waitpid(helper, &helper_status, WNOHANG) == helper; });
  if (!reaped) ::kill(helper, SIGKILL);
  ASSERT_TRUE(reaped) << "helper " << helper << " survived";
  EXPECT_TRUE(WIFSIGNALED(helper_status) && WTERMSIG(helper_status) == SIGTERM) << helper_status;
  std::filesystem::remove(helper_file);
}

TEST(SupervisorTest, ChildrenDieWhenTheLauncherIsKilled) {
  SubreaperScope subreaper;
  ASSERT_TRUE(subreaper.ok());
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    // A stand-in launcher: starts a role, reports its pid, and waits to be
    // SIGKILLed (no StopAll, no destructor).
    ::close(fds[0]);
    auto supervisor = Supervisor::Create({});
    if (!supervisor.ok() || !(*supervisor)->Start(Sleep("rollout")).ok()) ::_exit(1);
    const pid_t pid = (*supervisor)->pids().at(0);
    if (::write(fds[1], &pid, sizeof(pid)) != sizeof(pid)) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  const pid_t role = ReadPid(fds[0], 5s);
  ::close(fds[0]);
  ::kill(launcher, SIGKILL);
  int launcher_status = 0;
  ASSERT_EQ(::waitpid(launcher, &launcher_status, 0), launcher);  // SIGKILL: bounded
  ASSERT_GT(role, 0) << "the stand-in launcher did not start its child";
  EXPECT_TRUE(WIFSIGNALED(launcher_status) && WTERMSIG(launcher_status) == SIGKILL);

  // The orphaned role is re-parented to this process and must die of SIGTERM.
  int role_status = 0;
  const bool reaped = Eventually(2s, [&] { return ::waitpid(role, &role_status, WNOHANG) == role; });
  if (!reaped) ::kill(role, SIGKILL);
  ASSERT_TRUE(reaped) << "child " << role << " outlived its launcher";
  EXPECT_TRUE(WIFSIGNALED(role_status) && WTERMSIG(role_status) == SIGTERM) << role_status;
}

TEST(SupervisorTest, BadInputIsRejectedWithAClearMessage) {
  EXPECT_EQ(Supervisor::Create({.stop_grace = -1ms}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Supervisor::Create({.poll_interval = 0ms}).status().code(), StatusCode::kInvalidArgument);
  auto supervisor = MakeSupervisor();
  EXPECT_EQ(supervisor->Wait(1s).code(), StatusCode::kFailedPrecondition) << "nothing started";

  Status status = supervisor->Start(ChildSpec{"", "/bin/sleep", {"1"}, {}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("name"), std::string::npos) << status.ToString();

  status = supervisor->Start(ChildSpec{"rollout", "", {}, {}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'rollout'"), std::string::npos) << status.ToString();

  status = supervisor->Start(ChildSpec{"rollout", "/nonexistent/sluice", {}, {}});
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_NE(status.message().find("'rollout'"), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find("/nonexistent/sluice"), std::string::npos) << status.ToString();

  status = supervisor->Start(ChildSpec{"rollout", "/tmp", {}, {}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << "a directory is not executable";

  status = supervisor->Start(ChildSpec{"rollout", "/bin/sleep", {"1"}, {{"A=B", "c"}}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();

  ASSERT_TRUE(supervisor->Start(Sleep("rollout")).ok());
  EXPECT_EQ(supervisor->Start(Sleep("rollout")).code(), StatusCode::kInvalidArgument) << "duplicate name";
  EXPECT_EQ(supervisor->pids().size(), 1u) << "rejected specs start nothing";

  supervisor->StopAll();
  EXPECT_EQ(supervisor->Start(Sleep("trainer")).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(supervisor->Wait(1s).code(), StatusCode::kFailedPrecondition);
}

TEST(StopOnSignalsTest, SigintAbortsWaitAndThePreviousHandlerIsRestored) {
  struct sigaction before {};
  ASSERT_EQ(::sigaction(SIGINT, nullptr, &before), 0);
  {
    StopOnSignals signals;
    EXPECT_FALSE(signals.flag()->load());
    auto supervisor = MakeSupervisor();
    ASSERT_TRUE(supervisor->Start(Sleep("trainer")).ok());
    const pid_t pid = supervisor->pids().at(0);
    std::jthread interrupter([] {
      std::this_thread::sleep_for(100ms);
      ::kill(::getpid(), SIGINT);
    });

    const Status status = supervisor->Wait(20s, signals.flag());
    EXPECT_EQ(status.code(), StatusCode::kAborted) << status.ToString();
    EXPECT_EQ(signals.received_signal(), SIGINT);
    EXPECT_TRUE(Gone(pid));
  }
  struct sigaction after {};
  ASSERT_EQ(::sigaction(SIGINT, nullptr, &after), 0);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

}  // namespace
}  // namespace sluice::runtime
