#include "sluice/common/logging.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

TEST(ParseLogLevelTest, AcceptsNamesInAnyCase) {
  struct Case {
    const char* text;
    LogLevel level;
  };
  for (const Case& c :
       {Case{"debug", LogLevel::kDEBUG}, Case{"INFO", LogLevel::kINFO}, Case{"Warning", LogLevel::kWARNING},
        Case{"warn", LogLevel::kWARNING}, Case{"ERROR", LogLevel::kERROR}}) {
    SCOPED_TRACE(c.text);
    LogLevel level = c.level == LogLevel::kDEBUG ? LogLevel::kERROR : LogLevel::kDEBUG;
    EXPECT_TRUE(ParseLogLevel(c.text, &level));
    EXPECT_EQ(level, c.level);
  }
}

TEST(ParseLogLevelTest, RejectsUnknownAndLeavesOutputUntouched) {
  for (const char* text : {"", "verbose", "infoo", " info", "3"}) {
    SCOPED_TRACE(text);
    LogLevel level = LogLevel::kWARNING;
    EXPECT_FALSE(ParseLogLevel(text, &level));
    EXPECT_EQ(level, LogLevel::kWARNING);
  }
}

// Restores the process-wide threshold after each test.
class LoggingTest : public testing::Test {
 protected:
  void SetUp() override { saved_ = GetLogLevel(); }
  void TearDown() override { SetLogLevel(saved_); }

 private:
  LogLevel saved_ = LogLevel::kINFO;
};

TEST_F(LoggingTest, SetLogLevelIsVisibleThroughGetLogLevel) {
  SetLogLevel(LogLevel::kERROR);
  EXPECT_EQ(GetLogLevel(), LogLevel::kERROR);
  SetLogLevel(LogLevel::kDEBUG);
  EXPECT_EQ(GetLogLevel(), LogLevel::kDEBUG);
}

TEST_F(LoggingTest, MessagesBelowThresholdAreDropped) {
  SetLogLevel(LogLevel::kWARNING);
  testing::internal::CaptureStderr();
  SLUICE_LOG(DEBUG) << "debug-line";
  SLUICE_LOG(INFO) << "info-line";
  SLUICE_LOG(WARNING) << "warning-line";
  SLUICE_LOG(ERROR) << "error-line";
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("debug-line"), std::string::npos) << err;
  EXPECT_EQ(err.find("info-line"), std::string::npos) << err;
  EXPECT_NE(err.find("warning-line"), std::string::npos) << err;
  EXPECT_NE(err.find("error-line"), std::string::npos) << err;
}

TEST_F(LoggingTest, DroppedMessagesDoNotEvaluateTheirArguments) {
  SetLogLevel(LogLevel::kERROR);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  testing::internal::CaptureStderr();
  SLUICE_LOG(INFO) << count();
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(evaluated, 0);
  EXPECT_EQ(err, "");
}

TEST_F(LoggingTest, LineHasLevelLetterBaseFileNameAndLine) {
  SetLogLevel(LogLevel::kDEBUG);
  testing::internal::CaptureStderr();
  const int line = __LINE__ + 1;
  SLUICE_LOG(DEBUG) << "value=" << 42;
  std::string err = testing::internal::GetCapturedStderr();
  ASSERT_FALSE(err.empty());
  EXPECT_EQ(err[0], 'D') << err;
  EXPECT_NE(err.find(" logging_test.cc:" + std::to_string(line) + "] value=42\n"), std::string::npos) << err;
  EXPECT_EQ(err.find('/'), std::string::npos) << "directory should be stripped: " << err;
  EXPECT_EQ(err.back(), '\n');
}

TEST_F(LoggingTest, EachMessageIsOneLine) {
  SetLogLevel(LogLevel::kINFO);
  testing::internal::CaptureStderr();
  SLUICE_LOG(INFO) << "first";
  SLUICE_LOG(ERROR) << "second";
  std::string err = testing::internal::GetCapturedStderr();
  size_t newlines = 0;
  for (char c : err) newlines += c == '\n';
  EXPECT_EQ(newlines, 2u) << err;
  EXPECT_EQ(err[0], 'I');
  EXPECT_EQ(err[err.find('\n') + 1], 'E') << err;
}

}  // namespace
}  // namespace sluice
