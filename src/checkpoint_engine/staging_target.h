// The local store a broadcast subscriber stages versions into: one interface
// over the in-process VersionStore and the host's shared-memory store, by
// tensor index (layout order) instead of name.
//
// Thread safety: as for the stores' publish handles — a StagedVersion is
// used by one thread at a time, but the spans it hands out may be written by
// other threads (distinct tensors), concurrently with Seal of other tensors.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_STAGING_TARGET_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_STAGING_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine::internal {

class StagedVersion {
 public:
  virtual ~StagedVersion() = default;  // aborts unless committed
  virtual Result<std::span<std::byte>> Stage(size_t tensor) = 0;
  virtual Status Seal(size_t tensor, uint64_t checksum) = 0;
  virtual Status Commit() = 0;
};

class StagingTarget {
 public:
  virtual ~StagingTarget() = default;
  virtual const Layout& layout() const = 0;
  virtual int64_t latest_version() const = 0;
  // Errors of the store's BeginPublish.
  virtual Result<std::unique_ptr<StagedVersion>> Begin(int64_t version) = 0;
};

std::unique_ptr<StagingTarget> MakeStagingTarget(std::shared_ptr<VersionStore> store);
std::unique_ptr<StagingTarget> MakeStagingTarget(std::shared_ptr<ShmPublisher> store);

}  // namespace sluice::checkpoint_engine::internal

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_STAGING_TARGET_H_
