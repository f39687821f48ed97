// Sync vs one_step_off vs async training throughput on the same cores, same
// seed, same workload, measured in the same run (docs/design.md, how
// performance is measured).
//
// Workload: GRPO steps of P prompts x G answers on the built-in arithmetic
// task with a freshly initialised model; every answer's length is fixed up
// front from a long-tail (log-normal) distribution (SamplingParams::
// forced_length), identical in every mode, so the modes differ only in how
// rollout and training overlap. Rewards are irrelevant here (dynamic sampling
// off: every sample is trained).
//
// Threads: `threads` cores in total in every mode, and never more busy
// threads than that (each mode's budget is printed). sync gives each role all
// of them, since the roles alternate (the trainer as `threads` single-threaded
// micro-batch workers and the rollout as `threads` single-threaded engines,
// data parallel, their best use of the cores, unless --sync-dp=false);
// one_step_off and async split them between the rollout and trainer roles
// (--rollout-threads), and the rollout's cores train while the rollout idles
// (pipeline.lend_idle_cores, --lend), handed back before it decodes again.
//
// The bound is a lower bound on any mode's wall time, measured in every
// repetition next to the modes: each stage's work at its best rate per core,
// alone on one thread. Trainer: the workload's batches (same lengths, same
// options, no off-policy correction) trained on one thread, packed into the
// micro-batches of `threads` workers as every mode packs them (sync's data
// parallel workers; a split mode's own and lent ones) and computed one after
// another. Rollout: the workload's tokens
// decoded at full occupancy (a lockstep batch
// of `slots` sequences at the workload's mean context, one prefill per
// prompt). More threads or processes at best keep a stage's core-seconds
// (scaling is at most linear) and stages running at once only slow each
// other, so no mode can finish before (train + decode core-seconds) / cores.
// Measurements of the bound vary with the machine's noise like the modes'
// runs, so the bound used is the fastest measurement (each part's fastest):
// the estimate of the work's cost least inflated by noise, and the lowest,
// so every "of bound" figure is the smallest the measurements allow; every
// run is checked against it.
//
// --processes runs each streaming mode's roles as processes (the pipeline's
// process mode: this program is the launcher and hub, and re-executes itself
// as each role with --role-mode/--role-hub/--role-run-dir and the launcher's
// connection flags). --hub-paths=fast,socket then runs every mode twice,
// interleaved: the roles calling the hub through its fast paths (shared-memory
// rings) and through its ZeroMQ socket alone (pipeline.hub_fast_paths), and
// prints the ratio of the two walls.
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "bench_stats.h"
#include "bench_util.h"
#include "pipeline_modes.h"
#include "sluice/common/file_util.h"
#include "sluice/launch/simulation.h"
#include "sluice/model/device.h"
#include "sluice/model/tokenizer.h"
#include "sluice/model/transformer.h"
#include "sluice/pipeline/run.h"
#include "sluice/reward/task.h"
#include "sluice/rollout/engine.h"
#include "sluice/runtime/flags.h"
#include "sluice/runtime/process.h"
#include "sluice/simulate/simulator.h"
#include "sluice/trainer/losses.h"
#include "sluice/trainer/trainer.h"

namespace {

using sluice::Result;
using sluice::Status;
namespace model = sluice::model;
namespace pipeline = sluice::pipeline;
namespace rollout = sluice::rollout;
using Clock = std::chrono::steady_clock;
using sluice::bench::BoundParts;
using sluice::bench::MeasureBound;
using sluice::bench::ModeOptions;

struct ModeResult {
  std::string name;          // the pipeline mode
  std::string hub;           // --processes: "fast" or "socket" (pipeline.hub_fast_paths); "" with threads
  std::string label;         // how the row is printed: the mode, and the hub paths when several are compared
  std::string budget;        // the mode's threads, as configured
  size_t repetition = 0;     // which interleaved round it ran in
  size_t repetitions = 1;    // runs of its mode (set on the rows reported)
  double wall = 0;           // RL wall seconds (excluding the final evaluation)
  double samples = 0;        // trained
  double tokens = 0;         // trained response tokens
  double train_seconds = 0;  // trainer busy (sum over steps)
  double trainer_idle = 0;   // fraction of wall the trainer waited for data
  double rollout_busy = 0;   // fraction of wall the rollout engine had sequences running
  double occupancy = 0;      // mean share of the engine's slots decoding per decode step
  double staleness = 0;      // mean per sample
  int64_t hub_requests = 0, ring_requests = 0;  // --processes: the roles' calls to the hub
};

// The step records of a run whose trainer was a process of its own: its
// metrics.jsonl (the launcher's history holds none), the fields read here.
Result<std::vector<pipeline::StepRecord>> StepsFromMetrics(const std::string& run_dir) {
  const std::string path = run_dir + "/metrics.jsonl";
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot read " + path);
  std::vector<pipeline::StepRecord> steps;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Status::DataLoss(path + ": a line is not a JSON object");
    pipeline::StepRecord r;
    try {
      r.samples_trained = j.at("samples_trained").get<int64_t>();
      r.generated_tokens = j.at("generated_tokens").get<int64_t>();
      r.train_seconds = j.at("train_seconds").get<double>();
      r.wait_seconds = j.at("wait_seconds").get<double>();
      r.staleness_mean = j.at("staleness_mean").get<double>();
      r.elapsed_seconds = j.at("elapsed_seconds").get<double>();
    } catch (const nlohmann::json::exception& e) {
      return Status::DataLoss(path + ": " + e.what());
    }
    steps.push_back(r);
  }
  if (steps.empty()) return Status::DataLoss(path + " holds no step");
  return steps;
}

// Runs `o` (its mode, run directory and placement set) and measures it.
Result<ModeResult> RunMode(const pipeline::RunOptions& o, const pipeline::RunHooks& hooks,
                           const model::ModelConfig& config, std::shared_ptr<const sluice::reward::Task> task,
                           int32_t cores) {
  torch::set_num_threads(cores);  // the loop's roles set their own from here
  const pipeline::PipelineMode mode = o.pipeline.mode;
  const std::string name = pipeline::PipelineModeName(mode);
  SLUICE_RETURN_IF_ERROR(sluice::bench::CheckThreadBudget(o, cores));
  const pipeline::ThreadBudget budget = o.Threads(cores);
  auto policy = std::make_shared<model::Transformer>(config, o.seed);
  SLUICE_ASSIGN_OR_RETURN(auto loop, pipeline::TrainingRun::Create(policy, task, o, hooks));
  const auto t0 = Clock::now();
  SLUICE_RETURN_IF_ERROR(loop->Train(nullptr));
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  ModeResult r;
  r.name = name;
  r.budget = budget.ToString();
  std::vector<pipeline::StepRecord> history = loop->history();
  if (o.pipeline.processes) {
    SLUICE_ASSIGN_OR_RETURN(history, StepsFromMetrics(o.run_dir));
  }
  double waits = 0, stale = 0;
  for (const auto& rec : history) {
    r.samples += static_cast<double>(rec.samples_trained);
    r.tokens += static_cast<double>(rec.generated_tokens);
    r.train_seconds += rec.train_seconds;
    waits += rec.wait_seconds;
    stale += rec.staleness_mean;
  }
  const auto& last = history.back();
  // Wall time up to the end of the last step, before its evaluation.
  r.wall = last.elapsed_seconds > 0 ? last.elapsed_seconds : total;
  if (mode == pipeline::PipelineMode::kDirect) {
    r.trainer_idle = 0;
  } else {
    r.trainer_idle = waits / r.wall;
    r.rollout_busy = loop->stream_summary().rollout_busy_seconds / r.wall;
    r.occupancy = loop->stream_summary().rollout_occupancy;
    r.hub_requests = loop->stream_summary().hub_requests;
    r.ring_requests = loop->stream_summary().hub_ring_requests;
  }
  r.staleness = stale / static_cast<double>(history.size());
  return r;
}

// --profile: the simulator's prediction of every mode's wall time for this
// workload, next to the measured one (docs/simulator.md, validation).
// `fastest` holds each mode's fastest run, `results` its median one.
Status PrintSimulated(const std::string& profile_path, const std::vector<ModeResult>& results,
                      const std::vector<ModeResult>& fastest, const BoundParts& bound, const pipeline::RunOptions& base,
                      const model::ModelConfig& config, const sluice::reward::Task& task,
                      const std::vector<int32_t>& lengths, sluice::trainer::OffPolicyCorrection correction, bool lend,
                      const std::string& order, int64_t threads, int64_t rollout_threads, bool sync_dp) {
  namespace sim = sluice::simulate;
  SLUICE_ASSIGN_OR_RETURN(sim::CostProfile profile, sim::LoadCostProfile(profile_path));
  if (profile.model != sluice::launch::ModelShape(config)) {
    return Status::InvalidArgument(profile_path + " was measured for '" + profile.model +
                                   "', the benchmark's model is '" + sluice::launch::ModelShape(config) + "'");
  }
  sim::Workload w;
  w.steps = base.rl.steps;
  w.prompts_per_step = base.rl.prompts_per_step;
  w.group_size = base.rl.group_size;
  w.response_tokens = lengths;
  w.prompt_tokens.clear();
  model::ByteTokenizer tok;
  for (int64_t c = 0; c < w.steps * w.prompts_per_step; ++c) {
    SLUICE_ASSIGN_OR_RETURN(
        sluice::reward::Example ex,
        task.Get(sluice::reward::Split::kTrain, static_cast<uint64_t>(c) % task.size(sluice::reward::Split::kTrain)));
    w.prompt_tokens.push_back(1 + static_cast<int32_t>(tok.Encode(ex.prompt)->size()));
  }
  std::printf("simulated with %s (%s):\n", profile_path.c_str(), profile.measured_by.c_str());
  // The profile's trainer costs and slowdowns are each the fastest of
  // repeated measurements, its rollout costs a fit over many steps: it
  // predicts a run that the machine's other load did not slow down, which
  // the fastest run of a mode comes closest to.
  std::printf("(each mode's fastest run of %zu against the simulated one; the median run after it)\n",
              results.empty() ? size_t{0} : results[0].repetitions);
  std::printf("%-13s %9s %12s %7s %9s %7s %13s %15s %19s %19s\n", "mode", "fastest s", "simulated s", "error",
              "median s", "error", "fastest/sync", "simulated/sync", "train s (m / sim)", "trainer idle (m/sim)");
  double measured_sync = 0, simulated_sync = 0;
  std::string costs;
  for (size_t i = 0; i < results.size(); ++i) {
    const ModeResult& r = fastest[i];
    const double median = results[i].wall;
    SLUICE_ASSIGN_OR_RETURN(pipeline::PipelineMode mode, pipeline::ParsePipelineMode(r.name));
    const pipeline::RunOptions o = ModeOptions(base, mode, correction, lend, order, threads, rollout_threads, sync_dp);
    SLUICE_ASSIGN_OR_RETURN(sim::Layout layout, sluice::launch::SimulatedLayout(o, static_cast<int32_t>(threads)));
    SLUICE_ASSIGN_OR_RETURN(sim::SimResult s, sim::Simulate(w, layout, profile));
    if (mode == pipeline::PipelineMode::kSync) {
      measured_sync = r.wall, simulated_sync = s.wall_s;
      // The profile's costs against the bound's own measurements of the same
      // work (sync packs the bound's micro-batches).
      char line[256];
      std::snprintf(line, sizeof(line),
                    "the profile's costs of this workload: trainer %.1f core-seconds (the bound measured %.1f), "
                    "rollout %.1f in sync's engines (the bound's full-occupancy rollout %.1f)\n",
                    s.trainer_compute_s, bound.train, s.rollout_compute_s, bound.decode);
      costs = line;
    }
    std::printf("%-13s %9.1f %12.1f %+6.0f%% %9.1f %+6.0f%%", r.label.c_str(), r.wall, s.wall_s,
                100 * (s.wall_s / r.wall - 1), median, 100 * (s.wall_s / median - 1));
    if (measured_sync > 0) {
      std::printf(" %12.2fx %14.2fx", measured_sync / r.wall, simulated_sync / s.wall_s);
    } else {
      std::printf(" %13s %15s", "-", "-");
    }
    // Where the difference lies: the trainer's busy time (its steps: train,
    // publish, ack) and its share of the wall waiting for data.
    std::printf(" %9.1f / %6.1f %12.0f%% / %3.0f%%\n", r.train_seconds, s.trainer_busy_s, 100 * r.trainer_idle,
                100 * s.trainer_wait_s / s.wall_s);
  }
  if (bound.train > 0) std::printf("%s", costs.c_str());
  return Status::Ok();
}

Status Main(int argc, char** argv) {
  sluice::runtime::FlagSet flags;
  flags.Add("preset", "5m", "built-in model: tiny, 1m, 5m, 20m, 0.5b");
  flags.Add("device", "cpu",
            "where both roles run: cpu, cuda, cuda:N (on a GPU the CPU bound is not measured; every mode gets the "
            "same device and the same CPU threads)");
  flags.Add("steps", "8", "RL steps per mode");
  flags.Add("prompts", "8", "prompts per step");
  flags.Add("group", "8", "answers per prompt");
  flags.Add("median", "32", "median answer length (tokens)");
  flags.Add("tail", "16", "longest answer / median");
  flags.Add("slots", "64", "rollout engine slots");
  flags.Add("modes", "sync,one_step_off,async", "modes to run, comma-separated (direct, sync, one_step_off, async)");
  flags.Add("staleness", "2", "async max_staleness");
  flags.Add("threads", "2", "cores in total, the same in every mode");
  flags.Add("rollout-threads", "1", "one_step_off/async: threads of the rollout role (the trainer gets the rest)");
  flags.Add("correction", "behavior",
            "off-policy correction in one_step_off/async: none, decoupled, tis, seq-tis, behavior (the default "
            "of sluice train)");
  flags.Add("sync-dp", "true",
            "sync: train with one single-threaded micro-batch worker per core and generate with one single-threaded "
            "engine per core (else intra-op threads)",
            /*is_bool=*/true);
  flags.Add(
      "order", "prompt",
      "one_step_off/async: the trainer takes each step's own prompts (prompt) or groups as they complete (completion)");
  flags.Add("lend", "true", "one_step_off/async: the rollout's cores train while the rollout idles", /*is_bool=*/true);
  flags.Add("seed", "1", "seed of the model, prompts, sampling and lengths");
  flags.Add("repeat", "1",
            "runs of every mode, interleaved (sync, async, sync, async, ...); the table shows the median run");
  flags.Add("json", "", "also write results as JSON to this path");
  flags.Add("profile", "",
            "a cost profile (sluice calibrate) of this model: also print the simulator's prediction for every mode");
  flags.Add("processes", "false",
            "run each mode's roles as processes (pipeline.processes; the streaming modes only), this program the "
            "launcher",
            /*is_bool=*/true);
  flags.Add("hub-paths", "fast",
            "--processes: how the roles call the hub, comma-separated: fast (shared-memory rings), socket (ZeroMQ "
            "alone); each mode runs with each");
  // This program as one role of a --processes run (set by the launcher side).
  flags.Add("role-mode", "", "internal (--role): the mode of the run");
  flags.Add("role-hub", "", "internal (--role): the run's hub paths");
  flags.Add("role-run-dir", "", "internal (--role): the run's directory");
  pipeline::AddRoleFlags(flags);
  flags.Add("run-dir", "",
            "keep each run's directory (metrics.jsonl, timeline) under this path (default: a temporary one, removed)");
  SLUICE_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(argv + 1, argv + argc)));
  if (flags.help_requested()) {
    std::printf("usage: pipeline_bench [flags]\n%s", flags.Usage().c_str());
    return Status::Ok();
  }
  SLUICE_ASSIGN_OR_RETURN(std::string preset, flags.GetString("preset"));
  SLUICE_ASSIGN_OR_RETURN(int64_t steps, flags.GetInt("steps", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(int64_t prompts, flags.GetInt("prompts", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(int64_t group, flags.GetInt("group", 2, 1024));
  SLUICE_ASSIGN_OR_RETURN(int64_t median, flags.GetInt("median", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(double tail, flags.GetDouble("tail", 1.0, 1000.0));
  SLUICE_ASSIGN_OR_RETURN(int64_t slots, flags.GetInt("slots", 1, 4096));
  SLUICE_ASSIGN_OR_RETURN(std::string modes, flags.GetString("modes"));
  SLUICE_ASSIGN_OR_RETURN(int64_t staleness, flags.GetInt("staleness", 0, 1000));
  SLUICE_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", 1, 1024));
  SLUICE_ASSIGN_OR_RETURN(int64_t rollout_threads, flags.GetInt("rollout-threads", 1, 1024));
  SLUICE_ASSIGN_OR_RETURN(std::string correction, flags.GetString("correction"));
  SLUICE_ASSIGN_OR_RETURN(bool sync_dp, flags.GetBool("sync-dp"));
  SLUICE_ASSIGN_OR_RETURN(bool lend, flags.GetBool("lend"));
  SLUICE_ASSIGN_OR_RETURN(std::string order, flags.GetString("order"));
  if (order != "prompt" && order != "completion")
    return Status::InvalidArgument("--order must be prompt or completion");
  SLUICE_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("seed", 0, INT64_MAX));
  SLUICE_ASSIGN_OR_RETURN(int64_t repeat, flags.GetInt("repeat", 1, 100));
  SLUICE_ASSIGN_OR_RETURN(std::string json_path, flags.GetString("json"));
  SLUICE_ASSIGN_OR_RETURN(std::string profile_path, flags.GetString("profile"));
  SLUICE_ASSIGN_OR_RETURN(std::string keep_dir, flags.GetString("run-dir"));
  SLUICE_ASSIGN_OR_RETURN(std::string device_name, flags.GetString("device"));
  SLUICE_ASSIGN_OR_RETURN(torch::Device device, sluice::model::ResolveDevice(device_name));
  // The bound is in CPU core-seconds: it means nothing for a GPU run.
  const bool measure_bound = device.is_cpu();
  if (rollout_threads >= threads)
    return Status::InvalidArgument("--rollout-threads must leave the trainer at least one of --threads");
  torch::set_num_threads(static_cast<int>(threads));

  SLUICE_ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetModelConfig(preset));
  const int64_t answers = steps * prompts * group;
  const std::vector<int32_t> lengths = sluice::bench::LongTailLengths(
      static_cast<int>(answers), static_cast<int>(median), tail, static_cast<uint64_t>(seed));
  const int32_t longest = *std::max_element(lengths.begin(), lengths.end());
  if (longest + 64 > config.max_position_embeddings) {
    return Status::InvalidArgument("the longest answer (" + std::to_string(longest) + " tokens) does not fit the " +
                                   preset + " model's context");
  }
  const int64_t total_tokens = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});

  sluice::reward::TaskOptions to;
  to.name = "arithmetic";
  to.seed = static_cast<uint64_t>(seed);
  SLUICE_ASSIGN_OR_RETURN(auto task_ptr, sluice::reward::MakeTask(to));
  std::shared_ptr<const sluice::reward::Task> task(std::move(task_ptr));

  pipeline::RunOptions base;
  base.run_dir = keep_dir.empty() ? "/tmp/sluice-pipeline-bench-" + std::to_string(::getpid()) : keep_dir;
  base.seed = static_cast<uint64_t>(seed);
  base.checkpoint_interval = 0;
  base.rl.steps = steps;
  base.rl.prompts_per_step = prompts;
  base.rl.group_size = group;
  base.rl.rollout_slots = static_cast<int32_t>(slots);
  base.rl.sampling.max_new_tokens = longest;
  base.rl.dynamic_sampling = false;
  pipeline::RunHooks hooks;  // every mode generates exactly the workload's lengths
  hooks.forced_length = [&lengths, group](uint64_t cursor, int64_t g) {
    return lengths.at(cursor * static_cast<uint64_t>(group) + static_cast<uint64_t>(g));
  };
  base.eval.interval = 0;
  base.eval.size = 1;
  base.eval.max_new_tokens = 1;
  base.pipeline.max_staleness = staleness;
  base.devices.trainer = device.str();
  base.devices.rollout = device.str();
  SLUICE_ASSIGN_OR_RETURN(auto corr, sluice::trainer::ParseOffPolicyCorrection(correction));
  SLUICE_ASSIGN_OR_RETURN(bool processes, flags.GetBool("processes"));
  SLUICE_ASSIGN_OR_RETURN(std::string hub_paths, flags.GetString("hub-paths"));
  const std::vector<std::string> hubs = sluice::bench::SplitCommas(hub_paths);
  if (hubs.empty()) return Status::InvalidArgument("--hub-paths names no hub path");
  for (const std::string& hub : hubs) {
    if (hub != "fast" && hub != "socket") {
      return Status::InvalidArgument("--hub-paths: '" + hub + "' is not one of {fast, socket}");
    }
  }
  if (!processes && hub_paths != "fast") {
    return Status::InvalidArgument("--hub-paths needs --processes (roles as threads share one in-process hub)");
  }
  // A mode's options as this run places its roles: the same in the launcher
  // and in each role process.
  auto options_for = [&](pipeline::PipelineMode mode, const std::string& hub,
                         const std::string& run_dir) -> pipeline::RunOptions {
    pipeline::RunOptions o = ModeOptions(base, mode, corr, lend, order, threads, rollout_threads, sync_dp);
    o.run_dir = run_dir;
    if (processes) {
      o.pipeline.processes = true;
      o.pipeline.hub_fast_paths = hub == "fast";
      o.pipeline.wiring.role_command = {std::filesystem::read_symlink("/proc/self/exe").string()};
      o.pipeline.wiring.role_command.insert(o.pipeline.wiring.role_command.end(), argv + 1, argv + argc);
      for (const std::string& a :
           {"--role-mode=" + pipeline::PipelineModeName(mode), "--role-hub=" + hub, "--role-run-dir=" + run_dir}) {
        o.pipeline.wiring.role_command.push_back(a);
      }
    }
    return o;
  };

  // Started by a --processes launcher as one role of one mode's run.
  SLUICE_ASSIGN_OR_RETURN(std::optional<pipeline::RoleConnection> role, pipeline::RoleFromFlags(flags));
  if (role) {
    SLUICE_ASSIGN_OR_RETURN(std::string role_mode, flags.GetString("role-mode"));
    SLUICE_ASSIGN_OR_RETURN(std::string role_hub, flags.GetString("role-hub"));
    SLUICE_ASSIGN_OR_RETURN(std::string role_run_dir, flags.GetString("role-run-dir"));
    SLUICE_ASSIGN_OR_RETURN(pipeline::PipelineMode mode, pipeline::ParsePipelineMode(role_mode));
    const pipeline::RunOptions o = options_for(mode, role_hub, role_run_dir);
    auto policy = std::make_shared<model::Transformer>(config, o.seed);
    SLUICE_ASSIGN_OR_RETURN(auto loop, pipeline::TrainingRun::Create(policy, task, o, hooks));
    return loop->RunRole(*role, [](const std::string&, int64_t, int64_t, const pipeline::StepRecord*) {});
  }

  std::fprintf(stderr,
               "%s (%.1fM params): %lld steps x %lld prompts x %lld answers, %lld tokens (median %lld, longest %d), "
               "%lld slots, %lld threads, device %s\n",
               preset.c_str(), config.NumParameters() / 1e6, static_cast<long long>(steps),
               static_cast<long long>(prompts), static_cast<long long>(group), static_cast<long long>(total_tokens),
               static_cast<long long>(median), longest, static_cast<long long>(slots), static_cast<long long>(threads),
               device.str().c_str());

  // Each mode with each hub setting (one, "", without --processes).
  struct Variant {
    pipeline::PipelineMode mode;
    std::string hub, label;
  };
  std::vector<Variant> variants;
  if (sluice::bench::SplitCommas(modes).empty()) return Status::InvalidArgument("--modes names no mode");
  for (const std::string& name : sluice::bench::SplitCommas(modes)) {
    SLUICE_ASSIGN_OR_RETURN(pipeline::PipelineMode mode, pipeline::ParsePipelineMode(name));
    if (processes && mode == pipeline::PipelineMode::kDirect) {
      return Status::InvalidArgument("--processes: direct has no roles to run as processes (--modes)");
    }
    for (const std::string& hub : hubs) {
      variants.push_back({mode, processes ? hub : "", hubs.size() > 1 ? name + "/" + hub : name});
    }
  }
  // Every variant `repeat` times, interleaved, so a slow spell of a shared
  // machine falls on all alike; per variant, the run of median wall time.
  std::vector<std::vector<ModeResult>> mode_runs_all(variants.size());
  std::vector<double> bound_runs, bound_train, bound_decode;
  for (int64_t rep = 0; rep < repeat; ++rep) {
    for (size_t m = 0; m < variants.size(); ++m) {
      const Variant& v = variants[m];
      std::string dir = v.label;
      std::replace(dir.begin(), dir.end(), '/', '-');
      if (repeat > 1) dir += "-" + std::to_string(rep + 1);
      const pipeline::RunOptions o = options_for(v.mode, v.hub, base.run_dir + "/" + dir);
      SLUICE_ASSIGN_OR_RETURN(ModeResult r, RunMode(o, hooks, config, task, static_cast<int32_t>(threads)));
      r.hub = v.hub;
      r.label = v.label;
      std::fprintf(stderr, "  %-19s %.1f s, %.1f samples/s; %s", v.label.c_str(), r.wall, r.samples / r.wall,
                   r.budget.c_str());
      if (processes) {
        std::fprintf(stderr, "; hub: %lld requests, %lld through rings", static_cast<long long>(r.hub_requests),
                     static_cast<long long>(r.ring_requests));
      }
      std::fprintf(stderr, "\n");
      r.repetition = static_cast<size_t>(rep);
      mode_runs_all[m].push_back(r);
    }
    if (!measure_bound) continue;
    SLUICE_ASSIGN_OR_RETURN(BoundParts b, MeasureBound(base, config, *task, lengths, lengths, slots,
                                                       static_cast<int32_t>(threads), static_cast<uint64_t>(seed)));
    torch::set_num_threads(static_cast<int>(threads));
    const double bound = (b.train + b.decode) / static_cast<double>(threads);
    std::fprintf(stderr,
                 "  %-12s %.1f s = (trainer %.1f + rollout %.1f core-seconds, each alone on 1 thread) / %lld cores\n",
                 "bound", bound, b.train, b.decode, static_cast<long long>(threads));
    bound_runs.push_back(bound);
    bound_train.push_back(b.train);
    bound_decode.push_back(b.decode);
  }
  std::vector<ModeResult> results, fastest_runs;
  std::vector<sluice::bench::Stats> wall_stats, train_stats;
  for (auto& mode_runs : mode_runs_all) {
    std::vector<double> walls, trains;
    for (const auto& r : mode_runs) walls.push_back(r.wall), trains.push_back(r.train_seconds);
    wall_stats.push_back(sluice::bench::Summarize(walls));
    train_stats.push_back(sluice::bench::Summarize(trains));
    std::sort(mode_runs.begin(), mode_runs.end(), [](const auto& a, const auto& b) { return a.wall < b.wall; });
    results.push_back(mode_runs[mode_runs.size() / 2]);
    fastest_runs.push_back(mode_runs.front());
    results.back().repetitions = fastest_runs.back().repetitions = mode_runs.size();
  }

  const sluice::bench::Stats bound_stats = sluice::bench::Summarize(bound_runs);
  const sluice::bench::Stats bound_train_stats = sluice::bench::Summarize(bound_train);
  const sluice::bench::Stats bound_decode_stats = sluice::bench::Summarize(bound_decode);
  // No bound measured (a GPU run): 0, printed as "-".
  const double ideal = (bound_train_stats.min + bound_decode_stats.min) / static_cast<double>(threads);
  std::printf(
      "\npipeline throughput, %s, %lld x %lld x %lld answers, %s lengths (median %lld, longest %d), %lld threads, "
      "device %s\n",
      preset.c_str(), static_cast<long long>(steps), static_cast<long long>(prompts), static_cast<long long>(group),
      tail > 1 ? "long-tail" : "uniform", static_cast<long long>(median), longest, static_cast<long long>(threads),
      device.str().c_str());
  if (processes) {
    std::printf("roles as processes (this program the launcher and hub); hub paths: %s\n",
                hubs.size() > 1     ? "each mode with fast (shared-memory rings) and socket (ZeroMQ alone)"
                : hubs[0] == "fast" ? "fast (shared-memory rings)"
                                    : "socket (ZeroMQ alone)");
  }
  if (repeat > 1) {
    std::printf("(%lld runs of each mode, interleaved; each row is a mode's median run, wall min..max after it)\n",
                static_cast<long long>(repeat));
  }
  std::printf("%-19s %9s %11s %10s %13s %13s %10s %10s %9s\n", "mode", "wall s", "samples/s", "tokens/s",
              "trainer idle", "rollout busy", "occupancy", "staleness", "of bound");
  std::string json = "[";
  for (const auto& r : results) {
    std::printf("%-19s %9.1f %11.2f %10.0f %12.0f%% %12.0f%% %9.0f%% %10.2f", r.label.c_str(), r.wall,
                r.samples / r.wall, r.tokens / r.wall, 100 * r.trainer_idle, 100 * r.rollout_busy, 100 * r.occupancy,
                r.staleness);
    if (measure_bound) {
      std::printf(" %8.0f%%", 100 * ideal / r.wall);
    } else {
      std::printf(" %9s", "-");
    }
    const sluice::bench::Stats& ws = wall_stats[static_cast<size_t>(&r - results.data())];
    if (repeat > 1) std::printf("   %.1f..%.1f s", ws.min, ws.max);
    std::printf("\n");
    json += std::string(json.size() > 1 ? "," : "") + "{\"mode\":\"" + r.name +
            "\",\"processes\":" + (processes ? "true" : "false") + ",\"hub\":\"" + r.hub +
            "\",\"wall_seconds\":" + std::to_string(r.wall) +
            ",\"samples_per_s\":" + std::to_string(r.samples / r.wall) +
            ",\"tokens_per_s\":" + std::to_string(r.tokens / r.wall) +
            ",\"trainer_idle\":" + std::to_string(r.trainer_idle) +
            ",\"rollout_busy\":" + std::to_string(r.rollout_busy) + ",\"occupancy\":" + std::to_string(r.occupancy) +
            ",\"staleness\":" + std::to_string(r.staleness) + ",\"hub_requests\":" + std::to_string(r.hub_requests) +
            ",\"ring_requests\":" + std::to_string(r.ring_requests) + "}";
  }
  json += "]\n";
  if (!measure_bound)
    std::printf("bound: not measured (the bound is in CPU core-seconds; this run is on %s)", device.str().c_str());
  if (measure_bound)
    std::printf(
        "bound: %.1f s = (trainer %.1f + full-occupancy rollout %.1f core-seconds, each alone on 1 thread) / %lld "
        "cores",
        ideal, bound_train_stats.min, bound_decode_stats.min, static_cast<long long>(threads));
  // With repetitions: each part's fastest measurement; the measurements' range.
  if (measure_bound && repeat > 1) {
    std::printf(", the fastest of %lld measurements of each part (whole bound measured %.1f..%.1f s)",
                static_cast<long long>(repeat), bound_stats.min, bound_stats.max);
  }
  std::printf("\n");
  // Every run against the bound.
  for (size_t m = 0; m < mode_runs_all.size(); ++m) {
    for (const ModeResult& r : mode_runs_all[m]) {
      if (measure_bound && r.wall < ideal) {
        std::printf(
            "WARNING: %s run %zu finished in %.1f s, under the bound of %.1f s: the bound is wrong, not the mode\n",
            r.label.c_str(), r.repetition + 1, r.wall, ideal);
      }
    }
  }
  std::printf("threads (budget %lld cores):\n", static_cast<long long>(threads));
  for (const auto& r : results) std::printf("  %-19s %s\n", r.label.c_str(), r.budget.c_str());
  if (processes) {
    std::printf("the roles' requests to the hub (each row's run):\n");
    for (const auto& r : results) {
      std::printf("  %-19s %lld, %lld through shared-memory rings, %.0f per second\n", r.label.c_str(),
                  static_cast<long long>(r.hub_requests), static_cast<long long>(r.ring_requests),
                  static_cast<double>(r.hub_requests) / r.wall);
    }
  }
  // Each mode against sync with the same hub paths; each mode's fast paths
  // against its socket run.
  for (const auto& r : results) {
    for (const auto& other : results) {
      if (other.name == "sync" && r.name != "sync" && other.hub == r.hub) {
        std::printf("%s/sync throughput%s: %.2fx\n", r.name.c_str(),
                    hubs.size() > 1 ? (" (hub paths " + r.hub + ")").c_str() : "", other.wall / r.wall);
      }
      if (other.name == r.name && r.hub == "fast" && other.hub == "socket") {
        std::printf("%s: the hub's fast paths against its socket alone: %.2fx (wall %.1f s against %.1f s)\n",
                    r.name.c_str(), other.wall / r.wall, r.wall, other.wall);
      }
    }
  }
  if (!profile_path.empty()) {
    BoundParts fastest;  // each part's fastest measurement, as the bound uses
    if (!bound_train.empty()) fastest = {bound_train_stats.min, bound_decode_stats.min};
    SLUICE_RETURN_IF_ERROR(PrintSimulated(profile_path, results, fastest_runs, fastest, base, config, *task, lengths,
                                          corr, lend, order, threads, rollout_threads, sync_dp));
  }
  if (!json_path.empty()) std::ofstream(json_path) << json;
  if (keep_dir.empty()) static_cast<void>(sluice::RemoveTree(base.run_dir));
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) { return sluice::bench::BenchMain(argc, argv, Main); }
