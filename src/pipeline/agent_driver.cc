// Multi-turn trajectories on a rollout engine (agent_driver.h).
#include "agent_driver.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "metrics_log.h"
#include "sluice/agent/python_environment.h"
#include "sluice/common/random.h"

namespace sluice::pipeline {

using agent::EndReason;
using Clock = std::chrono::steady_clock;

Status AgentSettings::Validate() const {
  if (!make_env) return Status::InvalidArgument("agent.env: no environment to make");
  if (!format) return Status::InvalidArgument("an agent run needs its model's chat format");
  SLUICE_RETURN_IF_ERROR(limits.Validate());
  if (env_workers < 1) return Status::InvalidArgument("agent.env_workers must be >= 1");
  if (!(env_timeout_seconds > 0)) return Status::InvalidArgument("agent.env_timeout_seconds must be > 0");
  if (!(max_env_seconds > 0)) return Status::InvalidArgument("agent.max_env_seconds must be > 0");
  return Status::Ok();
}

namespace {

agent::PythonEnvironmentOptions PythonOptions(const AgentOptions& agent) {
  agent::PythonEnvironmentOptions po;
  po.spec = agent.env;
  po.config = agent.env_config;
  po.executable = agent.python_executable;
  po.workers = agent.env_workers;
  po.timeout = std::chrono::milliseconds(static_cast<int64_t>(agent.env_timeout_seconds * 1000));
  return po;
}

// agent.env=python: the sandbox's limits, its defaults overridden by
// agent.env_config's keys (python, wall_seconds, cpu_seconds, memory_bytes,
// file_bytes, open_files, processes, output_bytes).
Result<agent::SandboxLimits> SandboxLimitsFrom(const AgentOptions& agent) {
  agent::SandboxLimits l;
  const nlohmann::json c = nlohmann::json::parse(agent.env_config, nullptr, /*allow_exceptions=*/false);
  if (!c.is_object()) return Status::InvalidArgument("agent.env_config is not a map");
  for (const auto& [key, value] : c.items()) {
    const auto bad = [&](const std::string& what) {
      return Status::InvalidArgument("agent.env_config." + key + " (agent.env=python): " + what);
    };
    if (key == "python") {
      if (!value.is_string() || value.get<std::string>().empty()) return bad("must be a non-empty string");
      l.python = value.get<std::string>();
      continue;
    }
    if (key == "wall_seconds") {
      if (!value.is_number() || !(value.get<double>() > 0)) return bad("must be a number > 0");
      l.wall_seconds = value.get<double>();
      continue;
    }
    int64_t* field = key == "cpu_seconds"    ? &l.cpu_seconds
                     : key == "memory_bytes" ? &l.memory_bytes
                     : key == "file_bytes"   ? &l.file_bytes
                     : key == "open_files"   ? &l.open_files
                     : key == "processes"    ? &l.processes
                     : key == "output_bytes" ? &l.output_bytes
                                             : nullptr;
    if (field == nullptr) {
      return bad(
          "is not a limit of the sandbox (python, wall_seconds, cpu_seconds, memory_bytes, file_bytes, "
          "open_files, processes, output_bytes)");
    }
    if (!value.is_number_integer() || value.get<int64_t>() < 1) return bad("must be an integer >= 1");
    *field = value.get<int64_t>();
  }
  return l;
}

// agent.env=calculator: whether its tool is offered (agent.env_config's
// offer_tool, default true).
Result<bool> CalculatorOffered(const AgentOptions& agent) {
  const nlohmann::json c = nlohmann::json::parse(agent.env_config, nullptr, /*allow_exceptions=*/false);
  if (!c.is_object()) return Status::InvalidArgument("agent.env_config is not a map");
  bool offered = true;
  for (const auto& [key, value] : c.items()) {
    if (key != "offer_tool") {
      return Status::InvalidArgument("agent.env_config." + key +
                                     " (agent.env=calculator): not a setting of the calculator (offer_tool)");
    }
    if (!value.is_boolean()) {
      return Status::InvalidArgument("agent.env_config.offer_tool (agent.env=calculator): must be true or false");
    }
    offered = value.get<bool>();
  }
  return offered;
}

}  // namespace

Status CheckAgentEnvironment(const AgentOptions& agent, const std::string& tokenizer_dir) {
  if (!agent.enabled()) return Status::Ok();
  SLUICE_RETURN_IF_ERROR(model::ChatFormat::Load(tokenizer_dir).status().WithContext("agent.env"));
  if (agent.env == "calculator") return CalculatorOffered(agent).status();
  if (agent.env == "python") {
    // Its limits read, and the interpreter runs in the sandbox.
    SLUICE_ASSIGN_OR_RETURN(const agent::SandboxLimits limits, SandboxLimitsFrom(agent));
    SLUICE_ASSIGN_OR_RETURN(const agent::SandboxResult hello, agent::RunSandboxedPython("print('ok')", limits));
    if (hello.stdout_text != "ok\n") {
      return Status::FailedPrecondition("agent.env=python: the sandbox does not run Python (" + limits.python +
                                        "): " + hello.Describe());
    }
    return Status::Ok();
  }
  return agent.python() ? agent::CheckPythonEnvironment(PythonOptions(agent)) : Status::Ok();
}

Result<AgentSettings> AgentSettingsFor(const AgentOptions& agent, const std::string& tokenizer_dir,
                                       const model::ModelConfig& model, int32_t max_turn_tokens) {
  AgentSettings s;
  if (agent.python()) {
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<agent::PythonEnvironmentPool> pool,
                            agent::PythonEnvironmentPool::Create(PythonOptions(agent)));
    s.make_env = [pool](uint64_t) -> Result<std::unique_ptr<agent::Environment>> { return pool->Make(); };
  } else if (agent.env == "python") {
    SLUICE_ASSIGN_OR_RETURN(const agent::SandboxLimits limits, SandboxLimitsFrom(agent));
    s.make_env = [limits](uint64_t) -> Result<std::unique_ptr<agent::Environment>> {
      return agent::MakePythonToolEnvironment(limits);
    };
  } else {
    SLUICE_ASSIGN_OR_RETURN(const bool offered, CalculatorOffered(agent));
    s.make_env = [offered](uint64_t) -> Result<std::unique_ptr<agent::Environment>> {
      return agent::MakeCalculatorEnvironment(offered);
    };
  }
  SLUICE_ASSIGN_OR_RETURN(model::ChatFormat format, model::ChatFormat::Load(tokenizer_dir));
  if (agent.tool_call_format == "auto") {
    s.calls = !format.builtin() && model.model_type == "llama" ? agent::ToolCallFormat::kLlama3
                                                               : agent::ToolCallFormat::kHermes;
  } else {
    SLUICE_ASSIGN_OR_RETURN(s.calls, agent::ParseToolCallFormat(agent.tool_call_format));
  }
  s.format = std::make_shared<const model::ChatFormat>(std::move(format));
  const int64_t context = model.max_position_embeddings;
  if (agent.max_tokens > context) {
    return Status::InvalidArgument("agent.max_tokens " + std::to_string(agent.max_tokens) +
                                   " is past the model's context of " + std::to_string(context));
  }
  s.limits.max_tokens = agent.max_tokens > 0 ? agent.max_tokens : context;
  s.limits.max_turns = agent.max_turns;
  s.limits.max_turn_tokens = max_turn_tokens;
  s.limits.max_message_bytes = agent.max_message_bytes;
  s.env_workers = agent.env_workers;
  s.env_timeout_seconds = agent.env_timeout_seconds;
  s.max_env_seconds = agent.max_env_seconds;
  SLUICE_RETURN_IF_ERROR(s.Validate());
  return s;
}

std::string AgentRow(const reward::Example& example) {
  return nlohmann::json{{"prompt", example.prompt}, {"answer", example.answer}, {"index", example.index}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string UnopenedSummary(agent::EndReason reason, const std::string& detail) {
  return nlohmann::json{{"turns", nlohmann::json::array()},
                        {"end_reason", agent::EndReasonName(reason)},
                        {"detail", detail},
                        {"env_reward", nullptr},
                        {"content", ""}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status AppendTrajectories(const std::string& run_dir, int64_t step,
                          const std::vector<trainer::RolloutSample>& samples) {
  std::optional<MetricsLog> log;
  for (const trainer::RolloutSample& smp : samples) {
    if (smp.trajectory.empty()) continue;
    if (!log) {
      SLUICE_ASSIGN_OR_RETURN(MetricsLog opened, MetricsLog::Open(run_dir, kTrajectoriesFile));
      log.emplace(std::move(opened));
    }
    agent::TrajectoryLine line;
    line.sample_id = static_cast<int64_t>(smp.id);
    line.group_id = smp.group_id;
    line.step = step;
    line.tokens = smp.prompt;
    line.tokens.insert(line.tokens.end(), smp.response.begin(), smp.response.end());
    line.logprobs.assign(smp.prompt.size(), 0.f);
    line.logprobs.insert(line.logprobs.end(), smp.behavior_logprobs.begin(), smp.behavior_logprobs.end());
    line.versions.assign(smp.prompt.size(), -1);
    line.versions.insert(line.versions.end(), smp.versions.begin(), smp.versions.end());
    line.summary = smp.trajectory;
    line.reward = smp.reward;
    line.advantage = smp.advantage;
    SLUICE_ASSIGN_OR_RETURN(const std::string text, agent::FormatTrajectoryLine(line));
    SLUICE_RETURN_IF_ERROR(log->Append(text));
  }
  return Status::Ok();
}

Status CountAgentStep(const std::vector<std::string>& summaries, StepRecord* rec) {
  rec->agent = true;
  int64_t turns = 0, calls = 0, users = 0;
  for (const std::string& text : summaries) {
    SLUICE_ASSIGN_OR_RETURN(const agent::TrajectorySummary s, agent::ReadTrajectorySummary(text));
    turns += s.model_turns;
    calls += s.tool_calls;
    users += s.tool_calls > 0 ? 1 : 0;
    rec->agent_malformed_calls += s.malformed_tool_calls;
    ++rec->agent_end_reasons[s.end_reason];
  }
  const double n = std::max<double>(1.0, static_cast<double>(summaries.size()));
  rec->agent_turns_mean = static_cast<double>(turns) / n;
  rec->agent_tool_calls_mean = static_cast<double>(calls) / n;
  rec->agent_tool_use = static_cast<double>(users) / n;
  return Status::Ok();
}

// The environment's threads: jobs run in order of submission, at most one
// per thread.
class AgentDriver::Pool {
 public:
  explicit Pool(int32_t threads) {
    for (int32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void Submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  std::mutex& answers_mu() { return answers_mu_; }

 private:
  void Work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
  std::mutex answers_mu_;  // a Live's answer fields
};

struct AgentDriver::Live {
  uint64_t id = 0;
  std::string row;
  rollout::SamplingParams sampling;
  std::unique_ptr<agent::Environment> env;
  std::optional<agent::Trajectory> t;
  std::optional<agent::Action> action;  // what the step in flight answers
  double env_seconds = 0;
  bool calling = false;
  // Written by the pool's thread under answers_mu: when the call started
  // running (its timeout counts from then, not from its wait in the
  // queue), and once it returned.
  bool running = false;
  Clock::time_point running_since;
  bool answered = false;
  double call_seconds = 0;
  std::optional<Result<agent::Opening>> opening;
  std::optional<Result<agent::StepResult>> step;
};

Result<std::unique_ptr<AgentDriver>> AgentDriver::Create(AgentSettings settings, rollout::RolloutEngine* engine) {
  SLUICE_RETURN_IF_ERROR(settings.Validate());
  if (engine == nullptr) return Status::InvalidArgument("the agent driver needs a rollout engine");
  return std::unique_ptr<AgentDriver>(new AgentDriver(std::move(settings), engine));
}

AgentDriver::AgentDriver(AgentSettings settings, rollout::RolloutEngine* engine)
    : s_(std::move(settings)), engine_(engine), pool_(std::make_unique<Pool>(s_.env_workers)) {}

AgentDriver::~AgentDriver() = default;

size_t AgentDriver::waiting_env() const {
  return static_cast<size_t>(
      std::count_if(live_.begin(), live_.end(), [](const auto& l) { return l.second->calling; }));
}

void AgentDriver::Call(uint64_t id, bool is_step, std::function<void(Live&)> call) {
  std::shared_ptr<Live> live = live_.at(id);
  live->calling = true;
  live->running = false;
  live->answered = false;
  ++counters_.env_calls;
  std::mutex& mu = pool_->answers_mu();
  pool_->Submit([live, is_step, call = std::move(call), &mu] {
    const auto t0 = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu);
      live->running = true;
      live->running_since = t0;
    }
    // Fills opening or step, outside the lock: the owner does not read them until answered.
    std::string thrown;
    try {
      call(*live);
    } catch (const std::exception& e) {
      thrown = e.what();
    } catch (...) {
      thrown = "an exception that is not a std::exception";
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu);
    if (!thrown.empty()) {
      const Status raised = Status::Internal("the environment raised: " + thrown);
      if (is_step) {
        live->step = raised;
      } else {
        live->opening = raised;
      }
    }
    live->call_seconds = seconds;
    live->answered = true;
  });
}

void AgentDriver::Start(uint64_t id, std::string row, const rollout::SamplingParams& sampling) {
  auto live = std::make_shared<Live>();
  live->id = id;
  live->row = std::move(row);
  live->sampling = sampling;
  live_[id] = live;
  Call(id, /*is_step=*/false, [make = s_.make_env](Live& l) {
    Result<std::unique_ptr<agent::Environment>> env = make(l.id);
    if (!env.ok()) {
      l.opening = env.status();
      return;
    }
    l.env = std::move(env).value();
    l.opening = l.env->Reset(l.row);
  });
}

void AgentDriver::Finish(uint64_t id, std::vector<Finished>* ended) {
  auto it = live_.find(id);
  Live& l = *it->second;
  Finished f;
  f.id = id;
  f.env_seconds = l.env_seconds;
  if (l.t) {
    f.reason = l.t->end_reason();
    f.detail = l.t->end_detail();
    counters_.truncated_messages += l.t->truncated_messages();
    f.trajectory = std::move(l.t);
  }
  ended->push_back(std::move(f));
  engine_->DropKeptCache(id);
  live_.erase(it);  // a call in flight (timed out) keeps its Live until it returns
}

void AgentDriver::NextTurn(Live& l, std::vector<Finished>* ended) {
  agent::Trajectory& t = *l.t;
  rollout::GenerationRequest req;
  req.id = l.id;
  req.prompt = t.tokens();
  req.sampling = l.sampling;
  req.sampling.seed = HashCombine(l.sampling.seed, static_cast<uint64_t>(t.model_turns()));
  req.sampling.max_new_tokens = t.TurnBudget();
  req.keep_cache = true;                 // for the next turn, while it fits the engine's budget
  if (req.sampling.forced_length > 0) {  // benchmarks: every turn this long, as far as the budget goes
    req.sampling.forced_length = std::min<int32_t>(req.sampling.forced_length, req.sampling.max_new_tokens);
  }
  Status submitted = engine_->Submit(std::move(req));
  if (!submitted.ok()) {
    t.End(submitted.code() == StatusCode::kOutOfRange ? EndReason::kContext : EndReason::kEnvError,
          "the next turn: " + submitted.message());
    Finish(l.id, ended);
    return;
  }
}

Result<std::vector<AgentDriver::Finished>> AgentDriver::Advance(std::vector<rollout::GenerationResult>* results) {
  std::vector<Finished> ended;
  // The model's turns that finished.
  auto mine = std::stable_partition(results->begin(), results->end(), [this](const auto& r) { return !owns(r.id); });
  for (auto it = mine; it != results->end(); ++it) {
    Live& l = *live_.at(it->id);
    ++counters_.model_turns;
    SLUICE_ASSIGN_OR_RETURN(
        std::optional<agent::Action> action,
        l.t->AddModelTurn(it->tokens, it->logprobs, it->versions, it->finish != rollout::FinishReason::kLength));
    if (!action) {
      Finish(it->id, &ended);
      continue;
    }
    l.action = std::move(action);
    Call(l.id, /*is_step=*/true, [](Live& x) { x.step = x.env->Step(*x.action); });
  }
  results->erase(mine, results->end());
  // The environments' answers.
  const auto now = Clock::now();
  std::vector<uint64_t> ids;
  for (const auto& [id, l] : live_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto found = live_.find(id);
    if (found == live_.end() || !found->second->calling) continue;
    Live& l = *found->second;
    bool answered = false, running = false;
    Clock::time_point since;
    {
      std::lock_guard<std::mutex> lock(pool_->answers_mu());
      answered = l.answered;
      running = l.running;
      since = l.running_since;
      if (answered) l.env_seconds += l.call_seconds;
    }
    const double waited = running ? std::chrono::duration<double>(now - since).count() : 0.0;
    if (!answered) {
      if (!running || waited <= s_.env_timeout_seconds) continue;  // queued, or within its time
      if (!l.t) {
        Finished f{id, std::nullopt, EndReason::kEnvTimeout,
                   "reset ran past agent.env_timeout_seconds=" + std::to_string(s_.env_timeout_seconds), waited};
        ended.push_back(std::move(f));
        live_.erase(found);
        continue;
      }
      l.t->End(EndReason::kEnvTimeout,
               "step ran past agent.env_timeout_seconds=" + std::to_string(s_.env_timeout_seconds));
      l.env_seconds += waited;
      Finish(id, &ended);
      continue;
    }
    l.calling = false;
    counters_.env_seconds += l.call_seconds;
    if (!l.t) {  // the reset
      Result<agent::Opening> opening = std::move(*l.opening);
      l.opening.reset();
      Result<agent::Trajectory> t =
          opening.ok() ? agent::Trajectory::Open(s_.format, *opening, s_.calls, s_.limits) : opening.status();
      if (!t.ok()) {
        const EndReason why = t.status().code() == StatusCode::kOutOfRange ? EndReason::kContext
                              : t.status().code() == StatusCode::kTimeout  ? EndReason::kEnvTimeout
                                                                           : EndReason::kEnvError;
        ended.push_back({id, std::nullopt, why, "reset: " + t.status().message(), l.env_seconds});
        live_.erase(found);
        continue;
      }
      l.t = std::move(t).value();
      NextTurn(l, &ended);
      continue;
    }
    Result<agent::StepResult> step = std::move(*l.step);
    l.step.reset();
    if (!step.ok()) {
      l.t->End(step.status().code() == StatusCode::kTimeout ? EndReason::kEnvTimeout : EndReason::kEnvError,
               "step: " + step.status().message());
    } else {
      SLUICE_RETURN_IF_ERROR(l.t->AddEnvironmentTurn(*step));
      if (!l.t->ended() && l.env_seconds > s_.max_env_seconds) {
        l.t->End(EndReason::kEnvTime, std::to_string(l.env_seconds) +
                                          " s of environment calls, past "
                                          "agent.max_env_seconds");
      }
    }
    if (l.t->ended()) {
      Finish(id, &ended);
    } else {
      NextTurn(l, &ended);
    }
  }
  return ended;
}

AgentAnswer AnswerOfTrajectory(const AgentDriver::Finished& f, const std::vector<model::TokenId>& task_prompt,
                               model::TokenId eos) {
  AgentAnswer a;
  if (!f.trajectory) {
    a.prompt = task_prompt;
    a.response = {eos >= 0 ? eos : 0};
    a.logprobs = {0.f};
    a.versions = {-1};
    a.summary = UnopenedSummary(f.reason, f.detail);
    return a;
  }
  const agent::Trajectory& t = *f.trajectory;
  const auto opening = static_cast<ptrdiff_t>(t.opening_length());
  a.prompt.assign(t.tokens().begin(), t.tokens().begin() + opening);
  a.response.assign(t.tokens().begin() + opening, t.tokens().end());
  a.logprobs.assign(t.logprobs().begin() + opening, t.logprobs().end());
  a.versions.assign(t.versions().begin() + opening, t.versions().end());
  a.summary = t.Summary();
  return a;
}

Result<std::vector<AgentDriver::Finished>> RunTrajectories(AgentDriver& driver, rollout::RolloutEngine& engine,
                                                           size_t n, const std::function<bool()>& stopping) {
  std::vector<AgentDriver::Finished> all;
  while (all.size() < n && !stopping()) {
    SLUICE_ASSIGN_OR_RETURN(std::vector<rollout::GenerationResult> done, engine.Step());
    SLUICE_ASSIGN_OR_RETURN(std::vector<AgentDriver::Finished> ended, driver.Advance(&done));
    if (!done.empty()) return Status::Internal("the engine finished a request no trajectory made");
    for (auto& f : ended) all.push_back(std::move(f));
    // Every trajectory waits for its environment: wait a little for them.
    if (engine.idle() && all.size() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return all;
}

Result<trainer::SftExample> AgentWarmStartExample(const AgentSettings& settings, const reward::Example& example,
                                                  const std::string& answer_text, bool call_tool, model::TokenId eos) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<agent::Environment> env, settings.make_env(0));
  SLUICE_ASSIGN_OR_RETURN(const agent::Opening opening, env->Reset(AgentRow(example)));
  // The task's answers are what they are, whatever a sampled turn may hold
  // (rl.max_new_tokens) or however few turns the run allows: only the
  // context bounds them.
  agent::TrajectoryLimits limits = settings.limits;
  limits.max_turn_tokens = static_cast<int32_t>(std::min<int64_t>(limits.max_tokens, INT32_MAX));
  limits.max_turns = std::max(limits.max_turns, 2);
  SLUICE_ASSIGN_OR_RETURN(agent::Trajectory t,
                          agent::Trajectory::Open(settings.format, opening, settings.calls, limits));
  // A model turn of `text` and the end-of-turn token, as if sampled.
  const auto turn = [&](const std::string& text) -> Result<std::optional<agent::Action>> {
    SLUICE_ASSIGN_OR_RETURN(std::vector<model::TokenId> ids, settings.format->Encode(text));
    ids.push_back(eos);
    return t.AddModelTurn(ids, std::vector<float>(ids.size(), 0.f), std::vector<PolicyVersion>(ids.size(), 0),
                          /*eos=*/true);
  };
  std::string final_text = answer_text;
  if (call_tool) {
    std::string expression = example.prompt;
    if (!expression.empty() && expression.back() == '=') expression.pop_back();
    const nlohmann::ordered_json call = {{"name", "calculator"}, {"arguments", {{"expression", expression}}}};
    SLUICE_ASSIGN_OR_RETURN(std::optional<agent::Action> action, turn("<tool_call>" + call.dump() + "</tool_call>"));
    if (!action || action->tool_calls.size() != 1 || !action->tool_calls[0].error.empty()) {
      return Status::Internal("the warm start's tool call was not read back as one call");
    }
    SLUICE_ASSIGN_OR_RETURN(const agent::StepResult step, env->Step(*action));
    if (step.messages.size() != 1 || step.messages[0].content != example.answer) {
      return Status::FailedPrecondition("the calculator answers '" + expression + "' with '" +
                                        (step.messages.empty() ? std::string() : step.messages[0].content) +
                                        "', not the task's answer " + example.answer);
    }
    SLUICE_RETURN_IF_ERROR(t.AddEnvironmentTurn(step));
    final_text = std::string(1, reward::kAnswerMarker) + example.answer;
  }
  SLUICE_RETURN_IF_ERROR(turn(final_text).status());
  trainer::SftExample e;
  const auto opening_end = t.tokens().begin() + static_cast<ptrdiff_t>(t.opening_length());
  e.prompt.assign(t.tokens().begin(), opening_end);
  e.target.assign(opening_end, t.tokens().end());
  e.trained.assign(t.mask().begin() + static_cast<ptrdiff_t>(t.opening_length()), t.mask().end());
  return e;
}

}  // namespace sluice::pipeline
