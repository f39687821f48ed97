// Python environments in real worker processes (the interpreter:
// SLUICE_TEST_PYTHON, else /usr/bin/python3, else python3 on PATH; skipped
// when there is none).
#include "sluice/agent/python_environment.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "sluice/common/file_util.h"
#include "test_python.h"

namespace sluice::agent {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr char kEnvs[] = R"py(
import os, time

class Counter:
    """Counts the calls to calculator; done on a turn without calls."""
    def __init__(self, config):
        self.limit = config["limit"]
        self.calls = 0
    def reset(self, row):
        return {"messages": [{"role": "system", "content": "count"}, {"role": "user", "content": row["prompt"]}],
                "tools": [{"type": "function", "function": {"name": "calculator"}}]}
    def step(self, action):
        if not action["tool_calls"]:
            return {"messages": [], "reward": 1.0 if self.calls == self.limit else 0.0, "done": True}
        out = []
        for call in action["tool_calls"]:
            self.calls += 1
            args = call["arguments"]
            text = "bad: " + call["error"] if args is None else "%s=%d" % (args["expression"], self.calls)
            out.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        return {"messages": out, "reward": None, "done": False}
    def close(self):
        with open(os.environ["CLOSED_LOG"], "a") as f:
            f.write("closed %d\n" % self.calls)

class Raises:
    def __init__(self, config): pass
    def reset(self, row): raise ValueError("no reset for you")
    def step(self, action): return {}

class Hangs:
    def __init__(self, config): pass
    def reset(self, row): return {"messages": [{"role": "user", "content": "x"}]}
    def step(self, action):
        time.sleep(60)

class Exits:
    def __init__(self, config): pass
    def reset(self, row): return {"messages": [{"role": "user", "content": "x"}]}
    def step(self, action): os._exit(3)

class Malformed:
    def __init__(self, config): self.kind = config["kind"]
    def reset(self, row): return {"messages": [{"role": "user", "content": "x"}]}
    def step(self, action):
        if self.kind == "not_dict": return [1, 2]
        if self.kind == "no_done": return {"messages": []}
        if self.kind == "bad_message": return {"messages": [{"role": "tool", "content": 5}], "done": False}
        if self.kind == "huge": return {"messages": [{"role": "tool", "content": "x" * (2 << 20)}], "done": False}
        if self.kind == "surrogate": return {"messages": [{"role": "tool", "content": "\ud800"}], "done": False}
        if self.kind == "not_json": return {"messages": [], "done": False, "extra": {1, 2}}
        if self.kind == "nan": return {"messages": [], "reward": float("nan"), "done": True}

class NoStep:
    def __init__(self, config): pass
    def reset(self, row): return {}
)py";

class PythonEnvironmentTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("sluice_python_env_" + std::to_string(::getpid()) + "_" +
                                           testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "envs.py") << kEnvs;
    ::setenv("CLOSED_LOG", (dir_ / "closed.log").c_str(), 1);
    if (!CheckPythonEnvironment(Options("Counter", R"({"limit": 2})")).ok()) {
      GTEST_SKIP() << "no usable Python interpreter: " << TestPython();
    }
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(dir_.string())); }

  PythonEnvironmentOptions Options(const std::string& cls, const std::string& config = "{}") const {
    PythonEnvironmentOptions o;
    o.spec = (dir_ / "envs.py").string() + ":" + cls;
    o.config = config;
    o.executable = TestPython();
    o.workers = 2;
    o.timeout = milliseconds(2000);
    return o;
  }
  fs::path dir_;
};

// The contract of docs/agents.md, through a worker: the config reaches the
// constructor, reset's messages and tools come back, step sees the parsed
// calls (a malformed one flagged, its arguments None) and answers per call;
// each trajectory has its own instance (two at once on two workers), and a
// destroyed environment's close() runs. Fails if state leaks between
// trajectories, a call is dropped or close is never called.
TEST_F(PythonEnvironmentTest, TheContractRunsInWorkerProcesses) {
  auto pool = PythonEnvironmentPool::Create(Options("Counter", R"({"limit": 2})"));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  {
    std::unique_ptr<Environment> a = (*pool)->Make(), b = (*pool)->Make(), c = (*pool)->Make();
    auto opening = a->Reset(R"({"prompt": "12*34?"})");
    ASSERT_TRUE(opening.ok()) << opening.status().ToString();
    ASSERT_EQ(opening->messages.size(), 2u);
    EXPECT_EQ(opening->messages[1].content, "12*34?");
    EXPECT_NE(opening->tools.find("calculator"), std::string::npos);
    ASSERT_TRUE(b->Reset(R"({"prompt": "b"})").ok());
    ASSERT_TRUE(c->Reset(R"({"prompt": "c"})").ok());  // in a's worker, its own instance
    Action act;
    act.content = "...";
    act.tool_calls = {{"call_0_0", "calculator", R"({"expression": "1+1"})", ""}, {"call_0_1", "", "", "not JSON"}};
    auto step = a->Step(act);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    ASSERT_EQ(step->messages.size(), 2u);
    EXPECT_EQ(step->messages[0].content, "1+1=1");
    EXPECT_EQ(step->messages[0].tool_call_id, "call_0_0");
    EXPECT_EQ(step->messages[1].content, "bad: not JSON");
    EXPECT_FALSE(step->done);
    auto c_step = c->Step({"", {{"call_0_0", "calculator", R"({"expression": "2"})", ""}}});
    ASSERT_TRUE(c_step.ok());
    EXPECT_EQ(c_step->messages[0].content, "2=1") << "c counts its own calls";
    auto done = a->Step({"408", {}});
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_TRUE(done->done);
    EXPECT_EQ(done->reward, 1.0);
  }
  // Closed in their workers before those workers' next calls.
  auto d = (*pool)->Make(), e = (*pool)->Make();
  ASSERT_TRUE(d->Reset(R"({"prompt": "d"})").ok());
  ASSERT_TRUE(e->Reset(R"({"prompt": "e"})").ok());
  std::ifstream log(dir_ / "closed.log");
  std::string all((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("closed 2"), std::string::npos) << all;
  EXPECT_NE(all.find("closed 1"), std::string::npos) << all;
  EXPECT_NE(all.find("closed 0"), std::string::npos) << all;
}

// Every bad answer is an error of its call, naming what is wrong, and the
// worker lives on; a call that hangs or kills its worker is an error too,
// the worker is replaced, and an environment that lived in the old worker
// fails its next call instead of talking to a stranger's state. A class
// that does not load is refused before the run.
TEST_F(PythonEnvironmentTest, BadEnvironmentsAreErrorsNotCrashes) {
  auto raises = PythonEnvironmentPool::Create(Options("Raises"));
  ASSERT_TRUE(raises.ok());
  auto r = (*raises)->Make()->Reset("{}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no reset for you"), std::string::npos) << r.status().ToString();

  for (const auto& [kind, needle] : std::vector<std::pair<std::string, std::string>>{{"not_dict", "not a dict"},
                                                                                     {"no_done", "done"},
                                                                                     {"bad_message", "message 0"},
                                                                                     {"huge", "over the limit"},
                                                                                     {"surrogate", "JSON cannot hold"},
                                                                                     {"not_json", "JSON cannot hold"},
                                                                                     {"nan", "JSON cannot hold"}}) {
    auto pool = PythonEnvironmentPool::Create(Options("Malformed", R"({"kind": ")" + kind + R"("})"));
    ASSERT_TRUE(pool.ok());
    auto env = (*pool)->Make();
    ASSERT_TRUE(env->Reset("{}").ok());
    auto step = env->Step({"x", {}});
    ASSERT_FALSE(step.ok()) << kind;
    EXPECT_EQ(step.status().code(), StatusCode::kInvalidArgument) << kind << ": " << step.status().ToString();
    EXPECT_NE(step.status().message().find(needle), std::string::npos) << kind << ": " << step.status().ToString();
    EXPECT_TRUE(env->Reset("{}").ok()) << kind << ": the worker lives on";
  }

  PythonEnvironmentOptions hang = Options("Hangs");
  hang.workers = 1;
  hang.timeout = milliseconds(300);
  auto pool = PythonEnvironmentPool::Create(hang);
  ASSERT_TRUE(pool.ok());
  auto first = (*pool)->Make(), second = (*pool)->Make();
  ASSERT_TRUE(first->Reset("{}").ok());
  ASSERT_TRUE(second->Reset("{}").ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto hung = first->Step({"x", {}});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(hung.status().code(), StatusCode::kTimeout) << hung.status().ToString();
  auto orphan = second->Step({"x", {}});
  ASSERT_FALSE(orphan.ok());
  EXPECT_NE(orphan.status().message().find("replaced"), std::string::npos) << orphan.status().ToString();
  EXPECT_TRUE((*pool)->Make()->Reset("{}").ok()) << "a new worker serves new environments";

  auto exits = PythonEnvironmentPool::Create(Options("Exits"));
  ASSERT_TRUE(exits.ok());
  auto dies = (*exits)->Make();
  ASSERT_TRUE(dies->Reset("{}").ok());
  auto died = dies->Step({"x", {}});
  ASSERT_FALSE(died.ok());
  EXPECT_EQ(died.status().code(), StatusCode::kUnavailable) << died.status().ToString();

  Status no_step = CheckPythonEnvironment(Options("NoStep"));
  EXPECT_EQ(no_step.code(), StatusCode::kInvalidArgument) << no_step.ToString();
  EXPECT_NE(no_step.message().find("step"), std::string::npos) << no_step.ToString();
  EXPECT_EQ(CheckPythonEnvironment(Options("Nope")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPythonEnvironment(Options("Counter", "[1]")).code(), StatusCode::kInvalidArgument);
  PythonEnvironmentOptions no_colon = Options("Counter");
  no_colon.spec = "nocolon";
  EXPECT_EQ(CheckPythonEnvironment(no_colon).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::agent
