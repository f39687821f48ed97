// Python environments (`agent.env: module:Class`, docs/agents.md): the
// user's class, one instance per trajectory, made with agent.env_config and
// run in worker processes of a plain Python 3, as reward.python's functions
// are (the process, the protocol's checks and the kill of a worker and its
// helpers are reward.python's: reward/python_reward.h).
//
//   class Env:
//       def __init__(self, config: dict): ...
//       def reset(self, row: dict) -> dict: ...     {"messages": [...], "tools": [...]}
//       def step(self, action: dict) -> dict: ...   {"messages": [...], "reward": float|None, "done": bool}
//       def close(self): ...                        optional
//
// A pool of `workers` processes serves the run's environments: each
// environment lives in one worker for its whole trajectory (at its reset, a
// worker not busy with a call, else the next in turn), and a worker runs
// one call at a time. A call that raises,
// answers something malformed (checked here: the shapes above), answers
// more than 1 MiB or what JSON cannot hold is an error of that call; the
// worker lives on. A call past `timeout`, a worker that dies or breaks the
// protocol: the worker is killed with its process group and replaced at its
// next use, and every environment it held fails its next call (their
// trajectories end as env_error). An environment is closed (its close()
// called) in its worker when it is destroyed, before that worker's next call.
//
// Thread safety: the pool and the environments it makes may be used from
// any number of threads; one environment by one thread at a time.
#ifndef SLUICE_AGENT_PYTHON_ENVIRONMENT_H_
#define SLUICE_AGENT_PYTHON_ENVIRONMENT_H_

#include <chrono>
#include <memory>
#include <string>

#include "sluice/agent/environment.h"
#include "sluice/common/status.h"

namespace sluice::agent {

struct PythonEnvironmentOptions {
  std::string spec;                                // "package.module:Class" or "path/to/file.py:Class"
  std::string config = "{}";                       // the constructor's argument: a JSON object
  std::string executable = "python3";              // searched on PATH when it has no '/'
  int workers = 4;                                 // processes, in [1, 1024]
  std::chrono::milliseconds timeout{60000};        // one call, > 0
  std::chrono::milliseconds start_timeout{60000};  // a worker's start (import included), > 0
};

// Checks the options and that the class loads: starts one worker (which
// imports the module and finds the class with reset and step), then stops
// it. InvalidArgument naming the spec (a bad spec or config; the module does
// not import, has no such class, or it lacks reset or step, with the Python
// exception), NotFound (no interpreter), Timeout, Unavailable.
Status CheckPythonEnvironment(const PythonEnvironmentOptions& options);

class PythonEnvironmentPool {
 public:
  // Checks the options only (InvalidArgument); starts no process.
  static Result<std::shared_ptr<PythonEnvironmentPool>> Create(const PythonEnvironmentOptions& options);
  ~PythonEnvironmentPool();  // kills the workers

  // A new environment (its instance is made in its worker at Reset).
  std::unique_ptr<Environment> Make();

  struct Impl;

 private:
  explicit PythonEnvironmentPool(std::unique_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace sluice::agent

#endif  // SLUICE_AGENT_PYTHON_ENVIRONMENT_H_
