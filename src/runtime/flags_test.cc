#include "sluice/runtime/flags.h"

#include <gtest/gtest.h>

namespace sluice::runtime {
namespace {

FlagSet MakeFlags() {
  FlagSet f;
  f.Add("slots", "8", "slots");
  f.Add("temperature", "1.0", "temperature");
  f.Add("mode", "continuous", "mode");
  f.Add("verbose", "false", "verbose", /*is_bool=*/true);
  return f;
}

TEST(FlagsTest, DefaultsAndBothSpellings) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({"--slots=3", "--temperature", "0.5", "--verbose", "pos"}).ok());
  EXPECT_EQ(*f.GetInt("slots", 1, 10), 3);
  EXPECT_DOUBLE_EQ(*f.GetDouble("temperature", 0, 2), 0.5);
  EXPECT_TRUE(*f.GetBool("verbose"));
  EXPECT_EQ(*f.GetChoice("mode", {"continuous", "static"}), "continuous");
  EXPECT_EQ(f.positional(), std::vector<std::string>{"pos"});
  EXPECT_FALSE(f.help_requested());
}

TEST(FlagsTest, ErrorsNameTheFlagAndWhatIsAllowed) {
  FlagSet f = MakeFlags();
  Status s = f.Parse({"--slot=3"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--slot"), std::string::npos);
  EXPECT_NE(s.message().find("--slots"), std::string::npos) << "lists the known flags";

  FlagSet g = MakeFlags();
  EXPECT_NE(g.Parse({"--slots"}).message().find("needs a value"), std::string::npos);

  FlagSet h = MakeFlags();
  ASSERT_TRUE(h.Parse({"--slots=abc", "--temperature=9", "--mode=fast", "--verbose=maybe"}).ok());
  EXPECT_NE(h.GetInt("slots", 1, 10).status().message().find("must be an integer"), std::string::npos);
  EXPECT_NE(h.GetDouble("temperature", 0, 2).status().message().find("[0, 2]"), std::string::npos);
  EXPECT_NE(h.GetChoice("mode", {"continuous", "static"}).status().message().find("continuous, static"),
            std::string::npos);
  EXPECT_FALSE(h.GetBool("verbose").ok());

  FlagSet k = MakeFlags();
  ASSERT_TRUE(k.Parse({"--slots=0", "--temperature=nan"}).ok());
  EXPECT_NE(k.GetInt("slots", 1, 10).status().message().find("[1, 10]"), std::string::npos);
  EXPECT_FALSE(k.GetDouble("temperature", 0, 2).ok());
}

TEST(FlagsTest, HelpIsRecognized) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({"--help"}).ok());
  EXPECT_TRUE(f.help_requested());
  EXPECT_NE(f.Usage().find("--slots=8"), std::string::npos);
}

}  // namespace
}  // namespace sluice::runtime
