#include "sluice/checkpoint_engine/weights.h"

#include <utility>

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

SharedStagedWeights::SharedStagedWeights(std::unique_ptr<StagedWeights> staged)
    : version_(staged->version()), staged_(std::move(staged)) {}

Status SharedStagedWeights::Closed() const {
  return Status::FailedPrecondition("the publish of version " + std::to_string(version_) +
                                    " was already committed or aborted");
}

Status SharedStagedWeights::Put(std::string_view name, const HostTensor& tensor) {
  MutexLock lock(&mu_);
  return staged_ != nullptr ? staged_->Put(name, tensor) : Closed();
}

Status SharedStagedWeights::Commit() {
  MutexLock lock(&mu_);
  if (staged_ == nullptr) return Closed();
  Status s = staged_->Commit();
  if (s.ok()) staged_.reset();
  return s;
}

void SharedStagedWeights::Abort() {
  MutexLock lock(&mu_);
  if (staged_ == nullptr) return;
  staged_->Abort();
  staged_.reset();
}

}  // namespace sluice::checkpoint_engine
