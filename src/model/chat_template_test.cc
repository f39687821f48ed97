#include "sluice/model/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace sluice::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const fs::path kData = fs::path(SLUICE_TEST_DATA) / "chat_templates";

std::vector<Json> ReadJsonLines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<Json> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(Json::parse(line));
  }
  return out;
}

std::string Render(std::string_view source, const Json& context) {
  auto t = ChatTemplate::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + t.status().ToString();
  auto text = t->Render(context);
  return text.ok() ? *text : "RENDER ERROR: " + text.status().ToString();
}

// The real templates of tokenizer_config.json on conversations with system
// prompts, several turns, Qwen3's thinking switch and reasoning in earlier
// turns, tools, tool calls and responses, non-ASCII text and padded
// whitespace: byte for byte the reference's text, or an error where the
// reference raises one (scripts/tokenizer_fixtures/make_chat_fixtures.mjs).
class ChatTemplateReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateReference, RendersAsTheReference) {
  auto t = ChatTemplate::Load((kData / GetParam()).string());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::vector<Json> cases = ReadJsonLines(kData / "cases.jsonl");
  const std::vector<Json> expected = ReadJsonLines(kData / GetParam() / "expected.jsonl");
  ASSERT_EQ(cases.size(), expected.size());
  ASSERT_GE(cases.size(), 10u);
  for (size_t i = 0; i < cases.size(); ++i) {
    auto text = t->Render(cases[i]);
    if (expected[i].contains("error")) {
      EXPECT_FALSE(text.ok()) << "case " << i + 1 << " should fail: " << expected[i]["error"];
      continue;
    }
    ASSERT_TRUE(text.ok()) << "case " << i + 1 << ": " << text.status().ToString();
    EXPECT_EQ(*text, expected[i]["text"].get<std::string>()) << "case " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ChatTemplateReference, ::testing::Values("qwen2_5", "qwen3", "llama3_1", "llama3_2"));

TEST(ChatTemplateTest, WhitespaceControlAsTransformersConfiguresJinja) {
  const Json none = Json::object();
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the
  // indentation before one; '-' strips every whitespace on its side.
  EXPECT_EQ(Render("{% if true %}\n  yes\n{% endif %}\nend", none), "  yes\nend");
  EXPECT_EQ(Render("    {% if true %}x{% endif %}", none), "x");
  EXPECT_EQ(Render("a  {%- if true %} b {% endif -%}  c", none), "a b c");
  EXPECT_EQ(Render("{{ 'x' }}\n{{- 'y' }}", none), "xy");
  EXPECT_EQ(Render("{{ 'x' }}\n{{ 'y' }}", none), "x\ny");  // no trim after an expression
  EXPECT_EQ(Render("a {# note #} b", none), "a  b");
  EXPECT_EQ(Render("x {% if true %}y{% endif %}", none), "x y");  // not alone on its line: kept
}

TEST(ChatTemplateTest, ExpressionsLoopsAndNamespaces) {
  const Json ctx = {{"xs", {3, 1, 2}}, {"d", {{"b", 1}, {"a", 2}}}, {"s", "  Hello, World  "}};
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.index0 }}:{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", ctx),
            "0:3,1:1,2:2");
  EXPECT_EQ(Render("{{ xs[::-1] }} {{ xs[1:] }} {{ xs[-1] }} {{ xs | length }}", ctx), "[2, 1, 3] [1, 2] 2 3");
  EXPECT_EQ(
      Render("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}", ctx),
      "6");
  // A plain set inside a loop does not leak out of it.
  EXPECT_EQ(Render("{% set n = 0 %}{% for x in xs %}{% set n = n + x %}{% endfor %}{{ n }}", ctx), "0");
  EXPECT_EQ(Render("{{ s.strip().split(', ')[1] }}|{{ s | trim | upper }}|{{ s.startswith('  He') }}", ctx),
            "World|HELLO, WORLD|True");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx), "b=1;a=2;");
  EXPECT_EQ(Render("{{ d | tojson }}|{{ {'k': [1, 2.5, none, true, 'é\"'] } | tojson }}", ctx),
            "{\"b\": 1, \"a\": 2}|{\"k\": [1, 2.5, null, true, \"é\\\"\"]}");
  EXPECT_EQ(Render("{{ d | tojson(indent=2) }}", ctx), "{\n  \"b\": 1,\n  \"a\": 2\n}");
  EXPECT_EQ(Render("{{ missing }}|{{ missing is defined }}|{{ missing.attr is defined }}|{{ 7 // 2 }} {{ -7 // 2 }} "
                   "{{ 7 % 3 }} {{ 1 / 2 }} {{ 'a' ~ 1 }} {{ 'b' in 'abc' }} {{ 2 if false else 3 }}",
                   ctx),
            "|False|False|3 -4 1 0.5 a1 True 3");
}

TEST(ChatTemplateTest, UnsupportedAndBrokenTemplatesAreRefusedWithTheirLine) {
  struct Case {
    const char* source;
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {"a\n{% macro m() %}{% endmacro %}", "line 2: statement 'macro' is not supported"},
           {"{% if x %}never closed", "'if' is never closed"},
           {"{{ 'unterminated }}", "never closed"},
           {"x\ny {{ a | frobnicate }}", "line 2: filter 'frobnicate' is not supported"},
           {"{% if a is prime %}{% endif %}", "test 'prime' is not supported"},
           {"{% endfor %}", "'endfor' without its opening statement"},
           {"{{ 1 + }}", "expression ends early"},
       }) {
    auto t = ChatTemplate::Parse(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.needle), std::string::npos) << c.source << ": " << t.status().ToString();
  }
  // Nesting deep enough to exhaust the stack is refused.
  auto deep = ChatTemplate::Parse("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}");
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("nested deeper"), std::string::npos);
  std::string ifs;
  for (int k = 0; k < 10000; ++k) ifs += "{% if true %}";
  EXPECT_FALSE(ChatTemplate::Parse(ifs).ok());
  auto raised = ChatTemplate::Parse("{{ raise_exception('no system role') }}");
  ASSERT_TRUE(raised.ok());
  auto text = raised->Render(Json::object());
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("no system role"), std::string::npos);
  EXPECT_EQ(ChatTemplate::Load((kData / "no-such-model").string()).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice::model
