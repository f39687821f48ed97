// The TransferQueue's shared-memory data plane: one arena segment per
// server, holding the bytes of every stored cell, so that clients on the same
// host write a payload straight into it and read it in place (no copy through
// the socket, no copy out).
//
//  * ShmArena (server side) creates the segment, allocates blocks from it for
//    the storage units (it is their CellMemory), and reuses a freed block only
//    when no reader process can still be looking at it.
//  * ShmArenaClient (client side) maps the segment, claims a reader slot and
//    pins what it reads or writes in place.
//
// Reuse protocol (epoch based). The segment holds a global epoch counter
// (starting at 1) and one slot per attached client process: its owner
// (pid | low 32 bits of its start time, one word so a claim is one CAS) and
// its pin (0: none, else the oldest epoch any live view of that process was
// taken at). A client pins before the request that names blocks (its read, or
// the allocation it will write into) and unpins when the last view of that
// pin is dropped. The server retires a freed block with a new epoch r; the
// block is reused only once every live pin is >= r. Pins taken before the
// block was retired are < r; a pin taken after can no longer reach the block
// (it left the storage index before it was retired). A pin of a process that
// died (SIGKILL included) is ignored, and its slot is claimed again by the
// next client. So a view stays valid after its row is freed or cleared, for
// as long as the reader holds it, and a dead reader never blocks reuse.
//
// Costs: memory pinned by readers counts against the arena (not against the
// controller's capacity); an allocation that does not fit waits (bounded) for
// pins to drop and then fails with ResourceExhausted naming the pinned bytes.
// A client maps the arena read-write: same-host clients are trusted not to
// scribble over it (as they are trusted with the token).
//
// Cleanup: the server unlinks the segment when it stops. A server that
// crashed leaves it behind; its name carries the owner's pid and start time
// (/sluice.tq.<pid>-<start>.<n>) and every new arena sweeps segments whose
// owner is dead. Clients create no segments, so a killed client leaks none.
//
// Thread safety: both classes are thread-safe.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_SHM_ARENA_H_
#define SLUICE_SRC_TRANSFER_QUEUE_SHM_ARENA_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sluice/common/host_tensor.h"
#include "sluice/common/mutex.h"
#include "sluice/common/shm.h"
#include "sluice/common/status.h"
#include "sluice/transfer_queue/storage.h"

namespace sluice::transfer_queue::internal {

struct ArenaHeader;
struct ArenaSlot;

// Blocks start on this boundary (cache line; enough to wrap as tensors).
inline constexpr size_t kArenaAlignment = 64;

struct ShmArenaStats {
  uint64_t data_bytes = 0;
  uint64_t allocated_bytes = 0;  // in live blocks
  uint64_t pinned_bytes = 0;     // freed, waiting for readers to unpin
  uint64_t peak_allocated_bytes = 0;
  uint64_t allocations = 0;
  uint64_t alloc_waits = 0;  // allocations that had to wait for space
};

class ShmArena final : public CellMemory, public std::enable_shared_from_this<ShmArena> {
 public:
  struct Options {
    uint64_t data_bytes = 0;  // > 0
    uint32_t max_readers = 256;
    // How long an allocation that does not fit waits for blocks to be freed
    // and unpinned before ResourceExhausted.
    std::chrono::milliseconds alloc_timeout{10000};
  };

  // Sweeps segments of dead arenas, then creates a new one with every page
  // reserved. Errors of SharedMemorySegment::Create (ResourceExhausted when
  // /dev/shm is too small), InvalidArgument for bad options.
  static Result<std::shared_ptr<ShmArena>> Create(const Options& options);
  ~ShmArena() override;  // Unlink()
  // Removes the segment's name (mappings stay valid). Idempotent.
  void Unlink();

  const std::string& name() const { return segment_.name(); }
  uint64_t data_bytes() const { return options_.data_bytes; }
  const std::byte* data() const { return data_; }
  bool Contains(const void* p) const;
  // Offset of `p` in the data area. Precondition: Contains(p).
  uint64_t OffsetOf(const void* p) const;

  // A block of `nbytes` (rounded up to kArenaAlignment, at least one unit) as
  // a writable tensor view whose owner frees the block when dropped.
  Result<HostTensor> Allocate(DType dtype, std::vector<int64_t> shape, uint64_t nbytes);

  // CellMemory: adopts a tensor already in the arena, else copies it in.
  Result<HostTensor> Place(const HostTensor& tensor) override;

  ShmArenaStats Stats() const;

 private:
  struct Limbo {
    uint64_t offset, size, epoch;
  };

  ShmArena(Options options, SharedMemorySegment segment);
  void Retire(uint64_t offset, uint64_t size);
  // Moves limbo blocks no live pin can see to the free list.
  void ReclaimLocked() SLUICE_REQUIRES(mu_);
  // Frees limbo blocks retired at or before `min_pin` (the oldest live pin).
  void ReclaimUpToLocked(uint64_t min_pin) SLUICE_REQUIRES(mu_);
  bool TryAllocateLocked(uint64_t size, uint64_t* offset) SLUICE_REQUIRES(mu_);
  void FreeLocked(uint64_t offset, uint64_t size) SLUICE_REQUIRES(mu_);
  // The smallest pin, or UINT64_MAX if none; with check_liveness, only pins
  // of live readers count.
  uint64_t MinPin(bool check_liveness) const;

  const Options options_;
  SharedMemorySegment segment_;
  ArenaHeader* header_ = nullptr;
  ArenaSlot* slots_ = nullptr;
  std::byte* data_ = nullptr;
  std::atomic<bool> unlinked_{false};

  mutable Mutex mu_;
  CondVar freed_;
  std::map<uint64_t, uint64_t> free_ SLUICE_GUARDED_BY(mu_);  // offset -> size
  std::deque<Limbo> limbo_ SLUICE_GUARDED_BY(mu_);            // in epoch order
  ShmArenaStats stats_ SLUICE_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_liveness_check_ SLUICE_GUARDED_BY(mu_);
};

class ShmArenaClient final : public std::enable_shared_from_this<ShmArenaClient> {
 public:
  // Maps `name`, checks it is an arena of this protocol with `data_bytes`
  // bytes of data, and claims a reader slot. Errors: NotFound (no such
  // segment: another host, or the server is gone), FailedPrecondition (not
  // an arena, another protocol, other size), DataLoss (truncated),
  // ResourceExhausted (every reader slot taken by a live process).
  static Result<std::shared_ptr<ShmArenaClient>> Open(const std::string& name, uint64_t data_bytes);
  ~ShmArenaClient();  // releases the slot

  const std::string& name() const { return segment_.name(); }
  uint64_t data_bytes() const { return data_bytes_; }
  std::byte* data() const { return data_; }
  bool Contains(const void* p) const { return p >= data_ && p < data_ + data_bytes_; }

  // Pins the current epoch until the returned token is dropped: blocks named
  // by requests sent after this call are not reused while it is held.
  std::shared_ptr<const void> Pin();

  // A view of [offset, offset + meta.nbytes) owned by `pin`. DataLoss if the
  // range is outside the arena (a server bug or a hostile server).
  Result<HostTensor> View(uint64_t offset, DType dtype, std::vector<int64_t> shape, uint64_t nbytes,
                          std::shared_ptr<const void> pin) const;

 private:
  ShmArenaClient(SharedMemorySegment segment, ArenaHeader* header, ArenaSlot* slot, uint64_t data_bytes,
                 std::byte* data, uint64_t owner_word);
  void Unpin(uint64_t epoch);

  SharedMemorySegment segment_;
  ArenaHeader* header_;
  ArenaSlot* slot_;
  const uint64_t data_bytes_;
  std::byte* data_;
  const uint64_t owner_word_;
  Mutex mu_;
  std::multiset<uint64_t> pins_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_SHM_ARENA_H_
