#include "sluice/pipeline/options.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "sluice/common/enum_names.h"
#include "sluice/common/metrics_server.h"
#include "sluice/common/strings.h"
#include "sluice/model/device.h"
#include "sluice/pipeline/options_table.h"
#include "sluice/pipeline/roles.h"
#include "sluice/reward/python_reward.h"
#include "sluice/runtime/flags.h"

namespace sluice::pipeline {

Result<PipelineMode> ParsePipelineMode(const std::string& name) {
  if (name == "direct") return PipelineMode::kDirect;
  if (name == "sync") return PipelineMode::kSync;
  if (name == "one_step_off") return PipelineMode::kOneStepOff;
  if (name == "async") return PipelineMode::kAsync;
  return Status::InvalidArgument("pipeline mode '" + name + "' is not one of {direct, sync, one_step_off, async}");
}

std::string PipelineModeName(PipelineMode mode) {
  static constexpr const char* kNames[] = {"direct", "sync", "one_step_off", "async"};
  static_assert(std::size(kNames) == static_cast<size_t>(PipelineMode::kAsync) + 1);
  return EnumName(kNames, mode);
}

int64_t PipelineOptions::EffectiveMaxStaleness() const {
  switch (mode) {
    case PipelineMode::kDirect:
    case PipelineMode::kSync:
      return 0;
    case PipelineMode::kOneStepOff:
      return 1;
    case PipelineMode::kAsync:
      return max_staleness;
  }
  return 0;
}

Status RunOptions::Validate() const {
  auto bad = [](const std::string& key, const std::string& why) {
    return Status::InvalidArgument("option " + key + ": " + why);
  };
  if (run_dir.empty()) return bad("run.dir", "must be set");
  // Every field a config key sets: in its key's range, one of its values.
  SLUICE_RETURN_IF_ERROR(RunOptionsTable().Check(*this));
  if (rl.group_size < 2) {
    return bad("rl.group_size", "must be >= 2: GRPO normalizes rewards within a group of answers to one prompt, got " +
                                    std::to_string(rl.group_size));
  }
  // A step's answers are held in memory together (and, in the direct loop,
  // generated as one batch): refuse sizes no machine this runs on can hold,
  // before anything is allocated.
  constexpr int64_t kMaxAnswersPerStep = int64_t{1} << 16, kMaxTokensPerStep = int64_t{1} << 28;
  if (rl.prompts_per_step * rl.group_size > kMaxAnswersPerStep) {
    return bad("rl.prompts_per_step", "x rl.group_size is " + std::to_string(rl.prompts_per_step * rl.group_size) +
                                          " answers per step, more than the " + std::to_string(kMaxAnswersPerStep) +
                                          " a step may hold");
  }
  if (rl.prompts_per_step * rl.group_size * std::max<int64_t>(rl.sampling.max_new_tokens, 1) > kMaxTokensPerStep) {
    return bad("rl.max_new_tokens", "x rl.prompts_per_step x rl.group_size is over " +
                                        std::to_string(kMaxTokensPerStep) + " response tokens per step");
  }
  SLUICE_RETURN_IF_ERROR(rl.sampling.Validate());
  SLUICE_RETURN_IF_ERROR(rl.trainer.Validate());
  if (agent.enabled()) {
    if (agent.python()) {
      if (!reward::ParseFunctionSpec(agent.env).ok()) {
        return bad("agent.env", Quoted(agent.env) +
                                    " is neither calculator, python nor a Python class (package.module:Class or "
                                    "path/to/file.py:Class)");
      }
    }
    if (agent.max_tokens > 0 && agent.max_tokens < 2) return bad("agent.max_tokens", "must be 0 or >= 2");
  }
  if (sft.tool_call_fraction > 0 && agent.env != "calculator") {
    return bad("sft.tool_call_fraction",
               "needs agent.env=calculator (the tool the warm start calls), got agent.env=" + Quoted(agent.env));
  }
  const float sampled_temperature = rl.sampling.temperature > 0 ? rl.sampling.temperature : 1.0f;
  if (rl.trainer.temperature != sampled_temperature) {
    return bad("rl.trainer.temperature", "must equal the rollout temperature (" + std::to_string(sampled_temperature) +
                                             ") so trainer and rollout logprobs describe the same distribution");
  }
  if (pipeline.stop_on_stall && pipeline.stall_seconds == 0) {
    return bad("pipeline.stop_on_stall", "needs pipeline.stall_seconds > 0");
  }
  if (pipeline.processes && pipeline.mode == PipelineMode::kDirect) {
    return bad("pipeline.processes", "needs a streaming mode (sync, one_step_off or async), not direct");
  }
  if (trace && pipeline.mode == PipelineMode::kDirect) {
    return bad("run.trace", "records the roles of a streaming pipeline.mode (sync, one_step_off, async), not direct");
  }
  if (!metrics_listen.empty()) {
    if (pipeline.mode == PipelineMode::kDirect) {
      return bad("run.metrics_listen", "serves the roles of a streaming pipeline.mode (sync, one_step_off, async)");
    }
    std::string host;
    int port = 0;
    if (Status parsed = ParseListenAddress(metrics_listen, &host, &port); !parsed.ok()) {
      return bad("run.metrics_listen", parsed.message());
    }
    if (!metrics_allow_non_loopback && !IsLoopbackAddress(host)) {
      return bad("run.metrics_listen", host +
                                           " is not a loopback address: the counters are served without "
                                           "authentication (run.metrics_allow_non_loopback=true serves them there)");
    }
  }
  if (!pipeline.trainer_command.empty()) {
    if (!pipeline.processes) return bad("pipeline.trainer_command", "needs pipeline.processes=true");
    if (pipeline.trainer_command.find('\0') != std::string::npos ||
        pipeline.trainer_command.find_first_not_of(" \t\n") == std::string::npos) {
      return bad("pipeline.trainer_command", "must be a command line (it is blank or holds a NUL byte)");
    }
  }
  if (pipeline.max_restarts > 0 && (!pipeline.processes || !pipeline.trainer_command.empty())) {
    return bad("pipeline.max_restarts",
               "restarts Sluice's role processes: needs pipeline.processes=true and no "
               "pipeline.trainer_command");
  }
  if (pipeline.trainer_ranks > 1 && !pipeline.processes) {
    return bad("pipeline.trainer_ranks", "needs pipeline.processes=true (each rank is a process)");
  }
  if (pipeline.trainer_ranks > 1 && !pipeline.trainer_command.empty()) {
    return bad("pipeline.trainer_ranks", "is Sluice's trainer's; pipeline.trainer_command replaces that trainer");
  }
  // Replicas and workers: those on this host and those on other hosts
  // (cluster.*_ranks), 1 to 64 in all; none here only with some elsewhere.
  auto processes = [&](const std::string& here_key, int32_t here, const std::string& elsewhere_key,
                       int32_t elsewhere) -> Status {
    if (here + elsewhere > 64) return bad(elsewhere_key, "with " + here_key + " must be at most 64");
    if (here + elsewhere < 1) return bad(here_key, "must be at least 1 (0 only with " + elsewhere_key + ")");
    if (elsewhere > 0 && (!pipeline.processes || !pipeline.trainer_command.empty())) {
      return bad(elsewhere_key, "needs pipeline.processes=true and Sluice's trainer");
    }
    return Status::Ok();
  };
  SLUICE_RETURN_IF_ERROR(processes("pipeline.rollout_replicas", pipeline.rollout_replicas, "cluster.rollout_ranks",
                                   pipeline.remote_rollout_replicas));
  SLUICE_RETURN_IF_ERROR(processes("pipeline.reward_workers", pipeline.reward_workers, "cluster.reward_ranks",
                                   pipeline.remote_reward_workers));
  if ((pipeline.rollout_replicas > 1 || pipeline.reward_workers > 1) && !pipeline.processes) {
    return bad(pipeline.rollout_replicas > 1 ? "pipeline.rollout_replicas" : "pipeline.reward_workers",
               "needs pipeline.processes=true (each replica or worker is a process)");
  }
  if (pipeline.rollout_engines < 1 || pipeline.rollout_engines > rl.rollout_slots) {
    return bad("pipeline.rollout_engines", "must be in [1, rl.rollout_slots]");
  }
  if (Status d = model::CheckDeviceName(devices.trainer); !d.ok())
    return bad("pipeline.trainer_device (model.device)", d.message());
  if (Status d = model::CheckDeviceName(devices.rollout); !d.ok())
    return bad("pipeline.rollout_device (model.device)", d.message());
  if (pipeline.mode == PipelineMode::kDirect) {
    if (devices.rollout != devices.trainer) {
      return bad("pipeline.rollout_device",
                 "direct mode generates with the trainer's model: leave it unset or equal "
                 "to pipeline.trainer_device, or choose a streaming pipeline.mode");
    }
    if (devices.rollout_dtype == "bfloat16") {
      return bad("pipeline.rollout_dtype",
                 "direct mode generates with the trainer's float32 model: bfloat16 rollout weights need a streaming "
                 "pipeline.mode");
    }
  }
  if (pipeline.train_order == TrainOrder::kCompletion && pipeline.EffectiveMaxStaleness() > 0) {
    return bad("pipeline.train_order",
               "'completion' cannot keep pipeline.max_staleness in " + PipelineModeName(pipeline.mode) +
                   " mode (a long answer can be outlasted by any number of steps of short ones); use 'prompt'");
  }
  return Status::Ok();
}

ThreadBudget RunOptions::Threads(int32_t process_threads) const {
  const PipelineOptions& po = pipeline;
  ThreadBudget b;
  const bool direct = po.mode == PipelineMode::kDirect;
  b.roles_alternate = direct || po.mode == PipelineMode::kSync;
  const int32_t rollout_threads = !direct && po.rollout_threads > 0 ? po.rollout_threads : process_threads;
  const int32_t trainer_threads = !direct && po.trainer_threads > 0 ? po.trainer_threads : process_threads;
  b.rollout_replicas = direct ? 1 : std::max(1, po.rollout_replicas);
  b.rollout_engines = direct ? 1 : std::max(1, po.rollout_engines);
  b.threads_per_engine = direct ? process_threads : std::max(1, rollout_threads / b.rollout_engines);
  if (po.Lending()) {
    b.trainer_workers = po.trainer_threads;
    b.lent_workers = po.rollout_threads;
  } else {
    b.trainer_workers = rl.trainer.micro_batch_threads;
  }
  b.threads_per_worker = b.trainer_workers + b.lent_workers > 1 ? 1 : trainer_threads;
  b.trainer_ranks = direct ? 1 : std::max(1, po.trainer_ranks);
  const int32_t rollout = b.rollout_replicas * b.rollout_engines * b.threads_per_engine,
                trainer = b.trainer_ranks * b.trainer_workers * b.threads_per_worker;
  b.max_busy = b.roles_alternate ? std::max(rollout, trainer + b.lent_workers) : rollout + trainer;
  return b;
}

std::string ThreadBudget::ToString() const {
  auto n = [](int32_t k, const char* what) { return std::to_string(k) + " " + what + (k == 1 ? "" : "s"); };
  std::string out = "rollout " + (rollout_replicas > 1 ? n(rollout_replicas, "replica") + " x " : "") +
                    n(rollout_engines, "engine") + " x " + n(threads_per_engine, "thread") + ", trainer " +
                    (trainer_ranks > 1 ? n(trainer_ranks, "rank") + " x " : "") + n(trainer_workers, "worker") + " x " +
                    n(threads_per_worker, "thread");
  if (lent_workers > 0) out += " + " + n(lent_workers, "worker") + " on the rollout's cores while it idles";
  out += roles_alternate ? " (roles alternate)" : " (roles overlap)";
  return out + ": at most " + std::to_string(max_busy) + " busy";
}

namespace {
constexpr const char* kPipelineRoleNames[] = {"trainer", "rollout", "reward"};
static_assert(std::size(kPipelineRoleNames) == static_cast<size_t>(PipelineRole::kReward) + 1);
}  // namespace

Result<PipelineRole> ParsePipelineRole(const std::string& name) {
  if (std::optional<PipelineRole> role = EnumNamed<PipelineRole>(kPipelineRoleNames, name)) return *role;
  return Status::InvalidArgument("pipeline role '" + name + "' is not one of {trainer, rollout, reward}");
}

void AddRoleFlags(runtime::FlagSet& flags) {
  flags.Add("role", "", "internal: run one role (trainer, rollout, reward) of a launcher's run");
  flags.Add("hub", "", "internal (--role): the run's TransferQueue endpoint");
  flags.Add("weights", "", "internal (--role): the run's weight store");
  flags.Add("health", "", "internal (--role): the run's health and control segment (RunHealth)");
  flags.Add("start-step", "0", "internal (--role): the RL step the run starts at");
  flags.Add("start-version", "0", "internal (--role): the weight version the run starts at");
  flags.Add("trainer-rank", "0", "internal (--role=trainer): this trainer rank (pipeline.trainer_ranks > 1)");
  flags.Add("replica", "0", "internal (--role=rollout/reward): this rollout replica's or reward worker's index");
  flags.Add("health-slot", "-1", "internal (--role): this process's slot in the run's health (-1: its role's)");
  flags.Add("trainer-store", "", "internal (--role=trainer): the trainer ranks' store (HOST:PORT, or file:PATH)");
  flags.Add("trainer-store-prefix", "", "internal (--role=trainer): where the ranks' keys live in that store");
  flags.Add("trainer-ranks", "0",
            "internal (--role=trainer): the run's trainer ranks when a launcher placed them (0: the config's)");
}

Result<std::optional<RoleConnection>> RoleFromFlags(const runtime::FlagSet& flags) {
  SLUICE_ASSIGN_OR_RETURN(const std::string role, flags.GetString("role"));
  if (role.empty()) return std::optional<RoleConnection>();
  RoleConnection c;
  SLUICE_ASSIGN_OR_RETURN(c.role, ParsePipelineRole(role));
  SLUICE_ASSIGN_OR_RETURN(c.hub, flags.GetString("hub"));
  SLUICE_ASSIGN_OR_RETURN(c.weights, flags.GetString("weights"));
  SLUICE_ASSIGN_OR_RETURN(c.health, flags.GetString("health"));
  SLUICE_ASSIGN_OR_RETURN(c.start_step, flags.GetInt("start-step", 0, INT64_MAX));
  SLUICE_ASSIGN_OR_RETURN(c.start_version, flags.GetInt("start-version", 0, INT64_MAX));
  SLUICE_ASSIGN_OR_RETURN(c.trainer_rank, flags.GetInt("trainer-rank", 0, 255));
  SLUICE_ASSIGN_OR_RETURN(c.trainer_store, flags.GetString("trainer-store"));
  SLUICE_ASSIGN_OR_RETURN(c.trainer_store_prefix, flags.GetString("trainer-store-prefix"));
  SLUICE_ASSIGN_OR_RETURN(c.replica, flags.GetInt("replica", 0, 63));
  SLUICE_ASSIGN_OR_RETURN(c.health_slot, flags.GetInt("health-slot", -1, 1 << 20));
  SLUICE_ASSIGN_OR_RETURN(c.trainer_ranks, flags.GetInt("trainer-ranks", 0, 256));
  if (const char* token = std::getenv(kHubTokenVariable); token != nullptr) c.hub_token = token;
  if (c.hub.empty() || c.weights.empty() || c.health.empty()) {
    return Status::InvalidArgument("--role needs --hub, --weights and --health (it is started by a launcher)");
  }
  return std::optional<RoleConnection>(std::move(c));
}

std::string PipelineProcessTitle(PipelineRole role, int64_t index) {
  const char* kind = role == PipelineRole::kTrainer   ? "trainer rank "
                     : role == PipelineRole::kRollout ? "rollout replica "
                                                      : "reward worker ";
  return kind + std::to_string(index);
}

std::string PipelineRoleName(PipelineRole role) { return EnumName(kPipelineRoleNames, role); }

}  // namespace sluice::pipeline
