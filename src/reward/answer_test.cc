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

}  // namespace
}  // namespace sluice::reward
