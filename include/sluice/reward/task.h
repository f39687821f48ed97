// Verifiable RL tasks for a byte-level language model.
//
// A Task hands out examples (prompt, reference answer, optionally a full
// worked solution) and scores a model's response against one. Prompts and
// responses are short ASCII strings; the model's vocabulary is bytes.
//
// Response format shared by every task: free-form working, then the answer
// marker '#', then the final answer, e.g. "7+3=10,10-5=5#5". Only the text
// after the LAST '#' is scored (see ExtractFinalAnswer); the working before it
// is never checked, so a model is rewarded for the result, not the route.
//
// Tasks (chosen by TaskOptions::name, built by MakeTask):
//
//  "arithmetic"  Multi-step addition and subtraction with a scratchpad.
//      prompt    "7+3-5+2="
//      solution  "7+3=10,10-5=5,5+2=7#7"   (one "a<op>b=c" step per
//                operation, steps separated by ',', then '#' and the result)
//      answer    "7"
//    The number of operations k is drawn from P(k) ∝ k^-ops_exponent over
//    [1, max_ops], so most problems are short (k = 1 about 65% of the time
//    with the defaults, k <= 3 about 88%) and a few are long: the solution
//    length has a tail around 8-10x its median. Operands are drawn uniformly
//    from [1, max_operand]; each operator is '+' or '-' with equal odds, but
//    a '-' that would take the running total below 0 becomes '+', and a '+'
//    that would take it above max_total becomes '-', so every intermediate
//    value lies in [0, max_total].
//    With scratchpad "reduce" the solution is "10-5+2=5+2=7#7" instead (the
//    remaining expression after each operation).
//    Score: 1.0 iff the response contains '#' and the trimmed text after the
//    last '#' equals the answer exactly (so "...#7\n" scores 1.0 for answer
//    "7" but "...#07" scores 0.0); otherwise 0.0.
//
//  "sort"  Sort a list of decimal digits ascending (duplicates kept).
//      prompt    "sort:5281="
//      solution  "1258#1258"   (the sorted digits, then '#' and the answer;
//                the copy before '#' is the working a model may write)
//      answer    "1258"
//    The length is uniform in [min_length, max_length]; digits uniform 0-9.
//    Score: as for arithmetic.
//
//  "jsonl"  Examples read from a JSON Lines file, one object per line:
//      {"prompt": "...", "answer": "...", "solution": "..."}
//    "prompt" (non-empty string) and "answer" (string) are required,
//    "solution" (string) is optional, other fields are ignored, blank lines
//    are skipped. An answer may not contain '#' (it could never be matched),
//    and a solution, when given, must itself score 1.0 for its answer.
//    The eval split is a separate file when eval_path is set, otherwise the
//    last eval_fraction of the train file's examples (at least one). Sizes
//    come from the files; TaskOptions::train_size / eval_size are ignored.
//    Score: 1.0 iff NormalizeAnswer(ExtractFinalAnswer(response)) equals
//    NormalizeAnswer(answer); unlike the generated tasks a response without
//    '#' is compared whole.
//
// Held-out evaluation: no train example ever has the prompt of an eval
// example. Generated tasks split the problem space itself: a prompt is
// held out iff a hash of (prompt, seed) falls below eval_fraction, so every
// shape (number of operations / list length) keeps about 1 - eval_fraction
// of its prompts for training however large eval_size is. Examples of both
// splits are drawn i.i.d. (shape first, duplicates possible) and a candidate
// on the wrong side of the split is redrawn: first with the same shape, so
// the shape distribution is unchanged, then with fresh shapes. JSONL tasks
// drop train lines whose prompt appears in the eval split.
//
// Determinism: Get(split, index) depends only on (options, split, index); the
// generators use their own counter-based PRNG, not <random> distributions, so
// results do not depend on the standard library.
//
// Thread safety: a Task is immutable after MakeTask; every method is const
// and may be called concurrently from any number of threads.
#ifndef SLUICE_REWARD_TASK_H_
#define SLUICE_REWARD_TASK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/common/status.h"

namespace sluice::reward {

// Separates a response's working from its final answer.
inline constexpr char kAnswerMarker = '#';

enum class Split { kTrain, kEval };

// "train" or "eval".
std::string_view SplitName(Split split);

struct Example {
  uint64_t index = 0;           // position in its split
  std::string prompt;           // what the model is conditioned on
  std::string answer;           // the reference final answer (no marker)
  std::string solution;         // a full correct response, for supervised warm start; empty if none
  int difficulty = 0;           // generator shape (arithmetic: operations; sort: items); 0 if unknown
  std::string source;           // where it was read, for messages ("train.jsonl:19"); empty if generated
  Split split = Split::kTrain;  // the split it belongs to
};

class Task {
 public:
  virtual ~Task() = default;

  // The task's registry name ("arithmetic", "sort", "jsonl").
  virtual std::string name() const = 0;

  // Example `index` of `split`. Deterministic in (options, split, index).
  // Errors: OutOfRange if index >= size(split); FailedPrecondition if a
  // generated task cannot find a train prompt outside the eval split (the
  // problem space is too small for eval_size).
  virtual Result<Example> Get(Split split, uint64_t index) const = 0;

  // Number of examples in the split.
  virtual uint64_t size(Split split) const = 0;

  // 1.0 if `response` is correct for `example`, 0.0 otherwise. Never fails:
  // any response, however malformed, gets a score.
  virtual double Score(const Example& example, std::string_view response) const = 0;

  // True when examples carry a `solution` (jsonl: when at least one train
  // example does; the others have an empty solution).
  virtual bool has_solutions() const = 0;

  // How many Score calls so far returned an error reward because the scorer
  // itself failed (a Python reward that raised, timed out or returned a
  // non-number: python_reward.h); 0 for the built-in tasks, whose scoring
  // cannot fail.
  virtual uint64_t score_errors() const { return 0; }

  // How many Score calls are worth running at once: callers with many
  // answers to score run up to this many concurrently. 1 for the built-in
  // tasks (their scoring is cheap); reward.python: its workers.
  virtual int max_parallel_scores() const { return 1; }
};

struct ArithmeticOptions {
  int max_ops = 10;           // operations per problem, in [1, 64]
  int max_operand = 9;        // operands are drawn from [1, max_operand], in [1, 999]
  int max_total = 99;         // running totals stay in [0, max_total]; needs >= 2*max_operand - 1
  double ops_exponent = 2.0;  // P(k ops) ∝ k^-ops_exponent; in [0, 10], larger = shorter problems
  // Scratchpad style: "steps" writes one "a<op>b=c" per operation
  // ("7+3=10,10-5=5,5+2=7#7"); "reduce" rewrites the remaining expression
  // after each operation ("10-5+2=5+2=7#7"), so every step reads its operands
  // right next to where it writes, at the cost of responses that grow
  // quadratically with the number of operations (a longer tail).
  std::string scratchpad = "steps";
};

struct SortOptions {
  int min_length = 2;  // digits per list, in [1, 64]
  int max_length = 8;  // in [min_length, 64]
};

struct JsonlOptions {
  std::string train_path;      // required
  std::string eval_path;       // empty: hold out the tail of train_path
  double eval_fraction = 0.1;  // share of train_path held out when eval_path is empty, in (0, 1)
  // The "math" task: the same files, also in the GSM8K layout ({"question",
  // "answer": "... #### 72"}) or the MATH layout ({"problem", "solution":
  // "... \boxed{72} ..."}); answers compared by MathAnswersMatch; each
  // prompt followed by a line with `instruction` when it is not empty.
  bool math = false;
  std::string instruction;
};

struct TaskOptions {
  std::string name;              // "arithmetic", "sort" or "jsonl"
  uint64_t seed = 0;             // generated tasks: the whole dataset is a function of the seed
  uint64_t train_size = 100000;  // generated tasks: examples in the train split, >= 1
  uint64_t eval_size = 200;      // generated tasks: examples in the eval split, <= 1000000
  double eval_fraction = 0.1;    // generated tasks: share of the problem space held out, in (0, 0.5]
  ArithmeticOptions arithmetic;
  SortOptions sort;
  JsonlOptions jsonl;
};

// Builds the task named by options.name. Errors: InvalidArgument for an
// unknown name or an option out of range (the message names the option, e.g.
// "arithmetic.max_ops"); for jsonl, NotFound for a missing file and
// InvalidArgument for malformed content, naming the file and line number.
Result<std::unique_ptr<Task>> MakeTask(const TaskOptions& options);

// The text after the last kAnswerMarker with surrounding ASCII whitespace
// removed, or the whole response (trimmed) when there is no marker.
std::string ExtractFinalAnswer(std::string_view response);

// The final answer of a math response: the contents of its last \boxed{...}
// (braces balanced), else the text after its last "####" (GSM8K), else after
// its last '#', else its last number; "" when it has none of these.
std::string ExtractMathAnswer(std::string_view response);

// Canonical form of a math answer: $ signs, \left / \right, spacing
// commands, \text{...} units, degree signs, '%' and a trailing period
// removed; \dfrac and \tfrac read as \frac; commas between digits
// (thousands) removed; whitespace removed; ASCII letters lowercased.
std::string NormalizeMathAnswer(std::string_view answer);

// Whether two math answers agree: equal canonical forms, or both numbers
// (integers, decimals, a/b or \frac{a}{b}, with a sign) within 1e-6 relative.
bool MathAnswersMatch(std::string_view response_answer, std::string_view reference);

// Canonical form for comparing free-text answers: surrounding whitespace
// removed, each internal run of whitespace collapsed to one space, ASCII
// letters lowercased.
std::string NormalizeAnswer(std::string_view answer);

}  // namespace sluice::reward

#endif  // SLUICE_REWARD_TASK_H_
