// A local process supervisor: `sluice train` runs each pipeline role
// (trainer, rollout, reward) as its own OS process on one host, waits for
// them, and stops them all cleanly when one fails or the user interrupts.
//
//  * Each child runs in its own process group (so a terminal's Ctrl-C reaches
//    only the launcher, which then decides the shutdown order) and is signalled
//    as a group, so helpers a role forks die with it.
//  * Each child gets PR_SET_PDEATHSIG = SIGTERM before exec: if the launcher
//    dies, even by SIGKILL, its children are terminated by the kernel. Linux
//    delivers that signal when the *thread* that called Start exits, so call
//    Start from a thread that lives as long as the children (normally main).
//    Grandchildren are not covered by it.
//  * Stopping is SIGTERM (and SIGCONT, so a stopped child handles it) to every
//    group, up to `stop_grace` for the children to exit, then SIGKILL to every
//    group, then reaping. Every child started is
//    reaped by Wait or StopAll (or the destructor): no zombies are left.
//
// StopOnSignals turns the launcher's own SIGINT/SIGTERM into a flag that
// Supervisor::Wait polls.
//
// Thread safety: Supervisor is not thread-safe; one owner thread makes every
// call. To end a Wait from another thread or a signal handler, set the `stop`
// flag passed to it. StopOnSignals is constructed and destroyed by the main
// thread; its flag may be read from any thread.
#ifndef SLUICE_RUNTIME_SUPERVISOR_H_
#define SLUICE_RUNTIME_SUPERVISOR_H_

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::runtime {

struct ChildSpec {
  std::string name;                        // the role, e.g. "rollout"; named in every message, unique
  std::string path;                        // executable, run as is (no PATH search), e.g. /proc/self/exe
  std::vector<std::string> args;           // argv[1..]; argv[0] is `path`
  std::map<std::string, std::string> env;  // set on top of (overriding) the launcher's environment
  // A child that fails (exits non-zero or is killed by a signal) is started
  // again by Wait, with the same spec, up to this many times, each after a
  // back-off (restart_backoff, doubling per restart of it, at most
  // max_restart_backoff); the others keep running. Its process group is
  // killed and reaped first. 0: its failure ends Wait.
  int32_t max_restarts = 0;
};

struct SupervisorOptions {
  // How long stopping waits after SIGTERM before it sends SIGKILL.
  std::chrono::milliseconds stop_grace{5000};
  // How often Wait and StopAll look for exited children.
  std::chrono::milliseconds poll_interval{10};
  // ChildSpec::max_restarts: the first restart's delay, and the longest.
  std::chrono::milliseconds restart_backoff{1000};
  std::chrono::milliseconds max_restart_backoff{30000};
};

class Supervisor {
 public:
  // Errors: InvalidArgument for a negative stop_grace or a poll_interval
  // outside 1..1000 ms.
  static Result<std::unique_ptr<Supervisor>> Create(SupervisorOptions options = {});
  ~Supervisor();  // StopAll()
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts a child (fork + exec). The child inherits stdin/stdout/stderr and
  // (on Linux >= 5.11) no other descriptor. Returns once the child has exec'd.
  // Errors, with nothing left running:
  //   InvalidArgument    - empty or duplicate name, empty path, a NUL byte in
  //                        path/args/env, an env name that is empty or has '=',
  //                        a path that is not an executable regular file
  //   NotFound           - `path` does not exist
  //   FailedPrecondition - after StopAll (or after Wait returned)
  //   Unavailable        - fork, pipe or exec failed (errno in the message)
  Status Start(const ChildSpec& spec);

  // Blocks until the children are done, then stops and reaps all of them
  // (including helpers left in their process groups). A child with restarts
  // left that fails is started again meanwhile (logged with the cause).
  // Returns:
  //   OK                 - every child exited with status 0 (a child may exit 0
  //                        early while others still run)
  //   Unavailable        - a child exited non-zero or was killed by a signal
  //                        with no restart left (or failed to start again);
  //                        the message names it, its pid and "exit status N" or
  //                        "killed by signal N (SIGNAME)"
  //   Aborted            - `*stop` became true (checked every poll_interval)
  //   Timeout            - `timeout` passed with children still running
  //   FailedPrecondition - no child was started, or StopAll came first
  //   what `watch` returned, when it returned an error (it is called every
  //   poll_interval while children run, on this thread: a watchdog)
  // The outcome is final: a later Wait returns the same status.
  Status Wait(std::chrono::milliseconds timeout, const std::atomic<bool>* stop = nullptr,
              const std::function<Status()>& watch = nullptr);

  // Stops and reaps every child: SIGTERM, up to stop_grace, SIGKILL. Returns
  // within stop_grace + 5 s even if a child is stuck in the kernel (that one
  // is logged and left behind). Idempotent; later Starts fail.
  void StopAll();

  // Pids of the children started and not yet reaped, in start order.
  std::vector<pid_t> pids() const;
  // The pid of the child named `name` now (a restart gives it a new one);
  // -1 while it waits to be started again, or for an unknown name.
  pid_t PidOf(const std::string& name) const;
  // How many times the child named `name` was started again (until Wait
  // returns: then the children are gone).
  int32_t Restarts(const std::string& name) const;

  // Whether the child named `name` has exited, as of Wait's latest look
  // (so, inside Wait's `watch`: an exit Wait has seen, and since a failed
  // exit ends Wait, one with status 0). False for an unknown name.
  bool HasExited(const std::string& name) const;

 private:
  struct Child;
  explicit Supervisor(SupervisorOptions options);
  // Records the exit of every child that has exited since the last call,
  // without reaping it (its pid, and so its process group id, stays reserved).
  void PollExits();
  // fork + exec of `spec`: the child's pid. Errors as Start.
  Result<pid_t> Spawn(const ChildSpec& spec);
  // A failed child with restarts left: kill and reap its group, and plan its
  // start after the back-off. Restarts due now: start them. Errors: a start
  // that failed.
  void PlanRestart(Child& child);
  Status RestartDue();

  SupervisorOptions options_;
  std::vector<Child> children_;
  bool stopped_ = false;
  std::optional<Status> outcome_;  // set once Wait has returned
};

// While alive, SIGINT and SIGTERM set flag() (and received_signal()) instead
// of terminating the process; the destructor restores the previous handlers.
// A second signal of the same kind takes the default action, so a stuck
// shutdown can still be interrupted. At most one instance may exist at a time
// (a second one is a bug and aborts).
class StopOnSignals {
 public:
  StopOnSignals();
  ~StopOnSignals();
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;

  const std::atomic<bool>* flag() const;
  // The signal that set the flag (the first one), or 0.
  int received_signal() const;

 private:
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

}  // namespace sluice::runtime

#endif  // SLUICE_RUNTIME_SUPERVISOR_H_
