#include "sluice/agent/trajectory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/testing/status_macros.h"
#include "sluice/common/file_util.h"

namespace sluice::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const fs::path kData = fs::path(SLUICE_TEST_DATA);
const std::string kCall = R"(<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>)";

std::shared_ptr<const model::ChatFormat> Builtin() {
  return std::make_shared<const model::ChatFormat>(model::ChatFormat::Builtin());
}

std::vector<TokenId> Ids(const model::ChatFormat& f, const std::string& text) {
  Result<std::vector<TokenId>> ids = f.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<TokenId>();
}

// A model turn of `text` ended by `end` (the end-of-turn token), every token
// sampled by `version`.
Result<std::optional<Action>> Say(Trajectory& t, const model::ChatFormat& f, const std::string& text, TokenId end,
                                  PolicyVersion version) {
  std::vector<TokenId> ids = Ids(f, text);
  ids.push_back(end);
  return t.AddModelTurn(ids, std::vector<float>(ids.size(), -0.25f), std::vector<PolicyVersion>(ids.size(), version),
                        true);
}

// What a test checks of every trajectory: the arrays line up, spans tile
// the sequence in order, mask 1 exactly on the model's spans, whose tokens
// decode to the content the environment received; logprobs and versions
// only where the model sampled.
void ExpectWellFormed(const Trajectory& t, const model::ChatFormat& f, const std::vector<std::string>& received) {
  const size_t n = t.tokens().size();
  ASSERT_EQ(t.mask().size(), n);
  ASSERT_EQ(t.logprobs().size(), n);
  ASSERT_EQ(t.versions().size(), n);
  int64_t at = 0;
  size_t model_turn = 0;
  for (const Span& s : t.turns()) {
    EXPECT_EQ(s.start, at) << s.role;
    EXPECT_LE(s.start, s.end);
    for (int64_t i = s.start; i < s.end; ++i) {
      EXPECT_EQ(t.mask()[i], s.role == "assistant" ? 1 : 0) << "token " << i << " of a " << s.role << " span";
      if (s.role != "assistant") {
        EXPECT_EQ(t.versions()[i], -1);
      }
    }
    if (s.role == "assistant") {
      const std::vector<TokenId> ids(t.tokens().begin() + s.start, t.tokens().begin() + s.end);
      Result<std::string> text = f.tokenizer().Decode(ids, /*skip_special=*/true);
      ASSERT_TRUE(text.ok());
      EXPECT_EQ(*text, s.content);
      if (model_turn < received.size()) {
        EXPECT_EQ(s.content, received[model_turn]);
      }
      ++model_turn;
    }
    at = s.end;
  }
  EXPECT_EQ(at, static_cast<int64_t>(n));
  TrajectoryLine line{7, 3, 2, t.tokens(), t.logprobs(), t.versions(), t.Summary(), 1.0, 0.5};
  Result<std::string> text = FormatTrajectoryLine(line);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const ordered_json j = ordered_json::parse(*text);
  ASSERT_EQ(j["tokens"].size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(j["mask"][i] == 1, !j["logprobs"][i].is_null());
    EXPECT_EQ(j["mask"][i] == 1, !j["versions"][i].is_null());
    EXPECT_EQ(j["mask"][i], t.mask()[i]);
  }
  EXPECT_EQ(j["turns"].size(), t.turns().size());
  EXPECT_EQ(j["end_reason"], EndReasonName(t.end_reason()));
}

Opening Calculator(const std::string& prompt) {
  Opening o;
  o.messages = {{"user", prompt, ""}};
  o.tools = "[" + CalculatorToolSchema() + "]";
  return o;
}

// An environment that records what it receives and answers the calculator.
struct Recorder {
  std::unique_ptr<Environment> env = MakeCalculatorEnvironment();
  std::vector<std::string> received;
  StepResult Step(const Action& a) {
    received.push_back(a.content);
    Result<StepResult> r = env->Step(a);
    EXPECT_TRUE(r.ok());
    return *r;
  }
};

// Two turns on the built-in model: the trajectory is the built-in
// template's rendering of the whole conversation, token for token; only the
// model's tokens are trained, each with the version that sampled it (the
// weights changed between the turns); the tool's answer is there, rendered
// as the template renders it. Fails if environment tokens are trained, the
// end-of-turn token is doubled or dropped, the tool's answer is lost or a
// version is misattributed.
TEST(TrajectoryTest, TheBuiltinTrajectoryIsTheTemplatesRendering) {
  auto f = Builtin();
  Recorder env;
  Result<Opening> opening = env.env->Reset(R"({"prompt": "12*34?"})");
  ASSERT_TRUE(opening.ok());
  SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, *opening, ToolCallFormat::kHermes, {}));
  EXPECT_EQ(t.opening_length(), static_cast<int64_t>(t.tokens().size()));
  SLUICE_ASSERT_OK_AND_ASSIGN(std::optional<Action> a, Say(t, *f, kCall, model::ByteTokenizer::kEos, 3));
  ASSERT_TRUE(a.has_value());
  ASSERT_EQ(a->tool_calls.size(), 1u);
  SLUICE_ASSERT_OK(t.AddEnvironmentTurn(env.Step(*a)));
  EXPECT_FALSE(t.ended());
  SLUICE_ASSERT_OK_AND_ASSIGN(a, Say(t, *f, "#408", model::ByteTokenizer::kEos, 4));
  ASSERT_TRUE(a.has_value());
  SLUICE_ASSERT_OK(t.AddEnvironmentTurn(env.Step(*a)));
  ASSERT_TRUE(t.ended());
  EXPECT_EQ(t.end_reason(), EndReason::kDone);

  const ordered_json whole = {{"messages",
                               {{{"role", "user"}, {"content", "12*34?"}},
                                {{"role", "assistant"}, {"content", kCall}},
                                {{"role", "tool"}, {"content", "408"}},
                                {{"role", "assistant"}, {"content", "#408"}}}},
                              {"tools", ordered_json::parse("[" + CalculatorToolSchema() + "]")}};
  SLUICE_ASSERT_OK_AND_ASSIGN(const std::string rendered, f->Render(whole));
  EXPECT_EQ(t.tokens(), Ids(*f, rendered));
  ExpectWellFormed(t, *f, env.received);
  ASSERT_EQ(t.turns().size(), 4u);
  const Span& tool = t.turns()[2];
  EXPECT_EQ(tool.role, "tool");
  SLUICE_ASSERT_OK_AND_ASSIGN(const std::string tool_text,
                              f->Decode({t.tokens().begin() + tool.start, t.tokens().begin() + tool.end}));
  EXPECT_EQ(tool_text, "tool: 408\nassistant: ");
  EXPECT_EQ(t.versions()[t.turns()[1].start], 3);
  EXPECT_EQ(t.versions()[t.turns()[1].end - 1], 3);
  EXPECT_EQ(t.versions()[t.turns()[3].start], 4);
  EXPECT_EQ(t.last_model_content(), "#408");
}

// A byte model can sample bytes that are not UTF-8: they stay in the
// trajectory as sampled, and the environment receives them as U+FFFD.
TEST(TrajectoryTest, BytesThatAreNotUtf8ReachTheEnvironmentReplaced) {
  auto f = Builtin();
  SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, Calculator("q"), ToolCallFormat::kHermes, {}));
  const std::vector<TokenId> turn = {'a', 0xFF, 'b', model::ByteTokenizer::kEos};
  SLUICE_ASSERT_OK_AND_ASSIGN(std::optional<Action> a,
                              t.AddModelTurn(turn, std::vector<float>(4), std::vector<PolicyVersion>(4), true));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->content,
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_TRUE(std::equal(turn.begin(), turn.end(), t.tokens().end() - 4));
}

class QwenTrajectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("trajectory_" + std::to_string(::getpid()));
    static_cast<void>(sluice::RemoveTree(dir_.string()));
    fs::create_directories(dir_);
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(dir_.string())); }
  // Qwen3's tokenizer with `which`'s template (qwen2_5 or qwen3).
  std::shared_ptr<const model::ChatFormat> Format(const std::string& which) {
    fs::copy_file(kData / "tokenizers" / "qwen3" / "tokenizer.json", dir_ / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
    fs::copy_file(kData / "chat_templates" / which / "tokenizer_config.json", dir_ / "tokenizer_config.json",
                  fs::copy_options::overwrite_existing);
    Result<model::ChatFormat> f = model::ChatFormat::Load(dir_.string());
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    return std::make_shared<const model::ChatFormat>(std::move(f).value());
  }
  static constexpr TokenId kImEnd = 151645;
  fs::path dir_;
};

// Qwen2.5's template is append-only: the trajectory is its rendering of
// the whole conversation (tools in the system block, two tool answers of
// one turn grouped under one user header, as the template groups them),
// each tool answer its own span. Fails if the end-of-turn token is
// doubled, the newline the template puts after it is lost, or tool answers
// are rendered one conversation at a time.
TEST_F(QwenTrajectoryTest, AppendOnlyTemplatesGiveTheirWholeRendering) {
  auto f = Format("qwen2_5");
  Opening opening;
  opening.messages = {{"system", "Be exact.", ""}, {"user", "12*34 and 5*6?", ""}};
  opening.tools = "[" + CalculatorToolSchema() + "]";
  SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, opening, ToolCallFormat::kHermes, {}));
  const std::string calls =
      kCall + "\n" + R"(<tool_call>{"name": "calculator", "arguments": {"expression": "5*6"}}</tool_call>)";
  Recorder env;
  SLUICE_ASSERT_OK_AND_ASSIGN(std::optional<Action> a, Say(t, *f, calls, kImEnd, 0));
  ASSERT_TRUE(a.has_value());
  ASSERT_EQ(a->tool_calls.size(), 2u);
  SLUICE_ASSERT_OK(t.AddEnvironmentTurn(env.Step(*a)));
  SLUICE_ASSERT_OK_AND_ASSIGN(a, Say(t, *f, "408 and 30", kImEnd, 1));
  ASSERT_TRUE(a.has_value());
  SLUICE_ASSERT_OK(t.AddEnvironmentTurn(env.Step(*a)));
  EXPECT_EQ(t.end_reason(), EndReason::kDone);

  const ordered_json whole = {{"messages",
                               {{{"role", "system"}, {"content", "Be exact."}},
                                {{"role", "user"}, {"content", "12*34 and 5*6?"}},
                                {{"role", "assistant"}, {"content", calls}},
                                {{"role", "tool"}, {"content", "408"}},
                                {{"role", "tool"}, {"content", "30"}},
                                {{"role", "assistant"}, {"content", "408 and 30"}}}},
                              {"tools", ordered_json::parse(opening.tools)}};
  SLUICE_ASSERT_OK_AND_ASSIGN(std::string rendered, f->Render(whole));
  ASSERT_EQ(rendered.substr(rendered.size() - 1), "\n");
  rendered.pop_back();  // the sequence ends at the model's <|im_end|>
  EXPECT_EQ(t.tokens(), Ids(*f, rendered));
  ExpectWellFormed(t, *f, env.received);
  ASSERT_EQ(t.turns().size(), 6u);
  SLUICE_ASSERT_OK_AND_ASSIGN(const std::string first_tool, f->Decode({t.tokens().begin() + t.turns()[3].start,
                                                                       t.tokens().begin() + t.turns()[3].end}));
  EXPECT_EQ(first_tool, "\n<|im_start|>user\n<tool_response>\n408\n</tool_response>");
  SLUICE_ASSERT_OK_AND_ASSIGN(const std::string second_tool, f->Decode({t.tokens().begin() + t.turns()[4].start,
                                                                        t.tokens().begin() + t.turns()[4].end}));
  EXPECT_EQ(second_tool, "\n<tool_response>\n30\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
}

// Qwen3's template renders the last assistant turn with an empty <think>
// block it would not show earlier: not append-only. The model's turns stay
// as sampled and each tool answer is the template's rendering at its
// position. Fails if the trajectory re-renders the model's turn.
TEST_F(QwenTrajectoryTest, Qwen3KeepsTheSampledTurns) {
  auto f = Format("qwen3");
  Opening opening;
  opening.messages = {{"user", "12*34?", ""}};
  opening.tools = "[" + CalculatorToolSchema() + "]";
  SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, opening, ToolCallFormat::kHermes, {}));
  const std::string turn = "<think>\nuse the tool\n</think>\n\n" + kCall;
  Recorder env;
  SLUICE_ASSERT_OK_AND_ASSIGN(std::optional<Action> a, Say(t, *f, turn, kImEnd, 0));
  ASSERT_TRUE(a.has_value());
  SLUICE_ASSERT_OK(t.AddEnvironmentTurn(env.Step(*a)));
  ExpectWellFormed(t, *f, env.received);
  EXPECT_EQ(env.received[0], turn);
  const Span& tool = t.turns().back();
  SLUICE_ASSERT_OK_AND_ASSIGN(const std::string text,
                              f->Decode({t.tokens().begin() + tool.start, t.tokens().begin() + tool.end}));
  EXPECT_EQ(text, "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
}

// Every limit ends the trajectory with its reason, and what was sampled
// stays: max_turns with the environment not done; a turn that fills
// max_tokens; a turn that stops at its own budget; an answer that would
// not fit (not appended); a message past max_message_bytes is cut and
// counted. Fails if a limit is not enforced or a trajectory is cut short.
TEST(TrajectoryTest, LimitsEndTheTrajectoryWithTheirReason) {
  auto f = Builtin();
  const StepResult more{{{"tool", "408", "call_0_0"}}, std::nullopt, false};
  {
    TrajectoryLimits l;
    l.max_turns = 1;
    SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, Calculator("q"), ToolCallFormat::kHermes, l));
    SLUICE_ASSERT_OK_AND_ASSIGN(std::optional<Action> a, Say(t, *f, kCall, model::ByteTokenizer::kEos, 0));
    SLUICE_ASSERT_OK(t.AddEnvironmentTurn(more));
    EXPECT_EQ(t.end_reason(), EndReason::kMaxTurns);
    EXPECT_EQ(t.TurnBudget(), 0);
  }
  {
    TrajectoryLimits l;
    l.max_tokens = 40;
    SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, Calculator("q"), ToolCallFormat::kHermes, l));
    const int32_t budget = t.TurnBudget();
    EXPECT_EQ(budget, 40 - static_cast<int32_t>(t.tokens().size()));
    const std::vector<TokenId> filled(static_cast<size_t>(budget), 'x');
    EXPECT_FALSE(t.AddModelTurn(std::vector<TokenId>(budget + 1, 'x'), std::vector<float>(budget + 1),
                                std::vector<PolicyVersion>(budget + 1), false)
                     .ok());
    SLUICE_ASSERT_OK_AND_ASSIGN(
        std::optional<Action> a,
        t.AddModelTurn(filled, std::vector<float>(filled.size()), std::vector<PolicyVersion>(filled.size()), false));
    EXPECT_FALSE(a.has_value());
    EXPECT_EQ(t.end_reason(), EndReason::kMaxTokens);
    EXPECT_EQ(t.tokens().size(), 40u);
  }
  {
    TrajectoryLimits l;
    l.max_turn_tokens = 5;
    SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, Calculator("q"), ToolCallFormat::kHermes, l));
    EXPECT_EQ(t.TurnBudget(), 5);
    SLUICE_ASSERT_OK_AND_ASSIGN(
        std::optional<Action> a,
        t.AddModelTurn({'a', 'b', 'c', 'd', 'e'}, std::vector<float>(5), std::vector<PolicyVersion>(5), false));
    EXPECT_EQ(t.end_reason(), EndReason::kLength);
  }
  {
    TrajectoryLimits l;
    l.max_tokens = 200;
    SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, Calculator("q"), ToolCallFormat::kHermes, l));
    SLUICE_ASSERT_OK_AND_ASSIGN(std::optional<Action> a, Say(t, *f, kCall, model::ByteTokenizer::kEos, 0));
    const size_t before = t.tokens().size();
    SLUICE_ASSERT_OK(t.AddEnvironmentTurn({{{"tool", std::string(500, '9'), "call_0_0"}}, std::nullopt, false}));
    EXPECT_EQ(t.end_reason(), EndReason::kContext);
    EXPECT_EQ(t.tokens().size(), before);
    ExpectWellFormed(t, *f, {kCall});
  }
  {
    TrajectoryLimits l;
    l.max_message_bytes = 100;
    SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, Calculator("q"), ToolCallFormat::kHermes, l));
    SLUICE_ASSERT_OK_AND_ASSIGN(std::optional<Action> a, Say(t, *f, kCall, model::ByteTokenizer::kEos, 0));
    // "é" straddles the cut: it goes whole.
    SLUICE_ASSERT_OK(t.AddEnvironmentTurn(
        {{{"tool", std::string(99, 'x') + "\xC3\xA9" + std::string(1000, 'y'), "call_0_0"}}, std::nullopt, false}));
    EXPECT_FALSE(t.ended());
    EXPECT_EQ(t.truncated_messages(), 1);
    EXPECT_EQ(t.turns().back().content, std::string(99, 'x') + " [1002 bytes cut]");
    ExpectWellFormed(t, *f, {kCall});
  }
}

// A malformed answer from the environment ends the trajectory as an
// environment error, naming what is wrong, and adds nothing: an unknown
// role, content that is not UTF-8, no message while not done. A reward it
// gives is kept. Misuse of the object is an error, not a corruption.
TEST(TrajectoryTest, MalformedEnvironmentAnswersEndItAsEnvErrors) {
  auto f = Builtin();
  const std::vector<std::pair<StepResult, std::string>> bad = {
      {{{{"narrator", "x", ""}}, std::nullopt, false}, "narrator"},
      {{{{"tool", "\xFF\xFE", "call_0_0"}}, std::nullopt, false}, "UTF-8"},
      {{{}, std::nullopt, false}, "no message"},
  };
  for (const auto& [step, needle] : bad) {
    SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, Calculator("q"), ToolCallFormat::kHermes, {}));
    SLUICE_ASSERT_OK_AND_ASSIGN(std::optional<Action> a, Say(t, *f, kCall, model::ByteTokenizer::kEos, 0));
    const size_t before = t.tokens().size();
    SLUICE_ASSERT_OK(t.AddEnvironmentTurn(step));
    EXPECT_EQ(t.end_reason(), EndReason::kEnvError);
    EXPECT_NE(t.end_detail().find(needle), std::string::npos) << t.end_detail();
    EXPECT_EQ(t.tokens().size(), before);
    EXPECT_FALSE(t.AddEnvironmentTurn(step).ok());
    EXPECT_FALSE(Say(t, *f, "x", model::ByteTokenizer::kEos, 0).ok());
  }
  SLUICE_ASSERT_OK_AND_ASSIGN(Trajectory t, Trajectory::Open(f, Calculator("q"), ToolCallFormat::kHermes, {}));
  EXPECT_FALSE(t.AddEnvironmentTurn({{}, 1.0, true}).ok());  // no action to answer
  SLUICE_ASSERT_OK_AND_ASSIGN(std::optional<Action> a, Say(t, *f, "#5", model::ByteTokenizer::kEos, 0));
  SLUICE_ASSERT_OK(t.AddEnvironmentTurn({{}, 0.75, true}));
  EXPECT_EQ(t.end_reason(), EndReason::kDone);
  EXPECT_EQ(t.reward(), 0.75);
  // Openings are checked too: a role an opening cannot have, content that is
  // not UTF-8, tools that are not an array, one too long for any turn.
  SLUICE_EXPECT_ERROR(Trajectory::Open(f, {{{"tool", "x", ""}}, ""}, ToolCallFormat::kHermes, {}), kInvalidArgument,
                      "role");
  SLUICE_EXPECT_ERROR(Trajectory::Open(f, {{{"user", "\xC0\x80", ""}}, ""}, ToolCallFormat::kHermes, {}),
                      kInvalidArgument, "UTF-8");
  SLUICE_EXPECT_ERROR(Trajectory::Open(f, {{{"user", "x", ""}}, "{}"}, ToolCallFormat::kHermes, {}), kInvalidArgument,
                      "tools");
  TrajectoryLimits small;
  small.max_tokens = 10;
  SLUICE_EXPECT_ERROR(Trajectory::Open(f, Calculator("a long question"), ToolCallFormat::kHermes, small), kOutOfRange,
                      "max_tokens");
}

}  // namespace
}  // namespace sluice::agent
