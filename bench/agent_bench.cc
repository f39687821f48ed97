// Agent training throughput: sync vs one_step_off vs async on the same
// cores, the same environment workers and the same workload, measured in
// the same run (docs/agents.md, the benchmark).
//
// Workload: GRPO steps of P prompts x G trajectories of the built-in
// arithmetic task on a freshly initialised built-in model. Each trajectory's
// plan is fixed up front from the seed, identical in every mode: its number
// of model turns (uniform in --min-turns..--max-turns), the length of each
// of its model turns (a long-tail (log-normal) draw per trajectory,
// RunHooks::forced_length) and how long its environment takes at each step
// (a log-normal draw per step: median --wait-median seconds, log standard
// deviation --wait-sigma, capped at --wait-cap times the median; scaled by
// --scales). The environment's waits are idle (it sleeps, as a remote
// sandbox or a simulator on another machine would keep it waiting); it
// answers each model turn with a short user message until the
// trajectory's last turn, which it ends (done) with a reward. Rewards are
// irrelevant here (dynamic sampling off: every trajectory is trained).
//
// Every mode gets `threads` cores (as pipeline_bench shares them), the same
// agent.env_workers, rollout slots and slot release (a trajectory waiting
// for its environment holds no slot, in every mode).
//
// The bound is a lower bound on any mode's wall time, the largest of:
//  * compute: the workload's core-seconds over the cores. Trainer: the
//    trajectories' sampled tokens trained as every mode packs them; rollout:
//    the sampled tokens decoded at full occupancy (pipeline_modes.h). Both
//    leave out what the real runs also compute (the environment's tokens,
//    prefilling a trajectory again after each environment call), so the
//    bound is lower than any run could reach;
//  * the longest chain: the environment waits of the trajectory that waits
//    longest, one after another (its turns cannot overlap each other);
//  * the environment's capacity: all waits together over agent.env_workers
//    (at most that many calls run at once).
// Each run is checked against it.
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_stats.h"
#include "bench_util.h"
#include "html_chart.h"
#include "pipeline_modes.h"
#include "sluice/agent/environment.h"
#include "sluice/common/file_util.h"
#include "sluice/model/transformer.h"
#include "sluice/pipeline/run.h"
#include "sluice/reward/task.h"
#include "sluice/runtime/flags.h"

namespace {

using sluice::Result;
using sluice::Status;
namespace agent = sluice::agent;
namespace model = sluice::model;
namespace pipeline = sluice::pipeline;
using Clock = std::chrono::steady_clock;

// One trajectory's plan: its model turns, each `turn_tokens` long, and the
// environment's wait after each (seconds, before scaling).
struct Plan {
  int32_t turns = 0;
  int32_t turn_tokens = 0;
  std::vector<double> waits;
};

std::vector<Plan> MakePlans(int64_t n, int32_t min_turns, int32_t max_turns, int32_t median_tokens, double tail,
                            double wait_median, double wait_sigma, double wait_cap, uint64_t seed) {
  const std::vector<int32_t> lengths =
      sluice::bench::LongTailLengths(static_cast<int>(n), median_tokens, tail, seed ^ 0x5eedULL);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> turns(min_turns, max_turns);
  std::normal_distribution<double> z(0.0, 1.0);
  std::vector<Plan> plans(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Plan& p = plans[static_cast<size_t>(i)];
    p.turns = turns(rng);
    p.turn_tokens = lengths[static_cast<size_t>(i)];
    for (int32_t t = 0; t < p.turns; ++t) {
      p.waits.push_back(std::min(wait_cap * wait_median, wait_median * std::exp(wait_sigma * z(rng))));
    }
  }
  return plans;
}

// Follows its trajectory's plan: waits (sleeping) at each step, answers
// "go on" until the planned last turn, which it ends with a reward.
// Trajectories the plan does not know (the final evaluation's) end at the
// first turn without waiting.
class WaitingEnvironment : public agent::Environment {
 public:
  WaitingEnvironment(const Plan* plan, double scale, double reward) : plan_(plan), scale_(scale), reward_(reward) {}

  Result<agent::Opening> Reset(const std::string& row) override {
    const nlohmann::json j = nlohmann::json::parse(row, nullptr, false);
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
      return Status::InvalidArgument("the row has no prompt");
    }
    agent::Opening o;
    o.messages.push_back({"user", j["prompt"].get<std::string>(), ""});
    return o;
  }

  Result<agent::StepResult> Step(const agent::Action&) override {
    agent::StepResult r;
    if (plan_ == nullptr) {
      r.done = true;
      return r;
    }
    const size_t turn = static_cast<size_t>(turns_++);
    std::this_thread::sleep_for(std::chrono::duration<double>(scale_ * plan_->waits.at(turn)));
    r.done = turns_ >= plan_->turns;
    if (r.done) {
      r.reward = reward_;
    } else {
      r.messages.push_back({"user", "go on", ""});
    }
    return r;
  }

 private:
  const Plan* const plan_;
  const double scale_, reward_;
  int32_t turns_ = 0;
};

struct ModeResult {
  std::string name, budget;
  double scale = 1;
  double wall = 0;     // RL wall seconds (excluding the final evaluation)
  double samples = 0;  // trajectories trained
  double turns = 0;    // mean model turns per trajectory
  double trainer_idle = 0, rollout_busy = 0, staleness = 0;
};

Result<ModeResult> RunMode(const pipeline::RunOptions& o, const pipeline::RunHooks& hooks,
                           const model::ModelConfig& config, std::shared_ptr<const sluice::reward::Task> task,
                           int32_t cores) {
  torch::set_num_threads(cores);
  SLUICE_RETURN_IF_ERROR(sluice::bench::CheckThreadBudget(o, cores));
  const std::string name = pipeline::PipelineModeName(o.pipeline.mode);
  auto policy = std::make_shared<model::Transformer>(config, o.seed);
  SLUICE_ASSIGN_OR_RETURN(auto loop, pipeline::TrainingRun::Create(policy, task, o, hooks));
  SLUICE_RETURN_IF_ERROR(loop->Train(nullptr));
  ModeResult r;
  r.name = name;
  r.budget = o.Threads(cores).ToString();
  const std::vector<pipeline::StepRecord>& history = loop->history();
  if (history.empty()) return Status::Internal(name + " trained no step");
  double waits = 0, stale = 0, turns = 0;
  for (const auto& rec : history) {
    r.samples += static_cast<double>(rec.samples_trained);
    turns += rec.agent_turns_mean * static_cast<double>(rec.samples_trained);
    waits += rec.wait_seconds;
    stale += rec.staleness_mean;
  }
  r.wall = history.back().elapsed_seconds;
  r.turns = turns / std::max(1.0, r.samples);
  r.trainer_idle = waits / r.wall;
  r.rollout_busy = loop->stream_summary().rollout_busy_seconds / r.wall;
  r.staleness = stale / static_cast<double>(history.size());
  return r;
}

Status Main(int argc, char** argv) {
  sluice::runtime::FlagSet flags;
  flags.Add("preset", "1m", "built-in model: tiny, 1m, 5m, 20m");
  flags.Add("steps", "8", "RL steps per mode");
  flags.Add("prompts", "8", "prompts per step");
  flags.Add("group", "4", "trajectories per prompt");
  flags.Add("min-turns", "2", "fewest model turns of a trajectory");
  flags.Add("max-turns", "8", "most model turns of a trajectory");
  flags.Add("turn-tokens", "16", "median tokens of a model turn (a trajectory's turns are equally long)");
  flags.Add("turn-tail", "4", "longest model turn / median");
  flags.Add("wait-median", "0.5", "median seconds of one environment step (log-normal)");
  flags.Add("wait-sigma", "1.0", "log standard deviation of an environment step's seconds");
  flags.Add("wait-cap", "20", "longest environment step / median");
  flags.Add("scales", "1", "the environment's time scales to run, comma-separated (each multiplies every wait)");
  flags.Add("env-workers", "128", "agent.env_workers, the same in every mode");
  flags.Add("slots", "64", "rollout engine slots");
  flags.Add("modes", "sync,one_step_off,async", "modes to run, comma-separated (sync, one_step_off, async)");
  flags.Add("staleness", "4", "async max_staleness");
  flags.Add("threads", "2", "cores in total, the same in every mode");
  flags.Add("rollout-threads", "1", "one_step_off/async: threads of the rollout role (the trainer gets the rest)");
  flags.Add("seed", "1", "seed of the model, prompts, sampling and the plans");
  flags.Add("repeat", "3", "runs of every mode at every scale, interleaved; the table shows the median run");
  flags.Add("json", "", "also write results as JSON to this path");
  flags.Add("svg", "", "also draw async/sync and the bound's share over the scales (an SVG chart) to this path");
  SLUICE_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(argv + 1, argv + argc)));
  if (flags.help_requested()) {
    std::printf("usage: agent_bench [flags]\n%s", flags.Usage().c_str());
    return Status::Ok();
  }
  SLUICE_ASSIGN_OR_RETURN(std::string preset, flags.GetString("preset"));
  SLUICE_ASSIGN_OR_RETURN(int64_t steps, flags.GetInt("steps", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(int64_t prompts, flags.GetInt("prompts", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(int64_t group, flags.GetInt("group", 2, 1024));
  SLUICE_ASSIGN_OR_RETURN(int64_t min_turns, flags.GetInt("min-turns", 1, 64));
  SLUICE_ASSIGN_OR_RETURN(int64_t max_turns, flags.GetInt("max-turns", 1, 64));
  if (max_turns < min_turns) return Status::InvalidArgument("--max-turns is below --min-turns");
  SLUICE_ASSIGN_OR_RETURN(int64_t turn_tokens, flags.GetInt("turn-tokens", 1, 4096));
  SLUICE_ASSIGN_OR_RETURN(double turn_tail, flags.GetDouble("turn-tail", 1.0, 100.0));
  SLUICE_ASSIGN_OR_RETURN(double wait_median, flags.GetDouble("wait-median", 0.0, 3600.0));
  SLUICE_ASSIGN_OR_RETURN(double wait_sigma, flags.GetDouble("wait-sigma", 0.0, 4.0));
  SLUICE_ASSIGN_OR_RETURN(double wait_cap, flags.GetDouble("wait-cap", 1.0, 1000.0));
  SLUICE_ASSIGN_OR_RETURN(std::string scale_list, flags.GetString("scales"));
  SLUICE_ASSIGN_OR_RETURN(int64_t env_workers, flags.GetInt("env-workers", 1, 1024));
  SLUICE_ASSIGN_OR_RETURN(int64_t slots, flags.GetInt("slots", 1, 4096));
  SLUICE_ASSIGN_OR_RETURN(std::string modes, flags.GetString("modes"));
  SLUICE_ASSIGN_OR_RETURN(int64_t staleness, flags.GetInt("staleness", 0, 1000));
  SLUICE_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", 1, 1024));
  SLUICE_ASSIGN_OR_RETURN(int64_t rollout_threads, flags.GetInt("rollout-threads", 1, 1024));
  if (rollout_threads >= threads)
    return Status::InvalidArgument("--rollout-threads must leave the trainer at least one of --threads");
  SLUICE_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("seed", 0, INT64_MAX));
  SLUICE_ASSIGN_OR_RETURN(int64_t repeat, flags.GetInt("repeat", 1, 100));
  SLUICE_ASSIGN_OR_RETURN(std::string json_path, flags.GetString("json"));
  SLUICE_ASSIGN_OR_RETURN(std::string svg_path, flags.GetString("svg"));
  std::vector<double> scales;
  for (const std::string& s : sluice::bench::SplitCommas(scale_list)) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0' || !(v >= 0) || v > 1000) {
      return Status::InvalidArgument("--scales: '" + s + "' is not a number in [0, 1000]");
    }
    scales.push_back(v);
  }
  if (scales.empty()) return Status::InvalidArgument("--scales names no scale");
  std::vector<pipeline::PipelineMode> mode_list;
  for (const std::string& name : sluice::bench::SplitCommas(modes)) {
    SLUICE_ASSIGN_OR_RETURN(pipeline::PipelineMode mode, pipeline::ParsePipelineMode(name));
    if (mode == pipeline::PipelineMode::kDirect) return Status::InvalidArgument("--modes: direct has no roles");
    mode_list.push_back(mode);
  }
  if (mode_list.empty()) return Status::InvalidArgument("--modes names no mode");

  SLUICE_ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetModelConfig(preset));
  const int64_t answers = steps * prompts * group;
  const std::vector<Plan> plans = MakePlans(answers, static_cast<int32_t>(min_turns), static_cast<int32_t>(max_turns),
                                            static_cast<int32_t>(turn_tokens), turn_tail, wait_median, wait_sigma,
                                            wait_cap, static_cast<uint64_t>(seed));
  std::vector<int32_t> sampled;  // each trajectory's sampled tokens
  double total_wait = 0, longest_chain = 0;
  int32_t longest_turn = 0;
  for (const Plan& p : plans) {
    sampled.push_back(p.turns * p.turn_tokens);
    const double chain = std::accumulate(p.waits.begin(), p.waits.end(), 0.0);
    total_wait += chain;
    longest_chain = std::max(longest_chain, chain);
    longest_turn = std::max(longest_turn, p.turn_tokens);
  }
  // A trajectory's context: its turns, the environment's (a few tokens
  // each) and the opening, well inside the model's.
  const int64_t longest_context = max_turns * (longest_turn + 32) + 128;
  if (longest_context > config.max_position_embeddings) {
    return Status::InvalidArgument("trajectories of up to " + std::to_string(longest_context) +
                                   " tokens do not fit the " + preset + " model's context");
  }
  const int64_t total_sampled = std::accumulate(sampled.begin(), sampled.end(), int64_t{0});

  sluice::reward::TaskOptions to;
  to.name = "arithmetic";
  to.seed = static_cast<uint64_t>(seed);
  SLUICE_ASSIGN_OR_RETURN(auto task_ptr, sluice::reward::MakeTask(to));
  std::shared_ptr<const sluice::reward::Task> task(std::move(task_ptr));

  pipeline::RunOptions base;
  base.run_dir = "/tmp/sluice-agent-bench-" + std::to_string(::getpid());
  base.seed = static_cast<uint64_t>(seed);
  base.checkpoint_interval = 0;
  base.rl.steps = steps;
  base.rl.prompts_per_step = prompts;
  base.rl.group_size = group;
  base.rl.rollout_slots = static_cast<int32_t>(slots);
  base.rl.sampling.max_new_tokens = longest_turn;
  base.rl.dynamic_sampling = false;
  base.eval.interval = 0;
  base.eval.size = 1;
  base.eval.max_new_tokens = 1;
  base.pipeline.max_staleness = staleness;
  base.agent.env = "calculator";  // replaced by the waiting environment (hooks)
  base.agent.max_turns = static_cast<int32_t>(max_turns);
  base.agent.env_workers = static_cast<int32_t>(env_workers);
  const double longest_wait = wait_cap * wait_median * *std::max_element(scales.begin(), scales.end());
  base.agent.env_timeout_seconds = 60 + 2 * longest_wait;
  base.agent.max_env_seconds = 600 + 2 * longest_chain * *std::max_element(scales.begin(), scales.end());

  std::fprintf(stderr,
               "%s (%.1fM params): %lld steps x %lld prompts x %lld trajectories of %lld-%lld turns, %lld sampled "
               "tokens; environment steps %.2f s median; %lld env workers, %lld slots, %lld threads\n",
               preset.c_str(), config.NumParameters() / 1e6, static_cast<long long>(steps),
               static_cast<long long>(prompts), static_cast<long long>(group), static_cast<long long>(min_turns),
               static_cast<long long>(max_turns), static_cast<long long>(total_sampled), wait_median,
               static_cast<long long>(env_workers), static_cast<long long>(slots), static_cast<long long>(threads));

  // Every mode at every scale `repeat` times, interleaved (sync, one_step_off,
  // async, sync, ...); the compute bound measured once per round.
  std::vector<std::vector<std::vector<ModeResult>>> runs(scales.size(),
                                                         std::vector<std::vector<ModeResult>>(mode_list.size()));
  std::vector<double> bound_train, bound_decode;
  for (int64_t rep = 0; rep < repeat; ++rep) {
    for (size_t s = 0; s < scales.size(); ++s) {
      for (size_t m = 0; m < mode_list.size(); ++m) {
        pipeline::RunHooks hooks;
        hooks.forced_length = [&plans, group](uint64_t cursor, int64_t g) {
          return plans.at(cursor * static_cast<uint64_t>(group) + static_cast<uint64_t>(g)).turn_tokens;
        };
        const double scale = scales[s];
        hooks.make_environment = [&plans, scale](uint64_t id) -> Result<std::unique_ptr<agent::Environment>> {
          const Plan* plan = id < plans.size() ? &plans[id] : nullptr;
          return std::unique_ptr<agent::Environment>(
              std::make_unique<WaitingEnvironment>(plan, scale, static_cast<double>(id % 2)));
        };
        pipeline::RunOptions o =
            sluice::bench::ModeOptions(base, mode_list[m], sluice::trainer::OffPolicyCorrection::kBehavior,
                                       /*lend=*/true, "prompt", threads, rollout_threads,
                                       /*sync_dp=*/true);
        o.run_dir = base.run_dir + "/" + pipeline::PipelineModeName(mode_list[m]);
        SLUICE_ASSIGN_OR_RETURN(ModeResult r, RunMode(o, hooks, config, task, static_cast<int32_t>(threads)));
        r.scale = scale;
        std::fprintf(stderr, "  scale %-5g %-13s %.1f s, %.2f trajectories/s, %.2f turns each; %s\n", scale,
                     r.name.c_str(), r.wall, r.samples / r.wall, r.turns, r.budget.c_str());
        runs[s][m].push_back(r);
        static_cast<void>(sluice::RemoveTree(o.run_dir));
      }
    }
    SLUICE_ASSIGN_OR_RETURN(sluice::bench::BoundParts b,
                            sluice::bench::MeasureBound(base, config, *task, sampled, sampled, slots,
                                                        static_cast<int32_t>(threads), static_cast<uint64_t>(seed)));
    torch::set_num_threads(static_cast<int>(threads));
    std::fprintf(stderr, "  compute bound: trainer %.1f + rollout %.1f core-seconds, each alone on 1 thread\n", b.train,
                 b.decode);
    bound_train.push_back(b.train);
    bound_decode.push_back(b.decode);
  }
  static_cast<void>(sluice::RemoveTree(base.run_dir));
  const double compute = (sluice::bench::Summarize(bound_train).min + sluice::bench::Summarize(bound_decode).min) /
                         static_cast<double>(threads);

  std::printf(
      "\nagent training throughput, %s, %lld steps x %lld prompts x %lld trajectories, %lld threads, CPU; "
      "async: max_staleness %lld\n"
      "trajectories: %lld-%lld model turns (uniform), each turn %lld tokens median (long-tail, longest %d), %lld "
      "sampled tokens in all\n"
      "environment: each step waits (idle, sleeping: a remote sandbox) a log-normal time, median %.2f s, sigma %.2f, "
      "capped at %.1f s, times the scale; %lld env workers, %lld slots in every mode\n",
      preset.c_str(), static_cast<long long>(steps), static_cast<long long>(prompts), static_cast<long long>(group),
      static_cast<long long>(threads), static_cast<long long>(staleness), static_cast<long long>(min_turns),
      static_cast<long long>(max_turns), static_cast<long long>(turn_tokens), longest_turn,
      static_cast<long long>(total_sampled), wait_median, wait_sigma, wait_cap * wait_median,
      static_cast<long long>(env_workers), static_cast<long long>(slots));
  std::printf(
      "(%lld runs of each mode at each scale, interleaved; each row is the median run, wall min..max after "
      "it)\n",
      static_cast<long long>(repeat));
  std::printf(
      "bound = max(compute %.1f s: (trainer %.1f + full-occupancy rollout %.1f core-seconds) / %lld cores, "
      "the fastest of %lld measurements;\n"
      "            longest chain of waits %.1f s x scale; all waits %.1f s x scale / %lld env workers)\n",
      compute, sluice::bench::Summarize(bound_train).min, sluice::bench::Summarize(bound_decode).min,
      static_cast<long long>(threads), static_cast<long long>(repeat), longest_chain, total_wait,
      static_cast<long long>(env_workers));
  std::printf("%-6s %-13s %9s %14s %10s %13s %13s %10s %9s %10s\n", "scale", "mode", "wall s", "trajectories/s",
              "turns", "trainer idle", "rollout busy", "staleness", "of bound", "vs sync");
  nlohmann::json out = nlohmann::json::array();
  sluice::launch::Series gain{"gain", "async / sync", "#1f77b4", {}, false};
  sluice::launch::Series share{"share", "async, share of the bound", "#2ca02c", {}, false};
  for (size_t s = 0; s < scales.size(); ++s) {
    const double scale = scales[s];
    const double bound =
        std::max({compute, longest_chain * scale, total_wait * scale / static_cast<double>(env_workers)});
    double sync_wall = 0;
    for (size_t m = 0; m < mode_list.size(); ++m) {
      std::vector<ModeResult> rs = runs[s][m];
      std::sort(rs.begin(), rs.end(), [](const auto& a, const auto& b) { return a.wall < b.wall; });
      const ModeResult& r = rs[rs.size() / 2];
      if (r.name == "sync") sync_wall = r.wall;
      std::printf("%-6g %-13s %9.1f %14.2f %10.2f %12.0f%% %12.0f%% %10.2f %8.0f%%", scale, r.name.c_str(), r.wall,
                  r.samples / r.wall, r.turns, 100 * r.trainer_idle, 100 * r.rollout_busy, r.staleness,
                  100 * bound / r.wall);
      if (sync_wall > 0) {
        std::printf(" %9.2fx", sync_wall / r.wall);
      } else {
        std::printf(" %10s", "-");
      }
      if (repeat > 1) std::printf("   %.1f..%.1f s", rs.front().wall, rs.back().wall);
      std::printf("\n");
      for (const ModeResult& each : rs) {
        if (each.wall < bound) {
          std::printf("WARNING: a %s run at scale %g took %.1f s, under the bound of %.1f s: the bound is wrong\n",
                      each.name.c_str(), scale, each.wall, bound);
        }
      }
      if (r.name == "async" && sync_wall > 0) {
        gain.points.push_back({scale, sync_wall / r.wall});
        share.points.push_back({scale, bound / r.wall});
      }
      out.push_back({{"scale", scale},
                     {"mode", r.name},
                     {"wall_seconds", r.wall},
                     {"trajectories_per_s", r.samples / r.wall},
                     {"turns_mean", r.turns},
                     {"trainer_idle", r.trainer_idle},
                     {"rollout_busy", r.rollout_busy},
                     {"staleness", r.staleness},
                     {"bound_seconds", bound},
                     {"budget", r.budget}});
    }
    std::printf("%-6g %-13s %9.1f   (compute %.1f, longest chain %.1f, all waits / workers %.1f)\n", scale, "bound",
                bound, compute, longest_chain * scale, total_wait * scale / static_cast<double>(env_workers));
  }
  std::printf("threads (budget %lld cores):\n", static_cast<long long>(threads));
  for (size_t m = 0; m < mode_list.size(); ++m) {
    std::printf("  %-13s %s\n", pipeline::PipelineModeName(mode_list[m]).c_str(), runs[0][m][0].budget.c_str());
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  if (!svg_path.empty()) {
    std::ofstream svg(svg_path);
    svg << sluice::launch::Chart("Agents: async against sync as the environment's time grows", "ratio", {gain, share},
                                 "environment time scale (1: the waits above)")
        << "\n";
    if (!svg) return Status::Unavailable("cannot write " + svg_path);
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) { return sluice::bench::BenchMain(argc, argv, Main); }
