// The rollout's prompt intake: how many prompts an engine takes next, under
// the staleness admission (sluice/schedule/staleness.h). The policy the
// pipeline's rollout role runs and the simulator replays
// (docs/simulator.md), torch-free: what the trainer has done comes in
// through a callback, from the hub in a real run, from the model in a
// simulated one.
//
// Thread safety: none; the rollout's engines share one intake under their
// own mutex.
#ifndef SLUICE_SCHEDULE_INTAKE_H_
#define SLUICE_SCHEDULE_INTAKE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "sluice/common/status.h"
#include "sluice/schedule/staleness.h"

namespace sluice::schedule {

struct IntakeOptions {
  int64_t prompts_per_step = 1;  // P, > 0
  int64_t group_size = 1;        // G answers per prompt, > 0
  int64_t sync_interval = 1;     // steps per published version, > 0
  int64_t max_staleness = 0;     // >= 0 (sync: 0, one_step_off: 1)
  PolicyVersion version = 0;     // the trainer's version at the start
  int64_t start_step = 0;        // the trainer's step at the start (a resumed run)
  int64_t steps = 1;             // the run's last step; prompts end at steps * P
  int32_t engines = 1;           // data-parallel engines sharing this intake, > 0
  // Rollout replicas (processes, each with its own intake) taking prompts
  // from one stream, > 0. With more than one, the stream's cursor is global:
  // TrainerProgress::taken_prompts says where it is, and a replica may be
  // handed prompts past what it asked admission for (another replica took
  // the ones it counted on): StartLimit says which it may start.
  int32_t replicas = 1;
  // The same for one replica that may be restarted mid-run (its intake
  // starts afresh; the stream does not).
  bool shared = false;
  bool Shared() const { return shared || replicas > 1; }
};

// The trainer's progress as the rollout sees it.
struct TrainerProgress {
  // Steps trained since start_step, as the trainer records them: each once
  // its update is published (with the version, when it publishes one) and
  // before its groups are acked.
  int64_t trained_steps = 0;
  PolicyVersion latest_version = 0;  // the newest version published
  bool waiting = false;              // the trainer waits for its step's groups now
  // Shared(): prompts taken from the stream by all replicas since
  // start_step (finished or held now; a held prompt whose lease ran out is
  // not counted until it is taken again).
  int64_t taken_prompts = 0;
};

class PromptIntake {
 public:
  // InvalidArgument naming the bad option.
  static Result<std::unique_ptr<PromptIntake>> Create(const IntakeOptions& options);

  // The prompts an engine with `slots` slots, `queued` sequences waiting or
  // running, generating with `engine_version`, takes now: a lone engine
  // about one batch queued beyond its slots, so freed slots refill at once;
  // one of several only enough to fill its own slots (at least one group),
  // and at most its share of a step (P / engines, rounded up) per call, so
  // the first to look does not take what the others would run at the same
  // time (sync hands a whole step's prompts out at once: with many engines
  // of many slots, each gets about the same); while the trainer waits, nothing past
  // the prompts of the step it waits for; then as many as the staleness
  // admission allows. Asks `progress` only when it would
  // take some. Returns the count, >= 0: prompts cursor() .. cursor()+n-1
  // before the call. Errors: progress's, or the admission's (not a timeout).
  Result<int64_t> Take(int64_t slots, int64_t queued, PolicyVersion engine_version,
                       const std::function<Result<TrainerProgress>()>& progress);

  // Shared(): prompts below this cursor may be started now by an engine
  // generating with `engine_version` (the staleness rule with the global
  // cursor); one taken above it waits until the trainer or the engine's
  // weights move on. Errors: progress's.
  Result<int64_t> StartLimit(PolicyVersion engine_version, const std::function<Result<TrainerProgress>()>& progress);

  // The prompts below this cursor were trained once the trainer published
  // `latest`: it publishes a version after the update of its every
  // sync_interval-th step (and of the run's last), and a step trains its own
  // P prompts (prompt order; sync mode holds only one step's prompts), so a
  // prompt below it handed out again is not generated again.
  int64_t TrainedEnd(PolicyVersion latest) const;

  // The next prompt cursor to admit; steps * P when every prompt was.
  int64_t cursor() const { return cursor_; }
  int64_t end_cursor() const { return end_cursor_; }
  AdmissionStats stats() const { return admission_->stats(); }

 private:
  PromptIntake(const IntakeOptions& options, std::unique_ptr<StalenessAdmission> admission);
  // Shared(): Take and StartLimit from the trainer's progress.
  int64_t SharedLimit(const TrainerProgress& now, PolicyVersion engine_version) const;
  Result<int64_t> TakeShared(int64_t want, PolicyVersion engine_version, const TrainerProgress& now);

  const IntakeOptions options_;
  std::unique_ptr<StalenessAdmission> admission_;
  int64_t cursor_;
  const int64_t end_cursor_;
  int64_t retired_ = 0;  // prompts the trainer trained, as admission knows them
};

}  // namespace sluice::schedule

#endif  // SLUICE_SCHEDULE_INTAKE_H_
