#include "sluice/checkpoint_engine/weights.h"

namespace sluice::checkpoint_engine {

Layout LayoutOf(const TensorMap& tensors) {
  Layout layout;
  for (const auto& [name, t] : tensors) layout.push_back({name, t.dtype, t.shape});
  return layout;
}

Status TwoPhasePublisher::Publish(int64_t version, const TensorMap& tensors) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<StagedWeights> staged, BeginPublish(version));
  for (const auto& [name, tensor] : tensors) SLUICE_RETURN_IF_ERROR(staged->Put(name, tensor));
  return staged->Commit();  // the destructor aborts on any error above
}

}  // namespace sluice::checkpoint_engine
