// The code-execution sandbox on real runs of Python (the interpreter:
// SLUICE_TEST_PYTHON, else /usr/bin/python3, else python3 on PATH; skipped
// when there is none). Each hostile program is bounded by its limit and the
// run goes on.
#include "sluice/agent/sandbox.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "sluice/agent/environment.h"
#include "test_python.h"

namespace sluice::agent {
namespace {

class SandboxTest : public testing::Test {
 protected:
  void SetUp() override {
    limits_.python = TestPython();
    limits_.wall_seconds = 5;
    limits_.cpu_seconds = 2;
    limits_.memory_bytes = int64_t{256} << 20;
    limits_.file_bytes = int64_t{1} << 20;
    limits_.processes = 16;
    limits_.output_bytes = 1000;
    Result<SandboxResult> hello = RunSandboxedPython("print('hi')", limits_);
    if (!hello.ok() || hello->stdout_text != "hi\n") GTEST_SKIP() << "no usable Python interpreter: " << limits_.python;
  }
  SandboxResult Run(const std::string& code) {
    Result<SandboxResult> r = RunSandboxedPython(code, limits_);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SandboxResult{};
  }
  SandboxLimits limits_;
};

// What the code prints comes back, its errors too, bounded; it runs in a
// fresh directory of its own that is gone afterwards, with the
// environment's variables not passed on. Fails if output is lost or
// unbounded, or the directory is shared or left behind.
TEST_F(SandboxTest, OutputComesBackBoundedFromAFreshDirectory) {
  ::setenv("SLUICE_SECRET", "x", 1);
  SandboxResult r =
      Run("import os, sys\n"
          "print(os.listdir('.'), os.environ.get('SLUICE_SECRET'))\n"
          "open('scratch', 'w').write('x')\n"
          "print(os.getcwd())\n"
          "sys.stderr.write('warned\\n')\n");
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.stdout_text.substr(0, r.stdout_text.find('\n')), "['main.py'] None");
  const std::string cwd = r.stdout_text.substr(r.stdout_text.find('\n') + 1, std::string::npos);
  EXPECT_EQ(cwd.rfind("/tmp/sluice-sandbox-", 0), 0u) << cwd;
  EXPECT_FALSE(std::filesystem::exists(cwd.substr(0, cwd.size() - 1))) << "removed after the run";
  EXPECT_EQ(r.stderr_text, "warned\n");
  SandboxResult loud = Run("print('y' * 100000)");
  EXPECT_EQ(loud.stdout_text.size(), 1000u);
  EXPECT_EQ(loud.dropped_bytes, 100001 - 1000);
  SandboxResult raised = Run("raise ValueError('bad')");
  EXPECT_EQ(raised.exit_code, 1);
  EXPECT_NE(raised.Describe().find("ValueError: bad"), std::string::npos);
  EXPECT_NE(raised.Describe().find("[exit code 1]"), std::string::npos);
}

// Hostile code meets its limits: a loop that never ends (killed at the wall
// time), one that burns CPU (SIGXCPU), unbounded allocation (MemoryError),
// unbounded writing (the file size limit), a fork bomb (the process limit
// or the PID namespace; it ends within the wall time and leaves no
// process), and the network (none in the network namespace). Fails if any
// of them runs past its bound or takes the caller down.
TEST_F(SandboxTest, HostileCodeMeetsItsLimits) {
  limits_.wall_seconds = 1.5;
  SandboxResult sleeps = Run("import time\ntime.sleep(60)");
  EXPECT_TRUE(sleeps.timed_out);
  EXPECT_LT(sleeps.seconds, 4.0);
  EXPECT_NE(sleeps.Describe().find("ran past its time"), std::string::npos);

  limits_.wall_seconds = 10;
  limits_.cpu_seconds = 1;
  SandboxResult spins = Run("while True: pass");
  EXPECT_FALSE(spins.timed_out);
  EXPECT_TRUE(spins.signal == SIGXCPU || spins.signal == SIGKILL) << spins.Describe();
  EXPECT_LT(spins.seconds, 5.0);

  SandboxResult hungry = Run("x = bytearray(10**10)");
  EXPECT_NE(hungry.stderr_text.find("MemoryError"), std::string::npos) << hungry.Describe();

  SandboxResult writer = Run("f = open('big', 'wb')\nwhile True: f.write(b'x' * 65536)");
  EXPECT_TRUE(writer.signal == SIGXFSZ || writer.stderr_text.find("File too large") != std::string::npos)
      << writer.Describe();

  limits_.wall_seconds = 3;
  SandboxResult bomb =
      Run("import os\n"
          "while True:\n"
          "    try:\n"
          "        os.fork()\n"
          "    except OSError:\n"
          "        pass\n");
  EXPECT_LT(bomb.seconds, 8.0);
  if (::geteuid() == 0) {
    EXPECT_TRUE(bomb.dropped_privileges);
    EXPECT_TRUE(bomb.pid_namespace);
  }

  SandboxResult net =
      Run("import socket\n"
          "s = socket.socket()\n"
          "s.settimeout(1)\n"
          "try:\n"
          "    s.connect(('127.0.0.1', 9))\n"
          "    print('connected')\n"
          "except OSError as e:\n"
          "    print('refused', e.errno)\n");
  if (net.network_namespace) {
    EXPECT_EQ(net.stdout_text.rfind("refused", 0), 0u) << net.Describe();
  }
  EXPECT_EQ(net.stdout_text.find("connected"), std::string::npos);
}

// The built-in python tool answers each call with its run, a malformed
// call with why, and a turn without calls ends the episode.
TEST_F(SandboxTest, ThePythonToolEnvironmentRunsEachCall) {
  auto env = MakePythonToolEnvironment(limits_);
  Result<Opening> opening = env->Reset(R"({"prompt": "2**100?"})");
  ASSERT_TRUE(opening.ok());
  EXPECT_NE(opening->tools.find("\"python\""), std::string::npos);
  Action a;
  a.tool_calls = {{"call_0_0", "python", R"j({"code": "print(2**100)"})j", ""},
                  {"call_0_1", "python", R"({"source": "1"})", ""},
                  {"call_0_2", "shell", R"({"code": "ls"})", ""}};
  Result<StepResult> step = env->Step(a);
  ASSERT_TRUE(step.ok());
  ASSERT_EQ(step->messages.size(), 3u);
  EXPECT_EQ(step->messages[0].content, "1267650600228229401496703205376\n");
  EXPECT_NE(step->messages[1].content.find("takes a string \"code\""), std::string::npos);
  EXPECT_NE(step->messages[2].content.find("no tool 'shell'"), std::string::npos);
  EXPECT_FALSE(step->done);
  Result<StepResult> done = env->Step({"1267650600228229401496703205376", {}});
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done);
}

}  // namespace
}  // namespace sluice::agent
