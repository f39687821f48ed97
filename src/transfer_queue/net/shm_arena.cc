// ShmArena and ShmArenaClient: see shm_arena.h for the protocol.
#include "net/shm_arena.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <limits>
#include <thread>

#include "sluice/common/logging.h"

namespace sluice::transfer_queue::internal {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free");

// "SLTQARN1" little-endian.
inline constexpr uint64_t kArenaMagic = 0x314e524151544c53ULL;
inline constexpr uint32_t kArenaProtocol = 1;
inline constexpr uint64_t kNoPin = 0;

struct ArenaHeader {
  std::atomic<uint64_t> magic;  // written last by the creator
  uint32_t protocol;
  uint32_t max_readers;
  uint64_t segment_bytes;
  uint64_t slots_offset;
  uint64_t data_offset;
  uint64_t data_bytes;
  std::atomic<uint64_t> epoch;  // starts at 1; bumped by every retire
};

struct alignas(64) ArenaSlot {
  std::atomic<uint64_t> owner;  // OwnerWord of the process, 0: free
  std::atomic<uint64_t> pin;    // kNoPin or the oldest pinned epoch
};

namespace {

constexpr char kPrefix[] = "sluice";
constexpr char kKind[] = "tq";

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

uint64_t OwnerWord(const ProcessIdentity& id) {
  return (id.start_time & 0xffffffffULL) << 32 | static_cast<uint32_t>(id.pid);
}

// False only when the owner is known dead (gone, pid reused, zombie).
bool OwnerAlive(uint64_t word) {
  const auto pid = static_cast<int32_t>(word & 0xffffffffULL);
  Result<ProcessIdentity> now = ReadProcessIdentity(pid);
  if (!now.ok()) return now.status().code() != StatusCode::kNotFound;
  if ((now->start_time & 0xffffffffULL) != (word >> 32)) return false;
  return IsProcessAlive(*now);
}

// A tensor view of `nbytes` at `data`, kept alive by `owner`.
HostTensor ViewAt(std::byte* data, DType dtype, std::vector<int64_t> shape, uint64_t nbytes,
                  std::shared_ptr<const void> owner) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = data;
  t.nbytes = nbytes;
  t.owner = std::move(owner);
  return t;
}

// Unlinks arenas whose creator is dead (a server that crashed).
void SweepDeadArenas() {
  for (const std::string& name : UnlinkSegmentsOfDeadOwners({kPrefix, kKind})) {
    SLUICE_LOG(INFO) << "TransferQueue: removed shared-memory arena " << name << " of a dead process";
  }
}

}  // namespace

// ------------------------------------------------------------------ server

Result<std::shared_ptr<ShmArena>> ShmArena::Create(const Options& options) {
  if (options.data_bytes == 0) return Status::InvalidArgument("shared-memory arena: data_bytes must be > 0");
  if (options.data_bytes > (uint64_t{1} << 46)) {
    return Status::InvalidArgument("shared-memory arena: data_bytes " + std::to_string(options.data_bytes) +
                                   " is over the 64 TiB limit");
  }
  if (options.max_readers == 0 || options.max_readers > 65536) {
    return Status::InvalidArgument("shared-memory arena: max_readers must be in 1..65536");
  }
  SweepDeadArenas();
  static std::atomic<uint64_t> counter{0};
  const std::string name =
      ShmSegmentName({kPrefix, kKind, OwnerNameComponent(CurrentProcess()), std::to_string(counter.fetch_add(1))});
  const uint64_t slots_offset = AlignUp(sizeof(ArenaHeader), 64);
  const uint64_t data_offset = AlignUp(slots_offset + sizeof(ArenaSlot) * options.max_readers, 4096);
  const uint64_t data_bytes = AlignUp(options.data_bytes, kArenaAlignment);
  SLUICE_ASSIGN_OR_RETURN(SharedMemorySegment segment,
                          SharedMemorySegment::Create(name, data_offset + data_bytes, /*reserve=*/true));
  Options o = options;
  o.data_bytes = data_bytes;
  std::shared_ptr<ShmArena> arena(new ShmArena(o, std::move(segment)));
  ArenaHeader* h = arena->header_;
  h->protocol = kArenaProtocol;
  h->max_readers = options.max_readers;
  h->segment_bytes = data_offset + data_bytes;
  h->slots_offset = slots_offset;
  h->data_offset = data_offset;
  h->data_bytes = data_bytes;
  h->epoch.store(1);
  for (uint32_t i = 0; i < options.max_readers; ++i) {
    arena->slots_[i].owner.store(0);
    arena->slots_[i].pin.store(kNoPin);
  }
  h->magic.store(kArenaMagic, std::memory_order_release);
  return arena;
}

ShmArena::ShmArena(Options options, SharedMemorySegment segment) : options_(options), segment_(std::move(segment)) {
  header_ = reinterpret_cast<ArenaHeader*>(segment_.data());
  const uint64_t slots_offset = AlignUp(sizeof(ArenaHeader), 64);
  slots_ = reinterpret_cast<ArenaSlot*>(segment_.data() + slots_offset);
  data_ = segment_.data() + AlignUp(slots_offset + sizeof(ArenaSlot) * options_.max_readers, 4096);
  free_.emplace(0, options_.data_bytes);
  stats_.data_bytes = options_.data_bytes;
}

ShmArena::~ShmArena() { Unlink(); }

void ShmArena::Unlink() {
  if (unlinked_.exchange(true)) return;
  Status s = SharedMemorySegment::Unlink(segment_.name());
  if (!s.ok() && s.code() != StatusCode::kNotFound) SLUICE_LOG(WARNING) << "TransferQueue: " << s.ToString();
}

bool ShmArena::Contains(const void* p) const { return p >= data_ && p < data_ + options_.data_bytes; }

uint64_t ShmArena::OffsetOf(const void* p) const {
  return static_cast<uint64_t>(static_cast<const std::byte*>(p) - data_);
}

uint64_t ShmArena::MinPin(bool check_liveness) const {
  uint64_t min = std::numeric_limits<uint64_t>::max();
  for (uint32_t i = 0; i < options_.max_readers; ++i) {
    // Pin first (acquire), then the owner it was published under.
    const uint64_t pin = slots_[i].pin.load(std::memory_order_acquire);
    if (pin == kNoPin || pin >= min) continue;
    if (check_liveness) {
      const uint64_t owner = slots_[i].owner.load(std::memory_order_acquire);
      if (owner == 0 || !OwnerAlive(owner)) continue;  // a dead reader's pin does not count
    }
    min = pin;
  }
  return min;
}

void ShmArena::ReclaimUpToLocked(uint64_t min_pin) {
  while (!limbo_.empty() && limbo_.front().epoch <= min_pin) {
    const Limbo l = limbo_.front();
    limbo_.pop_front();
    stats_.pinned_bytes -= l.size;
    FreeLocked(l.offset, l.size);
  }
}

void ShmArena::ReclaimLocked() {
  if (limbo_.empty()) return;
  ReclaimUpToLocked(MinPin(/*check_liveness=*/false));  // atomics only: the common case
  if (limbo_.empty()) return;
  // Something is pinned: see whether its reader died (reads /proc, so at most
  // every few milliseconds).
  const auto now = std::chrono::steady_clock::now();
  if (now - last_liveness_check_ < std::chrono::milliseconds(5)) return;
  last_liveness_check_ = now;
  ReclaimUpToLocked(MinPin(/*check_liveness=*/true));
}

void ShmArena::FreeLocked(uint64_t offset, uint64_t size) {
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {  // merge with the block after
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {  // merge into the block before
      prev->second += size;
      return;
    }
  }
  free_.emplace(offset, size);
}

bool ShmArena::TryAllocateLocked(uint64_t size, uint64_t* offset) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {  // first fit
    if (it->second < size) continue;
    *offset = it->first;
    const uint64_t rest = it->second - size;
    free_.erase(it);
    if (rest > 0) free_.emplace(*offset + size, rest);
    return true;
  }
  return false;
}

void ShmArena::Retire(uint64_t offset, uint64_t size) {
  MutexLock lock(&mu_);
  stats_.allocated_bytes -= size;
  stats_.pinned_bytes += size;
  // Under mu_, so limbo stays in epoch order.
  limbo_.push_back(Limbo{offset, size, header_->epoch.fetch_add(1) + 1});
  ReclaimLocked();
  freed_.NotifyAll();
}

Result<HostTensor> ShmArena::Allocate(DType dtype, std::vector<int64_t> shape, uint64_t nbytes) {
  if (nbytes > options_.data_bytes) {
    return Status::ResourceExhausted("shared-memory arena " + name() + ": a " + std::to_string(nbytes) +
                                     "-byte cell can never fit in " + std::to_string(options_.data_bytes) + " bytes");
  }
  const uint64_t size = AlignUp(std::max<uint64_t>(nbytes, 1), kArenaAlignment);
  const auto deadline = std::chrono::steady_clock::now() + options_.alloc_timeout;
  uint64_t offset = 0;
  {
    MutexLock lock(&mu_);
    bool waited = false;
    while (!TryAllocateLocked(size, &offset)) {
      ReclaimLocked();
      if (TryAllocateLocked(size, &offset)) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status::ResourceExhausted(
            "shared-memory arena " + name() + " has no room for " + std::to_string(nbytes) + " bytes after " +
            std::to_string(options_.alloc_timeout.count()) + " ms: " + std::to_string(stats_.allocated_bytes) +
            " bytes held by stored cells, " + std::to_string(stats_.pinned_bytes) +
            " freed but still pinned by reader views; size the arena above the queue's capacity_bytes and drop "
            "views when done");
      }
      if (!waited) ++stats_.alloc_waits;
      waited = true;
      // In-process frees notify; pins dropped by other processes do not, so poll.
      freed_.WaitFor(&mu_, std::chrono::milliseconds(1), [] { return false; });
    }
    stats_.allocated_bytes += size;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    ++stats_.allocations;
  }
  std::shared_ptr<ShmArena> self = shared_from_this();
  // The owner returns the block when the last view of it is dropped.
  std::shared_ptr<const void> owner(data_ + offset, [self, offset, size](const void*) { self->Retire(offset, size); });
  return ViewAt(data_ + offset, dtype, std::move(shape), nbytes, std::move(owner));
}

Result<HostTensor> ShmArena::Place(const HostTensor& tensor) {
  if (tensor.nbytes > 0 && Contains(tensor.data)) return tensor;  // written in place by a client
  SLUICE_ASSIGN_OR_RETURN(HostTensor placed, Allocate(tensor.dtype, tensor.shape, tensor.nbytes));
  if (tensor.nbytes > 0) std::memcpy(const_cast<std::byte*>(placed.data), tensor.data, tensor.nbytes);
  return placed;
}

ShmArenaStats ShmArena::Stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

// ------------------------------------------------------------------ client

Result<std::shared_ptr<ShmArenaClient>> ShmArenaClient::Open(const std::string& name, uint64_t data_bytes) {
  SLUICE_ASSIGN_OR_RETURN(SharedMemorySegment segment, SharedMemorySegment::Open(name, ShmAccess::kReadWrite));
  const std::string what = "shared-memory arena " + name;
  if (segment.size() < sizeof(ArenaHeader)) {
    return Status::DataLoss(what + " is " + std::to_string(segment.size()) + " bytes, too short for its header");
  }
  auto* h = reinterpret_cast<ArenaHeader*>(segment.data());
  if (h->magic.load(std::memory_order_acquire) != kArenaMagic) {
    return Status::FailedPrecondition(what + " is not a TransferQueue arena (or is still being created)");
  }
  if (h->protocol != kArenaProtocol) {
    return Status::FailedPrecondition(what + " speaks arena protocol " + std::to_string(h->protocol) +
                                      ", this build speaks " + std::to_string(kArenaProtocol));
  }
  const bool consistent = h->segment_bytes == segment.size() && h->data_bytes == data_bytes &&
                          h->slots_offset >= sizeof(ArenaHeader) && h->max_readers > 0 && h->max_readers <= 65536 &&
                          h->slots_offset + uint64_t{h->max_readers} * sizeof(ArenaSlot) <= h->data_offset &&
                          h->data_offset <= segment.size() && h->data_bytes <= segment.size() - h->data_offset &&
                          h->slots_offset % 64 == 0 && h->data_offset % kArenaAlignment == 0;
  if (!consistent) {
    return Status::FailedPrecondition(what + " has an inconsistent geometry (" + std::to_string(segment.size()) +
                                      " bytes mapped, " + std::to_string(h->data_bytes) + " data bytes, " +
                                      std::to_string(data_bytes) + " expected)");
  }
  auto* slots = reinterpret_cast<ArenaSlot*>(segment.data() + h->slots_offset);
  const uint64_t me = OwnerWord(CurrentProcess());
  for (uint32_t i = 0; i < h->max_readers; ++i) {
    uint64_t owner = slots[i].owner.load();
    // A free slot, or one whose owner died: claim it with one CAS.
    if (owner != 0 && OwnerAlive(owner)) continue;
    if (!slots[i].owner.compare_exchange_strong(owner, me)) continue;
    slots[i].pin.store(kNoPin);
    std::byte* data = segment.data() + h->data_offset;
    return std::shared_ptr<ShmArenaClient>(new ShmArenaClient(std::move(segment), h, &slots[i], data_bytes, data, me));
  }
  return Status::ResourceExhausted(what + ": all " + std::to_string(h->max_readers) +
                                   " reader slots are held by live processes");
}

ShmArenaClient::ShmArenaClient(SharedMemorySegment segment, ArenaHeader* header, ArenaSlot* slot, uint64_t data_bytes,
                               std::byte* data, uint64_t owner_word)
    : segment_(std::move(segment)),
      header_(header),
      slot_(slot),
      data_bytes_(data_bytes),
      data_(data),
      owner_word_(owner_word) {}

ShmArenaClient::~ShmArenaClient() {
  slot_->pin.store(kNoPin);
  uint64_t mine = owner_word_;
  slot_->owner.compare_exchange_strong(mine, 0);
}

std::shared_ptr<const void> ShmArenaClient::Pin() {
  uint64_t epoch = 0;
  {
    MutexLock lock(&mu_);
    epoch = header_->epoch.load();
    pins_.insert(epoch);
    slot_->pin.store(*pins_.begin());  // seq_cst: visible before the request that follows
  }
  std::shared_ptr<ShmArenaClient> self = shared_from_this();
  return std::shared_ptr<const void>(data_, [self, epoch](const void*) { self->Unpin(epoch); });
}

void ShmArenaClient::Unpin(uint64_t epoch) {
  MutexLock lock(&mu_);
  pins_.erase(pins_.find(epoch));
  slot_->pin.store(pins_.empty() ? kNoPin : *pins_.begin());
}

Result<HostTensor> ShmArenaClient::View(uint64_t offset, DType dtype, std::vector<int64_t> shape, uint64_t nbytes,
                                        std::shared_ptr<const void> pin) const {
  if (offset > data_bytes_ || nbytes > data_bytes_ - offset || offset % kArenaAlignment != 0) {
    return Status::DataLoss("shared-memory arena " + name() + ": cell at offset " + std::to_string(offset) + " of " +
                            std::to_string(nbytes) + " bytes lies outside the " + std::to_string(data_bytes_) +
                            "-byte data area or is misaligned");
  }
  return ViewAt(data_ + offset, dtype, std::move(shape), nbytes, std::move(pin));
}

}  // namespace sluice::transfer_queue::internal
