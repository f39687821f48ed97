#include "sluice/schedule/staleness.h"

#include <algorithm>
#include <limits>
#include <string>

#include "sluice/common/deadline.h"

namespace sluice::schedule {

Result<std::unique_ptr<StalenessAdmission>> StalenessAdmission::Create(StalenessOptions options) {
  if (options.max_staleness < 0) {
    return Status::InvalidArgument("StalenessOptions.max_staleness must be >= 0, got " +
                                   std::to_string(options.max_staleness));
  }
  if (options.prompts_per_version <= 0) {
    return Status::InvalidArgument("StalenessOptions.prompts_per_version must be > 0, got " +
                                   std::to_string(options.prompts_per_version));
  }
  if (options.initial_trainer_version < 0) {
    return Status::InvalidArgument("StalenessOptions.initial_trainer_version must be >= 0, got " +
                                   std::to_string(options.initial_trainer_version));
  }
  return std::unique_ptr<StalenessAdmission>(new StalenessAdmission(options));
}

StalenessAdmission::StalenessAdmission(StalenessOptions options)
    : options_(options), trainer_version_(options.initial_trainer_version) {}

int64_t StalenessWindow(int64_t max_staleness, PolicyVersion rollout_version, PolicyVersion trainer_version,
                        int64_t prompts_per_version) {
  // The prompt at position p is admissible iff floor(p / ppv) <= budget,
  // budget = max_staleness + v_r - trainer_version, i.e. iff p < (budget +
  // 1) * ppv. Computed in 128 bits: versions and staleness are
  // caller-controlled.
  const __int128 budget = static_cast<__int128>(max_staleness) + rollout_version - trainer_version;
  if (budget < 0) return 0;
  const __int128 window = (budget + 1) * prompts_per_version;
  return static_cast<int64_t>(std::min<__int128>(window, std::numeric_limits<int64_t>::max()));
}

int64_t StalenessAdmission::AdmissibleLocked(PolicyVersion rollout_version) const {
  const int64_t window =
      StalenessWindow(options_.max_staleness, rollout_version, trainer_version_, options_.prompts_per_version);
  return std::max<int64_t>(window - pending_, 0);
}

int64_t StalenessAdmission::Admissible(PolicyVersion rollout_version) const {
  MutexLock lock(&mu_);
  return AdmissibleLocked(rollout_version);
}

Result<int64_t> StalenessAdmission::Admit(int64_t n, PolicyVersion rollout_version, std::chrono::milliseconds timeout) {
  if (n <= 0) return Status::InvalidArgument("Admit: n must be > 0, got " + std::to_string(n));
  if (rollout_version < 0) {
    return Status::InvalidArgument("Admit: rollout_version must be >= 0, got " + std::to_string(rollout_version));
  }
  if (timeout.count() < 0) {
    return Status::InvalidArgument("Admit: timeout is negative (" + std::to_string(timeout.count()) + " ms)");
  }
  MutexLock lock(&mu_);
  ++waiters_;
  auto admissible = [&]() SLUICE_REQUIRES(mu_) { return closed_ || AdmissibleLocked(rollout_version) > 0; };
  // A zero timeout is a poll (the rollout's intake, the simulator): answered
  // without a wait, which would cost a system call.
  const bool ready = timeout.count() == 0 ? admissible() : changed_.WaitUntil(&mu_, DeadlineAfter(timeout), admissible);
  --waiters_;
  if (closed_) return Status::Aborted("Admit: the staleness admission was closed");
  if (!ready) {
    return Status::Timeout("Admit: no prompt admissible for a rollout at version " + std::to_string(rollout_version) +
                           " within " + std::to_string(timeout.count()) + " ms (trainer at version " +
                           std::to_string(trainer_version_) + ", " + std::to_string(pending_) +
                           " prompts pending, max_staleness " + std::to_string(options_.max_staleness) +
                           ", prompts_per_version " + std::to_string(options_.prompts_per_version) + ")");
  }
  const int64_t admitted = std::min(n, AdmissibleLocked(rollout_version));
  pending_ += admitted;
  admitted_ += admitted;
  return admitted;
}

Status StalenessAdmission::ReportTrainerVersion(PolicyVersion version) { return CompleteStep(version, 0); }

Status StalenessAdmission::Retire(int64_t n) {
  if (n <= 0) return Status::InvalidArgument("Retire: n must be > 0, got " + std::to_string(n));
  MutexLock lock(&mu_);
  if (n > pending_) {
    return Status::FailedPrecondition("Retire: " + std::to_string(n) + " prompts retired but only " +
                                      std::to_string(pending_) + " are pending");
  }
  pending_ -= n;
  retired_ += n;
  changed_.NotifyAll();
  return Status::Ok();
}

Status StalenessAdmission::CompleteStep(PolicyVersion new_version, int64_t consumed) {
  if (consumed < 0)
    return Status::InvalidArgument("CompleteStep: consumed is negative (" + std::to_string(consumed) + ")");
  MutexLock lock(&mu_);
  if (new_version < trainer_version_) {
    return Status::FailedPrecondition("trainer version cannot go backwards: " + std::to_string(new_version) +
                                      " reported after " + std::to_string(trainer_version_));
  }
  if (consumed > pending_) {
    return Status::FailedPrecondition("CompleteStep: " + std::to_string(consumed) + " prompts retired but only " +
                                      std::to_string(pending_) + " are pending");
  }
  trainer_version_ = new_version;
  pending_ -= consumed;
  retired_ += consumed;
  changed_.NotifyAll();
  return Status::Ok();
}

AdmissionStats StalenessAdmission::stats() const {
  MutexLock lock(&mu_);
  return AdmissionStats{trainer_version_, pending_, admitted_, retired_, waiters_};
}

void StalenessAdmission::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  changed_.NotifyAll();
}

}  // namespace sluice::schedule
