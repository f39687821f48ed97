// `sluice calibrate` and `sluice simulate` (docs/simulator.md): measure what a
// run's parts cost here, then predict a run's wall time in each mode from
// the same config `sluice train` reads.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "sluice/common/file_util.h"
#include "sluice/launch/commands.h"
#include "sluice/launch/simulation.h"
#include "sluice/model/config.h"
#include "sluice/pipeline/options.h"
#include "sluice/runtime/config.h"
#include "sluice/runtime/flags.h"
#include "sluice/simulate/lengths.h"
#include "sluice/simulate/simulator.h"
#include "train_config.h"

namespace sluice::launch {
namespace {

using runtime::Config;
using runtime::FlagSet;

Result<model::ModelConfig> RunModelConfig(const Config& c) {
  const std::string path = c.GetString("model.path");
  if (!path.empty()) return model::LoadModelConfig(path + "/config.json");
  return model::PresetModelConfig(c.GetString("model.preset"));
}

std::string Joined(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

// A step's answer lengths and prompts, as `simulate` predicts them and
// `calibrate` measures them.
struct StepLengths {
  int64_t median = 0;
  double tail = 1;
  int64_t prompt_tokens = 0;
};

void AddStepLengthFlags(FlagSet* flags) {
  flags->Add("median", "0", "median answer length in tokens (0: rl.max_new_tokens / --tail, the longest answer fits)");
  flags->Add("tail", "16", "longest answer / median (1: every answer the median)");
  flags->Add("prompt-tokens", "0", "tokens per prompt (0: the task's mean prompt in bytes + 1, the byte tokenizer's)");
}

// InvalidArgument for a longest answer (median x tail) over rl.max_new_tokens.
// `task` is the run's task when the caller has built it (else built here for
// the prompts' mean length).
Result<StepLengths> ReadStepLengthFlags(const FlagSet& flags, const Config& config, const pipeline::RlOptions& rl,
                                        const reward::Task* task) {
  StepLengths s;
  SLUICE_ASSIGN_OR_RETURN(s.median, flags.GetInt("median", 0, 1 << 20));
  SLUICE_ASSIGN_OR_RETURN(s.tail, flags.GetDouble("tail", 1.0, 1000.0));
  SLUICE_ASSIGN_OR_RETURN(s.prompt_tokens, flags.GetInt("prompt-tokens", 0, 1 << 20));
  if (s.median == 0) s.median = std::max<int64_t>(1, static_cast<int64_t>(rl.sampling.max_new_tokens / s.tail));
  // LongTailLengths' longest answer is the median times the tail.
  const int64_t longest = std::lround(static_cast<double>(s.median) * s.tail);
  if (longest > rl.sampling.max_new_tokens) {
    return Status::InvalidArgument("the longest answer (" + std::to_string(longest) + " tokens = --median x --tail) " +
                                   "exceeds rl.max_new_tokens " + std::to_string(rl.sampling.max_new_tokens));
  }
  if (s.prompt_tokens == 0) {
    std::unique_ptr<reward::Task> built;
    if (task == nullptr) {
      SLUICE_ASSIGN_OR_RETURN(reward::TaskOptions task_options, TaskOptionsFrom(config));
      SLUICE_ASSIGN_OR_RETURN(built, MakeRunTask(config, task_options));
      task = built.get();
    }
    const uint64_t n = std::min<uint64_t>(1000, task->size(reward::Split::kTrain));
    double bytes = 0;
    for (uint64_t i = 0; i < n; ++i) {
      SLUICE_ASSIGN_OR_RETURN(reward::Example ex, task->Get(reward::Split::kTrain, i));
      bytes += static_cast<double>(ex.prompt.size());
    }
    s.prompt_tokens = n > 0 ? 1 + static_cast<int64_t>(bytes / static_cast<double>(n) + 0.5) : 16;
  }
  return s;
}

Status Calibrate(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Add("config", "", "the run's YAML config (the keys of `sluice train --help-config`)");
  flags.Add("out", "", "where to write the cost profile (YAML)");
  flags.Add("quick", "false", "fewer measurements (a rough profile in a few seconds)", /*is_bool=*/true);
  flags.Add("cores", "0", "the cores the roles share, measured busy at once (0: this machine's)");
  AddStepLengthFlags(&flags);
  SLUICE_ASSIGN_OR_RETURN(const bool helped,
                          flags.ParseOrHelp(args, "sluice calibrate --out=PROFILE [--config=FILE] [key=value ...]"));
  if (helped) return Status::Ok();
  SLUICE_ASSIGN_OR_RETURN(std::string out, flags.GetString("out"));
  if (out.empty()) return Status::InvalidArgument("--out: where to write the profile is required");
  SLUICE_ASSIGN_OR_RETURN(std::string config_path, flags.GetString("config"));
  SLUICE_ASSIGN_OR_RETURN(Config config, Config::Load(TrainSchema(), config_path, flags.positional()));
  SLUICE_ASSIGN_OR_RETURN(pipeline::RunOptions options, RunOptionsFrom(config));
  SLUICE_ASSIGN_OR_RETURN(reward::TaskOptions task_options, TaskOptionsFrom(config));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<reward::Task> task, MakeRunTask(config, task_options));
  SLUICE_ASSIGN_OR_RETURN(auto policy, InitialModel(config));
  CalibrationOptions co;
  SLUICE_ASSIGN_OR_RETURN(co.quick, flags.GetBool("quick"));
  SLUICE_ASSIGN_OR_RETURN(int64_t cores, flags.GetInt("cores", 0, 1024));
  co.cores = static_cast<int32_t>(cores > 0 ? cores : std::max(1u, std::thread::hardware_concurrency()));
  co.max_rows = options.rl.rollout_slots;
  co.max_context = std::min<int64_t>(policy->config().max_position_embeddings,
                                     64 + static_cast<int64_t>(options.rl.sampling.max_new_tokens));
  co.trainer = options.rl.trainer;
  // One step of the run (prompts x group answers of the expected lengths) is
  // measured too: the fit then interpolates at the run's own shape.
  SLUICE_ASSIGN_OR_RETURN(StepLengths lengths, ReadStepLengthFlags(flags, config, options.rl, task.get()));
  co.step.samples = options.rl.prompts_per_step * options.rl.group_size;
  co.step.median = static_cast<int32_t>(lengths.median);
  co.step.tail = lengths.tail;
  co.step.prompt_tokens = static_cast<int32_t>(lengths.prompt_tokens);
  co.seed = options.seed;
  co.measured_by = "sluice calibrate " + Joined(args) + " (libtorch " + TORCH_VERSION + ")";
  std::fprintf(stderr, "sluice calibrate: %s, one thread per role; decode, prefill, training, publish, reward...\n",
               ModelShape(policy->config()).c_str());
  SLUICE_ASSIGN_OR_RETURN(simulate::CostProfile p, launch::Calibrate(policy, *task, co));
  SLUICE_RETURN_IF_ERROR(WriteFileAtomically(out, FormatCostProfile(p)));
  std::printf("%s", FormatCostProfile(p).c_str());
  std::printf("cost profile written to %s\n", out.c_str());
  return Status::Ok();
}

Status Simulate(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Add("config", "", "the run's YAML config (the keys of `sluice train --help-config`)");
  flags.Add("profile", "", "the cost profile (from sluice calibrate)");
  flags.Add("modes", "sync,one_step_off,async", "modes to simulate, comma-separated");
  AddStepLengthFlags(&flags);
  flags.Add("threads", "2", "cores in every mode: sync runs that many engines and trainer workers, roles alternating");
  flags.Add("rollout-threads", "1", "one_step_off/async: the rollout's cores (the trainer gets the rest)");
  SLUICE_ASSIGN_OR_RETURN(const bool helped,
                          flags.ParseOrHelp(args, "sluice simulate --profile=PROFILE [--config=FILE] [key=value ...]"));
  if (helped) return Status::Ok();
  SLUICE_ASSIGN_OR_RETURN(std::string profile_path, flags.GetString("profile"));
  if (profile_path.empty()) return Status::InvalidArgument("--profile: a cost profile is required (sluice calibrate)");
  SLUICE_ASSIGN_OR_RETURN(simulate::CostProfile profile, simulate::LoadCostProfile(profile_path));
  SLUICE_ASSIGN_OR_RETURN(std::string config_path, flags.GetString("config"));
  SLUICE_ASSIGN_OR_RETURN(Config config, Config::Load(TrainSchema(), config_path, flags.positional()));
  SLUICE_ASSIGN_OR_RETURN(pipeline::RunOptions options, RunOptionsFrom(config));
  SLUICE_ASSIGN_OR_RETURN(model::ModelConfig model_config, RunModelConfig(config));
  if (ModelShape(model_config) != profile.model) {
    return Status::InvalidArgument(profile_path + " was measured for '" + profile.model + "', this run's model is '" +
                                   ModelShape(model_config) + "': calibrate for this model");
  }
  SLUICE_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", 1, 4096));
  SLUICE_ASSIGN_OR_RETURN(int64_t rollout_threads, flags.GetInt("rollout-threads", 1, 4096));
  if (rollout_threads >= threads) {
    return Status::InvalidArgument("--rollout-threads must leave the trainer at least one of --threads");
  }
  SLUICE_ASSIGN_OR_RETURN(std::string modes, flags.GetString("modes"));
  const pipeline::RlOptions& rl = options.rl;
  SLUICE_ASSIGN_OR_RETURN(StepLengths lengths, ReadStepLengthFlags(flags, config, rl, /*task=*/nullptr));
  const int64_t median = lengths.median, prompt_tokens = lengths.prompt_tokens;
  const double tail = lengths.tail;
  simulate::Workload w;
  w.steps = rl.steps;
  w.prompts_per_step = rl.prompts_per_step;
  w.group_size = rl.group_size;
  const int64_t answers = rl.steps * rl.prompts_per_step * rl.group_size;
  constexpr int64_t kMostAnswers = 20'000'000;
  if (answers > kMostAnswers) {
    return Status::InvalidArgument("rl.steps x rl.prompts_per_step x rl.group_size = " + std::to_string(answers) +
                                   " answers: the simulator takes at most " + std::to_string(kMostAnswers));
  }
  w.response_tokens =
      simulate::LongTailLengths(static_cast<int>(answers), static_cast<int>(median), tail, options.seed);
  const int32_t longest = *std::max_element(w.response_tokens.begin(), w.response_tokens.end());
  w.prompt_tokens = {static_cast<int32_t>(prompt_tokens)};

  std::printf(
      "simulated: %s, %lld steps x %lld prompts x %lld answers, lengths median %lld longest %d, prompts %lld "
      "tokens, %lld cores\nprofile: %s (%s)\n",
      ModelShape(model_config).c_str(), static_cast<long long>(rl.steps), static_cast<long long>(rl.prompts_per_step),
      static_cast<long long>(rl.group_size), static_cast<long long>(median), longest,
      static_cast<long long>(prompt_tokens), static_cast<long long>(threads), profile_path.c_str(),
      profile.measured_by.c_str());
  std::printf("%-13s %9s %11s %13s %13s %10s %10s %8s  %s\n", "mode", "wall s", "samples/s", "trainer idle",
              "rollout busy", "occupancy", "staleness", "x sync", "layout");
  double sync_wall = 0;
  for (size_t pos = 0; pos <= modes.size();) {
    const size_t comma = std::min(modes.find(',', pos), modes.size());
    const std::string name = modes.substr(pos, comma - pos);
    pos = comma + 1;
    pipeline::RunOptions o = options;
    SLUICE_ASSIGN_OR_RETURN(o.pipeline.mode, pipeline::ParsePipelineMode(name));
    ShareCores(&o, static_cast<int32_t>(threads), static_cast<int32_t>(rollout_threads), /*data_parallel_sync=*/true);
    SLUICE_ASSIGN_OR_RETURN(simulate::Layout layout, SimulatedLayout(o, static_cast<int32_t>(threads)));
    SLUICE_ASSIGN_OR_RETURN(simulate::SimResult r, simulate::Simulate(w, layout, profile));
    if (layout.mode == simulate::Mode::kSync) sync_wall = r.wall_s;
    std::printf("%-13s %9.1f %11.2f %12.0f%% %12.0f%% %9.0f%% %10.2f", name.c_str(), r.wall_s,
                static_cast<double>(answers) / r.wall_s, 100 * r.trainer_wait_s / r.wall_s,
                100 * r.rollout_busy_s / r.wall_s, 100 * r.occupancy, r.staleness_mean);
    if (sync_wall > 0) {
      std::printf(" %7.2fx", sync_wall / r.wall_s);
    } else {
      std::printf(" %8s", "-");
    }
    std::printf("  %s\n", o.Threads(static_cast<int32_t>(threads)).ToString().c_str());
  }
  return Status::Ok();
}

}  // namespace

int RunCalibrateCommand(const std::vector<std::string>& args) { return RunCommand(Calibrate, args); }
int RunSimulateCommand(const std::vector<std::string>& args) { return RunCommand(Simulate, args); }

}  // namespace sluice::launch
