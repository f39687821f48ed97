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

  // The options it was created with.
  const RunOptions& options() const;

  // Streaming modes: what the last Train() measured (zeros in direct mode).
  StreamSummary stream_summary() const;

  int64_t step() const;
  const std::vector<StepRecord>& history() const;

 private:
  struct State;
  friend struct StreamRoles;
  friend class LaunchAttempt;
  Status PrepareTraining();                                // reference model, trainer, resume
  Status TrainStreaming(const ProgressFn& progress);       // stream_train.cc: roles as threads
  Status TrainInProcesses(const std::atomic<bool>* stop);  // stream_launch.cc (the trainer role reports progress)
  // One start of the role processes; they resume from the run's latest
  // checkpoint when `resumed` (a restart after a failure) or the run resumed.
  Status RunProcessesOnce(const std::atomic<bool>* stop, bool resumed);
  explicit TrainingRun(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_RUN_H_
