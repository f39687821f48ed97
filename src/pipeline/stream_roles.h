// What the streaming modes share around their roles (RolloutRole,
// RewardRole, TrainerRole: public headers), over a training run's state: the
// prompt feeder, each role's options from the run's, the run as the trainer
// role's learner, the run's trace and live counters, pipeline.trainer_command's
// run info and checks. The roles run as
// threads of one process (stream_train.cc, TrainStreaming) or each in its own
// process (TrainingRun::RunRole, started by the launcher: launch_attempt.h).
//
// Thread safety: the feeder is one loop; everything it shares is thread-safe.
#ifndef SLUICE_SRC_PIPELINE_STREAM_ROLES_H_
#define SLUICE_SRC_PIPELINE_STREAM_ROLES_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "hub_records.h"
#include "ranks_store.h"
#include "role_support.h"
#include "run_state.h"
#include "sluice/checkpoint_engine/weights.h"
#include "sluice/common/metrics_server.h"
#include "sluice/pipeline/reward_role.h"
#include "sluice/pipeline/rollout_role.h"
#include "sluice/pipeline/run_health.h"
#include "sluice/pipeline/trainer_role.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/schedule/staleness.h"
#include "sluice/transfer_queue/client.h"
#include "sluice/transfer_queue/server.h"

namespace sluice::pipeline {

namespace tq = transfer_queue;

struct StreamRoles {
  // Writes the run's prompts (cursors s.step * P .. rl.steps * P - 1) into
  // the prompt partition, in order, each with its example id, tokens and
  // reference answer: the one place the training split is read. Keeps a
  // bounded window ahead of the rollout (what admission can let it take
  // before it finishes more prompts); returns when all are written, or at
  // health.StopRequested() / `stopping`.
  static Status FeedPrompts(const TrainingRun::State& s, tq::TransferQueueClient& client, RunHealth& health,
                            const std::function<bool()>& stopping);

  // Whether the hub says every prompt of the run has its answers (rollout),
  // or that and no answer waits to be scored (reward): a replica or worker
  // started again late has nothing left to do. False for the trainer.
  static Result<bool> RoleDone(const TrainingRun::State& s, tq::TransferQueueClient& client, PipelineRole role);

  // The rollout's and reward's options for this process, from the run's
  // (its step and version now, tokenizer, lease holder); the launcher sets
  // the replica's or worker's own (index, health slot, name).
  static RolloutRole::Options RolloutOptions(const TrainingRun::State& s);
  static RewardRole::Options RewardOptions(const TrainingRun::State& s);

  static TrainerRole::Options TrainerOptions(const TrainingRun::State& s);
  // A rollout replica's role process (TrainingRun::RunRole, stream_launch.cc).
  static Status RunRolloutProcess(TrainingRun::State& s, const RoleConnection& c, tq::TransferQueueClient& client,
                                  RunHealth& health, HealthSlot slot, const std::function<bool()>& stopping);
  // The training run as the trainer role's learner: its policy and
  // trainer, s.step and s.version, and the run's bookkeeping of each step
  // (metrics.jsonl, evaluations through `evaluate`, checkpoints, `progress`).
  class RunLearner : public TrainerRole::Learner {
   public:
    // Opens the run's metrics.jsonl (MetricsLog::Open's errors) for trainer
    // rank 0, which finishes the steps; the other ranks' learners write none.
    static Result<std::unique_ptr<RunLearner>> Open(TrainingRun::State& s, RunHealth& health,
                                                    std::function<Result<EvalResult>()> evaluate, ProgressFn progress);
    static std::unique_ptr<RunLearner> ForFollower(TrainingRun::State& s, RunHealth& health);
    ~RunLearner() override;
    int64_t step() const override;
    PolicyVersion version() const override;
    Status Train(std::vector<trainer::RolloutSample>& samples, StepRecord* rec) override;
    void Advance(int64_t step, PolicyVersion version) override;
    Result<TensorMap> Weights() override;
    Status FinishStep(StepRecord& rec) override;
    trainer::Trainer& trainer() override;
    trainer::DataParallelGroup* ranks() override;

   private:
    RunLearner(TrainingRun::State& s, RunHealth& health, std::function<Result<EvalResult>()> evaluate,
               ProgressFn progress, std::optional<MetricsLog> metrics);
    TrainingRun::State& s_;
    RunHealth& health_;
    const std::function<Result<EvalResult>()> evaluate_;
    const ProgressFn progress_;
    const Clock::time_point start_;
    std::optional<MetricsLog> metrics_;
  };

  // pipeline.trainer_command (stream_launch.cc): the run info the command
  // reads (JSON: the hub's endpoint, the weight store, the run's settings);
  // the check, once it exited 0, that it acked every answer of the run on
  // the train task (FailedPrecondition naming the count otherwise: the
  // rollout would wait for it forever); and then the check that it
  // published a newer version, whose weights become s.policy (s.step =
  // rl.steps, s.version = that version).
  static std::string ExternalTrainerInfo(const TrainingRun::State& s, const std::string& hub, const std::string& store,
                                         const std::string& model_dir);
  static Status CheckExternalTrainerAcked(const TrainingRun::State& s, tq::TransferQueueClient& hub);
  // The answers acked on the hub's train task so far (the trainer command's
  // progress, for the watchdog too).
  static Result<uint64_t> TrainTaskAcked(tq::TransferQueueClient& hub);

  // run.trace: this process starts recording into
  // run_dir/roles/trace-<part>.jsonl (no-op when tracing is off); and the
  // run's end: the recorder stops and the named parts (missing ones
  // skipped) become run_dir/trace.json. Finishing logs, never fails a run.
  static std::string TracePart(const TrainingRun::State& s, const std::string& part);
  static Status StartTrace(const TrainingRun::State& s, const std::string& part);
  static void FinishTrace(const TrainingRun::State& s, const std::vector<std::string>& parts);

  // run.metrics_listen: serves the run's live counters (the run
  // health's, per role process labelled there (`processes` are labelled here, the
  // launcher labels those elsewhere as it learns of them), and the hub's;
  // with `hub_server`, the requests the role processes made, by path) until
  // destroyed; null when not asked for.
  static Result<std::unique_ptr<MetricsServer>> ServeMetrics(const TrainingRun::State& s, RunHealth& health,
                                                             tq::TransferQueueClient& hub,
                                                             const std::vector<RoleProcess>& processes,
                                                             const tq::TransferQueueServer* hub_server);
  static Status AdoptExternalResult(TrainingRun::State& s, tq::TransferQueueClient& hub,
                                    checkpoint_engine::WeightReader& weights);
};

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_STREAM_ROLES_H_
