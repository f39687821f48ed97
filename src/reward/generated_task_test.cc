// Tests of the generated tasks (arithmetic, sort) through the public API.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sluice/reward/task.h"

namespace sluice::reward {
namespace {

std::unique_ptr<Task> Make(const TaskOptions& options) {
  auto task = MakeTask(options);
  EXPECT_TRUE(task.ok()) << task.status().ToString();
  return task.ok() ? std::move(task).value() : nullptr;
}

TaskOptions Arithmetic(uint64_t seed = 1) {
  TaskOptions options;
  options.name = "arithmetic";
  options.seed = seed;
  return options;
}

TaskOptions Sort(uint64_t seed = 1) {
  TaskOptions options = Arithmetic(seed);
  options.name = "sort";
  return options;
}

Example GetOk(const Task& task, Split split, uint64_t index) {
  auto example = task.Get(split, index);
  EXPECT_TRUE(example.ok()) << example.status().ToString();
  return example.ok() ? *example : Example{};
}

int CountOps(const std::string& prompt) {
  return static_cast<int>(std::count_if(prompt.begin(), prompt.end(), [](char c) { return c == '+' || c == '-'; }));
}

void ExpectContains(const Status& status, StatusCode code, const std::string& text) {
  EXPECT_EQ(status.code(), code) << status.ToString();
  EXPECT_NE(status.message().find(text), std::string::npos) << status.ToString();
}

TEST(GeneratedTaskTest, SizesAndOutOfRange) {
  TaskOptions options = Arithmetic();
  options.train_size = 50;
  options.eval_size = 7;
  auto task = Make(options);
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->name(), "arithmetic");
  EXPECT_TRUE(task->has_solutions());
  EXPECT_EQ(task->size(Split::kTrain), 50u);
  EXPECT_EQ(task->size(Split::kEval), 7u);
  EXPECT_EQ(GetOk(*task, Split::kTrain, 49).index, 49u);
  EXPECT_EQ(GetOk(*task, Split::kEval, 6).index, 6u);
  ExpectContains(task->Get(Split::kTrain, 50).status(), StatusCode::kOutOfRange, "train index 50");
  ExpectContains(task->Get(Split::kEval, 7).status(), StatusCode::kOutOfRange, "eval index 7");
}

TEST(GeneratedTaskTest, GetIsDeterministicInSeedSplitAndIndex) {
  for (const char* name : {"arithmetic", "sort"}) {
    TaskOptions options = Arithmetic(42);
    options.name = name;
    auto a = Make(options);
    auto b = Make(options);
    options.seed = 43;
    auto other = Make(options);
    ASSERT_TRUE(a && b && other);
    int differing = 0;
    for (uint64_t i = 0; i < 200; ++i) {
      for (Split split : {Split::kTrain, Split::kEval}) {
        Example x = GetOk(*a, split, i), y = GetOk(*b, split, i);
        EXPECT_EQ(x.prompt, y.prompt);
        EXPECT_EQ(x.answer, y.answer);
        EXPECT_EQ(x.solution, y.solution);
        EXPECT_EQ(x.prompt, GetOk(*a, split, i).prompt) << "repeated Get";
        differing += x.prompt != GetOk(*other, split, i).prompt;
      }
    }
    EXPECT_GT(differing, 200) << name << ": another seed gives another dataset";
  }
}

TEST(GeneratedTaskTest, ConcurrentGetsMatchSequentialOnes) {
  auto task = Make(Arithmetic(9));
  ASSERT_NE(task, nullptr);
  std::vector<std::string> expected;
  for (uint64_t i = 0; i < 2000; ++i) expected.push_back(GetOk(*task, Split::kTrain, i).solution);
  std::vector<int> mismatches(4, 0);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (uint64_t i = 0; i < expected.size(); ++i) {
          auto e = task->Get(Split::kTrain, (i * 7 + t) % expected.size());
          if (!e.ok() || e->solution != expected[(i * 7 + t) % expected.size()]) ++mismatches[t];
        }
      });
    }
  }
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(GeneratedTaskTest, TrainNeverContainsAnEvalPrompt) {
  for (const char* name : {"arithmetic", "sort"}) {
    TaskOptions options = Arithmetic(7);
    options.name = name;
    auto task = Make(options);
    ASSERT_NE(task, nullptr);
    std::set<std::string> eval;
    for (uint64_t i = 0; i < task->size(Split::kEval); ++i) eval.insert(GetOk(*task, Split::kEval, i).prompt);
    for (uint64_t i = 0; i < 20000; ++i) {
      ASSERT_EQ(eval.count(GetOk(*task, Split::kTrain, i).prompt), 0u) << name << " train " << i;
    }
  }
}

// A problem space of 10 prompts ("sort:0=" .. "sort:9="): eval and train
// partition it, and train covers everything that is not held out.
TEST(GeneratedTaskTest, SplitsPartitionATinySpace) {
  TaskOptions options = Sort(3);
  options.sort.min_length = options.sort.max_length = 1;
  options.eval_size = 50;
  options.eval_fraction = 0.3;
  auto task = Make(options);
  ASSERT_NE(task, nullptr);
  std::set<std::string> eval, train;
  for (uint64_t i = 0; i < 50; ++i) eval.insert(GetOk(*task, Split::kEval, i).prompt);
  for (uint64_t i = 0; i < 2000; ++i) train.insert(GetOk(*task, Split::kTrain, i).prompt);
  EXPECT_GE(eval.size(), 1u);
  EXPECT_GE(train.size(), 5u);
  EXPECT_EQ(eval.size() + train.size(), 10u) << "train covers everything not held out";
  for (const std::string& prompt : train) EXPECT_EQ(eval.count(prompt), 0u) << prompt;
}

// However large the eval split, every shape keeps most of its prompts for
// training: the ~126 one-operation arithmetic prompts are not all held out.
TEST(GeneratedTaskTest, ALargeEvalSplitDoesNotStarveAShape) {
  TaskOptions options = Arithmetic(11);
  options.eval_size = 2000;
  auto task = Make(options);
  ASSERT_NE(task, nullptr);
  std::set<std::string> eval_one_op, train_one_op;
  int64_t train_one_op_draws = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    Example e = GetOk(*task, Split::kEval, i);
    if (e.difficulty == 1) eval_one_op.insert(e.prompt);
  }
  for (uint64_t i = 0; i < 20000; ++i) {
    Example e = GetOk(*task, Split::kTrain, i);
    if (e.difficulty != 1) continue;
    ++train_one_op_draws;
    train_one_op.insert(e.prompt);
  }
  EXPECT_GT(train_one_op.size(), 3 * eval_one_op.size())
      << "train " << train_one_op.size() << " eval " << eval_one_op.size();
  // The shape distribution of train is unchanged by the split (P(1 op) is the largest).
  EXPECT_GT(train_one_op_draws, 20000 / 4);
  for (const std::string& p : eval_one_op) EXPECT_EQ(train_one_op.count(p), 0u) << p;
}

TEST(GeneratedTaskTest, AnEmptyHeldOutSpaceIsAFailedPrecondition) {
  TaskOptions options = Sort(5);
  options.sort.min_length = options.sort.max_length = 1;  // 10 prompts
  options.eval_fraction = 1e-6;                           // none of them held out
  auto task = MakeTask(options);
  ExpectContains(task.status(), StatusCode::kFailedPrecondition, "eval_fraction");
}

TEST(GeneratedTaskTest, EvalFractionIsValidated) {
  TaskOptions options = Sort(5);
  options.eval_fraction = 0.9;
  ExpectContains(MakeTask(options).status(), StatusCode::kInvalidArgument, "eval_fraction");
}

TEST(ArithmeticTaskTest, SolutionsFollowTheScratchpadFormatAndScoreOne) {
  auto task = Make(Arithmetic(11));
  ASSERT_NE(task, nullptr);
  for (Split split : {Split::kTrain, Split::kEval}) {
    for (uint64_t i = 0; i < std::min<uint64_t>(task->size(split), 2000); ++i) {
      Example e = GetOk(*task, split, i);
      ASSERT_EQ(task->Score(e, e.solution), 1.0) << e.prompt << " " << e.solution;
      const std::string off_by_one = std::to_string(std::stoi(e.answer) + 1);
      EXPECT_EQ(task->Score(e, e.solution.substr(0, e.solution.find('#') + 1) + off_by_one), 0.0) << e.solution;
      EXPECT_EQ(task->Score(e, e.answer), 0.0) << "the bare answer has no marker";
      // Replay the prompt "a+b-c=" and check each "x<op>y=z" step of the
      // solution "x+y=z,...#answer" against it.
      ASSERT_EQ(e.prompt.back(), '=');
      std::istringstream prompt(e.prompt.substr(0, e.prompt.size() - 1));
      int64_t value = 0;
      prompt >> value;
      ASSERT_GE(value, 1);
      ASSERT_LE(value, 9);
      const std::string steps = e.solution.substr(0, e.solution.find('#'));
      std::istringstream solution(steps);
      std::string step;
      int count = 0;
      char op;
      int64_t operand;
      while (prompt >> op >> operand) {
        ASSERT_TRUE(std::getline(solution, step, ',')) << e.solution;
        const int64_t next = op == '+' ? value + operand : value - operand;
        EXPECT_EQ(step, std::to_string(value) + op + std::to_string(operand) + "=" + std::to_string(next));
        EXPECT_GE(operand, 1);
        EXPECT_LE(operand, 9);
        EXPECT_GE(next, 0) << e.prompt;
        EXPECT_LE(next, 99) << e.prompt;
        value = next;
        ++count;
      }
      EXPECT_FALSE(std::getline(solution, step, ',')) << "extra steps in " << e.solution;
      EXPECT_EQ(count, CountOps(e.prompt));
      EXPECT_EQ(e.answer, std::to_string(value));
      EXPECT_EQ(e.solution, steps + "#" + e.answer);
    }
  }
}

TEST(ArithmeticTaskTest, ReduceScratchpadRewritesTheRemainingExpression) {
  TaskOptions options;
  options.name = "arithmetic";
  options.seed = 5;
  options.arithmetic.scratchpad = "reduce";
  auto task = std::move(MakeTask(options)).value();
  int multi = 0;
  for (uint64_t i = 0; i < 300; ++i) {
    Example e = std::move(task->Get(Split::kTrain, i)).value();
    ASSERT_EQ(task->Score(e, e.solution), 1.0) << e.solution;
    // Every '='-separated stage, evaluated left to right, equals the answer;
    // the last stage is the answer itself and each stage has one term fewer.
    const std::string work = e.solution.substr(0, e.solution.find('#'));
    std::vector<std::string> stages;
    std::istringstream in(work);
    for (std::string stage; std::getline(in, stage, '=');) stages.push_back(stage);
    const size_t ops = std::count_if(e.prompt.begin(), e.prompt.end(), [](char c) { return c == '+' || c == '-'; });
    ASSERT_EQ(stages.size(), ops) << e.prompt << " -> " << e.solution;
    EXPECT_EQ(stages.back(), e.answer);
    for (const std::string& stage : stages) {
      long long total = 0, term = 0;
      char op = '+';
      for (size_t j = 0; j <= stage.size(); ++j) {
        if (j == stage.size() || stage[j] == '+' || stage[j] == '-') {
          total += op == '+' ? term : -term;
          if (j < stage.size()) op = stage[j];
          term = 0;
        } else {
          term = term * 10 + (stage[j] - '0');
        }
      }
      EXPECT_EQ(std::to_string(total), e.answer) << stage << " in " << e.solution;
    }
    multi += ops > 1;
  }
  EXPECT_GT(multi, 50);
  options.arithmetic.scratchpad = "tree";
  auto bad = MakeTask(options);
  EXPECT_NE(bad.status().message().find("arithmetic.scratchpad"), std::string::npos);
}

TEST(ArithmeticTaskTest, ResponseLengthIsLongTailed) {
  auto task = Make(Arithmetic(13));
  ASSERT_NE(task, nullptr);
  std::vector<size_t> lengths;
  std::map<int, int> ops;
  for (uint64_t i = 0; i < 2000; ++i) {
    Example e = GetOk(*task, Split::kTrain, i);
    lengths.push_back(e.solution.size());
    ++ops[CountOps(e.prompt)];
  }
  std::sort(lengths.begin(), lengths.end());
  const double median = static_cast<double>(lengths[lengths.size() / 2]);
  const double max = static_cast<double>(lengths.back());
  EXPECT_GE(max / median, 8.0) << "median " << median << " max " << max;
  EXPECT_LE(max / median, 16.0) << "median " << median << " max " << max;
  EXPECT_GT(ops[1], 1000) << "most problems are one step";
  EXPECT_GT(ops[1] + ops[2] + ops[3], 1700) << "nearly all have at most three";
  EXPECT_GT(ops[10], 0) << "a few reach max_ops";
  EXPECT_EQ(ops.rbegin()->first, 10) << "none exceed max_ops";
}

TEST(ArithmeticTaskTest, MaxOpsBoundsTheProblems) {
  TaskOptions options = Arithmetic();
  options.arithmetic.max_ops = 3;
  options.arithmetic.ops_exponent = 0;  // uniform over 1..3
  auto task = Make(options);
  ASSERT_NE(task, nullptr);
  std::map<int, int> ops;
  for (uint64_t i = 0; i < 600; ++i) ++ops[CountOps(GetOk(*task, Split::kTrain, i).prompt)];
  ASSERT_EQ(ops.size(), 3u);
  for (auto [k, n] : ops) EXPECT_GT(n, 120) << k << " ops";
}

TEST(ArithmeticTaskTest, OnlyAnExactFinalAnswerScores) {
  auto task = Make(Arithmetic());
  ASSERT_NE(task, nullptr);
  Example e{0, "7+3-5+2=", "7", "7+3=10,10-5=5,5+2=7#7", 0, ""};
  EXPECT_EQ(task->Score(e, "7+3=10,10-5=5,5+2=7#7"), 1.0);
  EXPECT_EQ(task->Score(e, "#7"), 1.0) << "the scratchpad is not checked";
  EXPECT_EQ(task->Score(e, "1+1=5#7\n"), 1.0) << "surrounding whitespace is trimmed";
  EXPECT_EQ(task->Score(e, "#8#7"), 1.0) << "the last marker counts";
  EXPECT_EQ(task->Score(e, "#7#8"), 0.0);
  EXPECT_EQ(task->Score(e, "7+3=10,10-5=5,5+2=7#8"), 0.0);
  EXPECT_EQ(task->Score(e, "7"), 0.0) << "no marker";
  EXPECT_EQ(task->Score(e, "#07"), 0.0);
  EXPECT_EQ(task->Score(e, "#7 7"), 0.0);
  EXPECT_EQ(task->Score(e, "#"), 0.0);
  EXPECT_EQ(task->Score(e, ""), 0.0);
  EXPECT_EQ(task->Score(e, std::string("\x01\xff#\x7f", 4)), 0.0);
}

TEST(ArithmeticTaskTest, OptionsAreValidatedByName) {
  auto expect_bad = [](TaskOptions options, const std::string& key) {
    ExpectContains(MakeTask(options).status(), StatusCode::kInvalidArgument, "'" + key + "'");
  };
  TaskOptions o = Arithmetic();
  o.arithmetic.max_ops = 0;
  expect_bad(o, "arithmetic.max_ops");
  o = Arithmetic();
  o.arithmetic.max_operand = 0;
  expect_bad(o, "arithmetic.max_operand");
  o = Arithmetic();
  o.arithmetic.max_total = 10;  // operands up to 9 need totals up to 17
  expect_bad(o, "arithmetic.max_total");
  o = Arithmetic();
  o.arithmetic.ops_exponent = -1;
  expect_bad(o, "arithmetic.ops_exponent");
  o = Arithmetic();
  o.train_size = 0;
  expect_bad(o, "train_size");
  o = Arithmetic();
  o.eval_size = 2000000;
  expect_bad(o, "eval_size");
  o = Sort();
  o.sort.min_length = 0;
  expect_bad(o, "sort.min_length");
  o = Sort();
  o.sort.max_length = 1;
  expect_bad(o, "sort.max_length");
}

TEST(SortTaskTest, SolutionsSortThePromptAndScoreOne) {
  auto task = Make(Sort(17));
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->name(), "sort");
  std::set<size_t> lengths;
  for (uint64_t n = 0; n < 2000 + task->size(Split::kEval); ++n) {
    Example e = n < 2000 ? GetOk(*task, Split::kTrain, n) : GetOk(*task, Split::kEval, n - 2000);
    ASSERT_EQ(e.prompt.rfind("sort:", 0), 0u) << e.prompt;
    ASSERT_EQ(e.prompt.back(), '=');
    std::string digits = e.prompt.substr(5, e.prompt.size() - 6);
    ASSERT_TRUE(std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) << e.prompt;
    std::sort(digits.begin(), digits.end());
    EXPECT_EQ(e.answer, digits);
    EXPECT_EQ(e.solution, digits + "#" + digits);
    EXPECT_EQ(task->Score(e, e.solution), 1.0);
    lengths.insert(digits.size());
  }
  EXPECT_EQ(lengths, (std::set<size_t>{2, 3, 4, 5, 6, 7, 8}));
}

TEST(SortTaskTest, WrongOrderOrMissingMarkerScoresZero) {
  auto task = Make(Sort());
  ASSERT_NE(task, nullptr);
  Example e{0, "sort:5281=", "1258", "1258#1258", 0, ""};
  EXPECT_EQ(task->Score(e, "1258#1258"), 1.0);
  EXPECT_EQ(task->Score(e, "#1258"), 1.0);
  EXPECT_EQ(task->Score(e, "#8521"), 0.0);
  EXPECT_EQ(task->Score(e, "#125"), 0.0);
  EXPECT_EQ(task->Score(e, "1258"), 0.0);
  EXPECT_EQ(task->Score(e, "#1 2 5 8"), 0.0);
}

}  // namespace
}  // namespace sluice::reward
