// The agent driver on a real rollout engine and model: trajectories of
// several turns, environment calls on a bounded pool, failures and time
// limits ending trajectories with their reasons.
#include "agent_driver.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "agent_test_util.h"
#include "common/testing/status_macros.h"
#include "sluice/model/transformer.h"

namespace sluice::pipeline {
namespace {

using agent::EndReason;

using agent_test::EndingModel;

// Answers each turn with a user message until `turns` steps, then done
// with reward 1; sleeps `wait` per call, counting the calls at once.
struct Scripted : agent::Environment {
  Scripted(int turns, std::chrono::milliseconds wait, std::atomic<int>* now, std::atomic<int>* most, int fail_at = -1)
      : turns_(turns), wait_(wait), now_(now), most_(most), fail_at_(fail_at) {}
  Result<agent::Opening> Reset(const std::string& row) override {
    Busy b(this);
    return agent::Opening{{{"user", "row " + row, ""}}, ""};
  }
  Result<agent::StepResult> Step(const agent::Action& action) override {
    Busy b(this);
    if (++steps_ == fail_at_) throw std::runtime_error("the environment broke");
    if (steps_ >= turns_) return agent::StepResult{{}, 1.0, true};
    return agent::StepResult{{{"user", "go on " + std::to_string(steps_), ""}}, std::nullopt, false};
  }
  struct Busy {
    explicit Busy(Scripted* s) : s_(s) {
      const int n = ++*s->now_;
      for (int m = s->most_->load(); n > m && !s->most_->compare_exchange_weak(m, n);) {
      }
      std::this_thread::sleep_for(s->wait_);
    }
    ~Busy() { --*s_->now_; }
    Scripted* s_;
  };
  int turns_;
  std::chrono::milliseconds wait_;
  std::atomic<int>*now_, *most_;
  int fail_at_;
  int steps_ = 0;
};

Result<std::vector<AgentDriver::Finished>> RunAll(AgentDriver& driver, rollout::RolloutEngine& engine, size_t n) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  return RunTrajectories(driver, engine, n, [&] { return std::chrono::steady_clock::now() > give_up; });
}

class AgentDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rollout::EngineOptions eo;
    eo.num_slots = 4;
    eo.kept_cache_bytes = 1 << 20;
    auto engine = rollout::RolloutEngine::Create({EndingModel(), 5}, eo);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(engine).value();
    settings_.format = std::make_shared<const model::ChatFormat>(model::ChatFormat::Builtin());
    settings_.limits.max_tokens = 200;
    settings_.limits.max_turn_tokens = 16;
  }
  std::unique_ptr<rollout::RolloutEngine> engine_;
  AgentSettings settings_;
  std::atomic<int> now_{0}, most_{0};
};

// Eight trajectories of three turns on four slots, environments that take
// 30 ms on two workers: every trajectory ends done, with its three turns
// (each the end token, trained, version 5) and the environment's two
// messages (not trained) between them; no more than two environment calls
// ever ran at once; each later turn continued its trajectory's kept cache,
// and every cache was dropped when its trajectory ended. Fails if a turn
// or an environment message is lost, the pool is not bounded, a
// trajectory waiting for its environment is never resumed, or a turn's
// cache is not kept (or not dropped).
TEST_F(AgentDriverTest, TrajectoriesRunTheirTurnsWithBoundedEnvironmentCalls) {
  settings_.env_workers = 2;
  settings_.make_env = [this](uint64_t) -> Result<std::unique_ptr<agent::Environment>> {
    return std::unique_ptr<agent::Environment>(new Scripted(3, std::chrono::milliseconds(30), &now_, &most_));
  };
  SLUICE_ASSERT_OK_AND_ASSIGN(auto driver, AgentDriver::Create(settings_, engine_.get()));
  rollout::SamplingParams sampling;
  for (uint64_t id = 0; id < 8; ++id) driver->Start(id, std::to_string(id), sampling);
  SLUICE_ASSERT_OK_AND_ASSIGN(auto finished, RunAll(*driver, *engine_, 8));
  ASSERT_EQ(finished.size(), 8u);
  for (const auto& f : finished) {
    ASSERT_TRUE(f.trajectory.has_value()) << f.detail;
    const agent::Trajectory& t = *f.trajectory;
    EXPECT_EQ(f.reason, EndReason::kDone) << f.detail;
    EXPECT_EQ(t.model_turns(), 3);
    EXPECT_EQ(t.reward(), 1.0);
    int64_t trained = 0;
    for (size_t i = 0; i < t.tokens().size(); ++i) {
      if (t.mask()[i] == 1) {
        ++trained;
        EXPECT_EQ(t.tokens()[i], model::ByteTokenizer::kEos);
        EXPECT_EQ(t.versions()[i], 5);
      }
    }
    EXPECT_EQ(trained, 3);
    int user_turns = 0;
    for (const agent::Span& s : t.turns()) user_turns += s.role == "user" && s.content.rfind("go on", 0) == 0;
    EXPECT_EQ(user_turns, 2);
  }
  EXPECT_LE(most_.load(), 2);
  EXPECT_EQ(driver->counters().model_turns, 24);
  EXPECT_EQ(driver->counters().env_calls, 8 * 4);    // a reset and three steps each
  EXPECT_EQ(engine_->stats().caches_reused, 8 * 2);  // each trajectory's second and third turns
  EXPECT_EQ(engine_->stats().caches_dropped, 0);
  EXPECT_EQ(engine_->kept_cache_bytes(), 0);
  EXPECT_EQ(driver->in_flight(), 0u);
}

// A budget that holds no trajectory's cache: every later turn is prefilled
// again (counted as dropped), and every trajectory still runs its turns.
TEST_F(AgentDriverTest, CachesPastTheBudgetAreDroppedAndPrefilledAgain) {
  rollout::EngineOptions eo;
  eo.num_slots = 4;
  eo.kept_cache_bytes = 64;  // less than one token's keys and values
  SLUICE_ASSERT_OK_AND_ASSIGN(engine_, rollout::RolloutEngine::Create({EndingModel(), 5}, eo));
  settings_.make_env = [this](uint64_t) -> Result<std::unique_ptr<agent::Environment>> {
    return std::unique_ptr<agent::Environment>(new Scripted(3, std::chrono::milliseconds(1), &now_, &most_));
  };
  SLUICE_ASSERT_OK_AND_ASSIGN(auto driver, AgentDriver::Create(settings_, engine_.get()));
  rollout::SamplingParams sampling;
  for (uint64_t id = 0; id < 4; ++id) driver->Start(id, std::to_string(id), sampling);
  SLUICE_ASSERT_OK_AND_ASSIGN(auto finished, RunAll(*driver, *engine_, 4));
  ASSERT_EQ(finished.size(), 4u);
  for (const auto& f : finished) {
    ASSERT_TRUE(f.trajectory.has_value()) << f.detail;
    EXPECT_EQ(f.trajectory->model_turns(), 3);
  }
  EXPECT_EQ(engine_->stats().caches_reused, 0);
  EXPECT_EQ(engine_->stats().caches_dropped, 4 * 3);  // every turn's, none fits
}

// An environment that raises ends its trajectory as env_error; one that
// runs past agent.env_timeout_seconds ends as env_timeout when the
// deadline passes (not when the call returns); one whose calls sum past
// agent.max_env_seconds ends as env_time; one never done ends at
// max_turns. The others finish. Fails if a failure takes the run down or a
// limit is not enforced.
TEST_F(AgentDriverTest, FailuresAndTimeLimitsEndTrajectoriesWithTheirReasons) {
  settings_.env_workers = 4;
  settings_.env_timeout_seconds = 0.3;
  settings_.max_env_seconds = 0.15;
  settings_.limits.max_turns = 4;
  std::atomic<int> which{0};
  settings_.make_env = [&](uint64_t) -> Result<std::unique_ptr<agent::Environment>> {
    switch (which++) {
      case 0:
        return std::unique_ptr<agent::Environment>(new Scripted(3, std::chrono::milliseconds(0), &now_, &most_, 2));
      case 1:
        return std::unique_ptr<agent::Environment>(new Scripted(3, std::chrono::milliseconds(1000), &now_, &most_));
      case 2:
        return std::unique_ptr<agent::Environment>(new Scripted(99, std::chrono::milliseconds(60), &now_, &most_));
      case 3:
        return std::unique_ptr<agent::Environment>(new Scripted(99, std::chrono::milliseconds(0), &now_, &most_));
      default:
        return Status::Unavailable("no more environments");
    }
  };
  SLUICE_ASSERT_OK_AND_ASSIGN(auto driver, AgentDriver::Create(settings_, engine_.get()));
  for (uint64_t id = 0; id < 5; ++id) {
    // One at a time, so that environment `id` is trajectory `id`'s.
    driver->Start(id, "{}", {});
    while (which.load() <= static_cast<int>(id)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto t0 = std::chrono::steady_clock::now();
  SLUICE_ASSERT_OK_AND_ASSIGN(auto finished, RunAll(*driver, *engine_, 5));
  ASSERT_EQ(finished.size(), 5u);
  std::map<uint64_t, AgentDriver::Finished*> by_id;
  for (auto& f : finished) by_id[f.id] = &f;
  EXPECT_EQ(by_id[0]->reason, EndReason::kEnvError);
  EXPECT_NE(by_id[0]->detail.find("broke"), std::string::npos) << by_id[0]->detail;
  EXPECT_EQ(by_id[1]->reason, EndReason::kEnvTimeout) << by_id[1]->detail;
  EXPECT_EQ(by_id[2]->reason, EndReason::kEnvTime) << by_id[2]->detail;
  EXPECT_EQ(by_id[3]->reason, EndReason::kMaxTurns);
  EXPECT_EQ(by_id[3]->trajectory->model_turns(), 4);
  EXPECT_EQ(by_id[4]->reason, EndReason::kEnvError);
  EXPECT_FALSE(by_id[4]->trajectory.has_value());
  EXPECT_NE(by_id[4]->detail.find("no more environments"), std::string::npos);
  // The 1 s reset of environment 1 timed out at 0.3 s (the driver did not wait for it).
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.9);
}

// A warm-start example that calls the calculator: the opening offers the
// tool; the target is the call, the tool's answer and the final answer, in
// the built-in template; exactly the model's two turns (each with its end
// token) are trained, longer than a sampled turn may be (max_turn_tokens
// 8). One that answers at once is one trained turn. Fails if the tool's
// answer or the markup were trained, a turn's end token were not, or the
// turn budget of sampling applied to the task's answers.
TEST_F(AgentDriverTest, WarmStartExamplesTrainOnlyTheModelsTurns) {
  settings_.limits.max_turn_tokens = 8;
  settings_.make_env = [](uint64_t) -> Result<std::unique_ptr<agent::Environment>> {
    return agent::MakeCalculatorEnvironment();
  };
  reward::Example ex;
  ex.prompt = "12+30=";
  ex.answer = "42";
  const model::TokenId eos = model::ByteTokenizer::kEos;
  SLUICE_ASSERT_OK_AND_ASSIGN(trainer::SftExample call, AgentWarmStartExample(settings_, ex, "#42", true, eos));
  model::ByteTokenizer tok;
  const auto text = [&](const std::vector<model::TokenId>& ids, int want) {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (want >= 0 && call.trained[i] != want) continue;
      out += ids[i] == eos ? std::string("<eos>") : tok.Decode({ids[i]}).value();
    }
    return out;
  };
  EXPECT_EQ(tok.Decode(call.prompt).value(), "tools: calculator\nuser: 12+30=\nassistant: ");
  ASSERT_EQ(call.trained.size(), call.target.size());
  EXPECT_EQ(text(call.target, -1),
            "<tool_call>{\"name\":\"calculator\",\"arguments\":{\"expression\":\"12+30\"}}</tool_call><eos>"
            "tool: 42\nassistant: #42<eos>");
  EXPECT_EQ(text(call.target, 1),
            "<tool_call>{\"name\":\"calculator\",\"arguments\":{\"expression\":\"12+30\"}}</tool_call><eos>#42<eos>");
  SLUICE_ASSERT_OK_AND_ASSIGN(trainer::SftExample at_once, AgentWarmStartExample(settings_, ex, "#42", false, eos));
  EXPECT_EQ(at_once.prompt, call.prompt);
  EXPECT_EQ(at_once.target, (std::vector<model::TokenId>{'#', '4', '2', eos}));
  EXPECT_EQ(at_once.trained, (std::vector<uint8_t>{1, 1, 1, 1}));
}

}  // namespace
}  // namespace sluice::pipeline
