#include "sluice/common/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <sstream>
#include <thread>

#include "sluice/common/check.h"
#include "sluice/common/logging.h"

namespace sluice {
namespace {

bool IsComponentChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

// ------------------------------------------------------------------ naming

Status ValidateShmNameComponent(std::string_view component, std::string_view what) {
  if (component.empty() || component.size() > 100) {
    return Status::InvalidArgument(std::string(what) + " must be 1..100 characters, got " +
                                   std::to_string(component.size()));
  }
  for (char c : component) {
    if (!IsComponentChar(c)) {
      return Status::InvalidArgument(std::string(what) + " '" + std::string(component) +
                                     "' may only contain letters, digits, '_' and '-'");
    }
  }
  return Status::Ok();
}

std::string ShmSegmentName(std::initializer_list<std::string_view> components) {
  std::string name = "/";
  for (std::string_view c : components) {
    SLUICE_CHECK(ValidateShmNameComponent(c, "shm name component").ok()) << "bad shm name component '" << c << "'";
    if (name.size() > 1) name.push_back('.');
    name.append(c);
  }
  return name;
}

Result<std::vector<std::string>> ListShmSegments(std::initializer_list<std::string_view> components) {
  // Listing file names, not opening them: /dev/shm is a tmpfs whose entries
  // are exactly the POSIX segments.
  const std::string prefix = ShmSegmentName(components).substr(1) + ".";
  DIR* dir = ::opendir(std::string(kShmDirectory).c_str());
  if (dir == nullptr) return Status::Unavailable("cannot list " + std::string(kShmDirectory) + ": " + ErrnoText(errno));
  std::vector<std::string> names;
  while (dirent* entry = ::readdir(dir)) {
    std::string_view file = entry->d_name;
    if (file.size() <= prefix.size() || file.substr(0, prefix.size()) != prefix) continue;
    // Appended, not `"/" + ...`: that trips a GCC 12 -Wrestrict false positive.
    std::string name = "/";
    name.append(file);
    names.push_back(std::move(name));
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

// ---------------------------------------------------------------- segments

Status SharedMemorySegment::ValidateName(std::string_view name) {
  if (name.size() < 2 || name.size() > 251 || name[0] != '/') {
    return Status::InvalidArgument("shm name '" + std::string(name) + "' must be '/' followed by 1..250 characters");
  }
  for (char c : name.substr(1)) {
    if (!IsComponentChar(c) && c != '.') {
      return Status::InvalidArgument("shm name '" + std::string(name) +
                                     "' may only contain letters, digits, '_', '-' and '.' after the leading '/'");
    }
  }
  return Status::Ok();
}

Result<int> CreateShmObject(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) return Status::AlreadyExists("shm segment " + name + " already exists");
    return Status::Unavailable("cannot create shm segment " + name + ": " + ErrnoText(err));
  }
  return fd;
}

Status SizeShmObject(int fd, const std::string& name, size_t size, bool reserve) {
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    return Status::Unavailable("cannot size shm segment " + name + " to " + std::to_string(size) +
                               " bytes: " + ErrnoText(err));
  }
  if (reserve && size > 0) {
    const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (err == ENOSPC) {
      return Status::ResourceExhausted("no room in " + std::string(kShmDirectory) + " for shm segment " + name +
                                       " of " + std::to_string(size) + " bytes");
    }
    if (err != 0 && err != EOPNOTSUPP) {
      return Status::Unavailable("cannot reserve " + std::to_string(size) + " bytes for shm segment " + name + ": " +
                                 ErrnoText(err));
    }
  }
  return Status::Ok();
}

Result<SharedMemorySegment> SharedMemorySegment::Create(const std::string& name, size_t size, bool reserve) {
  SLUICE_RETURN_IF_ERROR(ValidateName(name));
  SLUICE_ASSIGN_OR_RETURN(const int fd, CreateShmObject(name));
  // Any failure from here on removes the half-made segment.
  auto fail = [&](Status status) -> Result<SharedMemorySegment> {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return status;
  };
  if (Status sized = SizeShmObject(fd, name, size, reserve); !sized.ok()) return fail(sized);
  void* addr = nullptr;
  if (size > 0) {
    addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      return fail(Status::Unavailable("cannot map shm segment " + name + ": " + ErrnoText(err)));
    }
  }
  ::close(fd);  // the mapping keeps the segment's memory referenced
  return SharedMemorySegment(name, ShmAccess::kReadWrite, static_cast<std::byte*>(addr), size);
}

Result<SharedMemorySegment> SharedMemorySegment::Open(const std::string& name, ShmAccess access) {
  SLUICE_RETURN_IF_ERROR(ValidateName(name));
  const bool rw = access == ShmAccess::kReadWrite;
  int fd = ::shm_open(name.c_str(), (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound("shm segment " + name + " does not exist");
    return Status::Unavailable("cannot open shm segment " + name + ": " + ErrnoText(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::Unavailable("cannot stat shm segment " + name + ": " + ErrnoText(err));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* addr = nullptr;
  if (size > 0) {
    addr = ::mmap(nullptr, size, rw ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Status::Unavailable("cannot map shm segment " + name + ": " + ErrnoText(err));
    }
  }
  ::close(fd);
  return SharedMemorySegment(name, access, static_cast<std::byte*>(addr), size);
}

Status SharedMemorySegment::Unlink(const std::string& name) {
  SLUICE_RETURN_IF_ERROR(ValidateName(name));
  if (::shm_unlink(name.c_str()) != 0) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound("shm segment " + name + " does not exist");
    return Status::Unavailable("cannot unlink shm segment " + name + ": " + ErrnoText(err));
  }
  return Status::Ok();
}

SharedMemorySegment::~SharedMemorySegment() { Reset(); }

SharedMemorySegment::SharedMemorySegment(SharedMemorySegment&& other) noexcept
    : name_(std::move(other.name_)),
      access_(other.access_),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {
  other.name_.clear();
}

SharedMemorySegment& SharedMemorySegment::operator=(SharedMemorySegment&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    other.name_.clear();
    access_ = other.access_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void SharedMemorySegment::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  name_.clear();
}

// ------------------------------------------------------- process liveness

namespace {

struct ProcStat {
  char state = '?';
  uint64_t start_time = 0;
};

// Parses /proc/<pid>/stat. The command name (field 2) may hold spaces and
// parentheses, so fields are counted from the last ')'.
Result<ProcStat> ReadProcStat(int32_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT || err == ESRCH) return Status::NotFound("no process " + std::to_string(pid));
    return Status::Unavailable("cannot open " + path + ": " + ErrnoText(err));
  }
  char buf[1024];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof(buf));
  } while (n < 0 && errno == EINTR);
  int err = errno;
  ::close(fd);
  // ESRCH or an empty read: the process exited between open and read.
  if (n == 0 || (n < 0 && err == ESRCH)) return Status::NotFound("no process " + std::to_string(pid));
  if (n < 0) return Status::Unavailable("cannot read " + path + ": " + ErrnoText(err));
  std::string_view text(buf, static_cast<size_t>(n));
  size_t paren = text.rfind(')');
  if (paren == std::string_view::npos) return Status::Unavailable("cannot parse " + path);
  std::istringstream fields(std::string(text.substr(paren + 1)));
  ProcStat stat;
  fields >> stat.state;  // field 3
  std::string skip;
  for (int field = 4; field < 22; ++field) fields >> skip;
  fields >> stat.start_time;  // field 22
  if (!fields) return Status::Unavailable("cannot parse " + path);
  return stat;
}

}  // namespace

ProcessIdentity CurrentProcess() {
  // Cached per pid: a forked child reads its own start time on first use.
  static std::atomic<int32_t> cached_pid{0};
  static std::atomic<uint64_t> cached_start{0};
  const int32_t pid = static_cast<int32_t>(::getpid());
  if (cached_pid.load(std::memory_order_acquire) == pid) return {pid, cached_start.load(std::memory_order_relaxed)};
  Result<ProcStat> stat = ReadProcStat(pid);
  // Without /proc the start time is unknown (0); IsProcessAlive then cannot
  // read /proc either and answers "alive", so nothing is wrongly reclaimed.
  const uint64_t start = stat.ok() ? stat->start_time : 0;
  if (!stat.ok()) SLUICE_LOG(WARNING) << "cannot read this process's /proc entry: " << stat.status().ToString();
  cached_start.store(start, std::memory_order_relaxed);
  cached_pid.store(pid, std::memory_order_release);
  return {pid, start};
}

Result<ProcessIdentity> ReadProcessIdentity(int32_t pid) {
  if (pid <= 0) return Status::NotFound("no process " + std::to_string(pid));
  SLUICE_ASSIGN_OR_RETURN(ProcStat stat, ReadProcStat(pid));
  return ProcessIdentity{pid, stat.start_time};
}

Result<char> ReadProcessState(int32_t pid) {
  if (pid <= 0) return Status::NotFound("no process " + std::to_string(pid));
  SLUICE_ASSIGN_OR_RETURN(ProcStat stat, ReadProcStat(pid));
  return stat.state;
}

std::string OwnerNameComponent(const ProcessIdentity& id) {
  return std::to_string(id.pid) + "-" + std::to_string(id.start_time);
}

std::vector<std::string> UnlinkSegmentsOfDeadOwners(std::initializer_list<std::string_view> components) {
  std::vector<std::string> removed;
  Result<std::vector<std::string>> names = ListShmSegments(components);
  if (!names.ok()) return removed;
  const std::string prefix = ShmSegmentName(components) + ".";
  for (const std::string& name : *names) {
    const std::optional<ProcessIdentity> owner = OwnerNamedIn(std::string_view(name).substr(prefix.size()));
    if (!owner || IsProcessAlive(*owner)) continue;
    if (SharedMemorySegment::Unlink(name).ok()) removed.push_back(name);
  }
  return removed;
}

std::optional<ProcessIdentity> OwnerNamedIn(std::string_view text) {
  const size_t dash = text.find('-');
  if (dash == std::string_view::npos || dash == 0) return std::nullopt;
  size_t end = text.find_first_of("-.", dash + 1);
  if (end == std::string_view::npos) end = text.size();
  ProcessIdentity owner;
  const auto p = std::from_chars(text.data(), text.data() + dash, owner.pid);
  const auto s = std::from_chars(text.data() + dash + 1, text.data() + end, owner.start_time);
  if (p.ec != std::errc() || p.ptr != text.data() + dash || s.ec != std::errc() || s.ptr != text.data() + end ||
      owner.pid <= 0 || end == dash + 1) {
    return std::nullopt;
  }
  return owner;
}

bool IsProcessAlive(const ProcessIdentity& id) {
  if (id.pid <= 0) return false;
  Result<ProcStat> stat = ReadProcStat(id.pid);
  if (!stat.ok()) return stat.status().code() != StatusCode::kNotFound;
  if (stat->start_time != id.start_time) return false;  // the pid was reused
  return stat->state != 'Z' && stat->state != 'X' && stat->state != 'x';
}

// ------------------------------------------------------------ robust mutex

Status ShmMutex::Init() {
  pthread_mutexattr_t attr;
  if (::pthread_mutexattr_init(&attr) != 0) return Status::Unavailable("pthread_mutexattr_init failed");
  int err = ::pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (err == 0) err = ::pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  if (err == 0) err = ::pthread_mutex_init(&native_, &attr);
  ::pthread_mutexattr_destroy(&attr);
  if (err != 0) return Status::Unavailable("cannot initialize a robust process-shared mutex: " + ErrnoText(err));
  return Status::Ok();
}

Result<ShmMutex::Locked> ShmMutex::Lock(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto backoff = std::chrono::microseconds(20);
  for (int attempt = 0;; ++attempt) {
    int err = ::pthread_mutex_trylock(&native_);
    if (err == 0) return Locked{};
    if (err == EOWNERDEAD) {
      // We hold the lock now. Mark it usable again at once: the repair the
      // caller runs is idempotent, so a second death during repair is safe.
      ::pthread_mutex_consistent(&native_);
      return Locked{true};
    }
    if (err == ENOTRECOVERABLE) return Status::Internal("shared-memory mutex is not recoverable");
    if (err != EBUSY) return Status::Internal("shared-memory mutex trylock failed: " + ErrnoText(err));
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout("shared-memory lock not acquired within " + std::to_string(timeout.count()) +
                             " ms (its holder may be stopped or stuck)");
    }
    // Critical sections are microseconds: yield a few times, then sleep with
    // a growing, capped backoff.
    if (attempt < 16) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(1000));
    }
  }
}

void ShmMutex::Unlock() { ::pthread_mutex_unlock(&native_); }

// ------------------------------------------------------------------- futex

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "futex words must be plain lock-free 32-bit atomics");

void ShmFutexWait(const std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // Not FUTEX_PRIVATE_FLAG: the waker may be another process.
  ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void ShmFutexWakeAll(const std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace sluice
