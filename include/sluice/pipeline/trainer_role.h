// The trainer role of the streaming modes: takes whole groups of scored
// answers from the hub (task "train") as they complete, trains on them,
// publishes every sync_interval-th step's weights to the CheckpointEngine and
// acks the step's groups, until the run's last step. As a thread of the
// training run or a role process of its own; with several data-parallel
// ranks, rank 0 leads (takes, publishes, records, acks) and the others
// follow its plan of each step. docs/pipeline.md has the data flow.
//
// Contract with the hub (the schema: src/pipeline/hub_records.h):
// * Each group stays leased (lease_seconds) until its step's update is
//   applied and published, then is acked: the hub redelivers what a dead
//   trainer held. A group delivered twice (a lease that ran out, or its
//   prompt generated again) is trained once and counted
//   (StepRecord::duplicate_groups).
// * After each step's update is published and before its groups are acked,
//   rank 0 writes the step's TrainerRecord (the steps trained, the newest
//   version published): the rollout's admission reads it.
// * Ranks above 0 read rank 0's plan of each step (StepPlan, through the
//   ranks' store) and their shard of its rows straight from the hub; they
//   publish, record and ack nothing.
//
// What the model does (its update, its weights, the run's metrics,
// evaluations and checkpoints) is the Learner's: the training run provides
// one; another trainer may.
//
// Thread safety: Run is called once, from one thread.
#ifndef SLUICE_PIPELINE_TRAINER_ROLE_H_
#define SLUICE_PIPELINE_TRAINER_ROLE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sluice/common/host_tensor.h"
#include "sluice/common/ids.h"
#include "sluice/common/status.h"
#include "sluice/pipeline/hooks.h"
#include "sluice/pipeline/metrics.h"
#include "sluice/pipeline/options.h"
#include "sluice/pipeline/run_health.h"

namespace sluice::trainer {
class Trainer;
class DataParallelGroup;
}  // namespace sluice::trainer
namespace sluice::checkpoint_engine {
class WeightPublisher;
}
namespace sluice::transfer_queue {
class TransferQueueClient;
}

namespace sluice::pipeline {

class TrainerRole {
 public:
  struct Options {
    int64_t prompts_per_step = 0;
    int64_t group_size = 0;
    int64_t steps = 0;              // the run's last step
    bool dynamic_sampling = false;  // rl.dynamic_sampling: groups of equal rewards are not trained
    int64_t mini_batches = 1;       // rl.trainer.mini_batches (each rank's shard follows them)
    int64_t sync_interval = 1;      // steps per published version
    TrainOrder train_order = TrainOrder::kPrompt;
    int64_t lease_seconds = 600;  // pipeline.lease_seconds: how long a taken group stays held
    int32_t replicas = 1;         // rollout replicas (their figures in each step's record)
    // Core lending (PipelineOptions::Lending): the trainer's micro-batch
    // workers beyond its own threads run on the rollout's cores while the
    // rollout has nothing to decode.
    bool lending = false;
    int32_t trainer_threads = 0;
    int32_t rollout_threads = 0;
    std::string run_dir;                       // where each rank records the rows it trains (kTrainedRowsPrefix)
    std::string lease_holder;                  // names this rank in the hub's ack log
    HealthSlot slot = PipelineRole::kTrainer;  // this rank's in the run's health

    static Options From(const RunOptions& run);
  };

  // The model side of the role, provided by whoever owns the model.
  class Learner {
   public:
    virtual ~Learner() = default;
    // Steps trained (the run's, counted from 0) and the newest version
    // published.
    virtual int64_t step() const = 0;
    virtual PolicyVersion version() const = 0;
    // The update on a step's samples, in training order (with data-parallel
    // ranks, all ranks take it together, each its shard); fills the
    // record's training figures.
    virtual Status Train(std::vector<trainer::RolloutSample>& samples, StepRecord* rec) = 0;
    // The step is done (step() + 1), and with `version` > version() that
    // version is published: its weights are Weights().
    virtual void Advance(int64_t step, PolicyVersion version) = 0;
    virtual Result<TensorMap> Weights() = 0;
    // Rank 0, after the step's groups are acked: the run's bookkeeping of the
    // step (metrics, evaluation, checkpoint, progress).
    virtual Status FinishStep(StepRecord& rec) = 0;
    // The trainer whose micro-batch workers core lending widens.
    virtual trainer::Trainer& trainer() = 0;
    // The data-parallel ranks; null with one.
    virtual trainer::DataParallelGroup* ranks() = 0;
  };

  struct Wiring {
    Learner* learner = nullptr;
    transfer_queue::TransferQueueClient* hub = nullptr;
    RunHealth* health = nullptr;
    // Rank 0: where every sync_interval-th step's weights are published.
    checkpoint_engine::WeightPublisher* weights = nullptr;
    // Rank 0: polled while waiting for data; an error (another role
    // failed) ends the run.
    std::function<Status()> check;
    // inspect_batch, rewrite_published, lose_taken_group (hooks.h).
    RunHooks hooks;
  };

  TrainerRole(Options options, Wiring wiring);

  // Trains until the run's last step, a stop (the run health's, or for a
  // rank above 0 rank 0's word that the run ended) or an error.
  Status Run();

 private:
  Status Lead();
  Status Follow();

  const Options o_;
  const Wiring w_;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_TRAINER_ROLE_H_
