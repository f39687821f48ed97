// Control: one attachment's mapping of a store's control segment, and every
// operation on the shared state that needs the control lock (pin bookkeeping,
// freeing versions, reclaiming dead processes, repair, teardown). The
// publisher and subscriber cores build on it; the protocol is described in
// include/sluice/checkpoint_engine/shm_store.h.
//
// Thread safety: a Control may be used from several threads; the methods
// taking `const Locked&` require that the caller holds the control lock
// (proved by the guard), the others are safe at any time.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_SHM_CONTROL_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_SHM_CONTROL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shm/shm_format.h"
#include "shm/shm_segment_file.h"
#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/common/shm.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine::shm {

// The segment names of one store.
class StoreNames {
 public:
  // InvalidArgument naming the field if prefix or store is malformed.
  static Result<StoreNames> Make(std::string_view prefix, std::string_view store);

  const std::string& prefix() const { return prefix_; }
  const std::string& store() const { return store_; }
  const std::string& control() const { return control_; }
  // The spare: a freed version's segment kept for the next staging.
  const std::string& spare() const { return spare_; }
  std::string Version(int64_t version) const;
  // The version a segment name belongs to, or kNoVersion if it is not a
  // version segment of this store.
  int64_t ParseVersion(std::string_view segment_name) const;
  // Every existing segment of this store.
  Result<std::vector<std::string>> List() const;

 private:
  std::string prefix_, store_, control_, spare_;
};

// "tensor 1: the store has 'b' I64 [16], expected 'b' F32 [16]", or "" if equal.
std::string DescribeLayoutDifference(const Layout& stored, const Layout& expected);

class Control {
 public:
  // Proof that the control lock is held; unlocks when destroyed.
  class Locked {
   public:
    Locked(Locked&& other) noexcept : control_(std::exchange(other.control_, nullptr)) {}
    Locked& operator=(Locked&&) = delete;
    Locked(const Locked&) = delete;
    ~Locked();

   private:
    friend class Control;
    explicit Locked(Control* control) : control_(control) {}
    Control* control_;
  };

  // Creates the control segment exclusively, with `self` as its publisher
  // (recycling segments or not). AlreadyExists if the store exists; other
  // errors of SharedMemorySegment.
  static Result<std::unique_ptr<Control>> Create(const StoreNames& names, const Layout& layout,
                                                 const std::vector<size_t>& tensor_bytes, size_t max_tensor_bytes,
                                                 uint32_t max_readers, uint32_t pins_per_reader, bool recycle_segments);

  // Opens an existing control segment and validates preamble, geometry and
  // layout. NotFound; Unavailable (not initialized yet); FailedPrecondition
  // (foreign, other protocol); DataLoss (truncated, inconsistent).
  static Result<std::unique_ptr<Control>> Open(const StoreNames& names);

  ControlBlock* block() const { return block_; }
  const Geometry& geometry() const { return geometry_; }
  const Layout& layout() const { return layout_; }
  const StoreNames& names() const { return names_; }
  uint64_t layout_hash() const { return block_->layout_hash; }
  size_t control_bytes() const { return segment_.size(); }
  const ProcessIdentity& self() const { return self_; }

  // Takes the lock; if the previous holder died inside a critical section,
  // runs Repair first. Timeout if not acquired in time.
  Result<Locked> Lock(std::chrono::milliseconds timeout);

  // ----- with the lock held
  VersionEntry* entry(uint32_t i) const;
  ReaderSlot* slot(uint32_t i) const;
  static ProcessIdentity Owner(const ProcessRecord& record);
  static void SetOwner(ProcessRecord* record, const ProcessIdentity& id);

  VersionEntry* FindEntry(const Locked&, int64_t version) const;
  VersionEntry* FreeEntryOrNull(const Locked&) const;
  bool IsPinned(const Locked&, int64_t version) const;
  // Clears the entry, then retires its segment (RetireSegment, parking it as
  // the spare if CanPark).
  void FreeVersion(const Locked&, VersionEntry* entry);
  // Removes segment `name`, which no reader may pin any more (its entry is
  // cleared, or it never had one). Takes its exclusive flock first: if some
  // process still holds a flock on it (a reader reading it outside the pins,
  // e.g. one whose slot was reclaimed by mistake), it is only unlinked, so
  // that reader keeps its bytes. Otherwise, if `may_park` and CanPark, it is
  // renamed to the spare (true is returned); else it is truncated (its pages
  // freed, even from idle mappings other processes keep) and unlinked.
  bool RetireSegment(const Locked&, const std::string& name, bool may_park);
  // Whether a freed segment may become the spare now: a live publisher that
  // recycles, nothing staged (the spare takes the staging's place in the
  // memory bound), no spare yet, the store not being destroyed.
  bool CanPark(const Locked&) const;
  // The spare's size in bytes, 0 if there is none.
  size_t SpareBytes(const Locked&) const;
  // Renames the spare to `name` (the version just reserved as staging) and
  // opens it with its exclusive flock held; checks it is a whole segment of
  // this store's size. NotFound if there is no spare; other errors if it
  // cannot be used (it is then removed; the caller creates a fresh segment).
  Result<SegmentFd> TakeSpare(const Locked&, const std::string& name);
  void RemoveSpare(const Locked&);
  // Frees `version` if it is superseded and no occupied slot pins it.
  void FreeIfUnreachable(const Locked&, int64_t version);
  // The cheap part of the repair, run at every attach, commit and
  // BeginPublish: reclaims slots of dead readers, retires a dead publisher
  // (dropping or finishing its staging), removes a spare that no publisher
  // will stage into, rolls back entries above latest and frees superseded
  // unpinned versions.
  void Collect(const Locked&);
  // Collect, then unlinks orphaned version segments (no entry, not staged).
  void Repair(const Locked&);
  bool HasLiveParticipant(const Locked&) const;
  // destroyed := 1, then unlinks every segment of the store (control last).
  void Destroy(const Locked&);
  ShmStoreStats Stats(const Locked&) const;

 private:
  Control(StoreNames names, SharedMemorySegment segment, Geometry geometry, Layout layout)
      : names_(std::move(names)),
        segment_(std::move(segment)),
        block_(reinterpret_cast<ControlBlock*>(segment_.data())),
        geometry_(std::move(geometry)),
        layout_(std::move(layout)),
        self_(CurrentProcess()) {}

  void UnlinkQuietly(const std::string& name) const;

  StoreNames names_;
  SharedMemorySegment segment_;
  ControlBlock* block_;
  Geometry geometry_;
  Layout layout_;
  ProcessIdentity self_;
};

}  // namespace sluice::checkpoint_engine::shm

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_SHM_CONTROL_H_
