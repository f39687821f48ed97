#include "sluice/runtime/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <string>

#include "sluice/common/file_util.h"

namespace sluice::runtime {
namespace {

ConfigSchema MakeSchema() {
  ConfigSchema s;
  s.AddInt("seed", 0, 0, 1 << 30, "Random seed.");
  s.AddDouble("trainer.lr", 1e-6, 0.0, 1.0, "Learning rate.");
  s.AddInt("trainer.steps", 100, 1, 1000000, "Optimizer steps.");
  s.AddBool("trainer.use_kl", false, "Add a KL penalty | against the reference.");
  s.AddDouble("rollout.temperature", 1.0, 0.0, 2.0, "Sampling temperature.");
  s.AddEnum("rollout.mode", "continuous", {"continuous", "static"}, "Batching mode.");
  s.AddString("rollout.sampling.stop", "#", "Stop text.");
  s.AddString("run_name", "", "Name of the run.");
  s.AddInt("trainer.optim.warmup", 0, 0, 1000, "Warm-up steps.");
  return s;
}

// The status is `code` and its message contains every piece of `parts`.
void ExpectError(const Status& status, StatusCode code, std::initializer_list<std::string> parts) {
  EXPECT_EQ(status.code(), code) << status.ToString();
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos) << "missing '" << part << "' in " << status.ToString();
  }
}

Status FromText(const std::string& text, std::vector<std::string> overrides = {}) {
  return Config::FromYamlText(MakeSchema(), text, overrides).status();
}

class ConfigFileTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(testing::TempDir()) / ("sluice_config_test_" + std::to_string(::getpid()) + "_" +
                                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(dir_)); }
  std::string Write(const std::string& text) {
    const std::string path = (dir_ / "run.yaml").string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST(ConfigTest, DefaultsWithoutFileOrOverrides) {
  auto c = Config::Load(MakeSchema(), "", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->GetInt("seed"), 0);
  EXPECT_DOUBLE_EQ(c->GetDouble("trainer.lr"), 1e-6);
  EXPECT_EQ(c->GetInt("trainer.steps"), 100);
  EXPECT_FALSE(c->GetBool("trainer.use_kl"));
  EXPECT_EQ(c->GetString("rollout.mode"), "continuous");
  EXPECT_EQ(c->GetString("rollout.sampling.stop"), "#");
  EXPECT_EQ(c->GetString("run_name"), "");
}

TEST(ConfigTest, NestedAndDottedYamlKeys) {
  auto c = Config::FromYamlText(MakeSchema(),
                                "seed: 7\n"
                                "trainer:\n"
                                "  lr: 1.0e-5\n"
                                "  use_kl: True\n"
                                "  optim:\n"
                                "    warmup: 10\n"
                                "rollout.temperature: 0.5\n"
                                "rollout:\n"
                                "  sampling: {stop: \"\\n\"}\n"
                                "  mode: static\n"
                                "run_name: 'exp 1'\n",
                                {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->GetInt("seed"), 7);
  EXPECT_DOUBLE_EQ(c->GetDouble("trainer.lr"), 1e-5);
  EXPECT_TRUE(c->GetBool("trainer.use_kl"));
  EXPECT_EQ(c->GetInt("trainer.optim.warmup"), 10);
  EXPECT_DOUBLE_EQ(c->GetDouble("rollout.temperature"), 0.5);
  EXPECT_EQ(c->GetString("rollout.sampling.stop"), "\n");
  EXPECT_EQ(c->GetString("rollout.mode"), "static");
  EXPECT_EQ(c->GetString("run_name"), "exp 1");
  EXPECT_EQ(c->GetInt("trainer.steps"), 100) << "unset keys keep their defaults";
}

TEST(ConfigTest, OverridesWinOverYamlAndApplyInOrder) {
  auto c = Config::FromYamlText(MakeSchema(), "trainer:\n  lr: 0.1\n  steps: 5\n",
                                {"trainer.lr=1e-5", "trainer.steps=6", "trainer.steps=7", "rollout.temperature=0.8",
                                 "trainer.use_kl=true", "run_name=a=b", "rollout.sampling.stop=\" x \"", "seed=+3"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->GetDouble("trainer.lr"), 1e-5);
  EXPECT_EQ(c->GetInt("trainer.steps"), 7);
  EXPECT_DOUBLE_EQ(c->GetDouble("rollout.temperature"), 0.8);
  EXPECT_TRUE(c->GetBool("trainer.use_kl"));
  EXPECT_EQ(c->GetString("run_name"), "a=b") << "only the first '=' splits";
  EXPECT_EQ(c->GetString("rollout.sampling.stop"), " x ") << "quotes keep spaces";
  EXPECT_EQ(c->GetInt("seed"), 3);
}

TEST(ConfigTest, EmptyYamlAndEmptySectionsAreDefaults) {
  for (const char* text : {"", "# only a comment\n", "trainer:\n"}) {
    auto c = Config::FromYamlText(MakeSchema(), text, {});
    ASSERT_TRUE(c.ok()) << text << ": " << c.status().ToString();
    EXPECT_EQ(c->GetInt("trainer.steps"), 100);
  }
}

TEST(ConfigTest, UnknownKeysSuggestTheClosest) {
  ExpectError(FromText("trainer:\n  lrr: 0.1\n"), StatusCode::kInvalidArgument,
              {"YAML text:2", "unknown config key 'trainer.lrr'", "did you mean 'trainer.lr'?"});
  ExpectError(FromText("", {"rollout.temprature=0.5"}), StatusCode::kInvalidArgument,
              {"command line 'rollout.temprature=0.5'", "did you mean 'rollout.temperature'?"});
  ExpectError(FromText("", {"warmup=3"}), StatusCode::kInvalidArgument, {"did you mean 'trainer.optim.warmup'?"});
  // Nothing close: list what the section holds, or the top-level names.
  ExpectError(
      FromText("", {"trainer.learning_rate_schedule=x"}), StatusCode::kInvalidArgument,
      {"unknown config key 'trainer.learning_rate_schedule'", "keys under 'trainer': trainer.lr, trainer.steps"});
  ExpectError(FromText("", {"completely_different=1"}), StatusCode::kInvalidArgument,
              {"top-level names: seed, trainer, rollout, run_name"});
}

TEST(ConfigTest, WrongTypesNameKeyOriginAndWhatIsAllowed) {
  ExpectError(FromText("trainer:\n  steps: abc\n"), StatusCode::kInvalidArgument,
              {"YAML text:2", "config key 'trainer.steps'", "expected an integer in [1, 1000000]", "'abc'"});
  ExpectError(FromText("trainer:\n  steps: 1.5\n"), StatusCode::kInvalidArgument,
              {"'trainer.steps'", "expected an integer", "'1.5'"});
  ExpectError(FromText("trainer:\n  steps: 1e3\n"), StatusCode::kInvalidArgument, {"expected an integer"});
  ExpectError(FromText("trainer:\n  steps: \"5\"\n"), StatusCode::kInvalidArgument,
              {"'trainer.steps'", "the quoted string '5'"});
  ExpectError(FromText("", {"trainer.lr=fast"}), StatusCode::kInvalidArgument,
              {"command line 'trainer.lr=fast'", "'trainer.lr'", "expected a number in [0.0, 1.0]"});
  ExpectError(FromText("", {"trainer.lr=nan"}), StatusCode::kInvalidArgument, {"expected a number"});
  ExpectError(FromText("", {"trainer.lr=0x1p-3"}), StatusCode::kInvalidArgument, {"expected a number"});
  ExpectError(FromText("", {"trainer.use_kl=yes"}), StatusCode::kInvalidArgument,
              {"'trainer.use_kl'", "expected true or false", "'yes'"});
  ExpectError(FromText("", {"trainer.steps="}), StatusCode::kInvalidArgument, {"expected an integer", "''"});
  ExpectError(FromText("", {"seed=+-3"}), StatusCode::kInvalidArgument, {"expected an integer"});
}

TEST(ConfigTest, OutOfRangeAndEnumValues) {
  ExpectError(FromText("trainer:\n  steps: 0\n"), StatusCode::kInvalidArgument,
              {"YAML text:2", "'trainer.steps'", "0 is out of range", "[1, 1000000]"});
  ExpectError(FromText("", {"trainer.steps=99999999999999999999"}), StatusCode::kInvalidArgument, {"out of range"});
  ExpectError(FromText("", {"rollout.temperature=2.5"}), StatusCode::kInvalidArgument,
              {"'rollout.temperature'", "2.5 is out of range", "[0.0, 2.0]"});
  ExpectError(FromText("", {"trainer.lr=-1e-5"}), StatusCode::kInvalidArgument, {"out of range"});
  ExpectError(FromText("rollout:\n  mode: dynamic\n"), StatusCode::kInvalidArgument,
              {"YAML text:2", "'rollout.mode'", "'dynamic' is not allowed", "continuous, static"});
  ExpectError(FromText("", {"rollout.mode=Static"}), StatusCode::kInvalidArgument, {"'Static' is not allowed"});
}

TEST(ConfigTest, MalformedOverrides) {
  ExpectError(FromText("", {"trainer.lr"}), StatusCode::kInvalidArgument,
              {"command line 'trainer.lr'", "must be key=value"});
  ExpectError(FromText("", {"=5"}), StatusCode::kInvalidArgument, {"key before '=' is empty"});
  ExpectError(FromText("", {"trainer.steps=[1,2]"}), StatusCode::kInvalidArgument,
              {"'trainer.steps'", "expected a scalar", "got a sequence"});
  ExpectError(FromText("", {"run_name={a: 1}"}), StatusCode::kInvalidArgument, {"got a map"});
  ExpectError(FromText("", {"trainer=5"}), StatusCode::kInvalidArgument, {"'trainer' is a section", "trainer.lr"});
}

TEST(ConfigTest, SequencesMapsAndNullsWhereAScalarIsExpected) {
  ExpectError(FromText("trainer:\n  steps: [1, 2]\n"), StatusCode::kInvalidArgument,
              {"YAML text:2", "'trainer.steps'", "expected a scalar", "got a sequence"});
  ExpectError(FromText("trainer:\n  lr:\n    - 0.1\n"), StatusCode::kInvalidArgument, {"got a sequence"});
  ExpectError(FromText("trainer:\n  lr: {x: 1}\n"), StatusCode::kInvalidArgument, {"'trainer.lr'", "got a map"});
  ExpectError(FromText("trainer: [1, 2]\n"), StatusCode::kInvalidArgument, {"'trainer' is a section"});
  ExpectError(FromText("trainer: 5\n"), StatusCode::kInvalidArgument, {"'trainer' is a section"});
  ExpectError(FromText("run_name:\n"), StatusCode::kInvalidArgument, {"'run_name'", "no value given", "\"\""});
  ExpectError(FromText("- a\n- b\n"), StatusCode::kInvalidArgument, {"top level must be a map", "sequence"});
  ExpectError(FromText("trainer.lr=1e-5\n"), StatusCode::kInvalidArgument, {"top level must be a map", "scalar"});
}

TEST(ConfigTest, KeySetTwiceInTheFileIsAnError) {
  ExpectError(FromText("trainer:\n  lr: 0.1\ntrainer.lr: 0.2\n"), StatusCode::kInvalidArgument,
              {"YAML text:3", "'trainer.lr'", "set twice", "first at YAML text:2"});
}

TEST(ConfigTest, YamlSyntaxErrorsCarryTheLine) {
  ExpectError(FromText("seed: 1\ntrainer: [1,\nrollout: 2\n"), StatusCode::kInvalidArgument,
              {"YAML text:", "YAML syntax error"});
  ExpectError(FromText("seed: 1\ntrainer:\n  lr: 1\n    steps: 2\n"), StatusCode::kInvalidArgument,
              {"YAML text:4:", "YAML syntax error"});
}

TEST(ConfigTest, ToYamlRoundTrips) {
  auto c = Config::FromYamlText(MakeSchema(), "",
                                {"trainer.lr=1.2345678901234567e-5", "rollout.temperature=0.1", "trainer.steps=42",
                                 "rollout.sampling.stop=\"a \\\"quoted\\\"\nline\"", "run_name=true",
                                 "trainer.use_kl=true", "rollout.mode=static", "seed=123"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string yaml = c->ToYaml();
  EXPECT_NE(yaml.find("trainer:\n  lr: "), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("run_name: \"true\""), std::string::npos) << "strings are quoted: " << yaml;
  auto again = Config::FromYamlText(MakeSchema(), yaml, {});
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << yaml;
  EXPECT_EQ(again->GetDouble("trainer.lr"), c->GetDouble("trainer.lr")) << "bit-exact";
  EXPECT_EQ(again->GetDouble("rollout.temperature"), 0.1);
  EXPECT_EQ(again->GetInt("trainer.steps"), 42);
  EXPECT_EQ(again->GetString("rollout.sampling.stop"), "a \\\"quoted\\\"\nline");
  EXPECT_EQ(again->GetString("run_name"), "true");
  EXPECT_TRUE(again->GetBool("trainer.use_kl"));
  EXPECT_EQ(again->GetString("rollout.mode"), "static");
  EXPECT_EQ(again->GetInt("seed"), 123);
  EXPECT_EQ(again->ToYaml(), yaml);

  auto defaults = Config::FromYamlText(MakeSchema(), "", {});
  ASSERT_TRUE(defaults.ok());
  EXPECT_NE(defaults->ToYaml().find("lr: 1.0e-06"), std::string::npos) << "YAML 1.1 readers see a float";
  const ConfigSchema schema = MakeSchema();
  for (const ConfigKey& k : schema.keys()) {
    const std::string leaf = k.key.substr(k.key.rfind('.') + 1);
    EXPECT_NE(defaults->ToYaml().find(leaf + ":"), std::string::npos) << "every key is written: " << k.key;
  }
}

TEST(ConfigTest, ControlCharactersAndInfinityRoundTrip) {
  ConfigSchema s;
  s.AddString("text", std::string("tab\there\x01\\", 10), "");
  s.AddDouble("clip", std::numeric_limits<double>::infinity(), 0, std::numeric_limits<double>::infinity(), "");
  auto c = Config::FromYamlText(s, "", {});
  ASSERT_TRUE(c.ok());
  auto again = Config::FromYamlText(s, c->ToYaml(), {});
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << c->ToYaml();
  EXPECT_EQ(again->GetString("text"), c->GetString("text"));
  EXPECT_EQ(again->GetDouble("clip"), std::numeric_limits<double>::infinity());
  auto finite = Config::FromYamlText(s, "clip: 1.5\n", {"clip=-.inf"});
  ExpectError(finite.status(), StatusCode::kInvalidArgument, {"out of range"});
}

TEST(ConfigTest, DocumentListsEveryKey) {
  const ConfigSchema schema = MakeSchema();
  const std::string doc = schema.Document();
  EXPECT_EQ(doc.rfind("| key | type | default | allowed | help |\n|---|", 0), 0u) << doc;
  for (const ConfigKey& k : schema.keys()) {
    EXPECT_NE(doc.find("| `" + k.key + "` | " + std::string(ConfigTypeName(k.type))), std::string::npos) << k.key;
    EXPECT_NE(doc.find(k.help.substr(0, 8)), std::string::npos) << k.key;
  }
  EXPECT_NE(doc.find("`1.0e-06` | a number in [0.0, 1.0] | Learning rate."), std::string::npos) << doc;
  EXPECT_NE(doc.find("one of continuous, static"), std::string::npos);
  EXPECT_NE(doc.find("Add a KL penalty \\| against"), std::string::npos) << "pipes are escaped";
  EXPECT_EQ(std::count(doc.begin(), doc.end(), '\n'), static_cast<long>(schema.keys().size()) + 2);
}

TEST_F(ConfigFileTest, LoadsAFileThenOverrides) {
  const std::string path = Write("trainer:\n  lr: 0.25\n  steps: 9\n");
  auto c = Config::Load(MakeSchema(), path, {"trainer.steps=10"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->GetDouble("trainer.lr"), 0.25);
  EXPECT_EQ(c->GetInt("trainer.steps"), 10);
}

TEST_F(ConfigFileTest, ErrorsNameTheFileAndLine) {
  const std::string path = Write("seed: 1\n\ntrainer:\n  steps: lots\n");
  ExpectError(Config::Load(MakeSchema(), path, {}).status(), StatusCode::kInvalidArgument,
              {path + ":4: config key 'trainer.steps'"});
  const std::string bad = Write("trainer: {lr: 1\n");
  ExpectError(Config::Load(MakeSchema(), bad, {}).status(), StatusCode::kInvalidArgument,
              {path + ":", "YAML syntax error"});
}

TEST_F(ConfigFileTest, MissingFileIsNotFound) {
  const std::string missing = (dir_ / "missing.yaml").string();
  ExpectError(Config::Load(MakeSchema(), missing, {}).status(), StatusCode::kNotFound, {missing});
}

TEST(ConfigSchemaDeathTest, DeclarationMistakesAreBugs) {
  EXPECT_DEATH(MakeSchema().AddInt("seed", 0, 0, 1, ""), "declared twice");
  EXPECT_DEATH(MakeSchema().AddInt("trainer", 0, 0, 1, ""), "section");
  EXPECT_DEATH(MakeSchema().AddInt("seed.x", 0, 0, 1, ""), "inside the key 'seed'");
  EXPECT_DEATH(MakeSchema().AddInt("a..b", 0, 0, 1, ""), "dotted segments");
  EXPECT_DEATH(MakeSchema().AddInt("x", 5, 0, 1, ""), "outside");
  EXPECT_DEATH(MakeSchema().AddEnum("e", "c", {"a", "b"}, ""), "not among");
  auto c = Config::FromYamlText(MakeSchema(), "", {});
  ASSERT_TRUE(c.ok());
  EXPECT_DEATH((void)c->GetInt("trainer.lr"), "declared as double, read as int");
  EXPECT_DEATH((void)c->GetBool("nope"), "never declared");
}

}  // namespace
}  // namespace sluice::runtime

namespace sluice::runtime {
namespace {

ConfigSchema MapSchema() {
  ConfigSchema s;
  s.AddString("agent.env", "", "The environment.");
  s.AddMap("agent.env_config", "Its constructor's argument.");
  return s;
}

// A map key takes a nested YAML map (scalars typed as JSON), a JSON object
// on the command line (later wins), and round-trips through ToYaml.
// Fails if nested values lose their types or structure, or an override
// that is not a JSON object is taken.
TEST(ConfigMapTest, NestedMapsFromYamlAndJsonOverrides) {
  auto c = Config::FromYamlText(MapSchema(),
                                "agent:\n  env: m:E\n  env_config:\n    n: 3\n    x: 0.5\n    on: true\n"
                                "    name: abc\n    quoted: \"7\"\n    none: ~\n    list: [1, two]\n"
                                "    inner: {deep: {k: v}}\n",
                                {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->GetString("agent.env_config"),
            R"({"n":3,"x":0.5,"on":true,"name":"abc","quoted":"7","none":null,"list":[1,"two"],)"
            R"("inner":{"deep":{"k":"v"}}})");
  auto again = Config::FromYamlText(MapSchema(), c->ToYaml(), {});
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << c->ToYaml();
  EXPECT_EQ(again->GetString("agent.env_config"), c->GetString("agent.env_config"));
  auto over = Config::FromYamlText(MapSchema(), "agent:\n  env_config:\n    n: 3\n",
                                   {R"(agent.env_config={"n": 4, "s": "x y"})"});
  ASSERT_TRUE(over.ok()) << over.status().ToString();
  EXPECT_EQ(over->GetString("agent.env_config"), R"({"n":4,"s":"x y"})");
  auto defaults = Config::FromYamlText(MapSchema(), "", {});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->GetString("agent.env_config"), "{}");
  for (const char* bad : {"agent.env_config=[1]", "agent.env_config={not json", "agent.env_config=5"}) {
    auto r = Config::FromYamlText(MapSchema(), "", {bad});
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("agent.env_config"), std::string::npos) << r.status().ToString();
  }
  std::string deep = "agent:\n  env_config:\n";
  for (int i = 0; i < 40; ++i) deep += std::string(4 + 2 * i, ' ') + "k:\n";
  deep += std::string(4 + 80, ' ') + "v: 1\n";
  auto too_deep = Config::FromYamlText(MapSchema(), deep, {});
  EXPECT_FALSE(too_deep.ok());
  EXPECT_NE(too_deep.status().message().find("nested deeper"), std::string::npos) << too_deep.status().ToString();
}

}  // namespace
}  // namespace sluice::runtime
