// The CheckpointEngine's one interface: every transport publishes through a
// WeightPublisher and is read through a WeightReader, so the trainer, the
// rollout and the tools do not know which transport carries the weights.
//
//   transport              publisher                       reader
//   in process             VersionStore                    VersionStore
//   same host, processes   ShmPublisher                    ShmSubscriber
//   across hosts           BroadcastPublisher              the store each host's BroadcastSubscriber
//                                                          fills (a VersionStore, or an ShmPublisher
//                                                          whose ShmSubscribers read)
//
// The contract every transport keeps
//  * Layout. A store holds exactly the tensors of one layout (names, dtypes,
//    shapes); every version has them all.
//  * Versions are immutable and only increase. A publish of v needs
//    v > latest_version(); kNoVersion (-1) means nothing was published yet.
//  * Two-phase publish. A staged publish (StagedWeights) copies each tensor
//    in and checksums it; Commit checks that every layout tensor was put
//    exactly once and that the staged bytes still match their checksums, then
//    makes the version the latest atomically. Readers never see a version
//    before its last byte is in place. A publish that fails in any way leaves
//    the previous version serving.
//  * Readers pin. A pinned version (PinnedWeights, or a transport's own
//    handle) stays valid, unchanged, for as long as the pin or any tensor
//    view taken from it lives. A version is freed as soon as it is neither
//    the latest nor pinned.
//  * Memory is bounded: committed versions held <= distinct pinned versions
//    + 1 (the latest), plus at most one being staged. Each transport's stats
//    report the bound next to the actual figures.
//  * Integrity. Per-tensor 64-bit checksums (XXH64-style) detect accidental
//    corruption (a stray write into staging, a torn copy); they are not a
//    defence against an adversary.
//
// The transports' headers (version_store.h, shm_store.h, broadcast.h) add
// what is their own: where the bytes live, crash repair, membership.
#ifndef SLUICE_CHECKPOINT_ENGINE_WEIGHTS_H_
#define SLUICE_CHECKPOINT_ENGINE_WEIGHTS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/host_tensor.h"
#include "sluice/common/mutex.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine {

// "No version": latest_version() before the first commit.
inline constexpr int64_t kNoVersion = -1;

// One named tensor of a store's layout.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};
using Layout = std::vector<TensorSpec>;

// The layout of `tensors` (names, dtypes, shapes), in name order.
Layout LayoutOf(const TensorMap& tensors);

// One publish in progress, from TwoPhasePublisher::BeginPublish. It belongs to
// one thread at a time (the spans of StageInPlace excepted, see there).
// Destroying it without a successful Commit aborts it.
class StagedWeights {
 public:
  virtual ~StagedWeights() = default;

  virtual int64_t version() const = 0;

  // Copies `tensor` into staging and checksums the copy. Errors leave the
  // staged state as it was (the caller may fix the input and Put again):
  //   InvalidArgument    - `name` not in the layout; dtype, shape or nbytes
  //                        differ from the layout; null data
  //   ResourceExhausted  - larger than the store's largest tensor
  //   AlreadyExists      - `name` was already put in this publish
  //   FailedPrecondition - the publish was committed or aborted
  virtual Status Put(std::string_view name, const HostTensor& tensor) = 0;

  // Zero-copy staging for transports that receive a tensor in pieces (the
  // cross-host broadcast lets network buffers land here directly).
  // StageInPlace returns writable staging memory for `name`, exactly its
  // layout size (a second call returns the same span); the caller fills it,
  // then SealInPlace checksums it and, if it matches `expected_checksum`,
  // counts the tensor as put. A tensor staged but not sealed is missing for
  // Commit. The span stays valid until Commit or Abort; a write after sealing
  // is caught by Commit's re-verification. Distinct tensors' spans may be
  // written by other threads, concurrently with each other and with
  // SealInPlace of other tensors. Errors:
  //   StageInPlace: InvalidArgument (not in the layout); AlreadyExists
  //                 (already put or sealed); FailedPrecondition (closed)
  //   SealInPlace:  FailedPrecondition (not staged in place; closed);
  //                 AlreadyExists (already sealed); DataLoss (the bytes do
  //                 not match: the tensor stays staged and unsealed, and may
  //                 be rewritten and sealed again)
  virtual Result<std::span<std::byte>> StageInPlace(std::string_view name) = 0;
  virtual Status SealInPlace(std::string_view name, uint64_t expected_checksum) = 0;

  // Makes the version the latest, atomically. Errors:
  //   FailedPrecondition - layout tensors missing (named; the publish stays
  //                        open so they can still be put); already
  //                        committed or aborted; transport-specific refusals
  //   DataLoss           - staged bytes changed since Put (tensor named); the
  //                        publish is aborted
  // On any error the previously committed version keeps serving.
  virtual Status Commit() = 0;

  // Frees staging and releases the version number. No-op after Commit/Abort.
  virtual void Abort() = 0;

  // TEST ONLY: writable access to the staged bytes of `name`, so tests can
  // simulate a memory fault between Put and Commit (which Commit must
  // catch). Empty span if `name` was not put or the publish is closed.
  virtual std::span<std::byte> MutableStagedBytesForTesting(std::string_view name) = 0;
};

// A StagedWeights (one thread at a time) that several threads share: each
// call takes a lock (the Python binding's handle, whose calls come from
// Python threads with the GIL released). A Commit that succeeds and Abort
// close it; Put or Commit after that is FailedPrecondition naming the
// version, Abort a no-op. Commit's errors keep it open where
// StagedWeights::Commit's do.
class SharedStagedWeights {
 public:
  explicit SharedStagedWeights(std::unique_ptr<StagedWeights> staged);
  int64_t version() const { return version_; }
  Status Put(std::string_view name, const HostTensor& tensor);
  Status Commit();
  void Abort();

 private:
  Status Closed() const;

  const int64_t version_;
  Mutex mu_;
  std::unique_ptr<StagedWeights> staged_ SLUICE_GUARDED_BY(mu_);
};

// Where a trainer publishes weight versions.
class WeightPublisher {
 public:
  virtual ~WeightPublisher() = default;
  virtual const Layout& layout() const = 0;
  // The newest version committed through this publisher's store or group;
  // kNoVersion before the first.
  virtual int64_t latest_version() const = 0;
  // Publishes every tensor of `tensors` (exactly the layout) as `version`,
  // all or nothing. Errors as for BeginPublish, StagedWeights::Put and
  // Commit, plus the transport's own (see its header).
  virtual Status Publish(int64_t version, const TensorMap& tensors) = 0;
};

// A publisher that stages versions itself (the in-process and shared-memory
// stores): the two phases are open to its caller.
class TwoPhasePublisher : public WeightPublisher {
 public:
  // Reserves `version` for staging. Errors:
  //   InvalidArgument    - version < 0
  //   AlreadyExists      - version == the latest committed version
  //   FailedPrecondition - version < the latest; another publish is open
  // and the transport's own (see its header).
  virtual Result<std::unique_ptr<StagedWeights>> BeginPublish(int64_t version) = 0;

  // BeginPublish + Put of every entry + Commit; any error aborts the publish
  // and is returned.
  Status Publish(int64_t version, const TensorMap& tensors) final;
};

// A pinned version: its number and a zero-copy, read-only view of every
// layout tensor. Each view holds the pin, so the bytes stay valid while any
// of them lives.
struct PinnedWeights {
  int64_t version = kNoVersion;
  TensorMap tensors;
};

// Where a rollout reads weight versions.
class WeightReader {
 public:
  virtual ~WeightReader() = default;
  virtual const Layout& layout() const = 0;
  // kNoVersion before the first commit. Cheap (no lock on the shared-memory
  // store): fit for polling.
  virtual int64_t latest_version() const = 0;
  // Pins the latest version. NotFound if nothing was committed yet;
  // ResourceExhausted if the reader may pin no more versions; the
  // transport's own errors.
  virtual Result<PinnedWeights> PinLatest() = 0;
  // Waits until a version >= at_least is committed, then pins the latest.
  // Timeout if none arrives within `timeout` (the message names the latest);
  // other errors as for PinLatest.
  virtual Result<PinnedWeights> WaitAndPin(int64_t at_least, std::chrono::milliseconds timeout) = 0;
};

}  // namespace sluice::checkpoint_engine

#endif  // SLUICE_CHECKPOINT_ENGINE_WEIGHTS_H_
