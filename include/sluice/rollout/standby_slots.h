// The bookkeeping of StandbyWeights' two model buffers (standby_weights.h),
// torch-free so that its locking is checked by clang's -Wthread-safety (the
// test command's thread_safety_check): which buffer the engine serves, which
// is filled and ready, which is handed to the engine but not serving yet,
// each buffer's version, and the counters. The buffers are the caller's;
// this class only says which one may be written and which one to hand out.
//
// Thread safety: every method is thread-safe (one mutex).
#ifndef SLUICE_ROLLOUT_STANDBY_SLOTS_H_
#define SLUICE_ROLLOUT_STANDBY_SLOTS_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <string>

#include "sluice/common/ids.h"
#include "sluice/common/mutex.h"
#include "sluice/common/status.h"

namespace sluice::rollout {

struct StandbyStats {
  int64_t fills = 0;             // versions copied into the standby buffer
  int64_t handed = 0;            // snapshots handed to the engine by the hook
  int64_t fill_errors = 0;       // versions that could not be loaded (see last_error)
  int64_t newest_seen = -1;      // newest version the filler pinned
  int64_t ready_version = -1;    // version filled and not handed yet (-1: none)
  double last_fill_seconds = 0;  // pin + copy of the last fill
  double max_hook_seconds = 0;   // longest hook call (the engine's stall per switch)
  std::string last_error;        // empty if no fill failed
};

class StandbySlots {
 public:
  // Both buffers hold `serving_version`; buffer 0 serves.
  explicit StandbySlots(PolicyVersion serving_version);

  // The buffer to hand the engine and its version, called between steps
  // with the version the engine serves: once the engine serves the handed
  // buffer's version, that buffer is the serving one (the other is free);
  // with nothing handed, a ready buffer newer than `current` is handed.
  struct Handed {
    int buffer = 0;
    PolicyVersion version = 0;
  };
  std::optional<Handed> OnStep(PolicyVersion current);

  // The version of the buffer being served.
  PolicyVersion serving_version() const;

  // The filler: `version` was pinned (stats().newest_seen).
  void Saw(PolicyVersion version);
  // The filler: waits (polling `stop` every `poll`) until a buffer is
  // neither serving nor handed, and returns it; a ready buffer there is
  // superseded (no longer ready). nullopt once `stop` is requested.
  std::optional<int> TakeFreeBuffer(const std::stop_token& stop, std::chrono::milliseconds poll);
  // The filler: `buffer` (from TakeFreeBuffer) now holds `version`, ready to
  // be handed; `seconds` the fill took.
  void Filled(int buffer, PolicyVersion version, double seconds);
  // The filler: a version could not be pinned or loaded.
  void FillFailed(std::string error);

  // Waits until a version >= v is ready, handed or serving. Timeout naming
  // the newest version seen and the last fill error otherwise.
  Status WaitUntilReady(PolicyVersion v, std::chrono::milliseconds timeout);

  StandbyStats stats() const;

 private:
  // The buffer the filler may write: neither serving nor handed.
  std::optional<int> FreeBuffer() const SLUICE_REQUIRES(mu_);

  mutable Mutex mu_;
  CondVar changed_;
  int serving_ SLUICE_GUARDED_BY(mu_) = 0;  // the buffer the engine reads
  std::array<PolicyVersion, 2> version_ SLUICE_GUARDED_BY(mu_);
  std::optional<int> handed_ SLUICE_GUARDED_BY(mu_);  // given to the engine, not serving yet
  std::optional<int> ready_ SLUICE_GUARDED_BY(mu_);   // filled, not handed
  StandbyStats stats_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice::rollout

#endif  // SLUICE_ROLLOUT_STANDBY_SLOTS_H_
