#include "sluice/schedule/intake.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

namespace sluice::schedule {

Result<std::unique_ptr<PromptIntake>> PromptIntake::Create(const IntakeOptions& o) {
  auto bad = [](const std::string& what) { return Status::InvalidArgument("prompt intake: " + what); };
  if (o.prompts_per_step <= 0) return bad("prompts_per_step must be > 0");
  if (o.group_size <= 0) return bad("group_size must be > 0");
  if (o.sync_interval <= 0) return bad("sync_interval must be > 0");
  if (o.start_step < 0 || o.steps < o.start_step) return bad("need 0 <= start_step <= steps");
  if (o.engines <= 0) return bad("engines must be > 0");
  if (o.replicas <= 0) return bad("replicas must be > 0");
  StalenessOptions so;
  so.max_staleness = o.max_staleness;
  so.prompts_per_version = o.prompts_per_step * o.sync_interval;
  so.initial_trainer_version = o.version;
  SLUICE_ASSIGN_OR_RETURN(auto admission, StalenessAdmission::Create(so));
  return std::unique_ptr<PromptIntake>(new PromptIntake(o, std::move(admission)));
}

PromptIntake::PromptIntake(const IntakeOptions& options, std::unique_ptr<StalenessAdmission> admission)
    : options_(options),
      admission_(std::move(admission)),
      cursor_(options.start_step * options.prompts_per_step),
      end_cursor_(options.steps * options.prompts_per_step) {}

Result<int64_t> PromptIntake::Take(int64_t slots, int64_t queued, PolicyVersion engine_version,
                                   const std::function<Result<TrainerProgress>()>& progress) {
  const int64_t P = options_.prompts_per_step, G = options_.group_size;
  // (At least one group for an engine with fewer slots than a group.)
  const int64_t sharers = int64_t{options_.engines} * options_.replicas;
  const int64_t target = sharers > 1 ? std::max(slots, G) : 2 * slots;
  // (Replicas learn where the shared stream is from `progress`.)
  int64_t want = (target - queued) / G;
  if (!options_.Shared()) want = std::min<int64_t>(want, end_cursor_ - cursor_);
  if (sharers > 1) want = std::min<int64_t>(want, (P + sharers - 1) / sharers);
  if (want <= 0) return int64_t{0};
  // Bring admission up to date: progress first, then the newest version,
  // which was published before that progress.
  SLUICE_ASSIGN_OR_RETURN(const TrainerProgress now, progress());
  if (options_.Shared()) return TakeShared(want, engine_version, now);
  const AdmissionStats seen = admission_->stats();
  const PolicyVersion latest = std::max(now.latest_version, seen.trainer_version);
  const int64_t trained = now.trained_steps * P;
  // (Never more than is pending.)
  const int64_t consumed = std::min(trained - retired_, seen.pending);
  retired_ = trained;
  SLUICE_RETURN_IF_ERROR(admission_->CompleteStep(latest, std::max<int64_t>(consumed, 0)));
  // A waiting trainer's prompts first: nothing past them while it waits.
  if (now.waiting) want = std::min<int64_t>(want, (options_.start_step + now.trained_steps + 1) * P - cursor_);
  if (want <= 0) return int64_t{0};
  auto admitted = admission_->Admit(want, engine_version, std::chrono::milliseconds(0));
  if (!admitted.ok()) {
    if (admitted.status().code() == StatusCode::kTimeout) return int64_t{0};
    return admitted.status();
  }
  cursor_ += *admitted;
  return *admitted;
}

// The staleness rule (StalenessWindow) with the global cursor: an engine at
// version v may start the cursors below the trainer's retired prompts plus
// the window of v against the latest version.
int64_t PromptIntake::SharedLimit(const TrainerProgress& now, PolicyVersion engine_version) const {
  const int64_t P = options_.prompts_per_step, ppv = P * options_.sync_interval;
  const int64_t retired = (options_.start_step + now.trained_steps) * P;
  const PolicyVersion latest = std::max<PolicyVersion>(now.latest_version, options_.version);
  const int64_t window = StalenessWindow(options_.max_staleness, engine_version, latest, ppv);
  return window > std::numeric_limits<int64_t>::max() - retired ? std::numeric_limits<int64_t>::max()
                                                                : retired + window;
}

int64_t PromptIntake::TrainedEnd(PolicyVersion latest) const {
  const int64_t si = options_.sync_interval, start = options_.start_step;
  // Versions published since the start (at most one a step).
  const int64_t k = std::clamp<int64_t>(latest - options_.version, 0, options_.steps);
  // Version start_version + k follows the update of step (k + start / si) * si
  // (the last step's, when that is past the run's end).
  return std::clamp((k + start / si) * si, start, options_.steps) * options_.prompts_per_step;
}

Result<int64_t> PromptIntake::TakeShared(int64_t want, PolicyVersion engine_version, const TrainerProgress& now) {
  const int64_t P = options_.prompts_per_step;
  // Where the stream is now: the other replicas may have moved it on, and a
  // dead one's prompts come back to it.
  cursor_ = std::clamp(options_.start_step * P + now.taken_prompts, options_.start_step * P, end_cursor_);
  int64_t limit = SharedLimit(now, engine_version);
  // A waiting trainer's prompts first: nothing past them while it waits.
  if (now.waiting) limit = std::min(limit, (options_.start_step + now.trained_steps + 1) * P);
  const int64_t n = std::clamp<int64_t>(std::min(want, limit - cursor_), 0, end_cursor_ - cursor_);
  cursor_ += n;
  return n;
}

Result<int64_t> PromptIntake::StartLimit(PolicyVersion engine_version,
                                         const std::function<Result<TrainerProgress>()>& progress) {
  SLUICE_ASSIGN_OR_RETURN(const TrainerProgress now, progress());
  return SharedLimit(now, engine_version);
}

}  // namespace sluice::schedule
