// Running a model's Python code in a sandboxed child process: the
// code-execution tool of agent runs (`agent.env=python`, docs/agents.md).
//
// What the sandbox does, for each run:
//   * a fresh temporary directory, the working directory, removed after;
//   * the interpreter in isolated mode (python3 -I: no user site, no
//     PYTHON* environment variables) with an empty environment but PATH;
//   * resource limits: CPU seconds, address space (memory), the size of any
//     file written, open files, and processes (RLIMIT_NPROC);
//   * its own process group, killed whole (SIGKILL) at the wall timeout or
//     when the run ends; where the kernel allows it (root, or unprivileged
//     user namespaces), its own PID namespace (a fork bomb's processes die
//     with it) and its own network namespace (no interface but a loopback
//     that is down: no network at all);
//   * as root, it drops to the unprivileged uid/gid 65534 (nobody), so that
//     the process limit applies (root is exempt from RLIMIT_NPROC) and the
//     code cannot write what root can;
//   * its stdout and stderr read back up to a bound each, the rest counted
//     and dropped.
// What it does not protect against: reading what the uid it runs as may
// read (the file system is not hidden; without the network namespace, the
// network is reachable), kernel exploits, and timing side channels. It is a
// guard against runaway or careless code, not a security boundary for
// hostile code: run untrusted models' code in a VM or container as well.
//
// Thread safety: RunSandboxedPython may run concurrently.
#ifndef SLUICE_AGENT_SANDBOX_H_
#define SLUICE_AGENT_SANDBOX_H_

#include <cstdint>
#include <string>

#include "sluice/common/status.h"

namespace sluice::agent {

struct SandboxLimits {
  std::string python = "python3";  // searched on PATH when it has no '/'
  double wall_seconds = 10;
  int64_t cpu_seconds = 5;
  int64_t memory_bytes = int64_t{512} << 20;  // address space
  int64_t file_bytes = int64_t{16} << 20;     // any one file written
  int64_t open_files = 64;
  int64_t processes = 32;       // for the uid it runs as
  int64_t output_bytes = 4096;  // stdout and stderr each
};

struct SandboxResult {
  std::string stdout_text, stderr_text;  // each cut to output_bytes
  int64_t dropped_bytes = 0;             // output past the bound
  int exit_code = -1;                    // when it exited
  int signal = 0;                        // when a signal ended it (SIGKILL at the wall timeout, SIGXCPU, ...)
  bool timed_out = false;                // killed at wall_seconds
  bool pid_namespace = false, network_namespace = false, dropped_privileges = false;  // what applied
  double seconds = 0;

  // What the code's run said, for the model: its stdout, then its stderr,
  // then how it ended when it did not exit 0 ("[killed: ran past 10 s]").
  std::string Describe() const;
};

// Runs `code`. Errors only for what is not the code's doing: Unavailable
// when the child cannot be set up (no temporary directory, fork fails, the
// interpreter cannot be started: its stderr says so); InvalidArgument for
// limits out of range.
Result<SandboxResult> RunSandboxedPython(const std::string& code, const SandboxLimits& limits);

}  // namespace sluice::agent

#endif  // SLUICE_AGENT_SANDBOX_H_
