#include <gtest/gtest.h>

#include <string>

#include "sluice/reward/task.h"

namespace sluice::reward {
namespace {

TEST(ExtractFinalAnswerTest, TakesTheTrimmedTextAfterTheLastMarker) {
  EXPECT_EQ(ExtractFinalAnswer("7+3=10#10"), "10");
  EXPECT_EQ(ExtractFinalAnswer("a#b#  c d \n"), "c d");
  EXPECT_EQ(ExtractFinalAnswer("work#"), "");
  EXPECT_EQ(ExtractFinalAnswer("#"), "");
  EXPECT_EQ(ExtractFinalAnswer(""), "");
}

TEST(ExtractFinalAnswerTest, WithoutAMarkerReturnsTheWholeResponseTrimmed) {
  EXPECT_EQ(ExtractFinalAnswer("  Paris\t"), "Paris");
  EXPECT_EQ(ExtractFinalAnswer("1 2 3"), "1 2 3");
}

TEST(NormalizeAnswerTest, TrimsCollapsesWhitespaceAndLowercases) {
  EXPECT_EQ(NormalizeAnswer("  New \t\n  YORK  "), "new york");
  EXPECT_EQ(NormalizeAnswer("ABC-12"), "abc-12");
  EXPECT_EQ(NormalizeAnswer(" \t "), "");
  EXPECT_EQ(NormalizeAnswer("a  b   c"), "a b c");
}

TEST(SplitNameTest, NamesBothSplits) {
  EXPECT_EQ(SplitName(Split::kTrain), "train");
  EXPECT_EQ(SplitName(Split::kEval), "eval");
}

TEST(MakeTaskTest, UnknownNameListsTheTasks) {
  TaskOptions options;
  options.name = "calculus";
  auto task = MakeTask(options);
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(task.status().message().find("'calculus'"), std::string::npos);
  EXPECT_NE(task.status().message().find("arithmetic, sort, jsonl"), std::string::npos);
}

TEST(MathAnswerTest, ExtractsBoxedThenHashesThenTheLastNumber) {
  EXPECT_EQ(ExtractMathAnswer("so \\boxed{1} then \\boxed{\\frac{1}{2}} done"), "\\frac{1}{2}");
  EXPECT_EQ(ExtractMathAnswer("\\boxed{x^{2}+1}"), "x^{2}+1");
  EXPECT_EQ(ExtractMathAnswer("work\n#### 1,234"), "1,234");
  EXPECT_EQ(ExtractMathAnswer("a # 7"), "7");
  EXPECT_EQ(ExtractMathAnswer("it costs $-3.50 in total."), "-3.50");
  EXPECT_EQ(ExtractMathAnswer("\\boxed{unclosed"), "");  // a box never closed holds no answer
  EXPECT_EQ(ExtractMathAnswer("nothing here"), "");
}

TEST(MathAnswerTest, NormalizesNotationAndComparesNumbers) {
  EXPECT_EQ(NormalizeMathAnswer(" $1,234$ "), "1234");
  EXPECT_EQ(NormalizeMathAnswer("\\dfrac{3}{4}"), "3/4");
  EXPECT_EQ(NormalizeMathAnswer("90^\\circ"), "90");
  EXPECT_EQ(NormalizeMathAnswer("50\\%"), "50");
  EXPECT_EQ(NormalizeMathAnswer("12 \\text{ cm}"), "12");
  EXPECT_EQ(NormalizeMathAnswer("\\left( 1, 2 \\right)"), "(1,2)");
  EXPECT_TRUE(MathAnswersMatch("0.5", "\\frac{1}{2}"));
  EXPECT_TRUE(MathAnswersMatch("-\\frac{1}{2}", "-0.5"));
  EXPECT_TRUE(MathAnswersMatch("18.00", "18"));
  EXPECT_TRUE(MathAnswersMatch("(1,2)", "\\left(1, 2\\right)"));
  EXPECT_FALSE(MathAnswersMatch("(1,3)", "(1,2)"));
  EXPECT_FALSE(MathAnswersMatch("", "0"));
  EXPECT_FALSE(MathAnswersMatch("1/0", "1/0.0"));  // no division by zero: compared as text, and they differ
}

}  // namespace
}  // namespace sluice::reward
