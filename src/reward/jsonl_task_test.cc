#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sluice/common/file_util.h"
#include "sluice/reward/task.h"

namespace sluice::reward {
namespace {

namespace fs = std::filesystem;

class JsonlTaskTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("sluice_jsonl_test_" + std::to_string(::getpid()) + "_" +
                                           testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(dir_)); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  // n lines {"prompt": "q<i>", "answer": "a<i>"}.
  std::string WriteNumbered(const std::string& name, int n) {
    std::string text;
    for (int i = 0; i < n; ++i) {
      text += R"({"prompt": "q)" + std::to_string(i) + R"(", "answer": "a)" + std::to_string(i) + "\"}\n";
    }
    return Write(name, text);
  }

  static TaskOptions Options(const std::string& train, const std::string& eval = "") {
    TaskOptions options;
    options.name = "jsonl";
    options.jsonl.train_path = train;
    options.jsonl.eval_path = eval;
    return options;
  }

  static std::vector<std::string> Prompts(const Task& task, Split split) {
    std::vector<std::string> prompts;
    for (uint64_t i = 0; i < task.size(split); ++i) {
      auto e = task.Get(split, i);
      EXPECT_TRUE(e.ok()) << e.status().ToString();
      if (!e.ok()) break;
      EXPECT_EQ(e->index, i);
      prompts.push_back(e->prompt);
    }
    return prompts;
  }

  // The file's first line is valid; `line` is line 3, after a blank line 2.
  void ExpectBadLine(const std::string& line, const std::string& what) {
    const std::string path = Write("bad.jsonl", "{\"prompt\": \"p\", \"answer\": \"a\"}\n\n" + line + "\n");
    auto task = MakeTask(Options(path));
    ASSERT_FALSE(task.ok()) << line;
    EXPECT_EQ(task.status().code(), StatusCode::kInvalidArgument) << line;
    EXPECT_NE(task.status().message().find(path + ":3: "), std::string::npos) << task.status().ToString();
    EXPECT_NE(task.status().message().find(what), std::string::npos) << task.status().ToString();
  }

  fs::path dir_;
};

TEST_F(JsonlTaskTest, ReadsExamplesAndHoldsOutTheTail) {
  const std::string path = Write("data.jsonl",
                                 "{\"prompt\": \"2+2=\", \"answer\": \"4\", \"solution\": \"2+2=4#4\", \"x\": 1}\n"
                                 "\n   \n"
                                 "{\"prompt\": \"capital of France?\", \"answer\": \"Paris\"}\r\n"
                                 "{\"prompt\": \"q3\", \"answer\": \"a3\"}");
  auto task = MakeTask(Options(path));
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ((*task)->name(), "jsonl");
  EXPECT_TRUE((*task)->has_solutions());
  EXPECT_EQ(Prompts(**task, Split::kTrain), (std::vector<std::string>{"2+2=", "capital of France?"}));
  EXPECT_EQ(Prompts(**task, Split::kEval), std::vector<std::string>{"q3"}) << "at least one example is held out";
  auto first = (*task)->Get(Split::kTrain, 0);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->answer, "4");
  EXPECT_EQ(first->solution, "2+2=4#4");
  EXPECT_EQ((*task)->Score(*first, first->solution), 1.0);
  auto second = (*task)->Get(Split::kTrain, 1);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->solution, "");
  EXPECT_EQ((*task)->Get(Split::kTrain, 2).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*task)->Get(Split::kEval, 1).status().code(), StatusCode::kOutOfRange);
}

TEST_F(JsonlTaskTest, EvalFractionSplitsTheLastLines) {
  const std::string path = WriteNumbered("data.jsonl", 20);
  TaskOptions options = Options(path);
  options.jsonl.eval_fraction = 0.25;
  auto task = MakeTask(options);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ((*task)->size(Split::kTrain), 15u);
  EXPECT_EQ(Prompts(**task, Split::kEval), (std::vector<std::string>{"q15", "q16", "q17", "q18", "q19"}));
  EXPECT_EQ(Prompts(**task, Split::kTrain).back(), "q14");
  EXPECT_FALSE((*task)->has_solutions());

  auto by_default = MakeTask(Options(path));  // 10%
  ASSERT_TRUE(by_default.ok());
  EXPECT_EQ((*by_default)->size(Split::kEval), 2u);
  EXPECT_EQ((*by_default)->size(Split::kTrain), 18u);

  for (double bad : {0.0, 1.0, -0.5}) {
    options.jsonl.eval_fraction = bad;
    auto r = MakeTask(options);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("'jsonl.eval_fraction'"), std::string::npos) << r.status().ToString();
  }
}

TEST_F(JsonlTaskTest, TrainDropsPromptsThatAreHeldOut) {
  // The repeated "q1" appears before the held-out tail: it must not be trained on.
  const std::string path = Write("dup.jsonl",
                                 "{\"prompt\": \"q0\", \"answer\": \"a\"}\n"
                                 "{\"prompt\": \"q1\", \"answer\": \"a\"}\n"
                                 "{\"prompt\": \"q2\", \"answer\": \"a\"}\n"
                                 "{\"prompt\": \"q1\", \"answer\": \"a\"}\n");
  TaskOptions options = Options(path);
  options.jsonl.eval_fraction = 0.25;
  auto task = MakeTask(options);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ(Prompts(**task, Split::kEval), std::vector<std::string>{"q1"});
  EXPECT_EQ(Prompts(**task, Split::kTrain), (std::vector<std::string>{"q0", "q2"}));
}

TEST_F(JsonlTaskTest, SeparateEvalFile) {
  const std::string train = WriteNumbered("train.jsonl", 5);
  const std::string eval =
      Write("eval.jsonl", "{\"prompt\": \"q3\", \"answer\": \"a3\"}\n{\"prompt\": \"new\", \"answer\": \"x\"}\n");
  auto task = MakeTask(Options(train, eval));
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ(Prompts(**task, Split::kTrain), (std::vector<std::string>{"q0", "q1", "q2", "q4"}));
  EXPECT_EQ(Prompts(**task, Split::kEval), (std::vector<std::string>{"q3", "new"}));

  const std::string single = WriteNumbered("single.jsonl", 1);
  EXPECT_TRUE(MakeTask(Options(single, eval)).ok()) << "one example is enough with an eval file";
  auto no_eval = MakeTask(Options(single));
  EXPECT_EQ(no_eval.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_eval.status().message().find("at least 2"), std::string::npos) << no_eval.status().ToString();

  auto all_held_out = MakeTask(Options(single, WriteNumbered("same.jsonl", 1)));
  EXPECT_EQ(all_held_out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(all_held_out.status().message().find("nothing is left to train on"), std::string::npos);
}

TEST_F(JsonlTaskTest, BadLinesNameTheFileAndLineNumber) {
  ExpectBadLine("{\"prompt\": \"p\", \"answer\": ", "malformed JSON");
  ExpectBadLine("not json at all", "malformed JSON");
  ExpectBadLine("[\"p\", \"a\"]", "expected a JSON object, got array");
  ExpectBadLine("\"p\"", "expected a JSON object, got string");
  ExpectBadLine("{\"answer\": \"a\"}", "missing \"prompt\"");
  ExpectBadLine("{\"prompt\": \"p\"}", "missing \"answer\"");
  ExpectBadLine("{\"prompt\": 5, \"answer\": \"a\"}", "\"prompt\" must be a string, got number 5");
  ExpectBadLine("{\"prompt\": \"p\", \"answer\": 4}", "\"answer\" must be a string, got number 4");
  ExpectBadLine("{\"prompt\": \"p\", \"answer\": \"a\", \"solution\": [1]}", "\"solution\" must be a string");
  ExpectBadLine("{\"prompt\": \"\", \"answer\": \"a\"}", "\"prompt\" is empty");
  ExpectBadLine("{\"prompt\": \"p\", \"answer\": \"  \"}", "\"answer\" is empty");
  ExpectBadLine("{\"prompt\": \"p\", \"answer\": \"C#\"}", "contains '#'");
  ExpectBadLine("{\"prompt\": \"p\", \"answer\": \"4\", \"solution\": \"2+2=5#5\"}",
                "\"solution\" ends in the answer '5'");
}

TEST_F(JsonlTaskTest, EmptyDatasetIsAnError) {
  for (const std::string text : {"", "\n\n  \n"}) {
    const std::string path = Write("empty.jsonl", text);
    auto task = MakeTask(Options(path));
    EXPECT_EQ(task.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(task.status().message().find(path + " holds no examples"), std::string::npos) << task.status().ToString();
  }
}

TEST_F(JsonlTaskTest, MissingFilesAreNotFound) {
  const std::string missing = (dir_ / "missing.jsonl").string();
  auto task = MakeTask(Options(missing));
  EXPECT_EQ(task.status().code(), StatusCode::kNotFound);
  EXPECT_NE(task.status().message().find(missing), std::string::npos);
  EXPECT_EQ(MakeTask(Options(WriteNumbered("train.jsonl", 3), missing)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(MakeTask(Options("")).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(JsonlTaskTest, ScoreComparesNormalizedFinalAnswers) {
  auto task = MakeTask(Options(WriteNumbered("train.jsonl", 3)));
  ASSERT_TRUE(task.ok());
  const Example e{0, "Where?", "New  York", "", 0, ""};
  EXPECT_EQ((*task)->Score(e, "new york"), 1.0) << "no marker: the whole response";
  EXPECT_EQ((*task)->Score(e, "  NEW\tYORK \n"), 1.0);
  EXPECT_EQ((*task)->Score(e, "it is # new   york"), 1.0);
  EXPECT_EQ((*task)->Score(e, "new york # boston"), 0.0) << "the last marker counts";
  EXPECT_EQ((*task)->Score(e, "the answer is new york"), 0.0);
  EXPECT_EQ((*task)->Score(e, "newyork"), 0.0);
  EXPECT_EQ((*task)->Score(e, "#"), 0.0);
  EXPECT_EQ((*task)->Score(e, ""), 0.0);
}

// GSM8K and MATH layouts: the final answer comes out of the worked solution,
// the instruction follows the question, and answers compare as math.
TEST_F(JsonlTaskTest, MathTaskReadsGsm8kAndMathLayouts) {
  const std::string path = Write(
      "math.jsonl",
      R"({"question": "Natalia sold 48 clips in April and half as many in May. How many in all?", "answer": "In May she sold 48/2 = <<48/2=24>>24.\nIn all 48+24 = <<48+24=72>>72.\n#### 72"})"
      "\n"
      R"({"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "solution": "Add: $\\frac{2}{4} + \\frac{1}{4} = \\boxed{\\frac{3}{4}}$."})"
      "\n"
      R"({"question": "A shop sells 1,200 pens a day. How many in 2 days?", "answer": "2 x 1,200 = 2,400\n#### 2,400"})"
      "\n"
      R"({"prompt": "2+2?", "answer": "4"})"
      "\n");
  TaskOptions options = Options(path);
  options.name = "math";
  options.jsonl.instruction = "Put the final answer in \\boxed{}.";
  options.jsonl.eval_fraction = 0.25;
  auto task = MakeTask(options);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ((*task)->name(), "math");
  EXPECT_TRUE((*task)->has_solutions());
  auto gsm = (*task)->Get(Split::kTrain, 0);
  ASSERT_TRUE(gsm.ok());
  EXPECT_EQ(gsm->answer, "72");
  EXPECT_EQ(gsm->prompt.substr(gsm->prompt.size() - 34), "\nPut the final answer in \\boxed{}.");
  auto math = (*task)->Get(Split::kTrain, 1);
  ASSERT_TRUE(math.ok());
  EXPECT_EQ(math->answer, "\\frac{3}{4}");
  const Task& t = **task;
  EXPECT_EQ(t.Score(*gsm, "48/2 = 24, so 48 + 24 = 72.\n#### 72"), 1.0);
  EXPECT_EQ(t.Score(*gsm, "The answer is \\boxed{72}."), 1.0);
  EXPECT_EQ(t.Score(*gsm, "so she sold $72$ clips"), 1.0);  // the last number
  EXPECT_EQ(t.Score(*gsm, "\\boxed{72.0}"), 1.0);
  EXPECT_EQ(t.Score(*gsm, "\\boxed{71}"), 0.0);
  EXPECT_EQ(t.Score(*gsm, "no idea"), 0.0);
  EXPECT_EQ(t.Score(*math, "\\boxed{\\dfrac{3}{4}}"), 1.0);
  EXPECT_EQ(t.Score(*math, "\\boxed{0.75}"), 1.0);
  EXPECT_EQ(t.Score(*math, "\\boxed{3/4}"), 1.0);
  EXPECT_EQ(t.Score(*math, "\\boxed{\\frac{3}{5}}"), 0.0);
  auto pens = (*task)->Get(Split::kTrain, 2);
  ASSERT_TRUE(pens.ok());
  EXPECT_EQ(t.Score(*pens, "\\boxed{2400 \\text{ pens}}"), 1.0);
  EXPECT_EQ(t.Score(*pens, "#### 2,400"), 1.0);
}

TEST_F(JsonlTaskTest, MathTaskBadLinesAreNamed) {
  auto bad = [&](const std::string& line, const std::string& what) {
    const std::string path = Write("bad.jsonl", R"({"prompt": "p", "answer": "1"})"
                                                "\n" +
                                                    line + "\n");
    TaskOptions options = Options(path);
    options.name = "math";
    auto task = MakeTask(options);
    ASSERT_FALSE(task.ok()) << line;
    EXPECT_EQ(task.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(task.status().message().find(path + ":2: " + what), std::string::npos) << task.status().ToString();
  };
  bad(R"({"question": "q", "answer": "no final line"})", "GSM8K \"answer\" has no '#### <final answer>'");
  bad(R"({"question": "q", "answer": "####   "})", "the final answer is empty");
  bad(R"({"problem": "q", "solution": "it is 4"})", "MATH \"solution\" has no \\boxed{<final answer>}");
  bad(R"({"problem": "q"})", "missing \"solution\"");
  bad(R"({"question": "", "answer": "#### 3"})", "the question is empty");
  bad(R"({"prompt": "p", "answer": "4", "solution": "\\boxed{5}"})",
      "the solution's final answer '5' is not the answer '4'");
  bad(R"({"question": 7, "answer": "#### 3"})", "\"question\" must be a string");
}

}  // namespace
}  // namespace sluice::reward
