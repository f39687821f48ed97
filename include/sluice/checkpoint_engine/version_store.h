// VersionStore: the in-process weight hub of the CheckpointEngine.
//
// The trainer publishes immutable, numbered weight versions; rollout workers
// pin the version they generate with and move to a newer one between decode
// steps. This is the in-process transport (a commit is a pointer swap under a
// lock); shared-memory and cross-host transports will stage into the same
// two-phase PublishHandle contract and are not part of this file.
//
// Contract
//  * Layout. Every version holds exactly the tensors of the layout given at
//    Create() (names, dtypes, shapes), so every version is `version_bytes()`.
//  * Two-phase publish. BeginPublish(v) reserves v; PublishHandle::Put copies
//    each tensor into staging and checksums it; Commit() checks that every
//    layout tensor was put exactly once and that the staged bytes still match
//    their checksums, then makes v the latest version atomically. Readers never
//    see a version before its last byte is in place.
//  * Versions only increase. v must be > the latest committed version; only
//    one publish may be staged at a time.
//  * Readers pin. Acquire*/WaitForVersion return a VersionHandle that keeps its
//    version alive. A version is freed as soon as it is neither the latest nor
//    pinned by any handle (or tensor view taken from one).
//  * Memory bound. Committed versions in memory are at most
//    (distinct pinned versions + 1 latest), plus at most 1 version being
//    staged: bytes_held <= (pinned + 2) * version_bytes(). Stats reports the
//    bound next to the actual figures. `max_pinned_versions` turns it into a
//    hard cap.
//  * Integrity. Checksums are 64-bit XXH64-style hashes computed per tensor
//    at Put (see src/checkpoint_engine/checksum.h). They detect accidental
//    corruption (a stray write into staging, a torn copy); they are not a
//    defence against an adversary.
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

#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine {

// "No version": returned by latest_version() before the first commit.
inline constexpr int64_t kNoVersion = -1;

// One named tensor of the registered layout.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};
using Layout = std::vector<TensorSpec>;

// The layout of `tensors` (names, dtypes, shapes), in name order.
Layout LayoutOf(const TensorMap& tensors);

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
  // not staging), so the bound is unchanged; it is reported as spare_bytes
  // and counted in bytes_held. Default false: freed bytes are freed.
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

// One staged publish, from VersionStore::BeginPublish. Destroying a handle
// that was not committed aborts it: staging is freed and the version number
// is released, the previous latest version keeps serving.
class PublishHandle {
 public:
  ~PublishHandle();
  PublishHandle(const PublishHandle&) = delete;
  PublishHandle& operator=(const PublishHandle&) = delete;

  int64_t version() const { return version_; }

  // Copies `tensor` into staging and checksums the copy. Errors leave the
  // staged state as it was (the caller may fix the input and Put again):
  //   InvalidArgument   - `name` not in the layout; dtype or shape differ from
  //                       the layout; nbytes inconsistent with the shape; null data
  //   ResourceExhausted - tensor.nbytes > max_tensor_bytes
  //   AlreadyExists     - `name` was already put in this publish
  //   FailedPrecondition- the publish was committed or aborted
  Status Put(std::string_view name, const HostTensor& tensor);

  // Zero-copy staging for transports that receive a tensor in pieces (the
  // cross-host broadcast lets network buffers land here directly, see
  // broadcast.h). StageInPlace returns writable staging memory for `name`,
  // exactly its layout size (a second call returns the same span); the caller
  // fills it, then SealInPlace checksums it and, if it matches
  // `expected_checksum`, counts the tensor as put. A tensor staged but not
  // sealed is missing for Commit. The span stays valid until Commit or Abort;
  // a write after sealing is caught by Commit's re-verification. Distinct
  // tensors' spans may be written by other threads, concurrently with each
  // other and with SealInPlace of other tensors. Errors:
  //   StageInPlace: InvalidArgument (not in the layout); AlreadyExists
  //                 (already put or sealed); FailedPrecondition (closed)
  //   SealInPlace:  FailedPrecondition (not staged in place; closed);
  //                 AlreadyExists (already sealed); DataLoss (the bytes do
  //                 not match: the tensor stays staged and unsealed, and may
  //                 be rewritten and sealed again)
  Result<std::span<std::byte>> StageInPlace(std::string_view name);
  Status SealInPlace(std::string_view name, uint64_t expected_checksum);

  // Makes the version visible atomically, then notifies subscribers (on this
  // thread, in commit order). Errors:
  //   FailedPrecondition - layout tensors missing (names listed; the publish
  //                        stays open so they can still be put); already
  //                        committed/aborted; called from a subscriber callback
  //   DataLoss           - staged bytes changed since Put (tensor named); the
  //                        publish is aborted
  // On any error the previously committed version keeps serving.
  Status Commit();

  // Frees staging and releases the version number. No-op after Commit/Abort.
  void Abort();

  // TEST ONLY: writable access to the staged bytes of `name`, so tests can
  // simulate a memory fault between Put and Commit (which Commit must catch).
  // Empty span if `name` was not put or the publish is no longer open.
  std::span<std::byte> MutableStagedBytesForTesting(std::string_view name);

 private:
  friend class VersionStore;
  PublishHandle(std::shared_ptr<internal::StoreCore> core, int64_t version);

  std::shared_ptr<internal::StoreCore> core_;
  int64_t version_;
  std::unique_ptr<internal::Staging> staging_;  // null once committed or aborted
};

class VersionStore {
 public:
  // InvalidArgument naming the offending layout entry if the options are
  // malformed (see VersionStoreOptions).
  static Result<std::unique_ptr<VersionStore>> Create(VersionStoreOptions options);
  ~VersionStore();
  VersionStore(const VersionStore&) = delete;
  VersionStore& operator=(const VersionStore&) = delete;

  // Reserves `version` for staging. Errors:
  //   InvalidArgument    - version < 0
  //   AlreadyExists      - version == latest committed version
  //   FailedPrecondition - version < latest committed version; another publish
  //                        is open (its version is named); called from a
  //                        subscriber callback
  Result<std::unique_ptr<PublishHandle>> BeginPublish(int64_t version);

  // BeginPublish + Put of every entry + Commit; any error aborts the publish
  // and is returned (tensors not in the layout are InvalidArgument).
  Status Publish(int64_t version, const TensorMap& tensors);

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

  // kNoVersion before the first commit.
  int64_t latest_version() const;
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

  const Layout& layout() const;
  // Bytes of one version: the sum of the layout's tensor sizes.
  size_t version_bytes() const;

 private:
  explicit VersionStore(std::shared_ptr<internal::StoreCore> core);
  std::shared_ptr<internal::StoreCore> core_;
};

}  // namespace sluice::checkpoint_engine

#endif  // SLUICE_CHECKPOINT_ENGINE_VERSION_STORE_H_
