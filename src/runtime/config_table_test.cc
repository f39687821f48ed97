#include "sluice/runtime/config_table.h"

#include <gtest/gtest.h>

namespace sluice::runtime {
namespace {

enum class Color { kRed, kBlue };

struct Options {
  struct Inner {
    int32_t count = 3;
    float rate = 0.5f;
  } inner;
  uint64_t seed = 0;
  bool on = false;
  std::string name = "a";
  std::string mode = "fast";
  Color color = Color::kRed;
};

ConfigTable<Options> Table() {
  ConfigTable<Options> t;
  t.Int("inner.count", 3, 1, 10, "a count", SLUICE_FIELD(inner.count));
  t.Double("inner.rate", 0.5, 0.0, 1.0, "a rate", SLUICE_FIELD(inner.rate));
  t.Int("run.seed", 0, 0, INT64_MAX, "a seed", SLUICE_FIELD(seed));
  t.Bool("run.on", false, "a switch", SLUICE_FIELD(on));
  t.String("run.name", "a", "a name", SLUICE_FIELD(name));
  t.Enum("run.mode", "fast", {"fast", "slow"}, "a mode", SLUICE_FIELD(mode));
  t.Choice<Color>("run.color", "red", {{"red", Color::kRed}, {"blue", Color::kBlue}}, "a color", SLUICE_FIELD(color));
  t.Declare().AddInt("run.derived", 2, 0, 5, "read by code");
  return t;
}

TEST(ConfigTable, OneDeclarationGivesTheSchemaTheMappingAndTheRangeCheck) {
  const ConfigTable<Options> t = Table();
  ASSERT_EQ(t.schema().keys().size(), 8u);
  EXPECT_EQ(t.schema().Find("run.color")->allowed, (std::vector<std::string>{"red", "blue"}));
  EXPECT_EQ(t.schema().Find("inner.count")->int_max, 10);
  auto c = Config::FromYamlText(t.schema(), "inner:\n  count: 7\n  rate: 0.25\nrun:\n  seed: 9\n",
                                {"run.on=true", "run.name=b", "run.mode=slow", "run.color=blue", "run.derived=4"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Options o;
  t.Apply(*c, &o);
  EXPECT_EQ(o.inner.count, 7);
  EXPECT_FLOAT_EQ(o.inner.rate, 0.25f);
  EXPECT_EQ(o.seed, 9u);
  EXPECT_TRUE(o.on);
  EXPECT_EQ(o.name, "b");
  EXPECT_EQ(o.mode, "slow");
  EXPECT_EQ(o.color, Color::kBlue);
  EXPECT_EQ(c->GetInt("run.derived"), 4);
  EXPECT_TRUE(t.Check(o).ok());
  // The schema refuses what Check refuses, at parse time.
  EXPECT_FALSE(Config::FromYamlText(t.schema(), "", {"inner.count=11"}).ok());
}

TEST(ConfigTable, CheckNamesTheKeyOfAFieldOutOfRange) {
  const ConfigTable<Options> t = Table();
  auto expect_bad = [&](const Options& o, const std::string& needle) {
    const Status s = t.Check(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
  };
  Options o;
  EXPECT_TRUE(t.Check(o).ok());
  o.inner.count = 0;
  expect_bad(o, "option inner.count: must be in [1, 10], got 0");
  o = Options();
  o.inner.rate = 1.5f;
  expect_bad(o, "option inner.rate: must be in [0, 1], got 1.5");
  o = Options();
  o.inner.rate = 0.1f;  // a float bound given as a double still admits the float nearest to it
  EXPECT_TRUE(t.Check(o).ok());
  o.seed = uint64_t{1} << 63;  // past INT64_MAX
  expect_bad(o, "option run.seed");
  o = Options();
  o.mode = "medium";
  expect_bad(o, "option run.mode: 'medium' is not one of fast, slow");
  o = Options();
  o.color = static_cast<Color>(7);
  expect_bad(o, "option run.color: holds a value that is none of red, blue");
}

}  // namespace
}  // namespace sluice::runtime
