// PinnedWeights from a transport's own pin handle (VersionHandle,
// ShmVersionHandle): a view of every layout tensor, each holding the pin.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_PIN_VIEWS_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_PIN_VIEWS_H_

#include "sluice/checkpoint_engine/weights.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine::internal {

template <typename Handle>
Result<PinnedWeights> PinViews(const Handle& handle, const Layout& layout) {
  PinnedWeights pinned;
  pinned.version = handle.version();
  for (const TensorSpec& spec : layout) {
    SLUICE_ASSIGN_OR_RETURN(HostTensor view, handle.tensor(spec.name));
    pinned.tensors.emplace(spec.name, std::move(view));
  }
  return pinned;
}

}  // namespace sluice::checkpoint_engine::internal

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_PIN_VIEWS_H_
