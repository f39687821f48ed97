#include "sluice/pipeline/options_table.h"

#include <algorithm>
#include <cstdint>

namespace sluice::pipeline {
namespace {

// The keys of the run, the model, the task and the warm start.
void AddRunKeys(runtime::ConfigTable<RunOptions>& t) {
  t.String("run.dir", "runs/arithmetic", "run directory: metrics.jsonl, config.yaml, sft/, checkpoints/, final/",
           SLUICE_FIELD(run_dir));
  t.Int("run.seed", 0, 0, INT64_MAX, "seed of everything random: data order, sampling, model init", SLUICE_FIELD(seed));
  t.Bool("run.resume", false, "continue from run.dir/checkpoints/latest (and reuse run.dir/sft)", SLUICE_FIELD(resume));
  t.String("run.metrics_listen", "",
           "streaming modes: serve live counters in Prometheus's text format at http://HOST:PORT/metrics (e.g. "
           "127.0.0.1:9400; port 0: any free port, logged); empty: off",
           SLUICE_FIELD(metrics_listen));
  t.Bool("run.metrics_allow_non_loopback", false,
         "run.metrics_listen may be an address beyond loopback (e.g. 0.0.0.0:9400), where anyone who reaches it "
         "reads the counters without authentication",
         SLUICE_FIELD(metrics_allow_non_loopback));
  t.Bool("run.trace", false,
         "streaming modes: record every role's timeline (decode steps, hub calls, scoring, training steps, "
         "publishes) to run.dir/trace.json, Chrome trace-event JSON for ui.perfetto.dev or chrome://tracing",
         SLUICE_FIELD(trace));
  t.String("model.path", "", "initial checkpoint (Hugging Face layout); empty: a fresh model.preset",
           SLUICE_FIELD(tokenizer_dir));
  t.Declare().AddString(
      "model.device", "auto",
      "where the trainer and the rollout run: auto (cuda when a GPU is usable, else cpu), cpu, cuda, cuda:N");
  t.Enum("task.chat_template", "auto", {"auto", "none"},
         "auto: prompts go through the chat template of model.path's tokenizer_config.json when it has one "
         "(as the user's message, with the generation prompt); none: the prompt text as it is",
         SLUICE_FIELD(prompts.chat_template));
  t.String("task.system_prompt", "", "with a chat template: a system message before every prompt (empty: none)",
           SLUICE_FIELD(prompts.system_prompt));
  t.Enum("task.enable_thinking", "auto", {"auto", "true", "false"},
         "with a chat template: the enable_thinking variable (Qwen3's thinking switch); auto: not set",
         SLUICE_FIELD(prompts.enable_thinking));
  t.Int("sft.steps", 0, 0, 10000000, "supervised warm-start steps on the task's solutions (0: none)",
        SLUICE_FIELD(sft.steps));
  t.Int("sft.batch_size", 64, 1, 1000000, "examples per warm-start step", SLUICE_FIELD(sft.batch_size));
  t.Double("sft.shortcut_fraction", 0.0, 0.0, 1.0,
           "fraction of warm-start targets that give only the final answer, without the worked solution",
           SLUICE_FIELD(sft.shortcut_fraction));
  t.Double("sft.tool_call_fraction", 0.0, 0.0, 1.0,
           "agent runs with agent.env=calculator: fraction of warm-start examples that call the tool (the rest answer "
           "at once)",
           SLUICE_FIELD(sft.tool_call_fraction));
  t.Double("sft.lr", 1e-3, 0.0, 10.0, "warm-start learning rate", SLUICE_FIELD(sft.optimizer.lr));
  t.Int("sft.warmup_steps", 20, 0, 10000000, "warm-start linear warm-up steps",
        SLUICE_FIELD(sft.optimizer.warmup_steps));
}

// The keys of RL sampling and the trainer.
void AddRlKeys(runtime::ConfigTable<RunOptions>& t) {
  t.Int("rl.steps", 100, 0, 10000000, "RL steps (one batch of prompts each)", SLUICE_FIELD(rl.steps));
  t.Int("rl.prompts_per_step", 16, 1, 1000000, "prompts per RL step", SLUICE_FIELD(rl.prompts_per_step));
  t.Int("rl.group_size", 8, 1, 100000, "answers sampled per prompt (GRPO group; >= 2)", SLUICE_FIELD(rl.group_size));
  t.Double("rl.temperature", 1.0, 0.0, 100.0, "rollout sampling temperature", SLUICE_FIELD(rl.sampling.temperature));
  t.Int("rl.top_k", 0, 0, 1000000000, "rollout top-k (0 = off)", SLUICE_FIELD(rl.sampling.top_k));
  t.Double("rl.top_p", 1.0, 1e-9, 1.0, "rollout nucleus mass (1 = off)", SLUICE_FIELD(rl.sampling.top_p));
  t.Int("rl.max_new_tokens", 96, 1, 1000000, "response length limit", SLUICE_FIELD(rl.sampling.max_new_tokens));
  t.Int("rl.slots", 64, 1, 100000, "rollout engine slots (continuous batching)", SLUICE_FIELD(rl.rollout_slots));
  t.Bool("rl.dynamic_sampling", false, "drop groups whose rewards are all equal (no learning signal)",
         SLUICE_FIELD(rl.dynamic_sampling));
  t.Bool("rl.adv_divide_by_std", true, "GRPO: divide centered rewards by the group's std",
         SLUICE_FIELD(rl.divide_adv_by_std));
  t.Double("trainer.lr", 1e-4, 0.0, 10.0, "RL learning rate", SLUICE_FIELD(rl.trainer.optimizer.lr));
  t.Double("trainer.weight_decay", 0.0, 0.0, 10.0, "AdamW decoupled weight decay",
           SLUICE_FIELD(rl.trainer.optimizer.weight_decay));
  t.Double("trainer.max_grad_norm", 1.0, 0.0, 1e9, "gradient clipping (0 = off)",
           SLUICE_FIELD(rl.trainer.optimizer.max_grad_norm));
  t.Int("trainer.warmup_steps", 0, 0, 10000000, "linear learning-rate warm-up (optimizer steps)",
        SLUICE_FIELD(rl.trainer.optimizer.warmup_steps));
  t.Declare().AddEnum("trainer.lr_schedule", "constant", {"constant", "cosine"},
                      "after warm-up: constant, or cosine decay over the run");
  t.Double("trainer.min_lr_ratio", 0.1, 0.0, 1.0, "cosine: final learning rate / lr",
           SLUICE_FIELD(rl.trainer.optimizer.min_lr_ratio));
  t.Int("trainer.micro_batch_tokens", 8192, 1, 100000000,
        "padded tokens per forward/backward (gradient accumulation beyond)",
        SLUICE_FIELD(rl.trainer.micro_batch_tokens));
  t.Int("trainer.micro_batch_threads", 1, 1, 256,
        "micro-batches computed at once, one single-threaded worker each (1: sequential and deterministic)",
        SLUICE_FIELD(rl.trainer.micro_batch_threads));
  t.Int("trainer.mini_batches", 1, 1, 100000, "optimizer steps per RL batch", SLUICE_FIELD(rl.trainer.mini_batches));
  t.Int("trainer.ppo_epochs", 1, 1, 1000, "passes over each RL batch", SLUICE_FIELD(rl.trainer.ppo_epochs));
  t.Double("trainer.clip_low", 0.2, 0.0, 0.999, "PPO ratio clip below: 1 - clip_low",
           SLUICE_FIELD(rl.trainer.loss.clip_low));
  t.Double("trainer.clip_high", 0.2, 0.0, 100.0, "PPO ratio clip above: 1 + clip_high",
           SLUICE_FIELD(rl.trainer.loss.clip_high));
  t.Choice<trainer::LossAggregation>(
      "trainer.loss_agg", "token-mean",
      {{"token-mean", trainer::LossAggregation::kTokenMean}, {"seq-mean", trainer::LossAggregation::kSequenceMean}},
      "loss aggregation", SLUICE_FIELD(rl.trainer.loss.aggregation));
  t.Double("trainer.kl_coef", 0.0, 0.0, 1000.0, "KL penalty to the frozen starting policy (0 = off)",
           SLUICE_FIELD(rl.trainer.loss.kl_coef));
  t.Choice<trainer::KlEstimator>("trainer.kl_estimator", "k3",
                                 {{"k1", trainer::KlEstimator::kK1}, {"k3", trainer::KlEstimator::kK3}}, "KL estimator",
                                 SLUICE_FIELD(rl.trainer.loss.kl_estimator));
  t.Declare().AddEnum(
      "trainer.off_policy_correction", "auto", {"auto", "none", "decoupled", "tis", "seq-tis", "behavior"},
      "stale samples: weighted by pi_prox/pi_behav (decoupled PPO, truncated IS per token or per sequence), or "
      "behavior: PPO clipped around the policy that sampled them; auto: behavior in one_step_off/async "
      "(samples may be stale), none otherwise");
  t.Double("trainer.is_cap", 2.0, 1e-6, 1e6,
           "cap on the behaviour importance weight (decoupled: tokens above are masked)",
           SLUICE_FIELD(rl.trainer.loss.is_cap));
  t.Declare().AddEnum(
      "trainer.recompute_old_logprobs", "auto", {"auto", "true", "false"},
      "recompute the proximal logprobs on the trainer before each update (one forward pass); auto: yes, "
      "except with the behavior correction, whose loss does not use them (then the rollout_logprob_gap "
      "metrics are not measured)");
  t.Bool("trainer.overlap_gradient_sum", true,
         "with pipeline.trainer_ranks > 1 on CPU: send each bucket of gradients to be summed over the ranks as soon "
         "as the mini-batch's backward passes have all accumulated into it, while they go on with the rest; false: "
         "one sum after the passes",
         SLUICE_FIELD(rl.trainer.overlap_gradient_sum));
  t.Enum("trainer.precision", "auto", {"auto", "float32", "bf16-mixed"},
         "bf16-mixed: forward passes under bfloat16 autocast on float32 master weights (CUDA only); auto: "
         "bf16-mixed on CUDA, float32 on CPU",
         SLUICE_FIELD(devices.trainer_precision));
}

// The keys of the pipeline and the cluster.
void AddPipelineKeys(runtime::ConfigTable<RunOptions>& t) {
  t.Choice<PipelineMode>(
      "pipeline.mode", "direct",
      {{"direct", PipelineMode::kDirect},
       {"sync", PipelineMode::kSync},
       {"one_step_off", PipelineMode::kOneStepOff},
       {"async", PipelineMode::kAsync}},
      "direct: one loop, no hub; sync/one_step_off/async: rollout, reward and trainer roles over the "
      "TransferQueue with max staleness 0/1/pipeline.max_staleness",
      SLUICE_FIELD(pipeline.mode));
  t.Int("pipeline.max_staleness", 2, 0, 1000, "async: weight versions a sample may lag the trainer",
        SLUICE_FIELD(pipeline.max_staleness));
  t.Int("pipeline.sync_interval", 1, 1, 1000000, "trainer steps per published weight version",
        SLUICE_FIELD(pipeline.sync_interval));
  t.Choice<rollout::SwitchPolicy>(
      "pipeline.switch", "in_flight",
      {{"in_flight", rollout::SwitchPolicy::kInFlight}, {"at_boundary", rollout::SwitchPolicy::kAtBoundary}},
      "rollout weight switch: in_flight (sequences continue on new weights) or at_boundary (finish first)",
      SLUICE_FIELD(pipeline.switch_policy));
  t.Int("pipeline.rollout_threads", 0, 0, 1024, "intra-op threads of the rollout role (0: run.threads)",
        SLUICE_FIELD(pipeline.rollout_threads));
  t.Int("pipeline.trainer_threads", 0, 0, 1024, "intra-op threads of the trainer role (0: run.threads)",
        SLUICE_FIELD(pipeline.trainer_threads));
  t.Declare().AddString("pipeline.trainer_device", "", "the trainer's device (empty: model.device)");
  t.Declare().AddString(
      "pipeline.rollout_device", "",
      "streaming modes: the rollout's device (empty: model.device; direct mode uses the trainer's model)");
  t.Enum(
      "pipeline.rollout_dtype", "auto", {"auto", "float32", "bfloat16"},
      "streaming modes: the rollout's weights and KV cache (auto: bfloat16 on CUDA, float32 on CPU; bfloat16 on CPU: "
      "bfloat16 matrices, float32 arithmetic and KV cache)",
      SLUICE_FIELD(devices.rollout_dtype));
  t.Int("pipeline.rollout_engines", 1, 1, 1024,
        "rollout engines, data parallel, each on rollout_threads / rollout_engines threads with its share of "
        "rl.slots",
        SLUICE_FIELD(pipeline.rollout_engines));
  t.Bool("pipeline.processes", false,
         "streaming modes: run the trainer, rollout and reward roles as separate processes (hub and weights "
         "over shared memory), supervised by this one; Ctrl-C stops them all",
         SLUICE_FIELD(pipeline.processes));
  t.String("pipeline.trainer_command", "",
           "pipeline.processes: a shell command that runs the trainer role instead of Sluice's trainer (e.g. a "
           "Python trainer); it reads the run's hub, weight store and settings from $SLUICE_RUN_INFO",
           SLUICE_FIELD(pipeline.trainer_command));
  t.Int("pipeline.trainer_ranks", 1, 1, 256,
        "pipeline.processes: trainer processes, data parallel (gradients all-reduced over Gloo; each trains its "
        "shard of every mini-batch on pipeline.trainer_threads threads); rank 0 publishes and checkpoints",
        SLUICE_FIELD(pipeline.trainer_ranks));
  t.Int("pipeline.rollout_replicas", 1, 0, 64,
        "pipeline.processes: rollout processes on this host, each with its own model copy, rollout_engines and "
        "rollout_threads, taking prompts from one stream under one staleness bound (0: only with "
        "cluster.rollout_ranks)",
        SLUICE_FIELD(pipeline.rollout_replicas));
  t.Int("cluster.rollout_ranks", 0, 0, 64,
        "launched by torchrun, srun or mpirun: how many of the launched processes (the ranks after the trainer "
        "ranks) are rollout replicas, one each, calling the hub over TCP and receiving the weights over the "
        "CheckpointEngine broadcast",
        SLUICE_FIELD(pipeline.remote_rollout_replicas));
  t.Int("cluster.reward_ranks", 0, 0, 64,
        "launched by torchrun, srun or mpirun: how many of the launched processes (the ranks after the rollout "
        "ranks) are reward workers, one each, scoring answers through the hub over TCP",
        SLUICE_FIELD(pipeline.remote_reward_workers));
  t.Int("cluster.storage_ranks", 0, 0, 64,
        "launched by torchrun, srun or mpirun: how many of the launched processes (the last ranks, after the "
        "reward ranks) each serve one of the hub's storage units, so the bytes of the hub's rows are spread over "
        "them and rank 0's host (one unit each)",
        SLUICE_FIELD(pipeline.remote_storage_units));
  t.Int("pipeline.reward_workers", 1, 0, 64,
        "pipeline.processes: reward processes on this host scoring answers from the hub (0: only with "
        "cluster.reward_ranks)",
        SLUICE_FIELD(pipeline.reward_workers));
  t.Int("pipeline.worker_lease_seconds", 30, 1, 86400,
        "how long a rollout replica or reward worker holds a prompt or answer between lease renewals (every "
        "third of it); what a dead one held goes to the others when the launcher sees it die, or after this "
        "when it hangs",
        SLUICE_FIELD(pipeline.worker_lease_seconds));
  t.Int("pipeline.max_restarts", 0, 0, 100,
        "pipeline.processes: a rollout replica or reward worker that fails or dies is started again alone, "
        "a failing trainer rank restarts every role from the latest checkpoint; each up to this many times "
        "(back-off 1-30 s); 0: a failure ends the run",
        SLUICE_FIELD(pipeline.max_restarts));
  t.Int("pipeline.rank_timeout_seconds", 600, 1, 86400,
        "trainer ranks: how long they wait for each other to meet and in each collective; a dead or "
        "unreachable rank ends the run after this",
        SLUICE_FIELD(pipeline.rank_timeout_seconds));
  t.Choice<TrainOrder>(
      "pipeline.train_order", "prompt", {{"prompt", TrainOrder::kPrompt}, {"completion", TrainOrder::kCompletion}},
      "streaming trainer: each step's own prompts in order (the direct loop's batches), or whole groups as "
      "they complete (sync only: refused where samples may be stale)",
      SLUICE_FIELD(pipeline.train_order));
  t.Bool("pipeline.lend_idle_cores", true,
         "one_step_off/async with both thread counts set: the rollout's cores train while the rollout idles",
         SLUICE_FIELD(pipeline.lend_idle_cores));
  t.Int("pipeline.lease_seconds", 600, 1, 604800,
        "streaming trainer: how long it may hold a group before acking it (it acks after the step's update); "
        "a trainer that dies leaves its groups to be delivered again after this",
        SLUICE_FIELD(pipeline.lease_seconds));
  t.Int("pipeline.stall_seconds", 300, 0, 604800,
        "pipeline.processes: report a role that makes no progress for this long (no decode step, hub poll or "
        "training step), naming it and its process state; 0: never",
        SLUICE_FIELD(pipeline.stall_seconds));
  t.Bool("pipeline.hub_fast_paths", true,
         "pipeline.processes: role processes call the hub through shared-memory rings (same host) or direct TCP "
         "connections; false: every call through its ZeroMQ socket (slower; for comparison)",
         SLUICE_FIELD(pipeline.hub_fast_paths));
  t.Int("pipeline.stall_start_seconds", 60, 1, 604800,
        "pipeline.processes: the silence a role may keep before its first turn (its start: the model, the hub; a "
        "trainer command's first ack or publish) when longer than pipeline.stall_seconds",
        SLUICE_FIELD(pipeline.stall_start_seconds));
  t.Bool("pipeline.stop_on_stall", false,
         "pipeline.processes: stop the run with an error when a role stalls (pipeline.stall_seconds), instead "
         "of only reporting it",
         SLUICE_FIELD(pipeline.stop_on_stall));
}

// The keys of evaluation and checkpoints.
void AddEvalKeys(runtime::ConfigTable<RunOptions>& t) {
  t.Int("eval.interval", 20, 0, 10000000, "RL steps between held-out evaluations (0: start and end only)",
        SLUICE_FIELD(eval.interval));
  t.Int("eval.size", 200, 1, 1000000, "held-out examples per evaluation (greedy decoding)", SLUICE_FIELD(eval.size));
  t.Int("eval.max_new_tokens", 96, 1, 1000000, "held-out response length limit", SLUICE_FIELD(eval.max_new_tokens));
  t.Int("eval.samples", 0, 0, 1024,
        "also sample this many answers per held-out example (RL sampling settings) and report their accuracy",
        SLUICE_FIELD(eval.samples));
  t.Int("checkpoint.interval", 50, 0, 10000000, "RL steps between checkpoints (0: end only)",
        SLUICE_FIELD(checkpoint_interval));
}

void AddAgentKeys(runtime::ConfigTable<RunOptions>& t) {
  t.String("agent.env", "",
           "multi-turn rollouts against an environment (docs/agents.md): calculator or python (the built-in tools), "
           "module:Class or path/to/file.py:Class (a Python environment); empty: one answer per prompt",
           SLUICE_FIELD(agent.env));
  t.Map("agent.env_config",
        "a Python environment's constructor argument (a dict); for python, the sandbox's "
        "limits; for calculator, offer_tool (docs/agents.md)",
        SLUICE_FIELD(agent.env_config));
  t.String("agent.python_executable", "python3",
           "a Python environment's interpreter (searched on PATH when it has no '/')",
           SLUICE_FIELD(agent.python_executable));
  t.Int("agent.max_turns", 8, 1, 1000, "model turns per trajectory", SLUICE_FIELD(agent.max_turns));
  t.Int("agent.max_tokens", 0, 0, 1 << 20, "a trajectory's tokens, opening included (0: the model's context)",
        SLUICE_FIELD(agent.max_tokens));
  t.Int("agent.env_workers", 4, 1, 1024, "environment calls running at once, per rollout engine",
        SLUICE_FIELD(agent.env_workers));
  t.Double("agent.env_timeout_seconds", 60, 0.001, 86400,
           "one environment call (reset or step): past it, the "
           "trajectory ends (env_timeout)",
           SLUICE_FIELD(agent.env_timeout_seconds));
  t.Double("agent.max_env_seconds", 600, 0.001, 864000, "a trajectory's environment calls together (env_time)",
           SLUICE_FIELD(agent.max_env_seconds));
  t.Int("agent.max_message_bytes", 8192, 16, 1 << 24, "an environment message's content; cut past it",
        SLUICE_FIELD(agent.max_message_bytes));
  t.Int("agent.kept_cache_mib", 256, 0, 1 << 20,
        "per rollout engine: MiB of keys and values kept for trajectories waiting for their environment (past it, "
        "the oldest are dropped and prefilled again; 0: none kept)",
        SLUICE_FIELD(agent.kept_cache_mib));
  t.Enum("agent.tool_call_format", "auto", {"auto", "hermes", "llama3"},
         "how the model writes tool calls: auto (llama3 for Llama models, else hermes: <tool_call>{json}</tool_call>)",
         SLUICE_FIELD(agent.tool_call_format));
}

runtime::ConfigTable<RunOptions> BuildTable() {
  runtime::ConfigTable<RunOptions> t;
  AddRunKeys(t);
  AddRlKeys(t);
  AddPipelineKeys(t);
  AddEvalKeys(t);
  AddAgentKeys(t);
  return t;
}

}  // namespace

const runtime::ConfigTable<RunOptions>& RunOptionsTable() {
  static const runtime::ConfigTable<RunOptions>* table = new runtime::ConfigTable<RunOptions>(BuildTable());
  return *table;
}

Result<RunOptions> RunOptionsFromConfig(const runtime::Config& c) {
  RunOptions o;
  RunOptionsTable().Apply(c, &o);
  o.sft.optimizer.decay_steps = std::max<int64_t>(0, o.sft.steps - o.sft.optimizer.warmup_steps);
  trainer::TrainerOptions& t = o.rl.trainer;
  const int64_t opt_steps = o.rl.steps * t.mini_batches * t.ppo_epochs;
  t.optimizer.decay_steps =
      c.GetString("trainer.lr_schedule") == "cosine" ? std::max<int64_t>(1, opt_steps - t.optimizer.warmup_steps) : 0;
  const std::string correction = c.GetString("trainer.off_policy_correction");
  if (correction == "auto") {
    // PPO clipped around the behaviour policy where samples may be stale:
    // at parity with sync at staleness 2 on the current warm start, where
    // token-level TIS fell behind on some seeds (docs/pipeline.md).
    const bool may_be_stale = o.pipeline.mode == PipelineMode::kOneStepOff ||
                              (o.pipeline.mode == PipelineMode::kAsync && o.pipeline.max_staleness > 0);
    t.loss.correction = may_be_stale ? trainer::OffPolicyCorrection::kBehavior : trainer::OffPolicyCorrection::kNone;
  } else {
    SLUICE_ASSIGN_OR_RETURN(t.loss.correction, trainer::ParseOffPolicyCorrection(correction));
  }
  const std::string recompute = c.GetString("trainer.recompute_old_logprobs");
  t.recompute_old_logprobs =
      recompute == "true" || (recompute == "auto" && t.loss.correction != trainer::OffPolicyCorrection::kBehavior);
  t.temperature = o.rl.sampling.temperature > 0 ? o.rl.sampling.temperature : 1.0f;
  const std::string device = c.GetString("model.device");
  const std::string trainer_device = c.GetString("pipeline.trainer_device");
  const std::string rollout_device = c.GetString("pipeline.rollout_device");
  o.devices.trainer = trainer_device.empty() ? device : trainer_device;
  // The direct loop generates with the trainer's model.
  o.devices.rollout = !rollout_device.empty()                    ? rollout_device
                      : o.pipeline.mode == PipelineMode::kDirect ? o.devices.trainer
                                                                 : device;
  SLUICE_RETURN_IF_ERROR(o.Validate());
  return o;
}

}  // namespace sluice::pipeline
