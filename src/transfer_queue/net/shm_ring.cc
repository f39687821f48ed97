// ShmRingServerEnd and ShmRingClientEnd: see shm_ring.h for the protocol.
#include "net/shm_ring.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "sluice/common/logging.h"

namespace sluice::transfer_queue::internal {

static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory atomics must be lock-free");

// "SLTQRNG1" little-endian.
inline constexpr uint64_t kRingMagic = 0x31474e5251544c53ULL;
inline constexpr uint32_t kRingProtocol = 1;
inline constexpr uint64_t kRingHeaderBytes = 4096;

// One direction. The writer owns the first cache line, the reader the second.
struct RingLane {
  alignas(64) std::atomic<uint32_t> seq;    // bumped after each chunk
  std::atomic<uint32_t> len;                // the chunk's bytes
  std::atomic<uint32_t> last;               // 1: the chunk ends a message
  std::atomic<uint32_t> writer_sleeps;      // the writer waits on `taken`
  alignas(64) std::atomic<uint32_t> taken;  // = seq of the last chunk copied out
  std::atomic<uint32_t> reader_sleeps;      // the reader waits on `seq`
};

struct RingHeader {
  std::atomic<uint64_t> magic;  // written last by the server
  uint32_t protocol;
  uint32_t reserved;
  uint64_t capacity;
  alignas(64) std::atomic<uint32_t> closed;  // 0 open, 1 client closed, 2 server closed
  RingLane request;
  RingLane reply;
};
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);

namespace {

using Steady = std::chrono::steady_clock;

constexpr char kPrefix[] = "sluice";
constexpr char kKind[] = "tqring";
// The longest a side sleeps before looking at its peer's liveness again.
constexpr auto kSleepSlice = std::chrono::milliseconds(50);
// Receive buffers up to this size are kept for the next message.
constexpr size_t kScratchMaxBytes = 1 << 20;
// How long a wait spins on the CPU alone before it yields between checks.
constexpr auto kPureSpin = std::chrono::microseconds(10);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Waits until `word` differs from `old`. `check(slow)` runs before each
// sleep (at most every kSleepSlice) and ends the wait when it returns other
// than kNone; so does `deadline` (kIdle). `slow` is true once the wait has
// lasted a sleep slice: only then are the costly checks (peer liveness,
// a syscall or a /proc read) worth making.
template <typename Check>
RingEnd WaitChange(const std::atomic<uint32_t>& word, uint32_t old, std::atomic<uint32_t>& sleeps,
                   Steady::time_point deadline, const RingSpin& spin, Check&& check) {
  const Steady::time_point start = Steady::now();
  const Steady::time_point spin_end = start + spin.spin;
  for (uint32_t i = 1;; ++i) {
    if (word.load(std::memory_order_acquire) != old) return RingEnd::kNone;
    if ((i & 15) != 0) {
      CpuRelax();
      continue;
    }
    const Steady::time_point now = Steady::now();
    if (now < spin_end) {
      // Past the first microseconds, spin by yielding: when the cores are
      // oversubscribed (more callers and ring threads than cores), a spinning
      // thread must not keep its peer from running.
      if (now - start > kPureSpin) std::this_thread::yield();
      continue;
    }
    if (RingEnd end = check(now - start >= kSleepSlice); end != RingEnd::kNone) return end;
    if (now >= deadline) return RingEnd::kIdle;
    // Dekker with the writer: it stores the word, then reads `sleeps`.
    sleeps.store(1, std::memory_order_seq_cst);
    if (word.load(std::memory_order_seq_cst) == old) {
      ShmFutexWait(&word, old, std::min<Steady::duration>(deadline - now, kSleepSlice));
    }
    sleeps.store(0, std::memory_order_relaxed);
  }
}

// A buffer of at least n bytes: `scratch` again when nothing else holds it
// any more (the last message's views are gone) and it is large enough, so a
// stream of messages does not allocate (and free) one buffer each.
std::shared_ptr<std::byte[]> BufferFor(size_t n, RingScratch* scratch) {
  if (scratch->buffer != nullptr && scratch->buffer.use_count() == 1 && scratch->capacity >= n) return scratch->buffer;
  const size_t capacity = std::max<size_t>(n, 4096);
  std::shared_ptr<std::byte[]> fresh(new std::byte[capacity]);
  // Kept for reuse only while small: a rare big message does not stay allocated.
  if (capacity <= kScratchMaxBytes) {
    scratch->buffer = fresh;
    scratch->capacity = capacity;
  }
  return fresh;
}

// Copies one message out of `lane` (see shm_ring.h). `seen` is the reader's
// last seq. The first chunk must come by `deadline`; later ones by
// `rest_deadline` (the server: as long as `check` allows; a client: its
// call's deadline).
template <typename Check>
Result<RingMessage> ReadMessage(RingLane& lane, const std::byte* area, uint64_t capacity, uint32_t* seen,
                                RingScratch* scratch, uint64_t max_bytes, Steady::time_point deadline,
                                Steady::time_point rest_deadline, const RingSpin& spin, Check&& check, RingEnd* end) {
  std::vector<std::byte> gathered;
  for (bool first = true;; first = false) {
    const RingEnd waited =
        WaitChange(lane.seq, *seen, lane.reader_sleeps, first ? deadline : rest_deadline, spin, check);
    if (waited != RingEnd::kNone) {
      if (end != nullptr) *end = waited;
      switch (waited) {
        case RingEnd::kIdle:
          return Status::Timeout("no message on the ring");
        case RingEnd::kClosed:
          return Status::Aborted("the ring was closed");
        default:
          return Status::Aborted("the process at the other end of the ring is gone");
      }
    }
    const uint32_t seq = lane.seq.load(std::memory_order_acquire);
    const uint64_t n = lane.len.load(std::memory_order_relaxed);
    const uint32_t last = lane.last.load(std::memory_order_relaxed);
    if (n > capacity) {
      return Status::DataLoss("ring chunk of " + std::to_string(n) + " bytes exceeds the ring's capacity " +
                              std::to_string(capacity));
    }
    if (last > 1) return Status::DataLoss("ring chunk has last flag " + std::to_string(last) + " (0 or 1 expected)");
    if (n == 0 && last == 0) return Status::DataLoss("empty ring chunk that does not end its message");
    if (gathered.size() + n > max_bytes) {
      return Status::InvalidArgument("message on the ring exceeds " + std::to_string(max_bytes) +
                                     " bytes (max_message_bytes)");
    }
    RingMessage out;
    if (first && last == 1) {
      // The usual case: one chunk, copied once.
      out.data = BufferFor(n, scratch);
      std::memcpy(out.data.get(), area, n);
      out.size = n;
    } else {
      gathered.insert(gathered.end(), area, area + n);
    }
    *seen = seq;
    lane.taken.store(seq, std::memory_order_seq_cst);
    if (lane.writer_sleeps.load(std::memory_order_seq_cst) != 0) ShmFutexWakeAll(&lane.taken);
    if (last == 0) continue;
    if (out.data == nullptr) {
      out.data = BufferFor(gathered.size(), scratch);
      std::memcpy(out.data.get(), gathered.data(), gathered.size());
      out.size = gathered.size();
    }
    if (end != nullptr) *end = RingEnd::kNone;
    return out;
  }
}

// Writes one message into `lane` in chunks; `seq` is the writer's last seq.
template <typename Check>
Status WriteMessage(RingLane& lane, std::byte* area, uint64_t capacity, uint32_t* seq, std::span<const std::byte> bytes,
                    Steady::time_point deadline, const RingSpin& spin, Check&& check) {
  size_t offset = 0;
  do {
    if (offset > 0) {
      // The reader must have copied the previous chunk out of the area.
      for (;;) {
        const uint32_t taken = lane.taken.load(std::memory_order_acquire);
        if (taken == *seq) break;
        const RingEnd waited = WaitChange(lane.taken, taken, lane.writer_sleeps, deadline, spin, check);
        if (waited == RingEnd::kIdle) return Status::Timeout("the ring's reader did not take a chunk");
        if (waited != RingEnd::kNone) return Status::Aborted("the ring was closed or its reader is gone");
      }
    }
    const size_t n = std::min<size_t>(capacity, bytes.size() - offset);
    std::memcpy(area, bytes.data() + offset, n);
    lane.len.store(static_cast<uint32_t>(n), std::memory_order_relaxed);
    lane.last.store(offset + n == bytes.size() ? 1 : 0, std::memory_order_relaxed);
    ++*seq;
    lane.seq.store(*seq, std::memory_order_seq_cst);
    if (lane.reader_sleeps.load(std::memory_order_seq_cst) != 0) ShmFutexWakeAll(&lane.seq);
    offset += n;
  } while (offset < bytes.size());
  return Status::Ok();
}

// Unlinks rings whose server is dead (it crashed before its clients attached).
void SweepDeadRings() { (void)UnlinkSegmentsOfDeadOwners({kPrefix, kKind}); }

uint64_t SegmentBytes(uint64_t capacity) { return kRingHeaderBytes + 2 * capacity; }

}  // namespace

// ------------------------------------------------------------------ server

Result<std::unique_ptr<ShmRingServerEnd>> ShmRingServerEnd::Create(uint64_t capacity,
                                                                   std::chrono::milliseconds attach_timeout) {
  if (capacity < kRingMinCapacity || capacity > kRingMaxCapacity || capacity % 64 != 0) {
    return Status::InvalidArgument("shared-memory ring capacity " + std::to_string(capacity) +
                                   " must be a multiple of 64 in " + std::to_string(kRingMinCapacity) + ".." +
                                   std::to_string(kRingMaxCapacity));
  }
  static std::once_flag swept;
  std::call_once(swept, SweepDeadRings);
  static std::atomic<uint64_t> counter{0};
  const std::string name =
      ShmSegmentName({kPrefix, kKind, OwnerNameComponent(CurrentProcess()), std::to_string(counter.fetch_add(1))});
  SLUICE_ASSIGN_OR_RETURN(SharedMemorySegment segment,
                          SharedMemorySegment::Create(name, SegmentBytes(capacity), /*reserve=*/true));
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    (void)SharedMemorySegment::Unlink(name);
    return Status::Unavailable("cannot open shared-memory ring " + name + " for its lock: " + why);
  }
  std::unique_ptr<ShmRingServerEnd> ring(new ShmRingServerEnd(std::move(segment), fd, capacity));
  ring->attach_by_ = Steady::now() + attach_timeout;
  RingHeader* h = ring->header_;
  h->protocol = kRingProtocol;
  h->capacity = capacity;
  h->magic.store(kRingMagic, std::memory_order_release);
  return ring;
}

ShmRingServerEnd::ShmRingServerEnd(SharedMemorySegment segment, int lock_fd, uint64_t capacity)
    : segment_(std::move(segment)), lock_fd_(lock_fd), capacity_(capacity) {
  header_ = reinterpret_cast<RingHeader*>(segment_.data());
  request_area_ = segment_.data() + kRingHeaderBytes;
  reply_area_ = request_area_ + capacity_;
}

ShmRingServerEnd::~ShmRingServerEnd() {
  // The client unlinks the name when it attaches; one that never did leaves it to us.
  (void)SharedMemorySegment::Unlink(segment_.name());
  if (lock_fd_ >= 0) close(lock_fd_);
}

bool ShmRingServerEnd::ClientGone() {
  if (!attached_) return false;
  // The client holds a shared lock for as long as it has the ring open.
  return flock(lock_fd_, LOCK_EX | LOCK_NB) == 0;
}

Result<RingMessage> ShmRingServerEnd::Receive(uint64_t max_bytes, Steady::time_point deadline, const RingSpin& spin,
                                              const std::atomic<bool>& stop, RingEnd* end) {
  auto check = [&](bool slow) -> RingEnd {
    if (stop.load(std::memory_order_relaxed) || header_->closed.load(std::memory_order_relaxed) != 0) {
      return RingEnd::kClosed;
    }
    // Attached from the first chunk on: the client locks before it sends.
    attached_ = attached_ || request_seen_ != 0 || header_->request.seq.load(std::memory_order_acquire) != 0;
    if (!attached_) return Steady::now() > attach_by_ ? RingEnd::kPeerGone : RingEnd::kNone;
    return slow && ClientGone() ? RingEnd::kPeerGone : RingEnd::kNone;
  };
  return ReadMessage(header_->request, request_area_, capacity_, &request_seen_, &scratch_, max_bytes, deadline,
                     Steady::time_point::max(), spin, check, end);
}

Status ShmRingServerEnd::Send(std::span<const std::byte> reply, const RingSpin& spin, const std::atomic<bool>& stop) {
  auto check = [&](bool slow) -> RingEnd {
    if (stop.load(std::memory_order_relaxed) || header_->closed.load(std::memory_order_relaxed) != 0) {
      return RingEnd::kClosed;
    }
    return slow && ClientGone() ? RingEnd::kPeerGone : RingEnd::kNone;
  };
  return WriteMessage(header_->reply, reply_area_, capacity_, &reply_seq_, reply, Steady::time_point::max(), spin,
                      check);
}

void ShmRingServerEnd::Close() {
  header_->closed.store(2, std::memory_order_seq_cst);
  ShmFutexWakeAll(&header_->request.seq);
  ShmFutexWakeAll(&header_->request.taken);
  ShmFutexWakeAll(&header_->reply.seq);
  ShmFutexWakeAll(&header_->reply.taken);
}

// ------------------------------------------------------------------ client

Result<std::unique_ptr<ShmRingClientEnd>> ShmRingClientEnd::Open(const std::string& name, uint64_t capacity) {
  SLUICE_RETURN_IF_ERROR(SharedMemorySegment::ValidateName(name));
  const std::string prefix = ShmSegmentName({kPrefix, kKind}) + ".";
  const std::optional<ProcessIdentity> server =
      name.rfind(prefix, 0) == 0 ? OwnerNamedIn(std::string_view(name).substr(prefix.size())) : std::nullopt;
  if (!server) return Status::FailedPrecondition("'" + name + "' is not the name of a TransferQueue ring");
  if (capacity < kRingMinCapacity || capacity > kRingMaxCapacity) {
    return Status::FailedPrecondition("ring " + name + ": capacity " + std::to_string(capacity) + " is out of range");
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound("no shared-memory ring " + name + " on this host");
    return Status::Unavailable("cannot open shared-memory ring " + name + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != SegmentBytes(capacity)) {
    close(fd);
    return Status::FailedPrecondition("shared-memory ring " + name + " is not " +
                                      std::to_string(SegmentBytes(capacity)) + " bytes long");
  }
  // Held until this end is destroyed (or the process dies): the server's
  // sign that the client is alive.
  if (flock(fd, LOCK_SH) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return Status::Unavailable("cannot lock shared-memory ring " + name + ": " + why);
  }
  Result<SharedMemorySegment> segment = SharedMemorySegment::Open(name, ShmAccess::kReadWrite);
  (void)SharedMemorySegment::Unlink(name);  // nobody else attaches to it
  if (!segment.ok()) {
    close(fd);
    return segment.status();
  }
  auto* h = reinterpret_cast<RingHeader*>(segment->data());
  if (segment->size() != SegmentBytes(capacity) || h->magic.load(std::memory_order_acquire) != kRingMagic ||
      h->protocol != kRingProtocol || h->capacity != capacity) {
    close(fd);
    return Status::FailedPrecondition("shared-memory ring " + name + " is not a ring of protocol " +
                                      std::to_string(kRingProtocol) + " with capacity " + std::to_string(capacity));
  }
  return std::unique_ptr<ShmRingClientEnd>(new ShmRingClientEnd(std::move(*segment), fd, capacity, *server));
}

ShmRingClientEnd::ShmRingClientEnd(SharedMemorySegment segment, int lock_fd, uint64_t capacity, ProcessIdentity server)
    : segment_(std::move(segment)), lock_fd_(lock_fd), capacity_(capacity), server_(server) {
  header_ = reinterpret_cast<RingHeader*>(segment_.data());
  request_area_ = segment_.data() + kRingHeaderBytes;
  reply_area_ = request_area_ + capacity_;
  // A fresh ring: both lanes start at 0. Read them anyway (never trust).
  request_seq_ = header_->request.seq.load(std::memory_order_acquire);
  reply_seen_ = header_->reply.seq.load(std::memory_order_acquire);
}

ShmRingClientEnd::~ShmRingClientEnd() {
  header_->closed.store(1, std::memory_order_seq_cst);
  ShmFutexWakeAll(&header_->request.seq);
  segment_.Reset();
  close(lock_fd_);  // drops the lock: the server sees the client gone
}

void ShmRingClientEnd::PostChunkForTest(std::span<const std::byte> chunk, bool last) {
  RingLane& lane = header_->request;
  const size_t n = std::min<size_t>(chunk.size(), capacity_);
  std::memcpy(request_area_, chunk.data(), n);
  lane.len.store(static_cast<uint32_t>(n));
  lane.last.store(last ? 1 : 0);
  lane.seq.store(++request_seq_);
  ShmFutexWakeAll(&lane.seq);
}

void ShmRingClientEnd::PostRawForTest(uint32_t len, uint32_t last) {
  RingLane& lane = header_->request;
  lane.len.store(len);
  lane.last.store(last);
  lane.seq.store(++request_seq_);
  ShmFutexWakeAll(&lane.seq);
}

bool ShmRingClientEnd::ServerGone() const { return !IsProcessAlive(server_); }

Result<RingMessage> ShmRingClientEnd::Call(std::span<const std::byte> request, uint64_t max_reply_bytes,
                                           Steady::time_point deadline, const RingSpin& spin) {
  if (broken_) return Status::FailedPrecondition("this ring failed before and is unusable");
  broken_ = true;  // until the call succeeds
  auto check = [&](bool slow) -> RingEnd {
    if (header_->closed.load(std::memory_order_relaxed) != 0) return RingEnd::kClosed;
    return slow && ServerGone() ? RingEnd::kPeerGone : RingEnd::kNone;
  };
  Status sent = WriteMessage(header_->request, request_area_, capacity_, &request_seq_, request, deadline, spin, check);
  if (!sent.ok()) return sent;
  RingEnd end = RingEnd::kNone;
  Result<RingMessage> reply = ReadMessage(header_->reply, reply_area_, capacity_, &reply_seen_, &scratch_,
                                          max_reply_bytes, deadline, deadline, spin, check, &end);
  if (!reply.ok()) {
    if (end == RingEnd::kIdle) return Status::Timeout("no reply on the ring in time");
    if (end == RingEnd::kClosed) return Status::Aborted("the server closed the ring");
    if (end == RingEnd::kPeerGone) return Status::Aborted("the server process is gone");
    return reply.status();
  }
  broken_ = false;
  return reply;
}

}  // namespace sluice::transfer_queue::internal
