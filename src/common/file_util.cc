#include "sluice/common/file_util.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace sluice {

namespace {
const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "of an unknown kind";
}
}  // namespace

Result<int> OpenRegularFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading blocks until a writer comes;
  // non-blocking, it returns at once and fstat tells what it is.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(path + ": cannot open: no such file");
    if (err == ENXIO) return Status::InvalidArgument(path + ": not a regular file (a socket or device)");
    return Status::Unavailable(path + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Unavailable(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path + ": not a regular file (" + FileKind(st.st_mode) + ")");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Unavailable(path + ": cannot set blocking reads: " + std::strerror(err));
  }
  return fd;
}

Result<std::string> ReadFileToString(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  std::string text;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return Status::Unavailable(path + ": read failed: " + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

namespace {
// nftw's callback: the entry's errno, if removing it fails, ends the walk.
thread_local std::string remove_tree_failed;
int RemoveEntry(const char* path, const struct stat*, int type, struct FTW*) {
  int rc = type == FTW_DP ? ::rmdir(path) : ::unlink(path);
  if (rc != 0 && errno != ENOENT) {
    remove_tree_failed = std::string(path) + ": " + std::strerror(errno);
    return 1;
  }
  return 0;
}
}  // namespace

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::Unavailable("cannot remove " + path + ": " + std::strerror(errno));
  }
  remove_tree_failed.clear();
  // Depth first (children before their directory), not crossing symbolic links.
  int rc = ::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc == 0) return Status::Ok();
  if (!remove_tree_failed.empty()) return Status::Unavailable("cannot remove " + remove_tree_failed);
  return Status::Unavailable("cannot remove " + path + ": " + std::strerror(errno));
}

Status WriteAll(int fd, std::string_view bytes, const std::string& what) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Unavailable(what + ": write failed: " + std::strerror(n < 0 ? errno : EIO));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<int> OpenAppendFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for writing must not wait for a reader (it is
  // refused below); cleared once the file is known to be a regular one.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0 && errno == EISDIR) return Status::InvalidArgument(path + ": not a regular file (a directory)");
  if (fd < 0) return Status::Unavailable(path + ": cannot open for appending: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path + ": not a regular file");
  }
  ::fcntl(fd, F_SETFL, O_APPEND);
  return fd;
}

Status AppendToFile(const std::string& path, std::string_view bytes) {
  SLUICE_ASSIGN_OR_RETURN(const int fd, OpenAppendFile(path));
  Status written = WriteAll(fd, bytes, path);
  ::close(fd);
  return written;
}

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  // Unique per process and call, so concurrent writers never share a temporary.
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Unavailable(tmp + ": cannot create: " + std::strerror(errno));
  if (Status written = WriteAll(fd, bytes, tmp); !written.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return written;
  }
  // Data reaches the disk before the rename makes it visible: a crash leaves
  // either the old file or the whole new one.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::Unavailable(tmp + ": cannot flush: " + std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::Unavailable(path + ": cannot rename into place: " + std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace sluice
