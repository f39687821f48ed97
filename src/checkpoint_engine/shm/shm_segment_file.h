// Version segments of the shared-memory store as open files: a descriptor
// kept open (for flock and fstat), a mapping that can outlive the descriptor
// and be reused when the same file comes back (a recycled segment), and a
// small cache of such idle mappings. See docs/checkpoint_engine.md ("Segment
// recycling") for the protocol built on them.
//
// Why descriptors and flock: a process that reads a version holds a shared
// flock on its segment for as long as it may read it; whoever rewrites
// (recycles) or truncates a segment first takes the exclusive flock without
// blocking. The kernel drops a dead process's flocks with its descriptors, so
// the check needs no liveness guess, and a reader whose pins were reclaimed by
// mistake (its liveness misjudged) still keeps its bytes: its segment is
// unlinked instead of being rewritten or truncated.
//
// Why mappings are kept: mapping a segment anew costs one page fault per page
// touched, whether its pages are fresh or not (on the development VM,
// writing 100 MB into a new mapping took 300-400 ms, into a kept one 5 ms).
// A kept mapping of a recycled segment costs nothing. A kept mapping never holds memory the store does not count:
// a segment that is freed instead of recycled is truncated before it is
// unlinked, which releases its pages from every mapping.
//
// Thread safety: SegmentFd and Mapping are move-only values owned by one
// thread at a time. MappingCache is not synchronized (its owner's mutex
// guards it).
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_SHM_SEGMENT_FILE_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_SHM_SEGMENT_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sluice/common/shm.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine::shm {

// Which file a descriptor refers to. Two descriptors of files that are both
// still linked refer to the same file iff their identities are equal.
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  friend bool operator==(const FileIdentity&, const FileIdentity&) = default;
};

struct FileStatus {
  FileIdentity id;
  size_t size = 0;
  size_t allocated = 0;  // bytes backed by memory (st_blocks * 512)
  bool linked = false;   // still has a name
};

// An open segment. Closing it drops any flock taken through it.
class SegmentFd {
 public:
  // Creates `name` exclusively with `size` zero bytes, its pages reserved
  // (posix_fallocate). Errors as SharedMemorySegment::Create: AlreadyExists,
  // ResourceExhausted (no room in /dev/shm), InvalidArgument, Unavailable.
  // On error nothing is left behind under `name`.
  static Result<SegmentFd> Create(const std::string& name, size_t size);
  // Opens an existing segment. NotFound; InvalidArgument; Unavailable.
  static Result<SegmentFd> Open(const std::string& name, ShmAccess access);

  SegmentFd() = default;
  ~SegmentFd();
  SegmentFd(SegmentFd&& other) noexcept;
  SegmentFd& operator=(SegmentFd&& other) noexcept;
  SegmentFd(const SegmentFd&) = delete;
  SegmentFd& operator=(const SegmentFd&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& name() const { return name_; }
  ShmAccess access() const { return access_; }

  Result<FileStatus> Stat() const;
  // Non-blocking flock. False if another open file description (of any
  // process, this one included) holds a conflicting lock, or on error.
  bool TryLockExclusive();
  bool TryLockShared();
  void Unlock();
  // Drops every byte of the file (size 0): the pages are freed at once, even
  // where other processes still map them (their mappings fault if touched).
  // Only under the exclusive lock. Unavailable on failure.
  Status Truncate();
  void Close();

 private:
  SegmentFd(int fd, std::string name, ShmAccess access) : fd_(fd), name_(std::move(name)), access_(access) {}
  int fd_ = -1;
  std::string name_;
  ShmAccess access_ = ShmAccess::kReadOnly;
};

// A whole-file shared mapping; unmapped on destruction.
class Mapping {
 public:
  // Maps `size` bytes of `fd` (its access). An empty file maps nothing
  // (data() null). Unavailable on failure.
  static Result<Mapping> Map(const SegmentFd& fd, size_t size);

  Mapping() = default;
  ~Mapping();
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  ShmAccess access() const { return access_; }
  void Reset();

 private:
  Mapping(std::byte* data, size_t size, ShmAccess access) : data_(data), size_(size), access_(access) {}
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  ShmAccess access_ = ShmAccess::kReadOnly;
};

// Renames segment `from` to `to` (both shm names; same store), refusing to
// replace an existing `to`. NotFound (no `from`), AlreadyExists (`to`
// exists), InvalidArgument (names), Unavailable.
Status RenameSegment(const std::string& from, const std::string& to);

// Whether segment `name` exists, and its size (stat of /dev/shm/<name>).
// NotFound; Unavailable.
Result<size_t> SegmentSize(const std::string& name);

// Mappings of segments this process no longer reads or writes, kept in case
// the same file comes back (recycled as a later version). Each entry keeps
// its descriptor, unlocked, to tell whether the file is still linked and
// which it is. At most `capacity` entries, least recently added dropped first.
class MappingCache {
 public:
  explicit MappingCache(size_t capacity) : capacity_(capacity) {}

  // Keeps `mapping` of the file open as `fd` (whose flocks must be released).
  void Put(SegmentFd fd, Mapping mapping);
  // The kept mapping of the file `status` describes (a linked file of the
  // same identity, mapped whole with `access`), removed from the cache; an
  // empty Mapping if there is none. Drops entries whose file was unlinked
  // on the way.
  Mapping Take(const FileStatus& status, ShmAccess access);
  // Drops entries whose file was unlinked (truncated first, so they hold no
  // memory, but they hold address space and a descriptor).
  void Prune();
  void Clear() { entries_.clear(); }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    SegmentFd fd;
    FileIdentity id;
    Mapping mapping;
  };
  size_t capacity_;
  std::vector<Entry> entries_;  // oldest first
};

}  // namespace sluice::checkpoint_engine::shm

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_SHM_SEGMENT_FILE_H_
