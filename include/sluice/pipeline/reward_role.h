// The reward role of the streaming modes: scores the rollout's answers as
// they appear in the hub (task "reward", one answer leased at a time for
// worker_lease_seconds) with the task's reward and writes each reward next to
// its answer. As a thread of the training run or a role process of its own
// (a reward worker; several share the hub's answers); docs/pipeline.md has the
// data flow.
//
// Contract with the hub (the schema: src/pipeline/hub_records.h): the
// answer's example index and reference answer travel with it (no lookup
// in a dataset of the rollout's); the reference answer must be the one this
// process's task has for that example (else the prompt feeder's task is not
// this worker's: DataLoss). An answer whose reward a dead worker wrote
// before its ack keeps that reward. The role ends once the hub says every
// answer of the run is scored (by this process or others), or at a stop.
//
// Thread safety: Run is called once; it runs task.max_parallel_scores()
// scoring loops (one on the calling thread) over the one hub client.
#ifndef SLUICE_PIPELINE_REWARD_ROLE_H_
#define SLUICE_PIPELINE_REWARD_ROLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "sluice/common/status.h"
#include "sluice/pipeline/options.h"
#include "sluice/pipeline/run_health.h"

namespace sluice::model {
class Tokenizer;
}
namespace sluice::reward {
class Task;
}
namespace sluice::transfer_queue {
class TransferQueueClient;
}

namespace sluice::pipeline {

class RewardRole {
 public:
  struct Options {
    // The run's prompts from this attempt's start ((rl.steps - start step) x
    // rl.prompts_per_step): every answer of theirs is scored at the end.
    uint64_t prompts = 0;
    int64_t lease_seconds = 30;  // pipeline.worker_lease_seconds
    std::string lease_holder;    // names this process in the hub's ack log
    // This worker's slot in the run's health, and the prefix of its
    // threads' names in the trace ("reward-1 ").
    HealthSlot slot = PipelineRole::kReward;
    std::string process;

    static Options From(const RunOptions& run, int64_t start_step);
  };
  struct Wiring {
    std::shared_ptr<const reward::Task> task;           // scores (its train split)
    std::shared_ptr<const model::Tokenizer> tokenizer;  // decodes the answers
    transfer_queue::TransferQueueClient* hub = nullptr;
    RunHealth* health = nullptr;  // beats, activity, the run's reward error count
  };

  RewardRole(Options options, Wiring wiring);

  // Runs to the end (every answer of the run scored), a stop
  // (health->StopRequested() / `stopping`) or an error (any loop's).
  Status Run(const std::function<bool()>& stopping);

 private:
  Status ScoreLoop(int loop);

  const Options o_;
  const Wiring w_;
  std::function<bool()> stopping_;
  std::atomic<bool> all_scored_{false};
  std::atomic<bool> failed_{false};
  std::atomic<int64_t> errors_shown_{0};  // of the task's score errors, added to the run health
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_REWARD_ROLE_H_
