#include "sluice/schedule/intake.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace sluice::schedule {

namespace tq = transfer_queue;

Result<std::unique_ptr<PromptIntake>> PromptIntake::Create(const IntakeOptions& o) {
  auto bad = [](const std::string& what) { return Status::InvalidArgument("prompt intake: " + what); };
  if (o.prompts_per_step <= 0) return bad("prompts_per_step must be > 0");
  if (o.group_size <= 0) return bad("group_size must be > 0");
  if (o.sync_interval <= 0) return bad("sync_interval must be > 0");
  if (o.start_step < 0 || o.steps < o.start_step) return bad("need 0 <= start_step <= steps");
  if (o.engines <= 0) return bad("engines must be > 0");
  tq::StalenessOptions so;
  so.max_staleness = o.max_staleness;
  so.prompts_per_version = o.prompts_per_step * o.sync_interval;
  so.initial_trainer_version = o.version;
  SLUICE_ASSIGN_OR_RETURN(auto admission, tq::StalenessAdmission::Create(so));
  return std::unique_ptr<PromptIntake>(new PromptIntake(o, std::move(admission)));
}

PromptIntake::PromptIntake(const IntakeOptions& options, std::unique_ptr<tq::StalenessAdmission> admission)
    : options_(options),
      admission_(std::move(admission)),
      cursor_(options.start_step * options.prompts_per_step),
      end_cursor_(options.steps * options.prompts_per_step) {}

Result<int64_t> PromptIntake::Take(int64_t slots, int64_t queued, PolicyVersion engine_version,
                                   const std::function<Result<TrainerProgress>()>& progress) {
  const int64_t P = options_.prompts_per_step, G = options_.group_size;
  // (At least one group for an engine with fewer slots than a group.)
  const int64_t target = options_.engines > 1 ? std::max(slots, G) : 2 * slots;
  int64_t want = std::min<int64_t>((target - queued) / G, end_cursor_ - cursor_);
  if (options_.engines > 1) want = std::min<int64_t>(want, (P + options_.engines - 1) / options_.engines);
  if (want <= 0) return int64_t{0};
  // Bring admission up to date: progress first, then the newest version,
  // which was published before that progress.
  SLUICE_ASSIGN_OR_RETURN(const TrainerProgress now, progress());
  const tq::AdmissionStats seen = admission_->stats();
  const PolicyVersion latest = std::max(now.latest_version, seen.trainer_version);
  const int64_t acked = now.acked_answers / G;
  // Never more than is pending: a group the hub delivered twice (a lease that
  // ran out) is acked twice but admitted once.
  const int64_t consumed = std::min(acked - retired_, seen.pending);
  retired_ = acked;
  SLUICE_RETURN_IF_ERROR(admission_->CompleteStep(latest, std::max<int64_t>(consumed, 0)));
  // A waiting trainer's prompts first: nothing past them while it waits.
  if (now.waiting) want = std::min<int64_t>(want, (options_.start_step + acked / P + 1) * P - cursor_);
  if (want <= 0) return int64_t{0};
  auto admitted = admission_->Admit(want, engine_version, std::chrono::milliseconds(0));
  if (!admitted.ok()) {
    if (admitted.status().code() == StatusCode::kTimeout) return int64_t{0};
    return admitted.status();
  }
  cursor_ += *admitted;
  return *admitted;
}

}  // namespace sluice::schedule
