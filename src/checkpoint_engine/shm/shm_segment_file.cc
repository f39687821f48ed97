#include "shm/shm_segment_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace sluice::checkpoint_engine::shm {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// The path of shm name "/x" in the tmpfs that holds POSIX shared memory.
std::string ShmPath(const std::string& name) { return std::string(kShmDirectory) + name; }

}  // namespace

// ----------------------------------------------------------------- SegmentFd

Result<SegmentFd> SegmentFd::Create(const std::string& name, size_t size) {
  SLUICE_RETURN_IF_ERROR(SharedMemorySegment::ValidateName(name));
  SLUICE_ASSIGN_OR_RETURN(const int fd, CreateShmObject(name));
  SegmentFd file(fd, name, ShmAccess::kReadWrite);
  if (Status sized = SizeShmObject(fd, name, size, /*reserve=*/true); !sized.ok()) {
    file.Close();
    ::shm_unlink(name.c_str());
    return sized;
  }
  return file;
}

Result<SegmentFd> SegmentFd::Open(const std::string& name, ShmAccess access) {
  SLUICE_RETURN_IF_ERROR(SharedMemorySegment::ValidateName(name));
  const bool rw = access == ShmAccess::kReadWrite;
  const int fd = ::shm_open(name.c_str(), (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("shm segment " + name + " does not exist");
    return Status::Unavailable("cannot open shm segment " + name + ": " + ErrnoText(err));
  }
  return SegmentFd(fd, name, access);
}

SegmentFd::~SegmentFd() { Close(); }

SegmentFd::SegmentFd(SegmentFd&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), name_(std::move(other.name_)), access_(other.access_) {}

SegmentFd& SegmentFd::operator=(SegmentFd&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    name_ = std::move(other.name_);
    access_ = other.access_;
  }
  return *this;
}

void SegmentFd::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<FileStatus> SegmentFd::Stat() const {
  struct stat st;
  if (fd_ < 0 || ::fstat(fd_, &st) != 0) {
    const int err = fd_ < 0 ? EBADF : errno;
    return Status::Unavailable("cannot stat shm segment " + name_ + ": " + ErrnoText(err));
  }
  FileStatus s;
  s.id = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  s.size = static_cast<size_t>(st.st_size);
  s.allocated = static_cast<size_t>(st.st_blocks) * 512;
  s.linked = st.st_nlink > 0;
  return s;
}

bool SegmentFd::TryLockExclusive() { return fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) == 0; }
bool SegmentFd::TryLockShared() { return fd_ >= 0 && ::flock(fd_, LOCK_SH | LOCK_NB) == 0; }
void SegmentFd::Unlock() {
  if (fd_ >= 0) ::flock(fd_, LOCK_UN);
}

Status SegmentFd::Truncate() {
  if (fd_ >= 0 && ::ftruncate(fd_, 0) == 0) return Status::Ok();
  const int err = fd_ < 0 ? EBADF : errno;
  return Status::Unavailable("cannot truncate shm segment " + name_ + ": " + ErrnoText(err));
}

// ------------------------------------------------------------------- Mapping

Result<Mapping> Mapping::Map(const SegmentFd& fd, size_t size) {
  if (size == 0) return Mapping(nullptr, 0, fd.access());
  const bool rw = fd.access() == ShmAccess::kReadWrite;
  void* addr = ::mmap(nullptr, size, rw ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd.fd(), 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    return Status::Unavailable("cannot map shm segment " + fd.name() + ": " + ErrnoText(err));
  }
  return Mapping(static_cast<std::byte*>(addr), size, fd.access());
}

Mapping::~Mapping() { Reset(); }

Mapping::Mapping(Mapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)), access_(other.access_) {}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    access_ = other.access_;
  }
  return *this;
}

void Mapping::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

// --------------------------------------------------------------------- names

Status RenameSegment(const std::string& from, const std::string& to) {
  SLUICE_RETURN_IF_ERROR(SharedMemorySegment::ValidateName(from));
  SLUICE_RETURN_IF_ERROR(SharedMemorySegment::ValidateName(to));
  if (::renameat2(AT_FDCWD, ShmPath(from).c_str(), AT_FDCWD, ShmPath(to).c_str(), RENAME_NOREPLACE) == 0) {
    return Status::Ok();
  }
  const int err = errno;
  if (err == ENOENT) return Status::NotFound("shm segment " + from + " does not exist");
  if (err == EEXIST) return Status::AlreadyExists("shm segment " + to + " already exists");
  return Status::Unavailable("cannot rename shm segment " + from + " to " + to + ": " + ErrnoText(err));
}

Result<size_t> SegmentSize(const std::string& name) {
  SLUICE_RETURN_IF_ERROR(SharedMemorySegment::ValidateName(name));
  struct stat st;
  if (::stat(ShmPath(name).c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("shm segment " + name + " does not exist");
    return Status::Unavailable("cannot stat shm segment " + name + ": " + ErrnoText(err));
  }
  return static_cast<size_t>(st.st_size);
}

// -------------------------------------------------------------- MappingCache

void MappingCache::Put(SegmentFd fd, Mapping mapping) {
  if (capacity_ == 0 || !fd.valid() || mapping.data() == nullptr) return;
  Result<FileStatus> status = fd.Stat();
  if (!status.ok() || !status->linked || status->size != mapping.size()) return;
  if (entries_.size() >= capacity_) entries_.erase(entries_.begin());
  entries_.push_back(Entry{std::move(fd), status->id, std::move(mapping)});
}

Mapping MappingCache::Take(const FileStatus& status, ShmAccess access) {
  Prune();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->id != status.id) continue;
    Mapping found;
    // Same file, both linked; a size changed from outside is not reused.
    if (it->mapping.size() == status.size && it->mapping.access() == access) found = std::move(it->mapping);
    entries_.erase(it);
    return found;
  }
  return Mapping();
}

void MappingCache::Prune() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    Result<FileStatus> s = it->fd.Stat();
    if (s.ok() && s->linked && s->size == it->mapping.size()) {
      ++it;
    } else {
      it = entries_.erase(it);
    }
  }
}

}  // namespace sluice::checkpoint_engine::shm
