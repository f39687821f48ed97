// The TransferQueue's same-host request path: a shared-memory mailbox per
// client connection ("ring"), so that a client on the server's host sends a
// request and gets its reply without a socket, a ZeroMQ I/O thread or a hop
// between the server's threads. Messages are the ordinary wire messages
// (wire.h); payloads still live in the arena (shm_arena.h).
//
// Layout of one ring segment (/sluice.tqring.<server pid>-<start>.<n>):
//
//   page 0   header: magic, protocol, capacity, a `closed` word, and one
//            lane per direction (request: client -> server; reply: server ->
//            client), each on its own cache lines
//   then     the request area, `capacity` bytes
//   then     the reply area, `capacity` bytes
//
// A lane carries a message as one or more chunks of at most `capacity`
// bytes: the writer copies a chunk into its area, stores its length and a
// "last" flag, then bumps `seq`; the reader copies the chunk out and sets
// `taken` = seq; the writer waits for that before overwriting the area with
// the next chunk. One message is in flight per ring: a client sends its
// next request only after reading the whole reply, and the server replies
// only after reading the whole request, so the first chunk of a message
// never waits. Each side spins a little (RingSpin) before sleeping on the
// word with a futex, and wakes the other only if it said it sleeps.
//
// Trust. The ring is a trust boundary like the socket: everything the
// server reads from it (lengths, flags, bytes) may be garbage written by a
// buggy or hostile client. Lengths are checked against the capacity and the
// message limit before copying, a message is copied out of shared memory
// before anything decodes it (so the client cannot change it under the
// decoder), and a ring that breaks its protocol is closed. A ring belongs to
// one client connection only: a client that scribbles over it, or dies in
// the middle of a message, harms no other client.
//
// Liveness. The server creates the segment; the client maps it, takes a
// shared flock on it and unlinks its name. The server knows the client is
// gone (closed, crashed, SIGKILLed) when it can take the lock exclusively,
// and then ends the ring. A client that never attaches is dropped after
// kRingAttachTimeout. The client knows a server is gone from the owner named
// in the segment's name (ProcessIdentity) or from the closed word. Segments
// of dead servers are swept when a server creates its first ring.
//
// Thread safety: one thread at a time uses each end (the server's ring
// thread; the client's call that checked the ring out).
#ifndef SLUICE_SRC_TRANSFER_QUEUE_SHM_RING_H_
#define SLUICE_SRC_TRANSFER_QUEUE_SHM_RING_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "sluice/common/shm.h"
#include "sluice/common/status.h"

namespace sluice::transfer_queue::internal {

struct RingHeader;
struct RingLane;

inline constexpr uint64_t kRingMinCapacity = 4096;
inline constexpr uint64_t kRingMaxCapacity = uint64_t{1} << 30;
inline constexpr std::chrono::seconds kRingAttachTimeout{10};

// How long a side busy-waits for its peer before sleeping on a futex.
struct RingSpin {
  std::chrono::nanoseconds spin{std::chrono::microseconds(20)};
};

// A whole message read from a ring (owned, out of shared memory).
struct RingMessage {
  std::shared_ptr<std::byte[]> data;
  size_t size = 0;
  std::span<const std::byte> bytes() const { return {data.get(), size}; }
};

// A receive buffer a ring end reuses while no message view holds it.
struct RingScratch {
  std::shared_ptr<std::byte[]> buffer;
  size_t capacity = 0;
};

// Why a wait on a ring ended without a message.
enum class RingEnd : uint8_t {
  kNone,      // not ended (a message or an error)
  kIdle,      // nothing arrived by the deadline (the caller may wait again)
  kClosed,    // the peer closed the ring (or the server is stopping)
  kPeerGone,  // the peer process died
};

class ShmRingServerEnd {
 public:
  // Sweeps rings of dead servers (first call only), then creates a segment
  // with `capacity` bytes per direction (kRingMinCapacity..kRingMaxCapacity).
  // A client that has not sent anything within `attach_timeout` counts as gone.
  static Result<std::unique_ptr<ShmRingServerEnd>> Create(
      uint64_t capacity, std::chrono::milliseconds attach_timeout = kRingAttachTimeout);
  ~ShmRingServerEnd();  // unlinks the name if the client has not, unmaps
  ShmRingServerEnd(const ShmRingServerEnd&) = delete;
  ShmRingServerEnd& operator=(const ShmRingServerEnd&) = delete;

  const std::string& name() const { return segment_.name(); }
  uint64_t capacity() const { return capacity_; }

  // Waits until `deadline` for a whole request of at most max_bytes. A
  // message whose first chunk came keeps being read past the deadline, as
  // long as the client lives. Returns the message; or an error whose code
  // says what happened: Timeout (idle), Aborted (closed, client
  // gone, `stop` set), DataLoss/InvalidArgument (the client broke the
  // protocol: close the ring). `end` (optional) receives the RingEnd.
  Result<RingMessage> Receive(uint64_t max_bytes, std::chrono::steady_clock::time_point deadline, const RingSpin& spin,
                              const std::atomic<bool>& stop, RingEnd* end = nullptr);
  // Writes a reply; between chunks waits for the client to take the last
  // one (Aborted if it closed, died or `stop` is set meanwhile).
  Status Send(std::span<const std::byte> reply, const RingSpin& spin, const std::atomic<bool>& stop);
  // Marks the ring closed and wakes both lanes (server stopping).
  void Close();
  // True once the client attached (sent anything) and no longer holds its lock.
  bool ClientGone();

 private:
  ShmRingServerEnd(SharedMemorySegment segment, int lock_fd, uint64_t capacity);

  SharedMemorySegment segment_;
  int lock_fd_ = -1;
  uint64_t capacity_ = 0;
  RingHeader* header_ = nullptr;
  std::byte* request_area_ = nullptr;
  std::byte* reply_area_ = nullptr;
  uint32_t request_seen_ = 0;  // the last request seq read
  uint32_t reply_seq_ = 0;     // the last reply seq written
  RingScratch scratch_;
  std::chrono::steady_clock::time_point attach_by_;
  bool attached_ = false;
  bool unlinked_ = false;
};

class ShmRingClientEnd {
 public:
  // Maps the server's ring `name`, checks its header against `capacity`,
  // takes the liveness lock and unlinks the name. Errors: NotFound (gone,
  // another host), FailedPrecondition (not a ring of this protocol or size),
  // Unavailable (other failures).
  static Result<std::unique_ptr<ShmRingClientEnd>> Open(const std::string& name, uint64_t capacity);
  ~ShmRingClientEnd();  // marks the ring closed, wakes the server, unmaps
  ShmRingClientEnd(const ShmRingClientEnd&) = delete;
  ShmRingClientEnd& operator=(const ShmRingClientEnd&) = delete;

  uint64_t capacity() const { return capacity_; }

  // Sends one request and reads its whole reply (at most max_reply_bytes),
  // all by `deadline`. Errors: Timeout (no reply in time), Aborted
  // (the server closed the ring or died), DataLoss (a malformed reply). After
  // any error the ring is unusable: drop it.
  Result<RingMessage> Call(std::span<const std::byte> request, uint64_t max_reply_bytes,
                           std::chrono::steady_clock::time_point deadline, const RingSpin& spin);

  // Test hooks: the raw segment, to scribble over; one chunk of a request
  // posted as if by Call (`last` false: a message left half-sent).
  std::byte* raw() const { return segment_.data(); }
  size_t raw_size() const { return segment_.size(); }
  void PostChunkForTest(std::span<const std::byte> chunk, bool last);
  // A chunk header with any length and flag (a hostile client's).
  void PostRawForTest(uint32_t len, uint32_t last);

 private:
  ShmRingClientEnd(SharedMemorySegment segment, int lock_fd, uint64_t capacity, ProcessIdentity server);
  bool ServerGone() const;

  SharedMemorySegment segment_;
  int lock_fd_ = -1;
  uint64_t capacity_ = 0;
  ProcessIdentity server_;
  RingHeader* header_ = nullptr;
  std::byte* request_area_ = nullptr;
  std::byte* reply_area_ = nullptr;
  uint32_t request_seq_ = 0;  // the last request seq written
  uint32_t reply_seen_ = 0;   // the last reply seq read
  RingScratch scratch_;
  bool broken_ = false;
};

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_SHM_RING_H_
