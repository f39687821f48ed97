// What a training run is asked to do: the supervised warm start, the RL
// steps, the held-out evaluation and how rollout and training are joined
// (the pipeline mode). Each field's config key is in docs/config.md; the
// command-line front end fills these from a YAML config
// (src/launch/train_command.cc). Test and benchmark hooks are not options:
// they are in hooks.h.
#ifndef SLUICE_PIPELINE_OPTIONS_H_
#define SLUICE_PIPELINE_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/rollout/engine.h"
#include "sluice/trainer/types.h"

namespace sluice::pipeline {

struct SftOptions {
  int64_t steps = 0;        // 0: no warm start
  int64_t batch_size = 64;  // examples per step
  // Fraction of warm-start examples whose target is only the final answer
  // ("#42") instead of the worked solution: a base policy that often answers
  // without working it out, as pretrained models do. RL can then learn from
  // reward alone that working it out pays. 0: every target is worked.
  double shortcut_fraction = 0.0;
  // Agent runs with the calculator (agent.env=calculator): the fraction of
  // warm-start examples that are conversations calling the tool (the
  // problem as its expression, the tool's answer, then the final answer);
  // the others answer at once. 0: none calls it.
  double tool_call_fraction = 0.0;
  trainer::OptimizerOptions optimizer;
};

struct RlOptions {
  int64_t steps = 100;
  int64_t prompts_per_step = 16;
  int64_t group_size = 8;            // answers per prompt (GRPO group), >= 2
  rollout::SamplingParams sampling;  // temperature etc.; seeds are set per sample
  int32_t rollout_slots = 64;
  bool dynamic_sampling = false;  // drop groups whose rewards are all equal
  bool divide_adv_by_std = true;
  trainer::TrainerOptions trainer;
};

struct EvalOptions {
  int64_t interval = 20;  // RL steps between evaluations (0: only before and after)
  int64_t size = 200;     // eval examples (<= the task's eval split)
  int32_t max_new_tokens = 96;
  // > 0: also sample this many answers per example with the RL sampling
  // settings and report their mean accuracy (what the policy does when it
  // samples, next to what its greedy answer does).
  int64_t samples = 0;
};

// How rollout and training are joined (docs/pipeline.md).
enum class PipelineMode {
  kDirect,      // one thread: generate a step's answers, score, train, repeat (no hub)
  kSync,        // rollout, reward and trainer roles over the TransferQueue, max_staleness 0
  kOneStepOff,  // the same, max_staleness 1: rollout generates step n+1 while step n trains
  kAsync,       // the same, max_staleness = pipeline.max_staleness
};
Result<PipelineMode> ParsePipelineMode(const std::string& name);  // direct, sync, one_step_off, async
std::string PipelineModeName(PipelineMode mode);

// The order the streaming trainer takes whole groups in.
enum class TrainOrder {
  // As they complete: the least waiting, but a step over-represents groups
  // that finish quickly and defers long ones to the staleness limit (it hurt
  // learning in the parity study, docs/pipeline.md).
  kCompletion,
  // The step's own prompts (step * P ...), later ones kept until their step:
  // the batches of the direct loop, each stale by at most the bound.
  kPrompt,
};
// kCompletion is refused when samples may be stale (one_step_off, async):
// admission bounds how far a prompt's start runs ahead of the trainer, but
// in completion order a long answer can be outlasted by any number of steps
// of short ones, so no staleness bound would hold.

// How this process is wired into its run: set by the command-line front end
// and the launchers it runs under (torchrun, Slurm, Open MPI), never by a
// config key.
struct LaunchWiring {
  // How to start a role process: this program's path and the arguments that
  // make it run `TrainingRun::RunRole` with this run's config; the launcher
  // appends --role=..., --hub=..., --weights=..., --health=... (see
  // RoleConnection).
  std::vector<std::string> role_command;
  // Where the ranks are, when a launcher (torchrun, Slurm, Open MPI) started
  // one `sluice train` per rank (set by the front end from the launcher's
  // variables, not config keys): the ranks' store at HOST:PORT (empty: this
  // launcher serves one on loopback), whether the launcher's agent serves
  // it already, how many ranks this process starts itself (0: all; the
  // others run in the launched processes), and the hub's bind (empty:
  // loopback; then a token is required and passed on).
  std::string trainer_store;
  bool trainer_store_external = false;
  // Where the ranks' keys live in that store (DataParallelOptions::
  // key_prefix; empty: the default): one namespace per torchrun restart
  // attempt, since torchrun's agent store outlives the attempts.
  std::string trainer_store_prefix;
  // The namespace of the attempt before this one (a torchrun restart; empty
  // for the first): a process elsewhere waits for rank 0 to end that attempt
  // before it waits for this one's (AwaitPreviousAttempt).
  std::string previous_store_prefix;
  int32_t local_trainer_ranks = 0;
  std::string hub_bind;
  // A digest of the run's config, which every launched rank must share.
  std::string config_digest;
  // model.path as this process reads it (empty: a preset): the files there
  // must be rank 0's (model::ModelFilesDigests) on every host.
  std::string model_path;
};

struct PipelineOptions {
  PipelineMode mode = PipelineMode::kDirect;
  int64_t max_staleness = 2;  // kAsync only; >= 0
  int64_t sync_interval = 1;  // trainer steps per published weight version, >= 1
  rollout::SwitchPolicy switch_policy = rollout::SwitchPolicy::kInFlight;
  // Intra-op threads of each role (0: the process setting). Give the roles
  // the same total in every mode for a fair comparison.
  int32_t rollout_threads = 0;
  int32_t trainer_threads = 0;
  // Rollout engines, data parallel: each on its own thread with
  // rollout_threads / rollout_engines intra-op threads and its share of
  // rl.rollout_slots, all taking prompts from the same stream. On CPUs two
  // single-threaded engines generate ~1.6x one two-threaded engine
  // (docs/design.md, libtorch on CPU).
  int32_t rollout_engines = 1;
  // pipeline.processes: rollout processes (replicas), each with its own copy
  // of the model, its rollout_engines engines and rollout_threads threads,
  // all taking prompts from the hub's one stream under one staleness bound;
  // and reward processes (workers) scoring answers from the hub. A replica
  // or worker that dies leaves what it held to the others: the launcher
  // releases its leases as soon as it sees the process gone (else they run
  // out, worker_lease_seconds); with max_restarts it starts it again.
  // 0 only with replicas (workers) on other hosts, below.
  int32_t rollout_replicas = 1;
  int32_t reward_workers = 1;
  // Rollout replicas on other hosts (cluster.rollout_ranks, set by the front
  // end from a launch): launched processes that call the hub over TCP and
  // receive each weight version over the CheckpointEngine broadcast, which
  // the launcher relays from this host's weight store. They share the
  // prompt stream and the staleness bound with the replicas here.
  int32_t remote_rollout_replicas = 0;
  int32_t AllRolloutReplicas() const { return rollout_replicas + remote_rollout_replicas; }
  // Reward workers on other hosts (cluster.reward_ranks): launched
  // processes scoring answers through the hub over TCP.
  int32_t remote_reward_workers = 0;
  int32_t AllRewardWorkers() const { return reward_workers + remote_reward_workers; }
  // Hub storage units on other hosts (cluster.storage_ranks): launched
  // processes that each serve one of the hub's storage units (a
  // TransferQueue storage server); the hub then has one unit on this host
  // and one on each of them, rows spread over them by id.
  int32_t remote_storage_units = 0;
  // Whether processes on other hosts take part (trainer ranks, replicas, workers or storage).
  bool HasRemoteProcesses() const {
    return (wiring.local_trainer_ranks > 0 && wiring.local_trainer_ranks < trainer_ranks) ||
           remote_rollout_replicas > 0 || remote_reward_workers > 0 || remote_storage_units > 0;
  }
  // How long a rollout replica holds a prompt, and a reward worker an
  // answer, without renewing the lease; live ones renew every third of it.
  // What a dead one held goes to the others when the launcher sees it die,
  // or after at most this (a process that hangs without dying).
  int64_t worker_lease_seconds = 30;
  // one_step_off and async with both thread counts set: the trainer computes
  // micro-batches on trainer_threads + rollout_threads single-threaded
  // workers, the rollout's only while the rollout is idle (no sequence to
  // decode, waiting for admission): an idle stage's cores help the busy one.
  // The rollout takes its cores back before its next decode step (it waits
  // for the lent workers' current micro-batches), so the run never has more
  // busy threads than rollout_threads + trainer_threads. Not in sync, where
  // the roles alternate and each already has every core.
  bool lend_idle_cores = true;
  TrainOrder train_order = TrainOrder::kPrompt;
  // Streaming modes: the trainer leases each group from the hub for this
  // long and acks it only after the update that trained it is applied and
  // published, so a trainer that dies mid-step leaves its groups to be
  // delivered again when the lease runs out. Must cover a group's wait for
  // its step (up to max_staleness + 1 steps) plus the step itself.
  int64_t lease_seconds = 600;
  // pipeline.processes: the launcher's watchdog. A role that goes this long
  // without a turn of its loop (a decode step, a poll of the hub, a training
  // step: each takes well under a second on the built-in models) is reported
  // by name, pid and process state; with stop_on_stall the run then stops
  // with an error. 0: no watchdog.
  int64_t stall_seconds = 300;
  bool stop_on_stall = false;
  // The silence a role may keep before its first turn (exec, libtorch, the
  // model, the hub and the weight store; a trainer command's first ack or
  // publish), when longer than stall_seconds. Raise it for a model that
  // loads slowly.
  int64_t stall_start_seconds = 60;
  // pipeline.processes: role processes on the hub's host call it through
  // shared-memory rings, others through direct TCP connections (the
  // TransferQueue's fast paths); false: every call through the hub's ZeroMQ
  // socket, as before they existed (pipeline_bench compares the two).
  bool hub_fast_paths = true;
  // Streaming modes: run the trainer, rollout and reward roles each as its
  // own OS process (hub and weights over shared memory), started and
  // supervised by this process, instead of as threads of it. Needs
  // wiring.role_command.
  bool processes = false;
  // pipeline.processes: a shell command line (run by /bin/sh -c) that takes
  // the trainer role's place, e.g. a Python trainer; empty: Sluice's own
  // trainer. The launcher publishes the starting weights, writes the run's
  // endpoints and settings to roles/trainer.json (the child finds it in
  // $SLUICE_RUN_INFO) and, once the command exits 0, checks that every group
  // was acked and takes the latest published version as the trained model
  // (docs/python.md, "Trainers in Python").
  std::string trainer_command;
  // pipeline.processes: restarts after a role process fails or dies. A
  // rollout replica or reward worker is started again alone (each up to
  // this many times, back-off 1, 2, 4, ... 30 s): the hub and the other
  // roles carry on, and what it held is handed out again at once (its
  // leases released by the launcher). A trainer rank failing (or any role stalling, with
  // stop_on_stall) stops every role and starts them all again from the
  // run's latest checkpoint (up to this many times): steps after that
  // checkpoint are trained again, with the same prompts (each step's
  // prompts follow from its number), so every prompt is trained once in
  // what the run keeps. 0: a failure ends the run. Not with trainer ranks on
  // other hosts, nor pipeline.trainer_command.
  int64_t max_restarts = 0;
  // pipeline.processes: trainer processes, data parallel (trainer::
  // DataParallelGroup over a rendezvous store the launcher serves on
  // loopback). Rank 0 takes the step's groups from the hub and shares the
  // step's plan (rows, rewards) through the store; every rank reads its
  // shard's rows from the hub and trains it, gradients all-reduced; rank 0
  // publishes, checkpoints and logs. Each rank computes on trainer_threads
  // (no core lending with more than one rank).
  int32_t trainer_ranks = 1;
  // How long trainer ranks wait for each other: to meet at the start (a
  // rank launched elsewhere waits this long for rank 0's run) and in every
  // collective of a step. A dead or unreachable rank ends the run after it.
  int64_t rank_timeout_seconds = 600;
  // Set by the front end and the launchers, not by config keys.
  LaunchWiring wiring;
  // Versions a sample may lag the weights it is trained with.
  int64_t EffectiveMaxStaleness() const;
  // Whether the rollout's cores train while it idles (lend_idle_cores in
  // one_step_off or async, with both thread counts set).
  bool Lending() const {
    return lend_idle_cores && (mode == PipelineMode::kOneStepOff || mode == PipelineMode::kAsync) &&
           rollout_threads > 0 && trainer_threads > 0 && trainer_ranks == 1 && rollout_replicas == 1;
  }
};

// The threads a run's roles compute on, as configured (0 thread counts read
// as `process_threads`, the process's intra-op setting).
struct ThreadBudget {
  int32_t rollout_replicas = 1, rollout_engines = 0, threads_per_engine = 0;  // engines per replica
  int32_t trainer_ranks = 1, trainer_workers = 0, threads_per_worker = 0;     // workers and threads per rank
  int32_t lent_workers = 0;      // trainer workers that run only on the idle rollout's cores
  bool roles_alternate = false;  // direct and sync: rollout and trainer never compute at once
  // Most threads computing at any moment (the light reward thread aside).
  int32_t max_busy = 0;
  std::string ToString() const;  // e.g. "rollout 1 engine x 1 thread, trainer 1 worker x 1 thread + 1 lent ..."
};

// Where the roles compute (docs/gpu.md). Names as model::ResolveDevice and
// ResolveDtype take them; the command-line front end fills them from
// model.device, pipeline.trainer_device, pipeline.rollout_device,
// pipeline.rollout_dtype and trainer.precision.
struct DeviceOptions {
  std::string trainer = "cpu";  // the policy's master weights, the trainer and the evaluation
  std::string rollout = "cpu";  // streaming modes: the rollout's model (direct: the trainer's model)
  // The rollout's weights: auto (bfloat16 on CUDA, float32 on CPU), float32,
  // bfloat16. Streaming modes only: the direct loop generates with the
  // trainer's float32 model.
  std::string rollout_dtype = "auto";
  // The trainer's compute: auto (bf16-mixed on CUDA, float32 on CPU),
  // float32, bf16-mixed (bfloat16 autocast on float32 master weights; CUDA).
  std::string trainer_precision = "auto";
};

// How a task's prompts reach the model (task.chat_template, task.system_prompt,
// task.enable_thinking).
struct PromptOptions {
  // auto: through the chat template of tokenizer_dir's tokenizer_config.json
  // when it has one (as the user's message, with the generation prompt);
  // none: the prompt text as it is, after BOS.
  std::string chat_template = "auto";
  std::string system_prompt;             // a system message first, when not empty
  std::string enable_thinking = "auto";  // auto (not passed), true, false: the template variable
};

// Multi-turn, tool-using rollouts (docs/agents.md): each answer is a
// trajectory of model turns and environment turns.
struct AgentOptions {
  // "": one answer per prompt, no environment; "calculator": the built-in
  // calculator tool (the task's prompt as the user's message); "python":
  // the built-in code-execution tool (its sandbox's limits from
  // env_config); "module:Class" or "path/to/file.py:Class": a Python
  // environment.
  std::string env;
  std::string env_config = "{}";              // a Python environment's constructor argument (JSON object text)
  std::string python_executable = "python3";  // a Python environment's interpreter
  int32_t max_turns = 8;                      // model turns per trajectory
  int64_t max_tokens = 0;                     // a trajectory's tokens, opening included (0: the model's context)
  int32_t env_workers = 4;                    // environment calls at once, per rollout engine
  double env_timeout_seconds = 60;            // one reset or step
  double max_env_seconds = 600;               // a trajectory's environment calls together
  int64_t max_message_bytes = 8192;           // an environment message's content; cut past it
  // Per rollout engine: memory for the keys and values of trajectories
  // waiting for their environment (their next turn prefills only what was
  // added); past it the oldest are dropped and prefilled again.
  int64_t kept_cache_mib = 256;
  int64_t KeptCacheBytes() const { return enabled() ? kept_cache_mib << 20 : 0; }
  std::string tool_call_format = "auto";  // auto (llama3 for Llama models, else hermes), hermes, llama3

  bool enabled() const { return !env.empty(); }
  bool python() const { return enabled() && env != "calculator" && env != "python"; }
};

// Before an agent run starts: the model (its tokenizer in `tokenizer_dir`)
// has a chat format; a Python environment (agent.env module:Class) loads
// (agent/python_environment.h, CheckPythonEnvironment); the python tool's
// sandbox runs Python. OK for a run without agents.
Status CheckAgentEnvironment(const AgentOptions& agent, const std::string& tokenizer_dir);

struct RunOptions {
  std::string run_dir;  // metrics.jsonl, checkpoints/, sft/, final/
  uint64_t seed = 0;
  int64_t checkpoint_interval = 50;  // RL steps between checkpoints (0: only at the end)
  bool resume = false;               // continue from run_dir/checkpoints/latest when present
  // Streaming modes: every role's timeline, Chrome trace-event JSON, in
  // run_dir/trace.json (this start of the run only; see common/trace.h).
  bool trace = false;
  // Streaming modes: "HOST:PORT" where live counters are served in
  // Prometheus's text format (common/metrics_server.h); empty: not served.
  std::string metrics_listen;
  // Serve them on a HOST outside 127.0.0.0/8: anyone who reaches it reads
  // them, unauthenticated. Off: such a HOST is refused.
  bool metrics_allow_non_loopback = false;
  // The model directory whose tokenizer.json the run uses (and copies into
  // every checkpoint it writes); empty, or without one: the byte tokenizer.
  std::string tokenizer_dir;
  SftOptions sft;
  RlOptions rl;
  EvalOptions eval;
  PipelineOptions pipeline;
  DeviceOptions devices;
  PromptOptions prompts;
  AgentOptions agent;

  // InvalidArgument naming the option for bad values (e.g. group_size 1).
  Status Validate() const;
  ThreadBudget Threads(int32_t process_threads) const;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_OPTIONS_H_
