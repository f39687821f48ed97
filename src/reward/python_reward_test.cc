// reward.python against real Python worker processes: the functions below are
// written to a temporary directory and run by a real interpreter
// (SLUICE_TEST_PYTHON, else /usr/bin/python3, else python3 on PATH). The
// faults are real too: functions that raise, hang, print, return junk, write
// junk on the protocol socket, and workers killed with SIGKILL.
#include "sluice/reward/python_reward.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sluice/common/file_util.h"
#include "sluice/common/mutex.h"

namespace sluice::reward {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The functions under test. A score that is a pid says which worker ran it.
constexpr char kRewards[] = R"py(
import math, os, signal, subprocess, sys, time

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imports.log"), "a") as log:
    log.write("%d\n" % os.getpid())

def exact(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str.strip() == ground_truth else 0.0

def inspect(data_source, solution_str, ground_truth, extra_info=None):
    # Every argument, folded into one number.
    assert data_source == "arithmetic", data_source
    assert set(extra_info) <= {"index", "split", "prompt"}, extra_info
    score = extra_info["index"] * 100 + (10 if extra_info["split"] == "eval" else 0)
    if "prompt" in extra_info:
        score += 1
    if solution_str == "\ufffd!":
        score += 0.5
    return score

def pid(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise ValueError("boom!")
    if solution_str == "hang":
        time.sleep(60)
    if solution_str == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if solution_str == "exit":
        sys.exit(3)
    if solution_str == "garbage":
        os.write(3, b"this is not json\n")
    if solution_str == "wrong id":
        os.write(3, b'{"id": 123456789, "score": 1.0}\n')
    if solution_str.startswith("sleep "):
        time.sleep(float(solution_str[6:]))
    if solution_str.startswith("helper "):
        helper = subprocess.Popen(["sleep", "60"])
        with open(solution_str[7:] + ".tmp", "w") as f:
            f.write(str(helper.pid))
        os.rename(solution_str[7:] + ".tmp", solution_str[7:])
        time.sleep(60)
    if solution_str.startswith(("detached ", "detached-ok ")):
        # A helper in a session of its own (setsid), out of the worker's
        # process group; "detached-ok" returns while it runs.
        helper = subprocess.Popen(["sleep", "60"], start_new_session=True)
        with open(solution_str.split()[1] + ".tmp", "w") as f:
            f.write(str(helper.pid))
        os.rename(solution_str.split()[1] + ".tmp", solution_str.split()[1])
        if solution_str.split()[0] == "detached":
            time.sleep(60)
    if solution_str.startswith("pidfile "):
        with open(solution_str[8:] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(solution_str[8:] + ".tmp", solution_str[8:])
        time.sleep(30)
    return os.getpid()

def returns(data_source, solution_str, ground_truth, extra_info=None):
    return {
        "none": None, "str": "x", "nan": float("nan"), "inf": float("inf"), "nodict": {"acc": 1.0},
        "dict nan": {"score": float("nan")}, "list": [1.0], "big": 10 ** 400,
        "dict": {"score": 0.25, "acc": 1.0}, "true": True, "int": 3, "float": -2.5,
    }[solution_str]

def prints(data_source, solution_str, ground_truth, extra_info=None):
    print('{"id": 0, "score": 99}')
    print("more", file=sys.stdout, flush=True)
    os.write(1, b"straight to fd 1\n")
    return 0.75

not_callable = 42

def two_args(solution_str, ground_truth):
    return 1.0

def keywords(**kwargs):
    return 1.0 if set(kwargs) == {"data_source", "solution_str", "ground_truth", "extra_info"} else 0.0

class Scorer:
    @staticmethod
    def score(data_source, solution_str, ground_truth, extra_info=None):
        return 0.5
)py";

std::string TestPython() {
  if (const char* env = std::getenv("SLUICE_TEST_PYTHON"); env != nullptr && *env != '\0') return env;
  if (::access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  return "python3";
}

bool Gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// Gone, or dead and not yet reaped by whoever adopted it (not our child).
bool Dead(pid_t pid) {
  if (Gone(pid)) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z';
}

class PythonRewardTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("sluice_python_reward_" + std::to_string(::getpid()) + "_" +
                                           testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    Write("rewards.py", kRewards);
    Write("broken_module.py", "raise RuntimeError('cannot load me')\n");
    python_ = TestPython();
    if (!CheckPythonReward(Options("exact")).ok()) GTEST_SKIP() << "no usable Python interpreter: " << python_;
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(dir_.string())); }

  void Write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }

  PythonRewardOptions Options(const std::string& function) const {
    PythonRewardOptions o;
    o.function = (dir_ / "rewards.py").string() + ":" + function;
    o.executable = python_;
    o.workers = 1;
    o.timeout = milliseconds(500);
    o.error_reward = -1.0;
    return o;
  }

  std::unique_ptr<Task> Make(const PythonRewardOptions& options) const {
    TaskOptions base;
    base.name = "arithmetic";
    base.eval_size = 8;
    auto task = MakePythonRewardTask(MakeTask(base).value(), options);
    EXPECT_TRUE(task.ok()) << task.status().ToString();
    return task.ok() ? std::move(*task) : nullptr;
  }

  static Example Answer(const std::string& answer, uint64_t index = 0) {
    Example e;
    e.index = index;
    e.answer = answer;
    return e;
  }

  // Imports of the rewards module so far (one line per worker started).
  int Imports() const {
    std::ifstream in(dir_ / "imports.log");
    int lines = 0;
    for (std::string line; std::getline(in, line);) ++lines;
    return lines;
  }

  fs::path dir_;
  std::string python_;
};

TEST_F(PythonRewardTest, ACorrectFunctionGivesItsRewards) {
  auto task = Make(Options("exact"));
  EXPECT_EQ(task->name(), "arithmetic");
  EXPECT_EQ(task->Score(Answer("7"), "7"), 1.0);
  EXPECT_EQ(task->Score(Answer("7"), " 7\n"), 1.0);
  EXPECT_EQ(task->Score(Answer("7"), "8"), 0.0);
  EXPECT_EQ(task->Score(Answer("12"), "3+9=12#12"), 0.0);
  EXPECT_EQ(task->score_errors(), 0u);
  EXPECT_EQ(Imports(), 2);  // CheckPythonReward's worker, then the task's one, which served every call
}

TEST_F(PythonRewardTest, TheFunctionGetsVerlsKeywordArguments) {
  auto task = Make(Options("inspect"));
  Result<Example> eval = task->Get(Split::kEval, 3);
  ASSERT_TRUE(eval.ok());
  EXPECT_EQ(eval->split, Split::kEval);
  EXPECT_EQ(task->Score(*eval, "1"), 311.0);  // index 3, eval, with its prompt
  Result<Example> train = task->Get(Split::kTrain, 5);
  ASSERT_TRUE(train.ok());
  EXPECT_EQ(task->Score(*train, "1"), 501.0);
  EXPECT_EQ(task->Score(Answer("1", 2), "1"), 200.0);  // no prompt: none passed
  // A response that is not UTF-8 arrives with U+FFFD in place of the bad byte.
  EXPECT_EQ(task->Score(Answer("1", 2), "\xff!"), 200.5);
  EXPECT_EQ(task->score_errors(), 0u);
}

TEST_F(PythonRewardTest, AModuleOnPythonPathAndANestedAttributeLoad) {
  ::setenv("PYTHONPATH", dir_.c_str(), 1);
  PythonRewardOptions o = Options("exact");
  o.function = "rewards:Scorer.score";
  EXPECT_TRUE(CheckPythonReward(o).ok()) << CheckPythonReward(o).ToString();
  auto task = Make(o);
  EXPECT_EQ(task->Score(Answer("1"), "1"), 0.5);
  ::unsetenv("PYTHONPATH");
  task = Make(Options("keywords"));  // any signature that takes the four keywords
  EXPECT_EQ(task->Score(Answer("1"), "1"), 1.0);
}

TEST_F(PythonRewardTest, AnExceptionGivesTheErrorRewardAndTheWorkerLivesOn) {
  auto task = Make(Options("pid"));
  const double pid = task->Score(Answer("1"), "ok");
  ASSERT_GT(pid, 0);
  EXPECT_EQ(task->Score(Answer("1"), "boom"), -1.0);
  EXPECT_EQ(task->score_errors(), 1u);
  EXPECT_EQ(task->Score(Answer("1"), "ok"), pid);     // the same worker
  EXPECT_EQ(task->Score(Answer("1"), "exit"), -1.0);  // SystemExit is an exception like any other
  EXPECT_EQ(task->Score(Answer("1"), "ok"), pid);
  EXPECT_EQ(task->score_errors(), 2u);
}

TEST_F(PythonRewardTest, AHangingCallTimesOutAndItsWorkerIsReplaced) {
  auto task = Make(Options("pid"));
  const double first = task->Score(Answer("1"), "ok");
  ASSERT_GT(first, 0);
  const auto start = Clock::now();
  EXPECT_EQ(task->Score(Answer("1"), "hang"), -1.0);
  const auto took = Clock::now() - start;
  EXPECT_GE(took, milliseconds(450));
  EXPECT_LT(took, milliseconds(5000));
  EXPECT_TRUE(Gone(static_cast<pid_t>(first)));  // killed and reaped
  const double second = task->Score(Answer("1"), "ok");
  EXPECT_GT(second, 0);
  EXPECT_NE(second, first);
  EXPECT_EQ(task->Score(Answer("1"), "ok"), second);
  EXPECT_EQ(task->score_errors(), 1u);
}

TEST_F(PythonRewardTest, ATimedOutWorkersHelperProcessesAreKilledWithIt) {
  auto task = Make(Options("pid"));
  const fs::path pidfile = dir_ / "helper.pid";
  EXPECT_EQ(task->Score(Answer("1"), "helper " + pidfile.string()), -1.0);
  std::ifstream in(pidfile);
  pid_t helper = 0;
  in >> helper;
  ASSERT_GT(helper, 0);
  bool dead = false;
  for (int i = 0; i < 200 && !dead; ++i) {
    dead = Dead(helper);
    if (!dead) std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(dead) << "helper " << helper << " outlived its worker";
  if (!dead) ::kill(helper, SIGKILL);
  EXPECT_GT(task->Score(Answer("1"), "ok"), 0);
}

// Helpers that left the worker's process group (setsid) outlived the run,
// though the docs promised they do not: killed with their worker now, when
// a call times out and when the task (the run) ends.
TEST_F(PythonRewardTest, HelpersInASessionOfTheirOwnAreKilledWithTheirWorker) {
  auto wait_dead = [](pid_t helper) {
    for (int i = 0; i < 300; ++i) {
      if (Dead(helper)) return true;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  };
  auto read_pid = [](const fs::path& path) {
    std::ifstream in(path);
    pid_t pid = 0;
    in >> pid;
    return pid;
  };
  auto task = Make(Options("pid"));
  const fs::path timed_out = dir_ / "detached.pid";
  EXPECT_EQ(task->Score(Answer("1"), "detached " + timed_out.string()), -1.0);  // times out
  const pid_t first = read_pid(timed_out);
  ASSERT_GT(first, 0);
  EXPECT_TRUE(wait_dead(first)) << "helper " << first << " outlived its timed-out worker";
  if (!Dead(first)) ::kill(first, SIGKILL);
  const fs::path at_end = dir_ / "detached-ok.pid";
  EXPECT_GT(task->Score(Answer("1"), "detached-ok " + at_end.string()), 0);  // returns; the helper runs on
  const pid_t second = read_pid(at_end);
  ASSERT_GT(second, 0);
  EXPECT_FALSE(Dead(second));
  task.reset();  // the run ends
  EXPECT_TRUE(wait_dead(second)) << "helper " << second << " outlived the task";
  if (!Dead(second)) ::kill(second, SIGKILL);
}

TEST_F(PythonRewardTest, ResultsThatAreNotFiniteNumbersGiveTheErrorReward) {
  auto task = Make(Options("returns"));
  uint64_t errors = 0;
  for (const char* bad : {"none", "str", "nan", "inf", "nodict", "dict nan", "list", "big"}) {
    EXPECT_EQ(task->Score(Answer("1"), bad), -1.0) << bad;
    EXPECT_EQ(task->score_errors(), ++errors) << bad;
  }
  EXPECT_EQ(task->Score(Answer("1"), "dict"), 0.25);
  EXPECT_EQ(task->Score(Answer("1"), "true"), 1.0);
  EXPECT_EQ(task->Score(Answer("1"), "int"), 3.0);
  EXPECT_EQ(task->Score(Answer("1"), "float"), -2.5);
  EXPECT_EQ(task->score_errors(), errors);
  EXPECT_EQ(Imports(), 2);  // one worker did it all
}

TEST_F(PythonRewardTest, PrintingToStdoutDoesNotBreakTheProtocol) {
  auto task = Make(Options("prints"));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(task->Score(Answer("1"), "x"), 0.75);
  EXPECT_EQ(task->score_errors(), 0u);
  EXPECT_EQ(Imports(), 2);
}

TEST_F(PythonRewardTest, AWorkerKilledMidCallIsReplaced) {
  PythonRewardOptions o = Options("pid");
  o.timeout = milliseconds(20000);  // the kill, not the timeout, ends the call
  auto task = Make(o);
  const fs::path pidfile = dir_ / "busy.pid";
  std::thread killer([&] {
    for (int i = 0; i < 1000 && !fs::exists(pidfile); ++i) std::this_thread::sleep_for(milliseconds(10));
    std::ifstream in(pidfile);
    pid_t victim = 0;
    in >> victim;
    if (victim > 0) ::kill(victim, SIGKILL);
  });
  const auto start = Clock::now();
  EXPECT_EQ(task->Score(Answer("1"), "pidfile " + pidfile.string()), -1.0);
  EXPECT_LT(Clock::now() - start, milliseconds(10000));
  killer.join();
  EXPECT_GT(task->Score(Answer("1"), "ok"), 0);
  // A worker that kills itself: the same.
  EXPECT_EQ(task->Score(Answer("1"), "die"), -1.0);
  EXPECT_GT(task->Score(Answer("1"), "ok"), 0);
  EXPECT_EQ(task->score_errors(), 2u);
}

TEST_F(PythonRewardTest, JunkOnTheProtocolSocketEndsTheWorker) {
  auto task = Make(Options("pid"));
  const double first = task->Score(Answer("1"), "ok");
  EXPECT_EQ(task->Score(Answer("1"), "garbage"), -1.0);
  const double second = task->Score(Answer("1"), "ok");
  EXPECT_GT(second, 0);
  EXPECT_NE(second, first);
  EXPECT_TRUE(Gone(static_cast<pid_t>(first)));
  EXPECT_EQ(task->Score(Answer("1"), "wrong id"), -1.0);
  const double third = task->Score(Answer("1"), "ok");
  EXPECT_GT(third, 0);
  EXPECT_NE(third, second);
  EXPECT_EQ(task->score_errors(), 2u);
}

TEST_F(PythonRewardTest, BadSpecsAreRefusedAtStartUpNamingTheProblem) {
  for (const char* spec : {"rewards", "rewards:", ":exact", "rewards:1x", "my rewards:exact", "rewards:a-b"}) {
    PythonRewardOptions o = Options("exact");
    o.function = spec;
    const Status s = CheckPythonReward(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(s.message().find("expected 'package.module:function'"), std::string::npos) << s.ToString();
    TaskOptions base;
    base.name = "arithmetic";
    EXPECT_EQ(MakePythonRewardTask(MakeTask(base).value(), o).status().code(), StatusCode::kInvalidArgument);
  }
  struct Case {
    std::string function;
    std::vector<std::string> needles;
  };
  const std::string file = (dir_ / "rewards.py").string();
  const Case cases[] = {
      {"no_such_module_sluice:f", {"cannot import module 'no_such_module_sluice'", "ModuleNotFoundError"}},
      {(dir_ / "broken_module.py").string() + ":f", {"cannot import module", "RuntimeError: cannot load me"}},
      {(dir_ / "missing.py").string() + ":f", {"no such file"}},
      {file + ":missing", {"has no attribute 'missing'"}},
      {file + ":not_callable", {"'not_callable'", "int 42, not callable"}},
      {file + ":two_args", {"cannot be called as two_args(data_source=..., solution_str=...", "'data_source'"}},
  };
  for (const Case& c : cases) {
    PythonRewardOptions o = Options("exact");
    o.function = c.function;
    const Status s = CheckPythonReward(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("reward.python '" + c.function + "'"), std::string::npos) << s.ToString();
    for (const std::string& needle : c.needles) EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
  }
  PythonRewardOptions o = Options("exact");
  o.executable = "no-such-python-sluice";
  Status s = CheckPythonReward(o);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("'no-such-python-sluice' is not on PATH"), std::string::npos) << s.ToString();
  o.executable = (dir_ / "python9").string();
  EXPECT_EQ(CheckPythonReward(o).code(), StatusCode::kNotFound);
  o = Options("exact");
  o.workers = 0;
  EXPECT_EQ(CheckPythonReward(o).code(), StatusCode::kInvalidArgument);
  o = Options("exact");
  o.timeout = milliseconds(0);
  EXPECT_EQ(CheckPythonReward(o).code(), StatusCode::kInvalidArgument);
  o = Options("exact");
  o.error_reward = NAN;
  EXPECT_EQ(CheckPythonReward(o).code(), StatusCode::kInvalidArgument);
}

TEST_F(PythonRewardTest, WorkersThatKeepFailingToStartAreGivenUpOnQuickly) {
  for (const bool bad_interpreter : {false, true}) {
    PythonRewardOptions o = Options("exact");
    if (bad_interpreter) {
      o.executable = "no-such-python-sluice";
    } else {
      o.function = "no_such_module_sluice:f";  // not checked: MakePythonRewardTask starts nothing
    }
    o.workers = 2;
    o.max_start_failures = 3;
    auto task = Make(o);
    const auto start = Clock::now();
    for (int i = 0; i < 20; ++i) EXPECT_EQ(task->Score(Answer("1"), "1"), -1.0);
    EXPECT_LT(Clock::now() - start, milliseconds(5000));
    EXPECT_EQ(task->score_errors(), 20u);
  }
  EXPECT_EQ(Imports(), 1);  // SetUp's check only
}

TEST_F(PythonRewardTest, WorkersStartOnFirstUseAndEndWithTheTask) {
  PythonRewardOptions o = Options("pid");
  o.workers = 3;
  auto task = Make(o);
  EXPECT_EQ(Imports(), 1);  // SetUp's check; building the task started none
  const double pid = task->Score(Answer("1"), "ok");
  EXPECT_EQ(Imports(), 2);  // one call, one worker
  EXPECT_FALSE(Gone(static_cast<pid_t>(pid)));
  task.reset();
  EXPECT_TRUE(Gone(static_cast<pid_t>(pid)));
}

TEST_F(PythonRewardTest, ThreadsScoreAtOnceOnUpToNWorkers) {
  PythonRewardOptions o = Options("pid");
  o.workers = 3;
  o.timeout = milliseconds(10000);
  auto task = Make(o);
  Mutex mu;
  std::set<double> pids;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 4; ++i) {
        const double pid = task->Score(Answer("1"), "sleep 0.05");
        if (pid <= 0) errors.fetch_add(1);
        MutexLock lock(&mu);
        pids.insert(pid);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(task->score_errors(), 0u);
  MutexLock lock(&mu);
  EXPECT_GE(pids.size(), 2u);  // six threads at once kept more than one worker busy
  EXPECT_LE(pids.size(), 3u);  // and never more than reward.python_workers
  EXPECT_EQ(Imports(), 1 + static_cast<int>(pids.size()));
}

}  // namespace
}  // namespace sluice::reward
