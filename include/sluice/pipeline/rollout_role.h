// The rollout role of the streaming modes: takes the run's prompts from the
// hub (TransferQueue) as staleness admission allows, generates G answers to
// each with the served model and writes each finished answer back to the hub
// the moment it is done; its weights come from the CheckpointEngine as the
// trainer publishes them. The same object runs as a thread of the training
// run (roles as threads) or in a role process of its own, on the hub's host
// or another; docs/pipeline.md has the data flow.
//
// Contract with the hub (the schema: src/pipeline/hub_records.h):
// * Prompts (partition "prompts", task "rollout") are leased one each for
//   worker_lease_seconds and renewed every third of it; a prompt's lease is
//   acked once all G of its answers are in the hub, so a replica that dies
//   leaves its prompts to the others.
// * Answers (partition "rollouts") are keyed by prompt and answer index
//   (AnswerKey): an answer is in the hub once, however many times its prompt
//   is generated (a prompt generated again after its replica died adds only
//   the answers missing; one generated again after it was trained adds none).
// * Admission (schedule::PromptIntake) reads the trainer's progress from its
//   records in the hub (TrainerRecord: the steps trained, each recorded after
//   its update is published and before its groups are acked) and the newest
//   version in the weight store, the same way in threads and processes and
//   on every host.
// * Replicas (several, or one that may be restarted, or one on another host)
//   share the hub's prompt stream: admission counts the prompts every replica
//   took, a prompt handed to this replica past what its weights may start
//   waits here, and the role ends when every prompt of the run is finished,
//   by whichever replica.
//
// Thread safety: Run is called once; it runs `engines` engine loops (one on
// the calling thread) over the one hub client, which is thread-safe.
#ifndef SLUICE_PIPELINE_ROLLOUT_ROLE_H_
#define SLUICE_PIPELINE_ROLLOUT_ROLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "sluice/common/mutex.h"
#include "sluice/common/status.h"
#include "sluice/model/config.h"
#include "sluice/model/tokenizer.h"
#include "sluice/pipeline/hooks.h"
#include "sluice/pipeline/options.h"
#include "sluice/pipeline/run_health.h"
#include "sluice/schedule/intake.h"

namespace sluice::model {
class Transformer;
}
namespace sluice::rollout {
class StandbyWeights;
}
namespace sluice::checkpoint_engine {
class WeightReader;
}
namespace sluice::transfer_queue {
class TransferQueueClient;
}

namespace sluice::pipeline {

class RolloutRole {
 public:
  struct Options {
    // The prompts' intake and its staleness admission: the run's shape
    // (prompts per step, answers per prompt, steps), sync_interval,
    // max_staleness (PipelineOptions::EffectiveMaxStaleness), this
    // replica's engines, the run's replicas and whether they share the hub's
    // prompt stream (several, one that may be restarted, or one on another
    // host), and where this attempt starts (its step, and the version the
    // served weights are).
    schedule::IntakeOptions intake;
    int32_t slots = 0;  // rl.rollout_slots, over this replica's engines
    rollout::SamplingParams sampling;
    uint64_t seed = 0;  // each answer's sampling seed: AnswerSeed(seed, ...)
    rollout::SwitchPolicy switch_policy = rollout::SwitchPolicy::kInFlight;
    int32_t threads = 0;         // pipeline.rollout_threads (0: as the process has)
    int64_t lease_seconds = 30;  // pipeline.worker_lease_seconds
    model::TokenId eos_id = -1;
    std::string lease_holder;  // names this process in the hub's ack log
    // This replica: its index, its slot in the run's health, and the prefix
    // of its threads' names in the trace ("rollout-1 ", with a space).
    int64_t replica = 0;
    HealthSlot slot = PipelineRole::kRollout;
    std::string process;
    // agent.*: each answer a multi-turn trajectory against an environment
    // (each prompt's row from the hub is its reset argument), the model's
    // chat format read from tokenizer_dir.
    AgentOptions agent;
    std::string tokenizer_dir;
    model::ModelConfig model;  // the served model's (its context and family, for agents)

    // The run's settings for this replica.
    static Options From(const RunOptions& run, int64_t start_step, PolicyVersion start_version);
  };

  // What the role works with, owned by the caller and outliving Run.
  struct Wiring {
    std::shared_ptr<model::Transformer> model;  // served; refreshed through `standby`
    rollout::StandbyWeights* standby = nullptr;
    // Where the trainer's versions are read (the standby buffer fills from
    // it; admission reads its latest version).
    checkpoint_engine::WeightReader* weights = nullptr;
    transfer_queue::TransferQueueClient* hub = nullptr;
    RunHealth* health = nullptr;
    // forced_length, hold_for_switch, lose_prompt_ack (hooks.h).
    RunHooks hooks;
  };

  // InvalidArgument for options admission refuses.
  static Result<std::unique_ptr<RolloutRole>> Create(Options options, Wiring wiring);
  ~RolloutRole();

  // Runs to the end: every prompt of the run has its answers in the hub, or
  // health->StopRequested() / `stopping`, or an error (any engine's).
  Status Run(const std::function<bool()>& stopping);

 private:
  class Engine;
  RolloutRole(Options options, Wiring wiring, std::unique_ptr<schedule::PromptIntake> intake);
  // The trainer's progress (its record, the hub's tasks), read anew.
  Result<schedule::TrainerProgress> ReadProgress() SLUICE_REQUIRES(mu_);

  const Options o_;
  const Wiring w_;
  std::function<bool()> stopping_;
  std::atomic<int32_t> active_{0};  // engines with something to decode
  std::atomic<bool> failed_{false};
  // Engines of a replica share the admission and the prompts' intake.
  Mutex mu_;
  std::unique_ptr<schedule::PromptIntake> intake_ SLUICE_PT_GUARDED_BY(mu_);
  int64_t owed_ SLUICE_GUARDED_BY(mu_) = 0;  // prompts admitted but not yet taken from the hub
  // Prompts not yet taken from the hub, and (not shared) those taken so far.
  int64_t untaken_ SLUICE_GUARDED_BY(mu_) = 0;
  std::set<uint64_t> taken_before_ SLUICE_GUARDED_BY(mu_);
  // From the trainer's last record read: the steps it trained, the newest
  // version it published then (from the attempt's start: no version known
  // yet; a replica started again mid-run serves a newer version than the
  // records it reads first). And the prompts every replica has finished.
  int64_t record_step_ SLUICE_GUARDED_BY(mu_) = 0;
  PolicyVersion record_version_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t prompts_done_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t run_prompts_ = 0;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_ROLLOUT_ROLE_H_
