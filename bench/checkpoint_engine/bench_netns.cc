// Network namespaces for the cross-host measurements, and their cleanup:
// on normal exit (destructors), on error (destructors on the way out) and on
// SIGINT/SIGTERM/SIGHUP (a signal thread); a run killed with SIGKILL is swept
// by the next run (SweepStaleNamespaces).
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "bench_cross_host.h"

namespace sluice::bench::ce {
namespace {

constexpr const char* kPrefix = "slbench-";

// Runs `ip ...` and waits (30 s at most). Output is discarded unless asked for.
Status Ip(const std::vector<std::string>& args, std::string* output = nullptr) {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  SLUICE_ASSIGN_OR_RETURN(Child child, Child::Spawn(argv, /*capture_stdout=*/true, /*signal_pipe=*/false));
  Status s = child.Wait(Clock::now() + std::chrono::seconds(30));
  if (output != nullptr) *output = child.output();
  if (!s.ok()) {
    std::string cmd;
    for (const std::string& a : argv) cmd += a + " ";
    return s.WithContext(cmd);
  }
  return Status::Ok();
}

}  // namespace

Status CheckCanUseNetns() {
  if (::geteuid() != 0) return Status::FailedPrecondition("not root (network namespaces need CAP_SYS_ADMIN)");
  std::string out;
  Status s = Ip({"netns", "list"}, &out);
  if (!s.ok()) return Status::FailedPrecondition("`ip netns` is unusable: " + s.ToString());
  return Status::Ok();
}

void SweepStaleNamespaces() {
  std::string out;
  if (!Ip({"netns", "list"}, &out).ok()) return;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    const std::string name = line.substr(0, line.find(' '));
    if (name.rfind(kPrefix, 0) != 0) continue;
    const size_t dash = name.find('-', std::strlen(kPrefix));
    const pid_t pid = static_cast<pid_t>(std::atoi(name.substr(std::strlen(kPrefix), dash).c_str()));
    if (pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM)) continue;  // its run is still going
    std::fprintf(stderr, "removing stale network namespace %s\n", name.c_str());
    (void)Ip({"netns", "del", name});
  }
}

// ------------------------------------------------------------ cleanup

namespace {
struct Registry {
  std::mutex mu;
  std::set<std::string> namespaces;
  std::set<pid_t> children;
  // Held for a whole DeleteAll, so a second caller (the main thread on its
  // way out while the signal thread cleans up) waits until it is done.
  std::mutex deleting;
};
Registry& TheRegistry() {
  static Registry* r = new Registry();  // leaked: used by the signal thread up to _exit
  return *r;
}
}  // namespace

CleanupRegistry& CleanupRegistry::Get() {
  static CleanupRegistry r;
  return r;
}

void CleanupRegistry::AddNamespace(const std::string& name) {
  std::lock_guard<std::mutex> lock(TheRegistry().mu);
  TheRegistry().namespaces.insert(name);
}
void CleanupRegistry::AddChild(pid_t pid) {
  std::lock_guard<std::mutex> lock(TheRegistry().mu);
  TheRegistry().children.insert(pid);
}
void CleanupRegistry::RemoveChild(pid_t pid) {
  std::lock_guard<std::mutex> lock(TheRegistry().mu);
  TheRegistry().children.erase(pid);
}

void CleanupRegistry::KillChildren() {
  std::set<pid_t> children;
  {
    std::lock_guard<std::mutex> lock(TheRegistry().mu);
    children = TheRegistry().children;
  }
  for (pid_t pid : children) ::kill(pid, SIGKILL);
}

void CleanupRegistry::DeleteAll() {
  std::lock_guard<std::mutex> deleting(TheRegistry().deleting);
  std::set<std::string> namespaces;
  {
    std::lock_guard<std::mutex> lock(TheRegistry().mu);
    namespaces.swap(TheRegistry().namespaces);
  }
  // Deleting a namespace destroys the veth ends inside it (and so their peers).
  for (const std::string& ns : namespaces) {
    Status s = Ip({"netns", "del", ns});
    if (!s.ok()) std::fprintf(stderr, "warning: %s\n", s.ToString().c_str());
  }
}

void CleanupRegistry::InstallSignalCleanup() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // Lives until the process exits: it only ever ends the process.
  static std::jthread* waiter = new std::jthread([set] {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) return;
    std::fprintf(stderr, "\nsignal %d: killing peers and removing network namespaces\n", sig);
    CleanupRegistry::Get().KillChildren();
    CleanupRegistry::Get().DeleteAll();
    std::_Exit(128 + sig);
  });
  (void)waiter;
}

// ------------------------------------------------------------ topology

Result<std::unique_ptr<NetTopology>> NetTopology::Create(int hosts) {
  std::unique_ptr<NetTopology> net(new NetTopology());
  const int pid = static_cast<int>(::getpid());
  net->subnet_ = "10." + std::to_string(200 + pid % 50) + "." + std::to_string((pid / 50) % 250) + ".";
  const std::string base = std::string(kPrefix) + std::to_string(pid) + "-";
  net->bridge_ns_ = base + "br";
  CleanupRegistry::Get().AddNamespace(net->bridge_ns_);
  SLUICE_RETURN_IF_ERROR(Ip({"netns", "add", net->bridge_ns_}));
  SLUICE_RETURN_IF_ERROR(Ip({"-n", net->bridge_ns_, "link", "add", "br0", "type", "bridge"}));
  SLUICE_RETURN_IF_ERROR(Ip({"-n", net->bridge_ns_, "link", "set", "br0", "up"}));
  for (int h = 0; h < hosts; ++h) {
    const std::string ns = base + "h" + std::to_string(h);
    const std::string host_if = "sb" + std::to_string(pid) + "h" + std::to_string(h);
    const std::string bridge_if = "sb" + std::to_string(pid) + "b" + std::to_string(h);
    CleanupRegistry::Get().AddNamespace(ns);
    net->namespaces_.push_back(ns);
    SLUICE_RETURN_IF_ERROR(Ip({"netns", "add", ns}));
    SLUICE_RETURN_IF_ERROR(Ip({"link", "add", host_if, "type", "veth", "peer", "name", bridge_if}));
    // Both ends leave the root namespace at once (deleting the namespaces
    // then deletes them); if that fails, the pair is deleted here.
    Status moved = Ip({"link", "set", bridge_if, "netns", net->bridge_ns_});
    if (moved.ok()) moved = Ip({"link", "set", host_if, "netns", ns});
    if (!moved.ok()) {
      (void)Ip({"link", "del", host_if});
      return moved;
    }
    SLUICE_RETURN_IF_ERROR(Ip({"-n", net->bridge_ns_, "link", "set", bridge_if, "master", "br0"}));
    SLUICE_RETURN_IF_ERROR(Ip({"-n", net->bridge_ns_, "link", "set", bridge_if, "up"}));
    SLUICE_RETURN_IF_ERROR(Ip({"-n", ns, "addr", "add", net->ip(h) + "/24", "dev", host_if}));
    SLUICE_RETURN_IF_ERROR(Ip({"-n", ns, "link", "set", host_if, "up"}));
    SLUICE_RETURN_IF_ERROR(Ip({"-n", ns, "link", "set", "lo", "up"}));
  }
  return net;
}

NetTopology::~NetTopology() { CleanupRegistry::Get().DeleteAll(); }

std::string NetTopology::ip(int host) const { return subnet_ + std::to_string(host + 1); }

}  // namespace sluice::bench::ce
