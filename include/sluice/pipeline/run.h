// A training run: the supervised warm start, the RL steps in the configured
// pipeline mode (direct, or rollout, reward and trainer over the hub as
// threads or processes), held-out evaluation between steps, checkpoints in
// the Hugging Face layout, and resume. The command-line front end
// (`sluice train`) is a thin layer over this class.
//
//   direct:  sample prompts -> generate G answers per prompt -> score ->
//            GRPO advantages -> train -> the engine serves the new weights
//   sync, one_step_off, async: the same steps as roles joined by the
//            TransferQueue and the CheckpointEngine (docs/pipeline.md)
//
// Determinism: every random choice is a function of (seed, step, index):
// prompt order (a seeded permutation per epoch), sampling seeds, model init.
// A run stopped after a checkpoint and resumed produces the same metrics as an
// uninterrupted run with the same seed and thread count (direct and sync).
//
// Thread safety: not thread-safe; one owner thread runs it.
#ifndef SLUICE_PIPELINE_RUN_H_
#define SLUICE_PIPELINE_RUN_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/pipeline/hooks.h"
#include "sluice/pipeline/metrics.h"
#include "sluice/pipeline/options.h"
#include "sluice/pipeline/roles.h"
#include "sluice/reward/task.h"

namespace sluice::model {
class Transformer;
}

namespace sluice::pipeline {

class TrainingRun {
 public:
  // `policy` is trained in place. Errors: InvalidArgument for bad options
  // or a task whose vocabulary does not fit the model.
  static Result<std::unique_ptr<TrainingRun>> Create(std::shared_ptr<model::Transformer> policy,
                                                     std::shared_ptr<const reward::Task> task,
                                                     const RunOptions& options, RunHooks hooks = {});
  ~TrainingRun();

  // Warm start: supervised steps on the task's solutions (skipped when
  // sft.steps == 0, or when resuming and run_dir/sft holds its result).
  Status WarmStart(const ProgressFn& progress);
  // The held-out evaluation (evaluator.h) of the policy as it is now.
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

  // A process above rank 0 that a launcher (torchrun, Slurm, Open MPI)
  // started, on any host, beside rank 0's `sluice train` (which runs the
  // hub, the reward, trainer rank 0 and the rollout replicas of its host):
  // trainer rank `index` (above 0), or rollout replica `index`
  // (cluster.rollout_ranks; its weights over the CheckpointEngine
  // broadcast). Waits up to `wait` in the ranks' store at `store`
  // (HOST:PORT) for rank 0's run, checks that it has this process's config
  // (options.pipeline.wiring.config_digest; FailedPrecondition naming both
  // otherwise), then runs its role until the run ends (the hub over TCP).
  // `joined`: a process that joins the run beyond the launch (`sluice train
  // --join`, index from ClaimJoinedIndex): a config that differs refuses
  // this process only, and a rollout replica needs a run that relays
  // weights to other hosts (cluster.rollout_ranks > 0).
  Status RunLaunchedRank(const std::string& store, PipelineRole role, int64_t index, std::chrono::milliseconds wait,
                         bool joined = false);
  // The same rollout replica or reward worker with pipeline.max_restarts:
  // this process is its host's supervisor. It checks the run as above, then
  // runs `command` (with `child_env` on top of its environment: the same
  // process again, told to run the role itself) as a child and starts it
  // again when it fails or dies, up to max_restarts times (back-off 1, 2,
  // 4, ... 30 s), giving the dead child's hub leases back at once.
  Status SuperviseLaunchedRank(const std::string& store, PipelineRole role, int64_t index,
                               std::chrono::milliseconds wait, const std::vector<std::string>& command,
                               const std::map<std::string, std::string>& child_env, bool joined = false);
  // A rollout replica or reward worker joining a launched run beyond the
  // processes the launch declared: numbers it after them (and after those
  // that joined before) through a counter in the ranks' store at `store`.
  // OutOfRange past RoleBoard's 64 replicas / workers.
  Result<int64_t> ClaimJoinedIndex(const std::string& store, PipelineRole role, std::chrono::milliseconds wait);

  // Streaming modes: what the last Train() measured (zeros in direct mode).
  StreamSummary stream_summary() const;

  int64_t step() const;
  const std::vector<StepRecord>& history() const;

 private:
  struct State;
  friend struct StreamRoles;
  Status PrepareTraining();                                // reference model, trainer, resume
  Status TrainStreaming(const ProgressFn& progress);       // stream_train.cc: roles as threads
  Status TrainInProcesses(const std::atomic<bool>* stop);  // stream_launch.cc (the trainer role reports progress)
  // One start of the role processes; they resume from the run's latest
  // checkpoint when `resumed` (a restart after a failure) or the run resumed.
  Status RunProcessesOnce(const std::atomic<bool>* stop, bool resumed);
  // RunLaunchedRank's meeting: rank 0's run from the store, checked.
  Result<RoleConnection> JoinLaunchedRun(const std::string& store, PipelineRole role, int64_t index,
                                         std::chrono::milliseconds wait, bool joined);
  explicit TrainingRun(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_RUN_H_
