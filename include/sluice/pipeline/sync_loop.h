// The synchronous RL loop — the baseline every later speedup is measured
// against: sample prompts -> generate G answers per prompt with the rollout
// engine -> score -> GRPO advantages -> train -> the engine serves the new
// weights (version + 1) -> repeat. Also the supervised warm start and the
// held-out evaluation, checkpoints in the Hugging Face layout, and resume.
//
// Determinism: every random choice is a function of (seed, step, index):
// prompt order (a seeded permutation per epoch), sampling seeds, model init.
// A run stopped after a checkpoint and resumed produces the same metrics as an
// uninterrupted run with the same seed and thread count.
//
// Thread safety: not thread-safe; one owner thread runs the loop.
#ifndef SLUICE_PIPELINE_SYNC_LOOP_H_
#define SLUICE_PIPELINE_SYNC_LOOP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/reward/task.h"
#include "sluice/rollout/engine.h"
#include "sluice/trainer/trainer.h"

namespace sluice::pipeline {

struct SftOptions {
  int64_t steps = 0;        // 0: no warm start
  int64_t batch_size = 64;  // examples per step
  // Fraction of warm-start examples whose target is only the final answer
  // ("#42") instead of the worked solution: a base policy that often answers
  // without working it out, as pretrained models do. RL can then learn from
  // reward alone that working it out pays. 0: every target is worked.
  double shortcut_fraction = 0.0;
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
  // Benchmarks only (not a config key): when set, answer g to the prompt at
  // `cursor` is generated to exactly this many tokens (SamplingParams::
  // forced_length), so every mode sees the same long-tail lengths.
  std::function<int32_t(uint64_t cursor, int64_t g)> forced_length;
  // Tests only (not config keys), streaming modes: `rewrite_published` may
  // change the weights the trainer publishes as `version` (e.g. to weights
  // whose output encodes the version); `inspect_batch` sees each step's
  // samples before they are trained.
  std::function<void(int64_t version, TensorMap* weights)> rewrite_published;
  std::function<void(int64_t step, const std::vector<trainer::RolloutSample>& samples)> inspect_batch;
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
  // Streaming modes: run the trainer, rollout and reward roles each as its
  // own OS process (hub and weights over shared memory), started and
  // supervised by this process, instead of as threads of it. Needs
  // role_command.
  bool processes = false;
  // How to start a role process: this program's path and the arguments that
  // make it run `SyncLoop::RunRole` with this run's config; the launcher
  // appends --role=..., --hub=..., --weights=..., --board=... (see
  // RoleConnection). Set by the command-line front end.
  std::vector<std::string> role_command;
  // Versions a sample may lag the weights it is trained with.
  int64_t EffectiveMaxStaleness() const;
  // Whether the rollout's cores train while it idles (lend_idle_cores in
  // one_step_off or async, with both thread counts set).
  bool Lending() const {
    return lend_idle_cores && (mode == PipelineMode::kOneStepOff || mode == PipelineMode::kAsync) &&
           rollout_threads > 0 && trainer_threads > 0;
  }
};

// The roles of the streaming modes.
enum class PipelineRole { kTrainer, kRollout, kReward };
Result<PipelineRole> ParsePipelineRole(const std::string& name);  // trainer, rollout, reward
std::string PipelineRoleName(PipelineRole role);

// What a role process is told by its launcher.
struct RoleConnection {
  PipelineRole role = PipelineRole::kTrainer;
  std::string hub;      // TransferQueue server endpoint (same-host shared memory when available)
  std::string weights;  // CheckpointEngine shared-memory store name (the trainer publishes, rollout reads)
  std::string board;    // shared-memory segment of the roles' counters and flags
  int64_t start_step = 0;
  int64_t start_version = 0;
};

// The threads a run's roles compute on, as configured (0 thread counts read
// as `process_threads`, the process's intra-op setting).
struct ThreadBudget {
  int32_t rollout_engines = 0, threads_per_engine = 0;
  int32_t trainer_workers = 0, threads_per_worker = 0;
  int32_t lent_workers = 0;      // trainer workers that run only on the idle rollout's cores
  bool roles_alternate = false;  // direct and sync: rollout and trainer never compute at once
  // Most threads computing at any moment (the light reward thread aside).
  int32_t max_busy = 0;
  std::string ToString() const;  // e.g. "rollout 1 engine x 1 thread, trainer 1 worker x 1 thread + 1 lent ..."
};

struct LoopOptions {
  std::string run_dir;  // metrics.jsonl, checkpoints/, sft/, final/
  uint64_t seed = 0;
  int64_t checkpoint_interval = 50;  // RL steps between checkpoints (0: only at the end)
  bool resume = false;               // continue from run_dir/checkpoints/latest when present
  SftOptions sft;
  RlOptions rl;
  EvalOptions eval;
  PipelineOptions pipeline;

  // InvalidArgument naming the option for bad values (e.g. group_size 1).
  Status Validate() const;
  ThreadBudget Threads(int32_t process_threads) const;
};

struct EvalResult {
  double accuracy = 0;  // fraction of examples whose greedy answer has reward 1
  double mean_reward = 0;
  double mean_length = 0;  // response tokens (greedy)
  int64_t examples = 0;
  // Mean accuracy of eval.samples sampled answers per example; -1 if not measured.
  double sampled_accuracy = -1;
  // Greedy accuracy by the example's difficulty (reward::Example::difficulty).
  struct Bucket {
    int64_t correct = 0, total = 0;
  };
  std::map<int, Bucket> by_difficulty;
  // "1:95% 2:60% ..." (empty when the task reports no difficulty).
  std::string DifficultySummary() const;
};

// One line of metrics.jsonl (also handed to the progress callback).
struct StepRecord {
  int64_t step = 0;  // RL step, 1-based
  int64_t total_steps = 0;
  double reward_mean = 0, accuracy = 0, response_len_mean = 0;
  int64_t response_len_max = 0;
  int64_t groups_kept = 0, samples_trained = 0;
  int64_t generated_tokens = 0;
  double gen_seconds = 0, train_seconds = 0, elapsed_seconds = 0;
  trainer::StepMetrics train;
  // Streaming modes: weight version trained with, staleness of the trained
  // samples (trainer version - version of each sample's first token), and how
  // long the trainer waited for data this step.
  int64_t version = 0;
  double staleness_mean = 0;
  int64_t staleness_max = 0;
  double token_staleness_mean = 0;
  double wait_seconds = 0;
  int64_t queue_ready = 0;  // rows waiting for the trainer when the step began
  // Streaming modes, over this step's wall interval (previous step's end to
  // this one's): tokens the rollout generated, and the fraction of the
  // interval each role was busy (rollout: decoding; trainer: training).
  int64_t rollout_tokens = 0;
  double rollout_busy = 0, trainer_busy = 0;
  // staleness_hist[k]: trained samples whose first token is k versions old.
  std::vector<int64_t> staleness_hist;
  // Prompt cursors consumed by the step (kept or dropped), read from the
  // rows the trainer took.
  std::vector<uint64_t> prompts;
  // Streaming modes: groups the hub delivered again after the trainer had
  // taken them (dropped, never trained twice); 0 unless exactly-once broke.
  int64_t duplicate_groups = 0;
  bool has_eval = false;
  EvalResult eval;
  std::string ToJson() const;
};

class SyncLoop {
 public:
  using ProgressFn = std::function<void(const std::string& phase, int64_t done, int64_t total, const StepRecord*)>;

  // `policy` is trained in place. Errors: InvalidArgument for bad options
  // or a task whose vocabulary does not fit the model.
  static Result<std::unique_ptr<SyncLoop>> Create(std::shared_ptr<model::Transformer> policy,
                                                  std::shared_ptr<const reward::Task> task, const LoopOptions& options);
  ~SyncLoop();

  // Warm start: supervised steps on the task's solutions (skipped when
  // sft.steps == 0, or when resuming and run_dir/sft holds its result).
  Status WarmStart(const ProgressFn& progress);
  // Greedy decoding of the first eval.size eval examples.
  Result<EvalResult> Evaluate();
  // RL steps until rl.steps (resuming from the latest checkpoint if asked).
  // With pipeline.processes, the roles run as child processes (each calls
  // RunRole); this process hosts the hub, supervises them, stops them all on
  // a failure or when `stop` becomes true (e.g. set by a SIGINT handler), and
  // removes every shared-memory segment of the run; afterwards it holds the
  // trained weights (from the trainer's last checkpoint).
  Status Train(const ProgressFn& progress, const std::atomic<bool>* stop = nullptr);

  // In a role process: runs one role of a launcher's run to its end. The
  // loop must be created with the launcher's options (model, seed, rl.*);
  // the trainer also resumes from the run's checkpoint when options.resume.
  Status RunRole(const RoleConnection& connection, const ProgressFn& progress);

  // Streaming modes: what the last Train() measured (zeros in direct mode).
  struct StreamSummary {
    double wall_seconds = 0;          // RL wall time
    double rollout_busy_seconds = 0;  // rollout steps with sequences running
    int64_t rollout_tokens = 0;       // tokens generated (including ones never trained)
    double rollout_occupancy = 0;     // mean share of the engine's slots decoding per decode step
  };
  StreamSummary stream_summary() const;

  int64_t step() const;
  const std::vector<StepRecord>& history() const;

 private:
  struct State;
  friend struct StreamRoles;
  Status PrepareTraining();                                // reference model, trainer, resume
  Status TrainStreaming(const ProgressFn& progress);       // stream_train.cc: roles as threads
  Status TrainInProcesses(const std::atomic<bool>* stop);  // stream_launch.cc (the trainer role reports progress)
  explicit SyncLoop(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_SYNC_LOOP_H_
