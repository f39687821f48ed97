// POSIX shared memory building blocks for same-host, cross-process transports
// (the CheckpointEngine's weight segments, later the TransferQueue's).
//
//  * SharedMemorySegment: an RAII mapping of one named segment. Created
//    exclusively (never silently reusing a stale segment), or opened read-only
//    / read-write. Destruction unmaps; it never unlinks: the name's lifetime
//    is a protocol decision of the caller (see Unlink).
//  * Names: ShmSegmentName("sluice", {"weights", "v7"}) == "/sluice.weights.v7".
//    Components are [A-Za-z0-9_-]+, so the segments of one prefix can be
//    listed (ListShmSegments) without matching a longer sibling prefix.
//  * ProcessIdentity: pid + start time (from /proc/<pid>/stat), so an owner
//    recorded in shared memory is known dead even after its pid was reused.
//  * ShmMutex: a process-shared, robust pthread mutex stored inside a segment;
//    a holder that dies (even by SIGKILL) hands the lock to the next caller
//    with `previous_owner_died` set, so the caller can repair what the dead
//    holder left half-written.
//  * ShmFutexWait / ShmFutexWakeAll: a bounded cross-process wait on a 32-bit
//    word in a shared mapping.
//
// All of this is Linux-specific (tmpfs at /dev/shm, /proc, futex). Processes
// sharing segments must share a PID namespace for liveness to mean anything.
//
// Thread safety: SharedMemorySegment is a move-only value owned by one thread
// at a time; the mapped bytes are shared and their synchronization is the
// caller's. The free functions are thread-safe. ShmMutex is itself a
// synchronization primitive.
#ifndef SLUICE_COMMON_SHM_H_
#define SLUICE_COMMON_SHM_H_

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/status.h"

namespace sluice {

// ------------------------------------------------------------------ naming

// Where POSIX shared memory lives on Linux; ListShmSegments reads it.
inline constexpr std::string_view kShmDirectory = "/dev/shm";

// OK if `component` is a valid name component: 1..100 characters of
// [A-Za-z0-9_-]. InvalidArgument (naming `what`) otherwise.
Status ValidateShmNameComponent(std::string_view component, std::string_view what);

// "/" + components joined by ".". Precondition: every component is valid
// (check with ValidateShmNameComponent first; violations abort).
std::string ShmSegmentName(std::initializer_list<std::string_view> components);

// Creates the shm object `name` (shm_open with O_CREAT | O_EXCL, read-write,
// mode 0600) and returns its descriptor: AlreadyExists if it exists,
// Unavailable for any other failure. Does not validate the name.
Result<int> CreateShmObject(const std::string& name);

// Sizes the object open on `fd` (`name` for messages) to `size` bytes and,
// with `reserve`, allocates its pages now (posix_fallocate, where the
// filesystem supports it), so a full /dev/shm is ResourceExhausted here
// instead of a SIGBUS at first touch. Unavailable for other failures.
Status SizeShmObject(int fd, const std::string& name, size_t size, bool reserve);

// Every existing segment whose name starts with ShmSegmentName(components) + ".",
// as full names ("/a.b.c"), sorted. Unavailable if /dev/shm cannot be read.
Result<std::vector<std::string>> ListShmSegments(std::initializer_list<std::string_view> components);

// ---------------------------------------------------------------- segments

enum class ShmAccess { kReadOnly, kReadWrite };

class SharedMemorySegment {
 public:
  // Creates `name` exclusively with `size` zero bytes and maps it read-write.
  // With `reserve`, the pages are allocated now (posix_fallocate), so a full
  // /dev/shm is an error here instead of a SIGBUS on first write. Errors:
  //   InvalidArgument   - malformed name (see ValidateShmName)
  //   AlreadyExists     - a segment of that name exists (it is left alone)
  //   ResourceExhausted - /dev/shm has no room for `size` bytes
  //   Unavailable       - any other shm_open / ftruncate / mmap failure
  // On error nothing is left behind under `name`.
  static Result<SharedMemorySegment> Create(const std::string& name, size_t size, bool reserve = true);

  // Opens an existing segment and maps its whole current size (an empty
  // segment maps nothing: data() is null). Errors: InvalidArgument (name),
  // NotFound (no such segment), Unavailable (other failures).
  static Result<SharedMemorySegment> Open(const std::string& name, ShmAccess access);

  // Removes `name`; existing mappings stay valid until unmapped. NotFound if
  // there is no such segment; InvalidArgument for a malformed name;
  // Unavailable otherwise.
  static Status Unlink(const std::string& name);

  // OK if `name` is a single-component POSIX shm name: a leading '/', then
  // 1..250 characters of [A-Za-z0-9_.-].
  static Status ValidateName(std::string_view name);

  SharedMemorySegment() = default;  // empty: valid() is false
  ~SharedMemorySegment();           // unmaps; never unlinks
  SharedMemorySegment(SharedMemorySegment&& other) noexcept;
  SharedMemorySegment& operator=(SharedMemorySegment&& other) noexcept;
  SharedMemorySegment(const SharedMemorySegment&) = delete;
  SharedMemorySegment& operator=(const SharedMemorySegment&) = delete;

  bool valid() const { return !name_.empty(); }
  const std::string& name() const { return name_; }
  ShmAccess access() const { return access_; }
  size_t size() const { return size_; }
  // Null for an empty segment. Writing through a read-only mapping faults.
  std::byte* data() const { return data_; }

  // Unmaps now (valid() becomes false). Idempotent.
  void Reset();

 private:
  SharedMemorySegment(std::string name, ShmAccess access, std::byte* data, size_t size)
      : name_(std::move(name)), access_(access), data_(data), size_(size) {}

  std::string name_;
  ShmAccess access_ = ShmAccess::kReadOnly;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// ------------------------------------------------------- process liveness

// A process as recorded by a peer: pid plus the kernel's start time of that
// pid (field 22 of /proc/<pid>/stat, clock ticks since boot). Together they
// name one process for the life of the host: a reused pid has another start
// time. pid 0 means "nobody".
struct ProcessIdentity {
  int32_t pid = 0;
  uint64_t start_time = 0;
  friend bool operator==(const ProcessIdentity&, const ProcessIdentity&) = default;
};

// This process (read once per pid, so it is right after a fork). If /proc
// cannot be read, start_time is 0 (and a warning is logged).
ProcessIdentity CurrentProcess();

// The identity of the process now holding `pid`. NotFound if there is none;
// Unavailable if /proc cannot be read or parsed.
Result<ProcessIdentity> ReadProcessIdentity(int32_t pid);

// The scheduler state of `pid` as /proc shows it: 'R' running, 'S' sleeping,
// 'D' waiting on I/O, 'T' stopped by a signal, 't' stopped by a tracer, 'Z'
// exited and not reaped, ... NotFound if there is no such process;
// Unavailable if /proc cannot be read or parsed.
Result<char> ReadProcessState(int32_t pid);

// True if `id.pid` runs and started at `id.start_time`. Zombies (exited,
// not yet reaped) count as dead: their mappings are already gone. When /proc
// gives no clear answer (an unexpected read error) the process counts as
// alive, so a caller never reclaims what a live process may still use.
bool IsProcessAlive(const ProcessIdentity& id);

// Segments named after the process that owns them carry "<pid>-<start_time>"
// at the start of a name component, followed by the component's end, '-' or
// '.'. The owner named at the start of `text`, or nullopt when it names none.
// Lets a later process tell a dead owner's segments and remove them.
std::optional<ProcessIdentity> OwnerNamedIn(std::string_view text);
// "<pid>-<start_time>": the name component OwnerNamedIn reads back.
std::string OwnerNameComponent(const ProcessIdentity& id);
// Unlinks every segment under ShmSegmentName(components) + "." whose name
// starts with an owner (OwnerNameComponent) that is dead; the names removed.
std::vector<std::string> UnlinkSegmentsOfDeadOwners(std::initializer_list<std::string_view> components);

// ------------------------------------------------------------ robust mutex

// A mutex for a shared-memory segment. Init() once, by the segment's creator,
// before any other process can see the segment. Locking polls trylock with a
// short backoff up to a deadline (pthread_mutex_timedlock is not understood by
// ThreadSanitizer for robust mutexes), so keep critical sections short.
class ShmMutex {
 public:
  struct Locked {
    // The previous holder died while holding the lock: the state it guarded
    // may be half-updated. The lock is already marked consistent again; the
    // caller repairs the state before unlocking.
    bool previous_owner_died = false;
  };

  // Unavailable if the pthread attributes cannot be set.
  Status Init();
  // Timeout if the lock is not acquired within `timeout` (the holder may be
  // stopped or stuck); Internal if the mutex is unusable.
  Result<Locked> Lock(std::chrono::milliseconds timeout);
  void Unlock();

 private:
  pthread_mutex_t native_;
};

// ------------------------------------------------------------------- futex

// Sleeps until `*word` is woken by ShmFutexWakeAll, or `timeout` passes, or
// (immediately) `*word != expected`. Spurious returns are possible: callers
// re-check their condition in a loop bounded by their own deadline. Works
// across processes when `word` lies in a MAP_SHARED mapping.
void ShmFutexWait(const std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);
void ShmFutexWakeAll(const std::atomic<uint32_t>* word);

}  // namespace sluice

#endif  // SLUICE_COMMON_SHM_H_
