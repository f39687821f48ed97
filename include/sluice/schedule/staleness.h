// Staleness admission: bounds how far rollout runs ahead of the trainer by
// admission control, not by discarding samples (discarding biases training
// toward short answers).
//
// The trainer reports the weight version it will train with next; a rollout
// worker generating with version v_r asks to admit prompts. With
//   pending = prompts admitted and not yet retired (consumed by the trainer,
//             or dropped),
//   ppv     = prompts_per_version, the prompts the trainer consumes per
//             weight version,
// a prompt is admitted only while
//   trainer_version + floor(pending / ppv) - v_r <= max_staleness,
// evaluated for each prompt in turn with `pending` counting the prompts
// admitted before it. A rollout that cannot be admitted waits (with a
// timeout) until the trainer advances or prompts retire.
//
// Guarantee. Suppose the trainer consumes prompts in admission order,
// exactly ppv prompts per version (dropped prompts are skipped), trains a
// step's prompts with the version it reported, and retires them no earlier
// than it reports the next version (CompleteStep does both atomically). Then
// every admitted prompt is trained with a version <= v_r + max_staleness:
// a prompt admitted at position p of the pending queue is trained in the
// floor(p / ppv)-th step from the trainer's current one (retirements are
// whole steps, drops only move it forward), i.e. with version
// trainer_version + floor(p / ppv) <= v_r + max_staleness. The guarantee is
// about admission order; a prompt that waits in the queue longer than its
// position implies (e.g. a consumer that skips it) is not covered.
//
// Thread safety: every method is thread-safe.
#ifndef SLUICE_SCHEDULE_STALENESS_H_
#define SLUICE_SCHEDULE_STALENESS_H_

#include <chrono>
#include <cstdint>
#include <memory>

#include "sluice/common/ids.h"
#include "sluice/common/mutex.h"
#include "sluice/common/status.h"

namespace sluice::schedule {

// The rule in one place: how many prompts past the ones the trainer has
// retired a rollout at `rollout_version` may start while the trainer is at
// `trainer_version`. The prompt at position p past the retired ones is
// trained floor(p / prompts_per_version) versions after trainer_version, so
// the window is (max_staleness + rollout_version - trainer_version + 1) *
// prompts_per_version: 0 when that is negative, saturated at INT64_MAX.
// StalenessAdmission admits what is left of it past its pending prompts;
// PromptIntake's shared stream starts the cursors below retired + window.
int64_t StalenessWindow(int64_t max_staleness, PolicyVersion rollout_version, PolicyVersion trainer_version,
                        int64_t prompts_per_version);

struct StalenessOptions {
  int64_t max_staleness = 1;                  // >= 0; 0 = fully on-policy
  int64_t prompts_per_version = 1;            // > 0
  PolicyVersion initial_trainer_version = 0;  // >= 0
};

struct AdmissionStats {
  PolicyVersion trainer_version = 0;
  int64_t pending = 0;
  int64_t admitted = 0;  // since start
  int64_t retired = 0;   // since start
  int64_t waiters = 0;   // Admit calls blocked now
};

class StalenessAdmission {
 public:
  // InvalidArgument naming the bad option.
  static Result<std::unique_ptr<StalenessAdmission>> Create(StalenessOptions options);

  // Admits up to n prompts for a rollout generating with `rollout_version`.
  // Waits up to `timeout` until at least one is admissible, then admits as
  // many as the rule allows, at most n, and returns the count (>= 1).
  // Errors: InvalidArgument (n <= 0, rollout_version < 0, negative timeout),
  // Timeout (nothing admissible in time; timeout 0 = do not wait), Aborted
  // (Close()).
  Result<int64_t> Admit(int64_t n, PolicyVersion rollout_version, std::chrono::milliseconds timeout);

  // How many prompts a rollout at `rollout_version` could be admitted now.
  int64_t Admissible(PolicyVersion rollout_version) const;

  // The trainer's new version. FailedPrecondition if it goes backwards;
  // reporting the current version again is a no-op.
  Status ReportTrainerVersion(PolicyVersion version);
  // n prompts were consumed by the trainer or dropped. InvalidArgument if
  // n <= 0; FailedPrecondition if n > pending.
  Status Retire(int64_t n);
  // ReportTrainerVersion(new_version) and Retire(consumed) as one step, so
  // admission never sees the prompts retired under the old version.
  // consumed may be 0. Errors as the two calls; nothing changes on error.
  Status CompleteStep(PolicyVersion new_version, int64_t consumed);

  AdmissionStats stats() const;
  // Wakes blocked Admit calls with Aborted; later Admit calls return Aborted.
  void Close();

 private:
  explicit StalenessAdmission(StalenessOptions options);
  int64_t AdmissibleLocked(PolicyVersion rollout_version) const SLUICE_REQUIRES(mu_);

  const StalenessOptions options_;
  mutable Mutex mu_;
  CondVar changed_;
  PolicyVersion trainer_version_ SLUICE_GUARDED_BY(mu_);
  int64_t pending_ SLUICE_GUARDED_BY(mu_) = 0;
  int64_t admitted_ SLUICE_GUARDED_BY(mu_) = 0;
  int64_t retired_ SLUICE_GUARDED_BY(mu_) = 0;
  int64_t waiters_ SLUICE_GUARDED_BY(mu_) = 0;
  bool closed_ SLUICE_GUARDED_BY(mu_) = false;
};

}  // namespace sluice::schedule

#endif  // SLUICE_SCHEDULE_STALENESS_H_
