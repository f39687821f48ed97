// Private to sluice_reward: one Python worker process of reward.python
// (python_reward.h has the contract users see).
//
// Process. The worker is `executable -c <kWorkerProgram> reward <spec>` (or,
// for an agent's Python environment, `... env <spec> <config JSON>`: the
// environment protocol is agent/python_environment.cc's), started with
// posix_spawnp: stdin is /dev/null, stdout is the parent's stderr (so output
// of the user's code, at the Python or the C level, lands on stderr), stderr
// is inherited, fd 3 is one end of a socketpair (the protocol), every other
// descriptor is closed, no signal is blocked or ignored. It leads a process
// group of its own, which is killed (SIGKILL) with it, so helpers the user's
// function started do not outlive it; it is not signalled with its parent's
// group. It exits on end of file on fd 3, and when its parent process
// changes (it looks twice a second), so it does not outlive a parent that
// died, even mid-call.
//
// Protocol: JSON lines over fd 3, one request, then one reply.
//   worker, once started   {"ready": true, "pid": N}
//                          {"ready": false, "error": "cannot import module 'x': ..."}  (then it exits)
//   request                {"id": K, "data_source": ..., "solution_str": ..., "ground_truth": ...,
//                           "extra_info": {"index": I, "split": "train"|"eval"[, "prompt": ...]}}
//   reply                  {"id": K, "score": X}  X a finite number
//                          {"id": K, "error": "raised ValueError: ..." | "returned None (NoneType), ..."}
// A reply line longer than kMaxLineBytes, one that is not such an object,
// one with another id, or bytes after the reply are a protocol violation:
// the worker cannot be trusted any more.
//
// Thread safety: a PythonWorker is used by one thread at a time.
#ifndef SLUICE_SRC_REWARD_PYTHON_WORKER_H_
#define SLUICE_SRC_REWARD_PYTHON_WORKER_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::reward::internal {

// The worker program (Python source), passed with -c.
extern const char* const kWorkerProgram;

// Longest line read from a worker.
inline constexpr size_t kMaxLineBytes = size_t{1} << 20;

// What one call scores; becomes the keyword arguments of the user's function.
struct ScoreRequest {
  std::string data_source;   // the task's name
  std::string solution_str;  // the response (invalid UTF-8 is replaced by U+FFFD)
  std::string ground_truth;  // the reference answer
  uint64_t index = 0;        // extra_info["index"]
  std::string split;         // extra_info["split"]
  std::string prompt;        // extra_info["prompt"]; left out when empty
};

// A valid reply: the function's score, or why it has none (it raised, or
// returned something that is not a finite number).
struct ScoreReply {
  bool ok = false;
  double score = 0;
  std::string error;  // when !ok
};

class PythonWorker {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts a worker for `spec` ("module:function", already parsed) and waits
  // until it has imported the module and found the function. Errors:
  //   NotFound        - `executable` does not exist (not on PATH)
  //   InvalidArgument - the function did not load (the worker's message,
  //                     naming the module, the function and the exception)
  //   Timeout         - no report before `deadline` (the process is killed)
  //   Unavailable     - the process could not be spawned, or ended or broke
  //                     the protocol before it was ready (how it ended)
  // `mode_args`: the program's arguments after its mode ("reward", spec):
  // {"reward", spec} or {"env", spec, config}. `executable_key` names the
  // setting that chose the interpreter, for the error when it is missing.
  static Result<std::unique_ptr<PythonWorker>> Start(const std::string& executable,
                                                     const std::vector<std::string>& mode_args,
                                                     Clock::time_point deadline,
                                                     const std::string& executable_key = "reward.python_executable");
  // Kills (SIGKILL) and reaps the process.
  ~PythonWorker();
  PythonWorker(const PythonWorker&) = delete;
  PythonWorker& operator=(const PythonWorker&) = delete;

  // Sends `request` as request `id` and waits for its reply. Errors (after
  // any of which the worker must be destroyed): Timeout (no reply before
  // `deadline`), Unavailable (the worker died: how it ended), DataLoss (a
  // protocol violation, quoting the start of what was read).
  Result<ScoreReply> Call(uint64_t id, const ScoreRequest& request, Clock::time_point deadline);

  // Sends `message` (an object; its "id" set to `id`) as one line and reads
  // the one-line reply, checked to be an object carrying that id. Errors as
  // for Call.
  Result<nlohmann::json> Exchange(uint64_t id, nlohmann::json message, Clock::time_point deadline);

  pid_t pid() const { return pid_; }

 private:
  PythonWorker(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  // The next line from the worker (without '\n'), before `deadline`.
  Result<std::string> ReadLine(Clock::time_point deadline);
  // After end of file: reaps the process (killing it if it lingers) and
  // says how it ended.
  std::string Ended();
  // Kills the worker's process group (SIGKILL) and reaps the worker: its
  // wait status, -1 if it did not end in time, -2 if it was gone already.
  int KillAndReap();

  pid_t pid_ = -1;  // -1 once reaped
  int fd_ = -1;     // our end of the socketpair
  std::string buffer_;
};

}  // namespace sluice::reward::internal

#endif  // SLUICE_SRC_REWARD_PYTHON_WORKER_H_
