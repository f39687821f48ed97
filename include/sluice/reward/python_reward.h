// Rewards computed by a user's Python function (`reward.python`).
//
// The function follows verl's convention, so reward functions written for
// verl work unchanged:
//
//   def compute_score(data_source, solution_str, ground_truth, extra_info=None):
//       return 1.0 if solution_str.strip().endswith(ground_truth) else 0.0
//
// called with keyword arguments: data_source is the task's name
// (Task::name()), solution_str the decoded response, ground_truth the
// example's reference answer, extra_info a dict {"index": <the example's
// index in its split>, "split": "train" or "eval"} plus "prompt" when the
// caller knows it (the streaming reward role reads only the answer and the
// reference from the hub, so its calls have no prompt). It returns a number
// (int, float or bool; any numbers.Real) or a dict whose "score" is one; the
// score must be finite.
//
// Where the function lives: FunctionSpec "package.module:function" imports
// the module as `import` would (the worker's sys.path: the current
// directory, then PYTHONPATH, then the interpreter's own), or
// "path/to/file.py:function" loads that file (a relative path is taken from
// the current directory). The function part may be a dotted attribute path
// ("rewards:Scorer.score").
//
// Workers. The function runs in separate Python processes (`workers` of
// them, the interpreter `executable`), started lazily: a task built in a
// process that never scores starts none. Each scoring call takes a free
// worker (waiting for one when all are busy), sends it one request and waits
// up to `timeout` for the reply. Requests and replies travel as JSON lines
// over a socket of their own (the worker's fd 3); the user's stdout is the
// process's stderr, so a function that prints cannot break the protocol, and
// everything read back is validated (a reply with the wrong id, malformed
// JSON, a line over 1 MiB or bytes after it end the worker).
//
// Errors never fail a Score: the sample gets `error_reward`, one line naming
// the example (split and index) and what went wrong is logged on stderr, and
// Task::score_errors() counts it. What goes wrong:
//   * the function raised (the exception's type, message and the innermost
//     frame are logged); the worker lives on;
//   * it returned something other than a finite number or a dict with one
//     under "score" (None, a string, NaN, inf, a dict without "score": the
//     type and a repr are logged); the worker lives on;
//   * no reply within `timeout`, or the worker died or broke the protocol:
//     the worker is killed (SIGKILL) with its process group (so processes
//     the function started die too), reaped, and replaced at the next call.
// A worker that cannot be started (the interpreter or the module is gone, the
// import fails or hangs past `start_timeout`) is retried on the spot; after
// `max_start_failures` failed starts in a row the scorer gives up for good
// (sticky): every later Score returns error_reward at once, logged.
// A worker also exits when its parent process is gone (it checks twice a
// second), and on the destruction of the task, which kills it (SIGKILL).
//
// Thread safety: the task returned by MakePythonRewardTask is immutable
// except for its pool of workers, which a mutex guards: every method may be
// called concurrently from any number of threads; up to `workers` Score calls
// run at once (its max_parallel_scores(), so callers with many answers score
// them on every worker), further ones wait for a free worker.
#ifndef SLUICE_REWARD_PYTHON_REWARD_H_
#define SLUICE_REWARD_PYTHON_REWARD_H_

#include <chrono>
#include <memory>
#include <string>

#include "sluice/common/status.h"
#include "sluice/reward/task.h"

namespace sluice::reward {

struct PythonRewardOptions {
  std::string function;                      // "package.module:function" or "file.py:function"
  std::string executable = "python3";        // the interpreter; searched on PATH when it has no '/'
  int workers = 2;                           // processes, in [1, 64]
  std::chrono::milliseconds timeout{10000};  // per call, > 0
  double error_reward = 0.0;                 // the reward of a sample whose scoring failed (finite)
  // How long a worker may take to start: exec, import the module, find the
  // function. > 0.
  std::chrono::milliseconds start_timeout{60000};
  // Failed starts in a row before the scorer gives up for good, >= 1.
  int max_start_failures = 3;
};

// The two halves of a FunctionSpec.
struct FunctionSpec {
  std::string module;    // "package.module", or a path ending in ".py"
  std::string function;  // "compute_score" or "Scorer.score"
};

// Splits "module:function" at its last ':'. InvalidArgument, naming the
// spec and the form it should have, when there is no ':', either half is
// empty, the function part is not a dotted Python identifier, or the module
// part is neither a dotted Python identifier nor a path ending in ".py".
Result<FunctionSpec> ParseFunctionSpec(const std::string& spec);

// Checks the options and that the function loads, before anything is built:
// starts one worker (which imports the module and looks the function up),
// then stops it. Errors:
//   InvalidArgument    - a bad spec or option; the module does not import, has
//                        no such attribute, the attribute is not callable, or
//                        its signature cannot take the four keyword arguments
//                        (the message names the module and function and
//                        carries the Python exception)
//   NotFound           - the interpreter does not exist (not on PATH)
//   Timeout            - the worker did not report within start_timeout
//   Unavailable        - the process could not be started or died starting
Status CheckPythonReward(const PythonRewardOptions& options);

// A task with `base`'s examples (name, Get, size, has_solutions forwarded)
// whose Score calls the Python function. Starts no process; checks the
// options only (InvalidArgument), so a missing module shows up as error
// rewards here: call CheckPythonReward first where the config is parsed.
Result<std::unique_ptr<Task>> MakePythonRewardTask(std::unique_ptr<Task> base, const PythonRewardOptions& options);

}  // namespace sluice::reward

#endif  // SLUICE_REWARD_PYTHON_REWARD_H_
