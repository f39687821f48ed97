// The same-host, cross-process transport of the CheckpointEngine: the trainer
// process writes each weight version once into POSIX shared memory; rollout
// processes map it read-only (zero-copy HostTensor views) or copy it into a
// standby buffer. It keeps the contract of weights.h: ShmPublisher is its
// WeightPublisher (two-phase), ShmSubscriber its WeightReader.
//
// Roles. One ShmPublisher per store at a time (a second live one is refused;
// a new one takes over a dead one's store). Any number of ShmSubscribers up to
// the store's reader slots, in any processes of the host (one PID namespace).
// Either side may start first (ShmSubscriberOptions::attach_timeout).
//
// Segments (under /dev/shm; <p> = shm_prefix, <s> = store_name):
//   /<p>.<s>.control  magic, protocol version, geometry, the layout (names,
//                     dtypes, shapes) and its hash, a robust process-shared
//                     mutex, latest committed version, version being staged,
//                     publisher {pid, start time}, a table of committed
//                     versions in memory, and reader slots {pid, start time,
//                     pinned versions}.
//   /<p>.<s>.v<N>     version N: a header (magic, protocol, layout hash, N,
//                     sealed flag) with one {offset, nbytes, XXH64} record per
//                     tensor, then the tensor bytes in layout order (first
//                     tensor page-aligned, each 64-byte aligned).
//   /<p>.<s>.spare    a freed version's segment, kept for the next staging
//                     (segment recycling, below); at most one.
//
// Synchronization. All state changes of the control block happen under its
// robust process-shared mutex (PTHREAD_MUTEX_ROBUST): critical sections are
// a few dozen stores and a few file operations on segments (open, flock,
// rename, truncate, unlink), never a tensor copy. A process that dies holding it
// (SIGKILL included) hands it to the next locker with EOWNERDEAD, which runs
// an idempotent repair (below) before going on. The fields read without the
// lock (latest version, commit counter) are lock-free 64/32-bit std::atomics;
// WaitForVersion sleeps on the commit counter with a shared futex.
//
// Publish (two-phase):
//  1. BeginPublish(v), locked: v > latest, no other staging; staging := v, so
//     a crash from here on is attributable and cleanable.
//  2. In the same critical section the spare, if any, is renamed /…v<v>;
//     otherwise, unlocked, /…v<v> is created exclusively (pages reserved up
//     front, so a full /dev/shm is ResourceExhausted, not SIGBUS). The
//     publisher holds the segment's exclusive flock while it writes. Put
//     copies each tensor in and checksums the copy (one pass).
//  3. Commit: every layout tensor put? re-checksum everything (a changed byte
//     is DataLoss: the publish is aborted and the serving version untouched),
//     set the sealed flag; then, locked: version entry := v, latest := v,
//     staging := none; the superseded latest is freed if unpinned; then the
//     commit counter is bumped and waiters woken. Readers resolve versions
//     only through the table and `latest`, so they never see v before this.
//
// Pin protocol (the race between a reader pinning v and the publisher or a
// reader freeing v): a reader takes the lock, resolves v (the latest, or the
// number it asked for), checks v has a live entry, writes v into a free pin
// of its slot, unlocks, and only then opens /…v<v>, takes a shared flock on
// it and maps it (validating its header). A freer checks, under the same
// lock, that no occupied slot pins v before clearing the entry and retiring
// the segment. Either the pin lands first (the freer sees it and keeps v)
// or the free does (the reader finds no entry: NotFound, or for
// AcquireLatest the next latest, which is live by construction). So a
// pinned segment is never retired, hence never rewritten, under its reader.
// A reader dropping its last pin releases its flock, then unpins; it keeps
// the mapping idle (see Segment recycling).
//
// Segment recycling (ShmPublisherOptions::recycle_segments, default on).
// Retiring a freed version's segment, under the lock: open it and take its
// exclusive flock without waiting. If that fails, a process still reads it
// outside the pins (one whose slot was reclaimed by mistake): it is only
// unlinked, never rewritten or truncated. Otherwise, if a live recycling
// publisher is attached, nothing is staged and there is no spare, it is
// renamed to the spare; else it is truncated (its pages freed at once, also
// from idle mappings) and unlinked. BeginPublish stages into the spare when
// there is one. Mapping a segment anew costs a page fault per page touched;
// so the publisher and each subscriber keep their mappings of segments they
// no longer use (a few, by file identity) and reuse them when the same file
// comes back as a later version. A kept mapping of a freed segment holds no
// memory (the segment was truncated). The kernel drops a dead process's
// flocks, so a dead reader never blocks recycling once its slot is reclaimed.
//
// Who unlinks what, and when:
//  * A staging /…v<N>: the publisher on Abort, DataLoss or destruction. If
//    the publisher died, whoever next holds the lock and finds it dead (a new
//    publisher attaching, any commit, attach or detach, SweepShmStore).
//  * A committed /…v<N>: whoever, under the lock, makes it superseded and
//    unpinned: the publisher committing a successor, the reader dropping the
//    last pin, any process reclaiming the slot of a dead reader. (Retired as
//    above: renamed to the spare, or truncated and unlinked.)
//  * The spare: the publisher staging into it (renamed), or whoever holds
//    the lock when no recycling publisher is attached any more (detach, a
//    dead publisher retired, a publisher attaching with recycling off).
//  * The latest /…v<N> and /…control: the last participant to detach (a
//    publisher or subscriber being destroyed with no other live participant
//    recorded), SweepShmStore when none is alive, or DestroyShmStore. A
//    process arriving while the store is torn down sees the `destroyed` flag
//    under the lock and starts over (creating or waiting for a fresh store).
// A version's entry is cleared before its segment is unlinked; a crash in
// between leaves an orphan that the repair scan (names under /<p>.<s>.v*
// with no entry and not being staged) unlinks.
//
// Crash safety and repair. Liveness is pid + process start time from
// /proc/<pid>/stat (pid reuse is detected; zombies count as dead). Repair,
// run after EOWNERDEAD, when a publisher attaches and by SweepShmStore:
// reclaims slots of dead readers (their pins vanish), drops a dead
// publisher's staging segment (or, if it died after writing `latest`, just
// clears staging), rolls back a committed entry above `latest` (a commit
// that died inside its critical section never happened), frees superseded
// unpinned versions and unlinks orphans. Each step is idempotent, so a
// repairer killed mid-repair is repaired by the next locker. Dead readers'
// slots are also reclaimed at every commit, attach and BeginPublish.
//
// Memory bound. Committed versions in shared memory <= distinct versions
// pinned by occupied slots + 1 (the latest); plus at most 1 staging or spare
// (a freed segment becomes the spare only while nothing is staged, and the
// staging takes the spare). So bytes <= (pinned + 2) *
// version_segment_bytes + control_segment_bytes, reported by stats() (the
// spare as versions.spare_bytes, inside bytes_held). The slot table makes it
// a hard cap: (max_readers * max_pins_per_reader + 2) versions.
//
// Integrity. Per-tensor XXH64 checksums detect accidental corruption (a
// stray write, a torn copy), not an adversary: every participant maps the
// control block read-write, and a recycling publisher keeps its read-write
// mappings of the versions it staged. A segment truncated by a foreign
// process while mapped would fault on access; sizes are validated when a
// segment is opened.
//
// Thread safety: ShmPublisher, ShmSubscriber and ShmVersionHandle are
// thread-safe (copy a handle per thread rather than assigning one object from
// several threads). An ShmPublishHandle belongs to one thread at a time.
// Lock order inside a process: the subscriber's local mutex before the
// control mutex. Not fork-safe: a forked child must attach anew.
//
// Lifetime: handles (and tensor views) keep their attachment alive, so they
// stay valid after the ShmPublisher / ShmSubscriber object is destroyed; the
// attachment detaches when the last of them goes.
#ifndef SLUICE_CHECKPOINT_ENGINE_SHM_STORE_H_
#define SLUICE_CHECKPOINT_ENGINE_SHM_STORE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/checkpoint_engine/weights.h"
#include "sluice/common/host_tensor.h"
#include "sluice/common/shm.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine {

// Fault injection for tests; leave empty in production.
struct ShmPublisherTestHooks {
  // Called after each successful Put, with the bytes staged so far in this
  // publish (e.g. to pause a publisher half way, then SIGKILL it).
  std::function<void(int64_t version, size_t bytes_staged)> after_put;
  // Called inside Commit's critical section, with the control lock held,
  // after the version's table entry is written and before it becomes the
  // latest (e.g. to die holding the lock).
  std::function<void(int64_t version)> inside_commit_lock;
};

struct ShmPublisherOptions {
  // Required: names the store; 1..100 characters of [A-Za-z0-9_-].
  std::string store_name;
  // Namespace of every segment name; same character set. Default "sluice".
  std::string shm_prefix = "sluice";
  // Required; validated as for VersionStoreOptions. Must equal the layout of
  // an existing store of that name (else FailedPrecondition).
  Layout layout;
  // Largest tensor accepted, in bytes. Default 4 GiB.
  size_t max_tensor_bytes = size_t{4} << 30;
  // Reader slots and distinct versions one subscriber may pin at once. Fixed
  // by whoever creates the store (an existing store keeps its own). 1..4096
  // and 1..64. Defaults 32 and 4.
  uint32_t max_readers = 32;
  uint32_t max_pins_per_reader = 4;
  // Longest wait for the control lock (a stopped holder); then Timeout.
  std::chrono::milliseconds lock_timeout{5000};
  // Stage each version into the segment of a freed one (the spare) instead
  // of a fresh segment, and keep mappings of segments that may come back, so
  // that a version costs no new pages and no page faults (see Segment
  // recycling above). The spare takes the staging version's place in the
  // memory bound. Default true; false: every version gets a fresh segment.
  bool recycle_segments = true;
  ShmPublisherTestHooks test_hooks;
};

struct ShmSubscriberOptions {
  std::string store_name;  // as for ShmPublisherOptions
  std::string shm_prefix = "sluice";
  // If set, attaching fails with FailedPrecondition naming the first
  // difference unless the store's layout is exactly this.
  std::optional<Layout> expected_layout;
  // How long Attach waits for the store to be created. Default 0: one try.
  std::chrono::milliseconds attach_timeout{0};
  std::chrono::milliseconds lock_timeout{5000};
  // CopyTo re-checksums what it copied (one more pass over the destination)
  // and reports DataLoss on a mismatch. Default true.
  bool verify_copies = true;
};

// A consistent snapshot, taken under the control lock.
struct ShmStoreStats {
  // As for VersionStore. pinned[i].pins counts reader slots pinning the
  // version (occupied slots, including dead ones not reclaimed yet). Byte
  // figures are whole version segments, headers included; staging_bytes is
  // the reserved staging segment. max_* are the documented bound.
  VersionStoreStats versions;
  size_t version_segment_bytes = 0;
  size_t control_segment_bytes = 0;
  ProcessIdentity publisher;  // pid 0: no publisher attached
  bool publisher_alive = false;
  size_t readers_attached = 0;  // occupied slots
  size_t dead_readers = 0;      // occupied by processes that are gone (reclaimed at the next commit or sweep)
  uint32_t max_readers = 0;
  uint32_t max_pins_per_reader = 0;
  // Repairs after a dead lock holder, and takeovers from a dead publisher.
  uint64_t recoveries = 0;
  // Whether the attached publisher recycles segments, and how many stagings
  // went into a recycled segment (the spare) since the store was created.
  // versions.spare_bytes is the spare's size (0 if there is none).
  bool recycle_segments = false;
  uint64_t segments_recycled = 0;
};

namespace shm {
class Control;
struct PublisherCore;
struct SubscriberCore;
struct MappedPin;
}  // namespace shm

// A pin on one committed version in shared memory. Copyable (copies share
// the pin) and movable; the version stays mapped and counted until every
// handle and every tensor view from it is gone. Empty when default-built or
// moved from: valid() is false and accessors return FailedPrecondition.
class ShmVersionHandle {
 public:
  ShmVersionHandle() = default;

  bool valid() const { return pinned_ != nullptr; }
  int64_t version() const;  // kNoVersion if empty

  // A zero-copy, read-only view into the mapped segment; its owner holds the
  // pin. NotFound if `name` is not in the layout.
  Result<HostTensor> tensor(std::string_view name) const;
  // The checksum recorded at Put. NotFound as for tensor().
  Result<uint64_t> checksum(std::string_view name) const;
  // Recomputes every checksum over the mapped bytes. DataLoss naming the
  // first tensor that no longer matches.
  Status Verify() const;

  // Copies every tensor into `destinations`, one span per layout tensor in
  // layout order, each exactly that tensor's size (InvalidArgument naming the
  // tensor otherwise; nothing is copied then). With verify_copies, DataLoss
  // naming the first tensor whose copy does not match its checksum.
  Status CopyTo(std::span<const std::span<std::byte>> destinations) const;
  // One tensor; errors as above plus NotFound for an unknown name.
  Status CopyTensorTo(std::string_view name, std::span<std::byte> destination) const;

 private:
  friend struct shm::SubscriberCore;
  explicit ShmVersionHandle(std::shared_ptr<const shm::MappedPin> pinned) : pinned_(std::move(pinned)) {}
  std::shared_ptr<const shm::MappedPin> pinned_;
};

// One staged publish, from ShmPublisher::BeginPublish: the contract of
// StagedWeights (weights.h). Put copies into the staging segment; the
// after_put test hook runs after each successful Put or SealInPlace.
// Destroying it without Commit aborts: the staging segment is unlinked, the
// previous latest keeps serving, the version number may be used again.
// Commit's own errors: FailedPrecondition when this publisher lost the store
// (see ShmPublisher); Timeout when the control lock was not acquired (the
// publish stays open).
class ShmPublishHandle final : public StagedWeights {
 public:
  ~ShmPublishHandle() override;
  ShmPublishHandle(const ShmPublishHandle&) = delete;
  ShmPublishHandle& operator=(const ShmPublishHandle&) = delete;

  int64_t version() const override { return version_; }
  Status Put(std::string_view name, const HostTensor& tensor) override;
  Result<std::span<std::byte>> StageInPlace(std::string_view name) override;
  Status SealInPlace(std::string_view name, uint64_t expected_checksum) override;
  Status Commit() override;
  void Abort() override;
  std::span<std::byte> MutableStagedBytesForTesting(std::string_view name) override;

 private:
  friend class ShmPublisher;
  struct Staging;
  ShmPublishHandle(std::shared_ptr<shm::PublisherCore> core, int64_t version, std::unique_ptr<Staging> staging);

  std::shared_ptr<shm::PublisherCore> core_;
  int64_t version_;
  std::unique_ptr<Staging> staging_;  // null once committed or aborted
};

class ShmPublisher final : public TwoPhasePublisher {
 public:
  // Creates the store, or attaches to an existing one whose publisher is gone
  // (detached, or dead: its staging is removed and the store repaired); the
  // next version must exceed the store's latest. Errors:
  //   InvalidArgument    - malformed options (the field is named)
  //   FailedPrecondition - the store has a live publisher (its pid named);
  //                        its layout differs (first difference named); it
  //                        is a foreign segment or speaks another protocol
  //   DataLoss           - the control segment is truncated or inconsistent
  //   Unavailable/Timeout- shared memory or the control lock is unusable
  static Result<std::unique_ptr<ShmPublisher>> Attach(ShmPublisherOptions options);
  // Detaches: an open publish is aborted (by its handle); if no other live
  // participant remains, every segment of the store is unlinked.
  ~ShmPublisher() override;
  ShmPublisher(const ShmPublisher&) = delete;
  ShmPublisher& operator=(const ShmPublisher&) = delete;

  // Reserves `version` and creates its staging segment (an
  // ShmPublishHandle). Errors of TwoPhasePublisher::BeginPublish, and:
  //   ResourceExhausted  - /dev/shm has no room for the segment
  //   Timeout            - the control lock was not acquired
  Result<std::unique_ptr<StagedWeights>> BeginPublish(int64_t version) override;

  // Reclaims dead readers' slots, frees superseded unpinned versions and
  // unlinks orphaned segments. Commits do the cheap part of this already;
  // call it to release a dead reader's pins without publishing.
  Status Sweep();

  int64_t latest_version() const override;  // lock-free; kNoVersion before the first commit
  Result<ShmStoreStats> stats() const;
  const Layout& layout() const override;
  size_t version_bytes() const;  // tensor bytes of one version
  const std::string& control_segment_name() const;

 private:
  explicit ShmPublisher(std::shared_ptr<shm::PublisherCore> core) : core_(std::move(core)) {}
  std::shared_ptr<shm::PublisherCore> core_;
};

class ShmSubscriber final : public WeightReader {
 public:
  // Attaches to an existing store and claims a reader slot (dead readers'
  // slots are reclaimed first). Errors:
  //   InvalidArgument    - malformed options
  //   NotFound           - no such store within attach_timeout
  //   Unavailable        - the store stayed uninitialized within attach_timeout
  //   FailedPrecondition - layout differs from expected_layout; foreign
  //                        segment; another protocol version
  //   ResourceExhausted  - every reader slot is taken by a live process
  //   DataLoss           - the control segment is truncated or inconsistent
  static Result<std::unique_ptr<ShmSubscriber>> Attach(ShmSubscriberOptions options);
  // Detaches once every handle from it is gone (see Lifetime above).
  ~ShmSubscriber() override;
  ShmSubscriber(const ShmSubscriber&) = delete;
  ShmSubscriber& operator=(const ShmSubscriber&) = delete;

  // Pins the latest committed version. NotFound if none yet;
  // ResourceExhausted if this subscriber already pins max_pins_per_reader
  // distinct versions; DataLoss if its segment fails validation (truncated,
  // wrong magic/protocol/layout, unsealed); Timeout (control lock).
  Result<ShmVersionHandle> AcquireLatest();
  // Pins `version`. NotFound if it was never committed or was already freed;
  // other errors as for AcquireLatest.
  Result<ShmVersionHandle> Acquire(int64_t version);
  // Waits (futex, bounded by `timeout`) until a version >= at_least is
  // committed, then pins the latest. Timeout naming the latest version and
  // whether a publisher is alive.
  Result<ShmVersionHandle> WaitForVersion(int64_t at_least, std::chrono::milliseconds timeout);

  // WeightReader: the same pins, as views of every tensor.
  Result<PinnedWeights> PinLatest() override;
  Result<PinnedWeights> WaitAndPin(int64_t at_least, std::chrono::milliseconds timeout) override;

  int64_t latest_version() const override;  // lock-free; kNoVersion before the first commit
  Result<ShmStoreStats> stats() const;
  const Layout& layout() const override;  // as stored in the control segment
  size_t version_bytes() const;

 private:
  explicit ShmSubscriber(std::shared_ptr<shm::SubscriberCore> core) : core_(std::move(core)) {}
  std::shared_ptr<shm::SubscriberCore> core_;
};

// Runs the repair (see above) on a store; if no live participant remains,
// unlinks every segment of the store. NotFound if there is no such store;
// errors of Attach for a foreign or incompatible control segment.
Status SweepShmStore(std::string_view shm_prefix, std::string_view store_name,
                     std::chrono::milliseconds lock_timeout = std::chrono::milliseconds(5000));

// Unlinks every segment named /<shm_prefix>.<store_name>.*, live or not
// (participants keep their mappings, but the store is marked destroyed so
// no one attaches to it again). For launchers cleaning up after a run.
Status DestroyShmStore(std::string_view shm_prefix, std::string_view store_name);

}  // namespace sluice::checkpoint_engine

#endif  // SLUICE_CHECKPOINT_ENGINE_SHM_STORE_H_
