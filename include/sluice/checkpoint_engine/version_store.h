// VersionStore: the in-process transport of the CheckpointEngine.
//
// The trainer publishes immutable, numbered weight versions; rollout workers
// in the same process pin the version they generate with and move to a newer
// one between decode steps. A commit is a pointer swap under a lock. It keeps
// the contract of weights.h (layout, increasing versions, two-phase publish,
// pins, memory bound, checksums) and is both the publisher and the reader.
//
// What is its own:
//  * Every version is `version_bytes()`, held in heap buffers; bytes_held <=
//    (pinned + 2) * version_bytes(), reported by stats(). `max_pinned_versions`
//    makes it a hard cap.
//  * Subscribe: callbacks on each commit.
//
// Thread safety: VersionStore and VersionHandle are thread-safe (a given
// VersionHandle object is a value: copy it per thread rather than sharing one
// object between threads that assign to it). A PublishHandle belongs to one
// thread at a time. Internally the store has two locks; lock order is
// notify_mu (serializes commit notifications and Unsubscribe) before mu (all
// version state). Neither lock is held while tensor bytes are copied or
// checksummed; subscriber callbacks run with only notify_mu held.
//
// Lifetime: handles hold a reference to the store's shared state, so
// VersionHandles, tensor views and PublishHandles stay valid after the
// VersionStore object is destroyed. The caller must not destroy the
// VersionStore while another thread is inside one of its methods.
#ifndef SLUICE_CHECKPOINT_ENGINE_VERSION_STORE_H_
#define SLUICE_CHECKPOINT_ENGINE_VERSION_STORE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/checkpoint_engine/weights.h"
#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine {

struct VersionStoreOptions {
  // Required: at least one tensor; names non-empty and unique; dimensions
  // non-negative; each tensor at most max_tensor_bytes.
  Layout layout;
  // Largest tensor accepted, in bytes. Default 4 GiB.
  size_t max_tensor_bytes = size_t{4} << 30;
  // If > 0, pinning a version that is not pinned yet fails with
  // ResourceExhausted once this many distinct versions are pinned; memory is
  // then at most (max_pinned_versions + 2) * version_bytes(). Re-pinning a
  // version that is already pinned (copying a handle) never fails.
  // Default 0: unlimited (the bound is still reported by stats()).
  size_t max_pinned_versions = 0;
  // Keep the buffers of one freed version (superseded and unpinned) and
  // reuse them for the next publish's Put / StageInPlace, instead of
  // returning them to the allocator and faulting fresh pages in next time:
  // worth it when versions arrive every few seconds (a rollout host fed by
  // the broadcast transport). The spare version takes the place of the
  // version being staged in the bound (it exists only while its buffers are
  // not staging, and a version freed while a publish is staging is not
  // kept), so the bound is unchanged; it is reported as spare_bytes and
  // counted in bytes_held. Default false: freed bytes are freed.
  bool reuse_buffers = false;
};

struct PinnedVersion {
  int64_t version = kNoVersion;
  int64_t pins = 0;  // live VersionHandles and tensor views of this version
};

// A consistent snapshot (taken under the store's lock).
struct VersionStoreStats {
  int64_t latest_version = kNoVersion;
  std::vector<PinnedVersion> pinned;        // ascending by version
  std::vector<int64_t> versions_in_memory;  // committed versions alive, ascending
  int64_t staging_version = kNoVersion;     // kNoVersion when nothing is staged
  size_t committed_bytes = 0;               // bytes of versions_in_memory
  size_t staging_bytes = 0;                 // bytes put so far into the open publish
  size_t spare_bytes = 0;                   // kept for reuse (reuse_buffers)
  size_t bytes_held = 0;                    // committed_bytes + staging_bytes + spare_bytes
  // The documented bound: pinned.size() + 1 latest + 1 staging, and the same
  // in bytes (every version is version_bytes()). Always
  // versions_in_memory.size() + (staging ? 1 : 0) <= max_versions_in_memory and
  // bytes_held <= max_bytes_held.
  size_t max_versions_in_memory = 0;
  size_t max_bytes_held = 0;
  uint64_t commits = 0;  // successful Commit()s
  uint64_t aborts = 0;   // publishes ended without commit (Abort, destruction, DataLoss)
};

namespace internal {
struct StoreCore;
struct Snapshot;
struct Staging;
}  // namespace internal

// A pin on one committed version. Copyable (each copy is one more pin) and
// movable (the moved-from handle is empty). The version stays in memory until
// every handle and every tensor view taken from it is gone. A default-built or
// moved-from handle is empty: valid() is false and accessors return errors.
class VersionHandle {
 public:
  VersionHandle() = default;
  VersionHandle(const VersionHandle& other);
  VersionHandle& operator=(const VersionHandle& other);
  VersionHandle(VersionHandle&& other) noexcept;
  VersionHandle& operator=(VersionHandle&& other) noexcept;
  ~VersionHandle();

  bool valid() const { return snapshot_ != nullptr; }
  // kNoVersion if empty.
  int64_t version() const;

  // A zero-copy view of tensor `name`. The view's owner holds its own pin, so
  // the bytes stay valid (and the version stays counted in stats) for as long
  // as the view or any copy of it lives. NotFound if `name` is not in the
  // layout; FailedPrecondition if the handle is empty.
  Result<HostTensor> tensor(std::string_view name) const;

  // The checksum recorded at Put for `name`. NotFound / FailedPrecondition as
  // for tensor().
  Result<uint64_t> checksum(std::string_view name) const;

  // Recomputes every tensor's checksum. DataLoss naming the first tensor whose
  // bytes no longer match; FailedPrecondition if the handle is empty.
  Status Verify() const;

 private:
  friend struct internal::StoreCore;
  VersionHandle(std::shared_ptr<internal::StoreCore> core, const internal::Snapshot* snapshot)
      : core_(std::move(core)), snapshot_(snapshot) {}
  void Release();

  std::shared_ptr<internal::StoreCore> core_;
  const internal::Snapshot* snapshot_ = nullptr;  // pinned; owned by core_
};

// One staged publish, from VersionStore::BeginPublish: the contract of
// StagedWeights (weights.h). Destroying a handle that was not committed
// aborts it: staging is freed and the version number is released, the
// previous latest version keeps serving. Commit notifies subscribers on the
// committing thread, in commit order, and is FailedPrecondition from inside
// a subscriber callback.
class PublishHandle final : public StagedWeights {
 public:
  ~PublishHandle() override;
  PublishHandle(const PublishHandle&) = delete;
  PublishHandle& operator=(const PublishHandle&) = delete;

  int64_t version() const override { return version_; }
  Status Put(std::string_view name, const HostTensor& tensor) override;
  Result<std::span<std::byte>> StageInPlace(std::string_view name) override;
  Status SealInPlace(std::string_view name, uint64_t expected_checksum) override;
  Status Commit() override;
  void Abort() override;
  std::span<std::byte> MutableStagedBytesForTesting(std::string_view name) override;

 private:
  friend class VersionStore;
  PublishHandle(std::shared_ptr<internal::StoreCore> core, int64_t version);

  std::shared_ptr<internal::StoreCore> core_;
  int64_t version_;
  std::unique_ptr<internal::Staging> staging_;  // null once committed or aborted
};

class VersionStore final : public TwoPhasePublisher, public WeightReader {
 public:
  // InvalidArgument naming the offending layout entry if the options are
  // malformed (see VersionStoreOptions).
  static Result<std::unique_ptr<VersionStore>> Create(VersionStoreOptions options);
  ~VersionStore() override;
  VersionStore(const VersionStore&) = delete;
  VersionStore& operator=(const VersionStore&) = delete;

  // Errors of TwoPhasePublisher::BeginPublish; also FailedPrecondition from
  // inside a subscriber callback. The handle is a PublishHandle.
  Result<std::unique_ptr<StagedWeights>> BeginPublish(int64_t version) override;

  // Pins the latest committed version. NotFound if nothing was committed yet;
  // ResourceExhausted if max_pinned_versions is reached.
  Result<VersionHandle> AcquireLatest();

  // Pins `version`. NotFound if it was never committed or was already freed
  // (superseded and unpinned); ResourceExhausted as for AcquireLatest.
  Result<VersionHandle> Acquire(int64_t version);

  // Waits until a version >= at_least is committed, then pins the latest.
  // Timeout if none arrives within `timeout` (the message names the latest);
  // ResourceExhausted as for AcquireLatest.
  Result<VersionHandle> WaitForVersion(int64_t at_least, std::chrono::milliseconds timeout);

  // WeightReader: the same pins, as views of every tensor.
  Result<PinnedWeights> PinLatest() override;
  Result<PinnedWeights> WaitAndPin(int64_t at_least, std::chrono::milliseconds timeout) override;

  // kNoVersion before the first commit.
  int64_t latest_version() const override;
  VersionStoreStats stats() const;

  // Registers `callback`, called with the version after each successful
  // commit from then on: on the committing thread, outside the state lock,
  // in commit order, one call at a time. A callback may Acquire* and
  // Unsubscribe (effective from the next commit) but must not publish (that
  // returns FailedPrecondition). Returns an id for Unsubscribe.
  uint64_t Subscribe(std::function<void(int64_t version)> callback);

  // Removes a subscription. Called outside a callback, it waits for a
  // notification in progress, so the callback never runs after it returns.
  // NotFound if `id` is not subscribed.
  Status Unsubscribe(uint64_t id);

  const Layout& layout() const override;
  // Bytes of one version: the sum of the layout's tensor sizes.
  size_t version_bytes() const;

 private:
  explicit VersionStore(std::shared_ptr<internal::StoreCore> core);
  std::shared_ptr<internal::StoreCore> core_;
};

}  // namespace sluice::checkpoint_engine

#endif  // SLUICE_CHECKPOINT_ENGINE_VERSION_STORE_H_
