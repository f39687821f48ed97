// The code-execution tool's sandbox (sandbox.h).
#include "sluice/agent/sandbox.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "sluice/common/file_util.h"

namespace sluice::agent {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uid_t kNobody = 65534;
constexpr int kSetupFailed = 126;  // the child's exit code when its set-up failed (its stderr says why)

// Bits the child reports on its info pipe.
constexpr char kPidNamespace = 1, kNetworkNamespace = 2, kDroppedPrivileges = 4;

void WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// After fork, in a process with other threads: no allocation from here on.
[[noreturn]] void Fail(const char* what) {
  const char* why = std::strerror(errno);
  WriteAll(2, "sandbox: ", 9);
  WriteAll(2, what, std::strlen(what));
  WriteAll(2, ": ", 2);
  WriteAll(2, why, std::strlen(why));
  WriteAll(2, "\n", 1);
  ::_exit(kSetupFailed);
}

void Limit(int resource, int64_t value) {
  const rlimit r{static_cast<rlim_t>(value), static_cast<rlim_t>(value)};
  if (::setrlimit(resource, &r) != 0) Fail("setrlimit");
}

// What the child needs, made before the fork (the child allocates nothing).
struct Launch {
  std::string dir, home, python;
  const SandboxLimits* limits;
  bool root;
};

// The process that becomes the interpreter: limits, identity, directory, exec.
[[noreturn]] void Become(const Launch& x, int info) {
  const SandboxLimits& l = *x.limits;
  const bool root = x.root;
  char flags = root ? kDroppedPrivileges : 0;
  Limit(RLIMIT_CPU, l.cpu_seconds);
  Limit(RLIMIT_AS, l.memory_bytes);
  Limit(RLIMIT_FSIZE, l.file_bytes);
  Limit(RLIMIT_NOFILE, l.open_files);
  Limit(RLIMIT_CORE, 0);
  if (root) {
    // RLIMIT_NPROC binds only an unprivileged uid: drop to nobody.
    Limit(RLIMIT_NPROC, l.processes);
    if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) Fail("dropping to nobody");
  }
  WriteAll(info, &flags, 1);
  ::close(info);
  if (::chdir(x.dir.c_str()) != 0) Fail("chdir");
  const char* env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", x.home.c_str(), "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1",
                       nullptr};
  const char* argv[] = {x.python.c_str(), "-I", "main.py", nullptr};
  ::execvpe(x.python.c_str(), const_cast<char* const*>(argv), const_cast<char* const*>(env));
  Fail("cannot run the interpreter");
}

// The child: its own process group and, where allowed, namespaces; then the
// interpreter (or, in a new PID namespace, a child that is its init and
// whose wait status goes to the info pipe).
[[noreturn]] void Child(const Launch& x, int out, int err, int info) {
  const bool root = x.root;
  ::setpgid(0, 0);
  const int null = ::open("/dev/null", O_RDONLY);
  if (null < 0 || ::dup2(null, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) Fail("redirecting");
  for (int fd = 3; fd < 1024; ++fd) {
    if (fd != info) ::close(fd);
  }
  char flags = 0;
  if (!root) static_cast<void>(::unshare(CLONE_NEWUSER));  // unprivileged namespaces, where the kernel allows them
  if (::unshare(CLONE_NEWNET) == 0) flags |= kNetworkNamespace;
  if (::unshare(CLONE_NEWPID) == 0) flags |= kPidNamespace;
  WriteAll(info, &flags, 1);
  if (!(flags & kPidNamespace)) Become(x, info);
  const pid_t init = ::fork();
  if (init < 0) Fail("fork");
  if (init == 0) Become(x, info);
  int status = 0;
  while (::waitpid(init, &status, 0) < 0 && errno == EINTR) {
  }
  WriteAll(info, &status, sizeof(status));
  ::_exit(0);
}

void KillGroup(pid_t pgid) { ::kill(-pgid, SIGKILL); }

}  // namespace

std::string SandboxResult::Describe() const {
  std::string out = stdout_text;
  if (!stderr_text.empty()) out += (out.empty() || out.back() == '\n' ? "" : "\n") + stderr_text;
  if (dropped_bytes > 0) out += "\n[" + std::to_string(dropped_bytes) + " more bytes of output dropped]";
  if (timed_out) {
    out += "\n[killed: ran past its time]";
  } else if (signal != 0) {
    out += "\n[killed by signal " + std::to_string(signal) + (signal == SIGXCPU ? ": out of CPU time" : "") +
           (signal == SIGXFSZ ? ": a file past its size limit" : "") + "]";
  } else if (exit_code != 0) {
    out += "\n[exit code " + std::to_string(exit_code) + "]";
  }
  return out;
}

Result<SandboxResult> RunSandboxedPython(const std::string& code, const SandboxLimits& l) {
  if (!(l.wall_seconds > 0) || l.cpu_seconds < 1 || l.memory_bytes < (int64_t{16} << 20) || l.file_bytes < 0 ||
      l.open_files < 8 || l.processes < 1 || l.output_bytes < 1 || l.python.empty()) {
    return Status::InvalidArgument("sandbox limits out of range");
  }
  char pattern[] = "/tmp/sluice-sandbox-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) return Status::Unavailable(std::string("mkdtemp: ") + std::strerror(errno));
  const std::string dir = pattern;
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() { static_cast<void>(RemoveTree(dir)); }
  } remove{dir};
  { std::ofstream(dir + "/main.py", std::ios::binary) << code; }
  const bool root = ::geteuid() == 0;
  if (root && (::chown(dir.c_str(), kNobody, kNobody) != 0 || ::chmod(dir.c_str(), 0700) != 0)) {
    return Status::Unavailable(std::string("preparing the sandbox directory: ") + std::strerror(errno));
  }
  int out[2], err[2], info[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return Status::Unavailable("pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]), ::close(out[1]);
    return Status::Unavailable("pipe");
  }
  if (::pipe2(info, O_CLOEXEC) != 0) {
    ::close(out[0]), ::close(out[1]), ::close(err[0]), ::close(err[1]);
    return Status::Unavailable("pipe");
  }
  const Launch launch{dir, "HOME=" + dir, l.python, &l, root};
  const auto start = Clock::now();
  const pid_t child = ::fork();
  if (child < 0) {
    for (int fd : {out[0], out[1], err[0], err[1], info[0], info[1]}) ::close(fd);
    return Status::Unavailable(std::string("fork: ") + std::strerror(errno));
  }
  if (child == 0) Child(launch, out[1], err[1], info[1]);
  ::setpgid(child, child);  // as the child does: whichever runs first
  ::close(out[1]), ::close(err[1]), ::close(info[1]);

  SandboxResult r;
  std::string* texts[2] = {&r.stdout_text, &r.stderr_text};
  int fds[2] = {out[0], err[0]};
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(l.wall_seconds));
  while (fds[0] >= 0 || fds[1] >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      r.timed_out = true;
      KillGroup(child);
      break;
    }
    pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    const int ready = ::poll(p, 2, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char chunk[8192];
      const ssize_t n = ::read(fds[i], chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fds[i]);
        fds[i] = -1;
        continue;
      }
      const size_t room =
          static_cast<size_t>(l.output_bytes) - std::min(texts[i]->size(), static_cast<size_t>(l.output_bytes));
      const size_t keep = std::min(room, static_cast<size_t>(n));
      texts[i]->append(chunk, keep);
      r.dropped_bytes += static_cast<int64_t>(static_cast<size_t>(n) - keep);
    }
  }
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  // Whatever is left of it (a helper it started in the background) goes too.
  KillGroup(child);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // The info pipe: the namespace flags, then (in a PID namespace) the
  // interpreter's flags and its wait status as its init saw it.
  std::string info_bytes;
  char buf[64];
  for (ssize_t n; (n = ::read(info[0], buf, sizeof(buf))) > 0;) info_bytes.append(buf, static_cast<size_t>(n));
  ::close(info[0]);
  if (!info_bytes.empty()) {
    r.pid_namespace = info_bytes[0] & kPidNamespace;
    r.network_namespace = info_bytes[0] & kNetworkNamespace;
  }
  if (info_bytes.size() >= 2) r.dropped_privileges = info_bytes[1] & kDroppedPrivileges;
  if (r.pid_namespace && info_bytes.size() >= 2 + sizeof(int)) {
    std::memcpy(&status, info_bytes.data() + 2, sizeof(int));  // the interpreter's, as its init saw it
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  if (r.timed_out) r.signal = SIGKILL;
  if (r.exit_code == kSetupFailed && r.stderr_text.rfind("sandbox: ", 0) == 0) {
    return Status::Unavailable(r.stderr_text);
  }
  return r;
}

}  // namespace sluice::agent
