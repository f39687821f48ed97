// StandbyWeights: the rollout side of the CheckpointEngine.
//
// A rollout worker serves one weight version while the next one is copied
// into a standby copy of the model in the background; at a decode-step
// boundary the engine's weight-swap hook swaps the two (a pointer swap), so
// the rollout stall per switch is the swap, not the transfer.
//
//   reader (a CheckpointEngine WeightReader: the VersionStore in process,
//      │    an ShmSubscriber across processes)
//      │  newer version committed
//      ▼
//   filler thread: pins it, copies every tensor into the free buffer
//      │  ready
//      ▼
//   engine hook (between steps): hands the ready buffer to the engine
//
// Two model buffers. At any time one is serving (the engine reads it), and the
// other is free, being filled, ready, or handed to the engine but not serving
// yet (SwitchPolicy::kAtBoundary keeps it pending until the sequences in
// flight finish). The filler only writes the free buffer; the buffer the
// engine stopped serving becomes free once the hook is called with the new
// version as `current` (the engine's contract, see engine.h). Versions that
// are superseded before they are copied are skipped: only the newest is
// filled.
//
// Thread safety: the hook is called on the engine's thread; the filler runs on
// its own thread; stats() and Stop() from any thread.
#ifndef SLUICE_ROLLOUT_STANDBY_WEIGHTS_H_
#define SLUICE_ROLLOUT_STANDBY_WEIGHTS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/checkpoint_engine/weights.h"
#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"
#include "sluice/rollout/engine.h"
#include "sluice/rollout/standby_slots.h"

namespace sluice::rollout {

class StandbyWeights {
 public:
  // `serving` is the model the engine serves now, as `serving_version`; a
  // second buffer is cloned from it. The filler thread starts at once and
  // waits for versions > serving_version in `weights`, which must outlive
  // this object. InvalidArgument for a null model.
  static Result<std::unique_ptr<StandbyWeights>> Create(std::shared_ptr<model::Transformer> serving,
                                                        PolicyVersion serving_version,
                                                        checkpoint_engine::WeightReader& weights);
  ~StandbyWeights();  // stops and joins the filler
  StandbyWeights(const StandbyWeights&) = delete;
  StandbyWeights& operator=(const StandbyWeights&) = delete;

  // The hook to install with RolloutEngine::SetWeightSwapHook. It only swaps
  // pointers under a lock, never copies.
  WeightSwapHook Hook();

  // Waits until a version >= v is ready or handed out (tests, at start-up).
  Status WaitUntilReady(int64_t v, std::chrono::milliseconds timeout);

  StandbyStats stats() const;

  // Stops the filler (idempotent); the hook keeps working with what is ready.
  void Stop();

 private:
  struct State;
  explicit StandbyWeights(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

// Shares one weight-swap hook among `engines` engines that start serving
// `start_version` (data-parallel rollout). Each engine gets its own hook; the
// shared hook is told the version the slowest engine serves, so a source that
// recycles the buffer of the version it was last told (StandbyWeights) never
// overwrites weights an engine still reads, and each engine adopts the newest
// snapshot handed out at its next step. Thread-safe.
std::vector<WeightSwapHook> ShareWeightSwapHook(WeightSwapHook hook, int engines, PolicyVersion start_version);

}  // namespace sluice::rollout

#endif  // SLUICE_ROLLOUT_STANDBY_WEIGHTS_H_
