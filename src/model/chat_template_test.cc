#include "sluice/model/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sluice/common/file_util.h"

namespace sluice::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const fs::path kData = fs::path(SLUICE_TEST_DATA) / "chat_templates";

// 4 Dec 2026, 09:30 (a Friday): what strftime_now formats in these tests.
std::tm FixedNow() {
  std::tm now{};
  now.tm_year = 2026 - 1900;
  now.tm_mon = 11;
  now.tm_mday = 4;
  now.tm_hour = 9;
  now.tm_min = 30;
  return now;
}

std::vector<Json> ReadJsonLines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<Json> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(Json::parse(line));
  }
  return out;
}

// The rendering, or "PARSE ERROR: ..." / "ERROR: ...".
std::string Render(std::string_view source, const Json& context) {
  auto t = ChatTemplate::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + t.status().ToString();
  auto text = t->Render(context, FixedNow());
  return text.ok() ? *text : "ERROR: " + text.status().ToString();
}

// The variables of the engine tests below.
const Json& Context() {
  static const Json context = Json::parse(R"({
    "xs": [3, 1, 2], "d": {"b": 1, "a": 2}, "s": "  Hello, World  ", "u": "héllo🤗", "n": null,
    "msgs": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "c"}]
  })");
  return context;
}

std::string R(std::string_view source) { return Render(source, Context()); }

// The real templates of four models' tokenizer_config.json on the
// conversations of cases.jsonl (system prompts, several turns, Qwen3's
// thinking switch and reasoning in earlier turns, tools, tool calls and
// responses, non-ASCII text, padded whitespace): byte for byte the
// reference's text, or an error where the reference raises one
// (scripts/tokenizer_fixtures/make_chat_fixtures.mjs made expected.jsonl
// with @huggingface/jinja; Python's Jinja2 as transformers configures it
// renders every case the same).
class ChatTemplateReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateReference, RendersAsTheReference) {
  auto t = ChatTemplate::Load((kData / GetParam()).string());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::vector<Json> cases = ReadJsonLines(kData / "cases.jsonl");
  const std::vector<Json> expected = ReadJsonLines(kData / GetParam() / "expected.jsonl");
  ASSERT_EQ(cases.size(), expected.size());
  ASSERT_GE(cases.size(), 15u);
  for (size_t i = 0; i < cases.size(); ++i) {
    auto text = t->Render(cases[i], FixedNow());
    if (expected[i].contains("error")) {
      ASSERT_FALSE(text.ok()) << "case " << i + 1 << " should fail with " << expected[i]["error"];
      EXPECT_NE(text.status().message().find(expected[i]["error"].get<std::string>()), std::string::npos)
          << "case " << i + 1 << ": " << text.status().ToString();
      continue;
    }
    ASSERT_TRUE(text.ok()) << "case " << i + 1 << ": " << text.status().ToString();
    EXPECT_EQ(*text, expected[i]["text"].get<std::string>()) << "case " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ChatTemplateReference, ::testing::Values("qwen2_5", "qwen3", "llama3_1", "llama3_2"));

TEST(ChatTemplateTest, StrftimeNowGivesLlamaItsDate) {
  // Llama 3.2's template asks strftime_now for the date when the context
  // has no date_string: the same text as the first case, which sets it.
  auto t = ChatTemplate::Load((kData / "llama3_2").string());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Json context = ReadJsonLines(kData / "cases.jsonl")[0];
  context.erase("date_string");
  auto text = t->Render(context, FixedNow());
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, ReadJsonLines(kData / "llama3_2" / "expected.jsonl")[0]["text"].get<std::string>());
  EXPECT_NE(text->find("Today Date: 04 Dec 2026\n"), std::string::npos);
  // Without a given time, the current one (a date, whatever it is).
  auto today = t->Render(context);
  ASSERT_TRUE(today.ok()) << today.status().ToString();
  EXPECT_NE(today->find("Today Date: "), std::string::npos);
}

TEST(ChatTemplateTest, AnEmptyConversationFailsAsInTransformers) {
  // Python's Jinja2 raises for messages[0]['role'] of an empty list (an
  // item of an undefined value); @huggingface/jinja renders it instead.
  auto t = ChatTemplate::Load((kData / "qwen2_5").string());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto text = t->Render(Json{{"messages", Json::array()}, {"add_generation_prompt", true}});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("list object has no element 0"), std::string::npos)
      << text.status().ToString();
}

// The engine on its own. Every expected text below is what Python's Jinja2
// gives with transformers' settings (trim_blocks, lstrip_blocks, its tojson)
// for the same template and variables.
TEST(ChatTemplateTest, WhitespaceControlAsTransformersConfiguresJinja) {
  // trim_blocks drops the newline after a block or comment tag, lstrip_blocks
  // the indentation before one that starts its line, '-' every whitespace on
  // its side, '+' neither; the template's final newline goes, CRLF becomes LF.
  EXPECT_EQ(R("{% if true %}\n  yes\n{% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(R("    {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(R("a  {%- if true %} b {% endif -%}  c"), "a b c");
  EXPECT_EQ(R("{{ 'x' }}\n{{- 'y' }}"), "xy");
  EXPECT_EQ(R("{{ 'x' }}\n{{ 'y' }}"), "x\ny");
  EXPECT_EQ(R("a {# note #} b\n  {# whole line #}\nc"), "a  b\nc");
  EXPECT_EQ(R("x {% if true %}y{% endif %}"), "x y");
  EXPECT_EQ(R("{%+ if true %}\n  a\n  {%+ endif +%}\nb"), "  a\n  \nb");
  EXPECT_EQ(R("line\r\nnext\r\n"), "line\nnext");
  EXPECT_EQ(R("{% for x in xs %}\n  - {{ x }}\n{% endfor %}\n"), "  - 3\n  - 1\n  - 2\n");
  EXPECT_EQ(R("{{- '  a  ' -}}   \n  {{- 'b' }}"), "  a  b");
  EXPECT_EQ(R("{%- if true -%}\n\n  a  \n\n{%- endif -%}\n\nb"), "ab");
  EXPECT_EQ(R("  {# c #}  x"), "  x");
  EXPECT_EQ(R("a\n  {#- c -#}\n  b"), "ab");
  EXPECT_EQ(R("{% if true %}a{% endif %}\n\n"), "a");
  EXPECT_EQ(R("x\n    {%- if true %}y{% endif %}"), "xy");
  EXPECT_EQ(R("{{ 'a' }}  {% if true %}\n b{% endif %}"), "a   b");
  EXPECT_EQ(R("\t{% for i in [1,2] %}\n\t{{ i }}\n\t{% endfor %}\n"), "\t1\n\t2\n");
  EXPECT_EQ(R("{%- for m in msgs -%}\n  {{- m.content -}}\n{%- endfor %}"), "abc");
}

TEST(ChatTemplateTest, TagsStringsAndNumbersLexAsInJinja) {
  // A tag ends at its closing delimiter outside brackets and strings.
  EXPECT_EQ(R("{{ {'a': {'b': 1}} }}|{{ {'k': [1, {'z': none}]}['k'][1] }}"), "{'a': {'b': 1}}|{'z': None}");
  EXPECT_EQ(R("{% set x = {'k': '}}'} %}{{ x.k }}"), "}}");
  EXPECT_EQ(R("{{ '%}' }}{# '#} ' #}"), "%} ' #}");
  EXPECT_EQ(R("{{ \"a\" \"b\" 'c' }}"), "abc");
  EXPECT_EQ(R("{{ 0x1F }} {{ 1_000 }} {{ 1e3 }} {{ 0o17 }} {{ 0b101 }} {{ 1.5e-3 }} {{ 2E2 }}"),
            "31 1000 1000.0 15 5 0.0015 200.0");
  EXPECT_EQ(R("{{ 'a\\qb' }}|{{ '\\101\\x41\\u0041\\U0001F917' }}|{{ 'tab\\there' }}|{{ 'line\\\ncont' }}"),
            "a\\qb|AAA🤗|tab\there|linecont");
  EXPECT_EQ(R("{{ '{{' }} {{ '{%' }} {{ '}}' }}"), "{{ {% }}");
}

TEST(ChatTemplateTest, ForLoops) {
  EXPECT_EQ(R("{% for x in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ "
              "loop.length }};{% endfor %}"),
            "013TrueFalse3;122FalseFalse3;231FalseTrue3;");
  EXPECT_EQ(
      R("{% for x in xs %}{{ loop.previtem }}-{{ x }}-{{ loop.nextitem }}|{{ loop.cycle('a', 'b') }};{% endfor %}"),
      "-3-1|a;3-1-2|b;1-2-|a;");
  EXPECT_EQ(R("{% for x in [] %}no{% else %}empty{% endfor %}|{% for x in missing %}no{% else %}undef{% endfor %}"),
            "empty|undef");
  EXPECT_EQ(R("{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }};{% endfor %}"), "312;222;");
  EXPECT_EQ(R("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ "
              "x }}{% endfor %}"),
            "0134");
  EXPECT_EQ(R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d | items %}{{ k }}{{ v }}{% "
              "endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}"),
            "b=1;a=2;b1a237");
  EXPECT_EQ(R("{% for c in u %}[{{ c }}]{% endfor %}{% for k in d %}{{ k }}{% endfor %}"), "[h][é][l][l][o][🤗]ba");
  EXPECT_EQ(R("{% for x in [1] %}{{ x }}{% else %}none{% endfor %}"), "1");
  EXPECT_EQ(R("{{ loop }}|{% for x in xs %}{% for y in xs %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}"),
            "|1231|1232|1233|");
  EXPECT_EQ(R("{% for m in msgs %}{{ m.role }}{% if not loop.last %}, {% endif %}{% endfor %}"), "user, system, user");
  EXPECT_EQ(R("{% for m in msgs %}{% set outer = loop %}{% for c in m.content %}{{ outer.index }}{{ loop.index }}{% "
              "endfor %}{% endfor %}"),
            "112131");
}

TEST(ChatTemplateTest, SetScopingAndNamespaces) {
  // A plain set in a loop lasts for that iteration; a namespace carries
  // values out; an if opens no scope.
  EXPECT_EQ(R("{% set n = 0 %}{% for x in xs %}{% set n = n + x %}{{ n }},{% endfor %}{{ n }}"), "3,1,2,0");
  EXPECT_EQ(R("{% set ns = namespace(n=0, seen=[]) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% set ns.seen = "
              "ns.seen + [x] %}{% endfor %}{{ ns.n }} {{ ns.seen }}"),
            "6 [3, 1, 2]");
  EXPECT_EQ(R("{% set x %}a{{ 1 + 1 }}b{% endset %}[{{ x }}]"), "[a2b]");
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ a }}{{ b }}{{ (a, b) }}"), "12(1, 2)");
  EXPECT_EQ(
      R("{% if xs %}{% set t = 'yes' %}{% endif %}{{ t }}|{% for x in xs %}{% set last = x %}{% endfor %}[{{ last }}]"),
      "yes|[]");
  EXPECT_EQ(R("{% set ns = namespace(items=[]) %}{% for m in msgs %}{% if m.role == 'user' %}{% set ns.items = "
              "ns.items + [m.content] %}{% endif %}{% endfor %}{{ ns.items | join(',') }}"),
            "a,c");
  EXPECT_EQ(R("{% set a = 1 %}{% set b = a + 1 %}{% set a = b * 10 %}{{ a }} {{ b }}"), "20 2");
  EXPECT_EQ(
      R("{% set ns = namespace(a=1) %}{% set ns.b = ns.a + 1 %}{{ ns.b }}{{ ns['a'] }}{{ ns.missing is defined }}"),
      "21False");
}

TEST(ChatTemplateTest, ItemsAndSlicesByCodePoint) {
  EXPECT_EQ(R("{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[-1] }} {{ xs[5:0:-1] }} {{ xs[::2] }} {{ xs[10] is "
              "defined }} {{ xs[-10:10] }}"),
            "[2, 1, 3] [1, 2] [3, 1] 2 [2, 1] [3, 2] False [3, 1, 2]");
  EXPECT_EQ(R("{{ u[1:3] }} {{ u[::-1] }} {{ u[-1] }} {{ u | length }} {{ u[0] }}"), "él 🤗olléh 🤗 6 h");
  EXPECT_EQ(R("{{ (1, 2)[1] }} {{ [1,2,3][1:][0] }} {{ 'abc'[1] }} {{ xs.1 }}"), "2 2 b 1");
  EXPECT_EQ(R("{{ 'é' * 0 }}|{{ [] * 3 }}|{{ 'ab'[5:] }}|{{ 'ab'[-5:] }}"), "|[]||ab");
}

TEST(ChatTemplateTest, TojsonIsJsonDumps) {
  // json.dumps(ensure_ascii=False): ", " and ": ", floats as Python writes
  // them; indent switches the item separator to ","; the first positional
  // argument is ensure_ascii, as transformers declares it.
  EXPECT_EQ(R("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ xs | tojson(indent='\t') }}|{{ d | "
              "tojson(sort_keys=true) }}|{{ d | tojson(separators=(',', ':')) }}"),
            "{\"b\": 1, \"a\": 2}|{\n  \"b\": 1,\n  \"a\": 2\n}|[\n\t3,\n\t1,\n\t2\n]|{\"a\": 2, \"b\": "
            "1}|{\"b\":1,\"a\":2}");
  EXPECT_EQ(R("{{ ('é\\x01\\x7f\"\\\\' ~ '\\n') | tojson }}|{{ 'é🤗' | tojson(ensure_ascii=true) }}|{{ 'é' | "
              "tojson(4) }}"),
            "\"é\\u0001\x7f"
            "\\\"\\\\\\n\"|\"\\u00e9\\ud83e\\udd17\"|\"\\u00e9\"");
  EXPECT_EQ(R("{{ [1.0, 0.1, 1e16, 1e-5, 100000.0, -0.0, 2.5e-7, 123456789012345678.0, 1/3] | tojson }}|{{ [[], {}, "
              "[[]]] | tojson(indent=1) }}"),
            "[1.0, 0.1, 1e+16, 1e-05, 100000.0, -0.0, 2.5e-07, 1.2345678901234568e+17, 0.3333333333333333]|[\n [],\n "
            "{},\n [\n  []\n ]\n]");
  EXPECT_EQ(
      R("{{ xs | tojson(indent=none) }} {{ 'é' | tojson(ensure_ascii=false) }} {{ {'a': [1, 2]} | tojson(indent=0) }}"),
      "[3, 1, 2] \"é\" {\n\"a\": [\n1,\n2\n]\n}");
}

TEST(ChatTemplateTest, ValuesPrintAndComputeAsInPython) {
  EXPECT_EQ(R("{{ [1, 'a', none, true, 1.5, \"it's\", 'q\"', 'tab\\t', '\\x00é\\u200b'] }}|{{ {'a': {'b': none}} }}|{{ "
              "(1,) }}|{{ () }}|{{ 1/3 }}|{{ 10/2 }}|{{ 1e16 }}|{{ 1e-5 }}"),
            "[1, 'a', None, True, 1.5, \"it's\", 'q\"', 'tab\\t', '\\x00é\\u200b']|{'a': {'b': "
            "None}}|(1,)|()|0.3333333333333333|5.0|1e+16|1e-05");
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7.5 % 2 }} {{ 7.5 // 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ -2 "
              "** 2 }} {{ 'ab' * 2 }} {{ [1] * 2 }} {{ true + 1 }} {{ 1 == 1.0 }} {{ [1] == (1,) }}"),
            "3 -4 -2 0.5 3.0 1024 0.5 4 abab [1, 1] 2 True False");
  EXPECT_EQ(R("{{ not 1 == 2 }} {{ -1 | abs }} {{ - 3 + 1 }} {{ 2 * 3 ~ 'a' }} {{ -xs[0] }}"), "True 1 -2 6a -3");
  EXPECT_EQ(R("{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(3, 0, -1) | list }}"),
            "[0, 1, 2] [1, 4, 7] [3, 2, 1]");
  EXPECT_EQ(R("{{ dict(a=1, b='x') }} {{ namespace(a=1) }}"), "{'a': 1, 'b': 'x'} <Namespace {'a': 1}>");
  EXPECT_EQ(R("{{ msgs[0] }} {{ d.items() | list }} {{ true }}{{ True }}{{ none }}{{ None }} {{ 3 > 2 > 1 }}"),
            "{'role': 'user', 'content': 'a'} [('b', 1), ('a', 2)] TrueTrueNoneNone True");
}

TEST(ChatTemplateTest, Filters) {
  // Python's whitespace for trim (U+3000, U+0085), its full case mappings
  // of ß and ligatures, Jinja's title rule beside str.title()'s.
  EXPECT_EQ(R("{{ '\\u3000a\\x85' | trim }}|{{ '--a--' | trim('-') }}|{{ 'ÉCOLE' | lower }}|{{ 'straße ﬁx' | upper "
              "}}|{{ 'İ' | lower | length }}|{{ 'ßa'.title() }}|{{ 'straße' | upper }}|{{ \"it's a-b(c d\" | title "
              "}}|{{ \"it's a-b(c d\".title() }}|{{ 'hELLO wORLD' | capitalize }}"),
            "a|a|école|STRASSE FIX|2|Ssa|STRASSE|It's A-B(C D|It'S A-B(C D|Hello world");
  EXPECT_EQ(R("{{ xs | length }} {{ d | count }} {{ missing | length }} {{ 'abc' | first }} {{ xs | last }} {{ [] | "
              "first is defined }} {{ xs | join(', ') }} {{ msgs | join('/', attribute='role') }}"),
            "3 2 0 a 2 False 3, 1, 2 user/system/user");
  EXPECT_EQ(R("{{ missing | default('x') }} {{ none | default('x') }} {{ '' | default('x', true) }} {{ 0 | d(5) }} {{ "
              "xs | list }} {{ 'ab' | list }} {{ d | list }} {{ xs | reverse | list }} {{ 'abc' | reverse }}"),
            "x None x 0 [3, 1, 2] ['a', 'b'] ['b', 'a'] [2, 1, 3] cba");
  EXPECT_EQ(R("{{ msgs | map(attribute='role') | list }} {{ ['a', 'B'] | map('upper') | join }} {{ msgs | "
              "selectattr('role', 'equalto', 'user') | map(attribute='content') | join }} {{ msgs | rejectattr('role', "
              "'eq', 'user') | list | length }} {{ xs | select('odd') | list }} {{ xs | reject('odd') | list }} {{ "
              "['a', 'A', 'b', 'a'] | unique | list }}"),
            "['user', 'system', 'user'] AB ac 1 [3, 1] [2] ['a', 'b']");
  EXPECT_EQ(R("{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '1.5' | float }} {{ 'x' | "
              "float }} {{ -3 | abs }} {{ 'a-b-c' | replace('-', '+', 1) }} {{ 'abc' | replace('', '.') }} {{ 5 | "
              "string }}{{ none | string }}"),
            "42 4 7 3 1.5 0.0 3 a+b-c .a.b.c. 5None");
  EXPECT_EQ(R("{{ msgs | selectattr('role', 'in', ['user', 'system']) | list | length }} {{ [1,2] | first }}{{ {'a': "
              "1} | first }}"),
            "3 1a");
  EXPECT_EQ(R("{{ '   ' | trim | length }} {{ ' x ' | trim('') }} {{ 'xax' | trim('x') }}"), "0  x  a");
  EXPECT_EQ(R("{{ 'A B' | lower | replace(' ', '_') }} {{ 'a' | upper * 2 }}"), "a_b AA");
}

TEST(ChatTemplateTest, StringMethods) {
  EXPECT_EQ(
      R("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ '  a  "
        "b '.split() }}|{{ 'a b c'.split(none, 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}"),
      "Hello, World|Hello, World  |  Hello, World|a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a,b', 'c']|['a', "
      "'b', 'c']");
  EXPECT_EQ(R("{{ 'aaa'.replace('a', 'b', 2) }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith('bc') }} {{ "
              "'héllo'.find('l') }} {{ 'banana'.count('a') }} {{ '-'.join(['a', 'b']) }} {{ "
              "'prefix_x'.removeprefix('prefix_') }} {{ 'x.txt'.removesuffix('.txt') }} {{ 'hello'.upper() }}{{ "
              "'HeLLo'.lower() }}"),
            "bba True True 2 3 a-b x x HELLOhello");
}

TEST(ChatTemplateTest, TestsAndComparisons) {
  EXPECT_EQ(R("{{ 1 is number }} {{ true is number }} {{ true is integer }} {{ 1.5 is float }} {{ 'a' is string }} {{ "
              "{} is mapping }} {{ [] is sequence }} {{ 'a' is iterable }} {{ none is none }} {{ n is not none }} {{ 3 "
              "is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 1 is eq 1 }} {{ missing is undefined }} {{ "
              "missing is iterable }} {{ d is callable }} {{ s.strip is callable }}"),
            "True True False True True True True True True False True True True True True True False True");
  EXPECT_EQ(R("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' in 'abc' }} {{ 'x' not in ['a'] }} {{ 'b' in d }} {{ 2 in xs }} "
              "{{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 'a' if false }}|{{ 'y' if true else 'n' }} {{ not missing }} "
              "{{ missing or 'z' }} {{ 0 and 1 }} {{ none ~ 'x' ~ missing ~ 1 }}"),
            "True False True True True True True True |y True z 0 Nonex1");
  EXPECT_EQ(R("{{ 1 if 0 else 2 if 0 else 3 }}"), "3");
  EXPECT_EQ(R("{{ xs|length > 2 and 'long' or 'short' }}"), "long");
  EXPECT_EQ(R("{% if 'tool_calls' in msgs[0] %}y{% else %}n{% endif %} {{ msgs[0].tool_calls is defined }} {{ "
              "msgs[0].get('role') }}"),
            "n False user");
}

TEST(ChatTemplateTest, UndefinedValuesAreJinjasDefaultUndefined) {
  // Falsy, printed as nothing, `is defined` false; a missing attribute of a
  // dict or of none is undefined too.
  EXPECT_EQ(R("{{ missing }}|{{ missing is defined }}|{{ d.nokey is defined }}|{{ none.attr is defined }}|{{ "
              "msgs[0].role }}|{{ msgs[0]['content'] }}|{{ d.get('a') }}{{ d.get('z', 9) }}{{ d.get('z') }}|{{ "
              "d.keys() | list }}|{{ d.values() | list }}|{{ xs.0 }}"),
            "|False|False|False|user|a|29None|['b', 'a']|[1, 2]|3");
}

TEST(ChatTemplateTest, StrftimeNowFormatsTheGivenTime) {
  EXPECT_EQ(R("{{ strftime_now('%Y-%m-%d %H:%M %b %A %d') }}"), "2026-12-04 09:30 Dec Friday 04");
}
TEST(ChatTemplateTest, UnsupportedAndBrokenTemplatesAreRefusedWhenParsed) {
  struct Case {
    const char* source;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"a\n{% macro m() %}{% endmacro %}", "line 2, column 4: statement 'macro' is not supported"},
           {"{% include 'x.jinja' %}", "line 1, column 4: statement 'include' is not supported"},
           {"{% raw %}x{% endraw %}", "line 1, column 4: statement 'raw' is not supported"},
           {"x\ny {{ a | frobnicate }}", "line 2, column 10: filter 'frobnicate' is not supported"},
           {"{% if a is prime %}{% endif %}", "line 1, column 12: test 'prime' is not supported"},
           {"{{ 'x'.isdigit() }}", "line 1, column 8: method 'isdigit' is not supported"},
           {"{{ xs.append(1) }}", "line 1, column 7: method 'append' is not supported"},
           {"{{ cycler(1, 2) }}", "line 1, column 4: function 'cycler' is not supported"},
           {"{% for x in xs recursive %}{% endfor %}", "line 1, column 16: recursive for loops are not supported"},
           {"{% if x %}\nnever closed",
            "line 1, column 4: 'if' is never closed (expected 'elif' or 'else' or 'endif')"},
           {"{% for x in xs %}{% if x %}{% endfor %}",
            "line 1, column 31: 'endfor' where 'elif' or 'else' or 'endif' was expected"},
           {"{% endfor %}", "line 1, column 4: 'endfor' without its opening statement"},
           {"{% break %}", "line 1, column 4: 'break' outside a for loop"},
           {"x\n  {{ a", "line 2, column 3: '{{' is never closed with '}}'"},
           {"{% if x", "line 1, column 1: '{%' is never closed with '%}'"},
           {"{# note", "line 1, column 1: comment '{#' is never closed with '#}'"},
           {"{{ 'unterminated }}", "line 1, column 4: string literal is never closed"},
           {"{{ 1 + }}", "line 1, column 8: expected an expression, found '}}'"},
           {"{{ a b }}", "line 1, column 6: expected '}}', found 'b'"},
           {"{{ (1 }}", "line 1, column 7: unexpected '}'"},
           {"{{ 'a' @ 1 }}", "line 1, column 8: unexpected character '@' in a tag"},
           {"{{ 'bad \\N{DASH}' }}", "line 1, column 4: string literal: \\N{...} escapes are not supported"},
           {"ok \xff", "chat template: not valid UTF-8 at byte 3"},
       }) {
    auto t = ChatTemplate::Parse(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.message), std::string::npos) << c.source << ": " << t.status().ToString();
  }
}

TEST(ChatTemplateTest, ValuesATemplateCannotUseAreRenderErrors) {
  struct Case {
    const char* source;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"x\n{{ raise_exception('no system role' ~ '!') }}", "line 2, column 4: raise_exception: no system role!"},
           {"{{ missing.attr }}", "line 1, column 12: 'missing' is undefined"},
           {"{{ missing['x'] }}", "'missing' is undefined"},
           {"{{ missing + 1 }}", "'missing' is undefined"},
           {"{{ msgs[5].role }}", "line 1, column 12: list object has no element 5"},
           {"{{ d.nokey.more }}", "'dict object' has no attribute 'nokey'"},
           {"{{ none.x.y }}", "'None' has no attribute 'x'"},
           {"{{ 'a' + 1 }}", "line 1, column 8: unsupported operand types for +: str and int"},
           {"{{ 'a' ~ 1 + 2 }}", "unsupported operand types for +: str and int"},  // ~ binds first
           {"{{ 'a' < 1 }}", "'<' is not supported between str and int"},
           {"{{ 'x' in none }}", "'in' needs a container, not none"},
           {"{% for x in 5 %}{% endfor %}", "line 1, column 13: cannot iterate over a value of type int"},
           {"{% for a, b in [[1, 2, 3]] %}{% endfor %}", "cannot unpack 3 value(s) into 2 names"},
           {"{% set ns = 3 %}{% set ns.x = 1 %}", "cannot set attribute 'x' of 'ns', which is not a namespace()"},
           {"{{ xs[1:'a'] }}", "slice bounds must be integers or none, not str"},
           {"{{ d[1:2] }}", "a value of type dict cannot be sliced"},
           {"{{ 9223372036854775807 + 1 }}", "integer overflow (integers are 64-bit here)"},
           {"{{ 1 / 0 }}", "division by zero"},
           {"{{ namespace(a=1) | tojson }}", "tojson: a value of type namespace is not JSON serializable"},
           {"{{ d | tojson(indent=2, spaces=1) }}", "filter 'tojson' got an unexpected keyword argument 'spaces'"},
           {"{{ 'x'.upper }}", "cannot print function 'str.upper' (call it)"},
           {"{{ 'x'.zfill }}", "method 'zfill' of str is not supported"},
           {"{{ d.pop }}", "method 'pop' of dict is not supported"},
           {"{{ unknown_function() }}", "'unknown_function' is undefined, so it cannot be called"},
           {"{{ '%s' % 1 }}", "string formatting with '%' is not supported"},
       }) {
    EXPECT_NE(R(c.source).find(std::string("ERROR: InvalidArgument: chat template ")), std::string::npos) << c.source;
    EXPECT_NE(R(c.source).find(c.message), std::string::npos) << c.source << ": " << R(c.source);
  }
}

class ChatTemplateLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("chat_template_" + std::to_string(::getpid()));
    static_cast<void>(sluice::RemoveTree(dir_));
    fs::create_directories(dir_);
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(dir_)); }
  void Write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  Result<ChatTemplate> Load() { return ChatTemplate::Load(dir_.string()); }
  fs::path dir_;
};

TEST_F(ChatTemplateLoadTest, SpecialTokensAndDefaults) {
  Write("tokenizer_config.json", Json{{"chat_template",
                                       "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|"
                                       "{{ tools }}|{{ documents }}|{{ add_generation_prompt }}"},
                                      {"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                                      {"eos_token", "</s>"},
                                      {"unk_token", nullptr}}
                                     .dump());
  auto t = Load();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  // As transformers passes them: the special tokens that are set, tools
  // and documents none, no generation prompt; the context overrides them.
  EXPECT_EQ(*t->Render(Json::object()), "<s>|</s>|False|None|None|False");
  EXPECT_EQ(*t->Render(Json{{"bos_token", "B"}, {"add_generation_prompt", true}}), "B|</s>|False|None|None|True");
}

TEST_F(ChatTemplateLoadTest, NamedTemplatesTakeDefaultAndToolUseWithTools) {
  Write("tokenizer_config.json",
        Json{{"chat_template", Json::array({{{"name", "rag"}, {"template", "R"}},
                                            {{"name", "default"}, {"template", "D"}},
                                            {{"name", "tool_use"}, {"template", "T{{ tools | length }}"}}})}}
            .dump());
  auto t = Load();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t->Render(Json::object()), "D");
  EXPECT_EQ(*t->Render(Json{{"tools", nullptr}}), "D");
  EXPECT_EQ(*t->Render(Json{{"tools", {1, 2}}}), "T2");
  Write("tokenizer_config.json", Json{{"chat_template", Json::array({{{"name", "rag"}, {"template", "R"}}})}}.dump());
  EXPECT_EQ(Load().status().code(), StatusCode::kNotFound);
}

TEST_F(ChatTemplateLoadTest, ChatTemplateJinjaComesFirst) {
  Write("tokenizer_config.json", Json{{"chat_template", "config"}}.dump());
  Write("chat_template.jinja", "jinja {{ 1 + 1 }}\n");
  auto t = Load();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t->Render(Json::object()), "jinja 2");
}

TEST_F(ChatTemplateLoadTest, ErrorsNameTheFile) {
  EXPECT_EQ(Load().status().code(), StatusCode::kNotFound);  // no tokenizer_config.json
  Write("tokenizer_config.json", "{\"eos_token\": \"x\"}");
  EXPECT_EQ(Load().status().code(), StatusCode::kNotFound);  // no chat_template
  Write("tokenizer_config.json", "{not json");
  EXPECT_EQ(Load().status().code(), StatusCode::kInvalidArgument);
  Write("tokenizer_config.json", Json{{"chat_template", "ok\n{% frobnicate %}"}}.dump());
  const Status bad = Load().status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("tokenizer_config.json: chat template line 2, column 4: statement 'frobnicate'"),
            std::string::npos)
      << bad.ToString();
}

TEST_F(ChatTemplateLoadTest, ASpecialTokenOfTheWrongTypeIsRefused) {
  // Ignored before: the template rendered without the model's bos_token.
  Write("tokenizer_config.json", Json{{"chat_template", "{{ bos_token }}"}, {"bos_token", 7}}.dump());
  const Status bad = Load().status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("tokenizer_config.json: bos_token must be a string or an object with a string "
                               "'content', not 7"),
            std::string::npos)
      << bad.ToString();
  Write("tokenizer_config.json", Json{{"chat_template", "{{ bos_token }}"}, {"bos_token", nullptr}}.dump());
  EXPECT_TRUE(Load().ok());  // null (Qwen's) leaves it undefined
}

// A downloaded model's template is a program from an untrusted source.
// Each case crashed (std::bad_alloc, SIGSEGV on the stack) or rendered for
// ever before its budget; now each is an error naming where it went over.
struct HostileCase {
  std::string what, source, message;
};
void ExpectStoppedAtTheirBudgets(const std::vector<HostileCase>& cases) {
  for (const HostileCase& c : cases) {
    SCOPED_TRACE(c.what);
    const auto start = std::chrono::steady_clock::now();
    const std::string got = R(c.source);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(got.find("InvalidArgument: chat template line "), std::string::npos) << got.substr(0, 300);
    EXPECT_NE(got.find(c.message), std::string::npos) << got.substr(0, 300);
    EXPECT_LT(seconds, 20.0);  // bounded: the budgets end it, not the test's timeout
  }
}

TEST(ChatTemplateTest, HostileTemplatesStopAtTheNestingLimit) {
  auto chain = [](const std::string& head, const std::string& link) {
    std::string source = "{{ " + head;
    for (int i = 0; i < 20000; ++i) source += link;
    return source + " }}";
  };
  const std::string deep_attrs = chain("x", ".a"), deep_filters = chain("'x'", "|upper");
  const std::string deep_sum = chain("1", " + 1"), deep_items = chain("xs", "[0]");
  const std::vector<HostileCase> cases = {
      {"attribute chain", deep_attrs, "PARSE ERROR: InvalidArgument: chat template line 1, column "},
      {"filter chain", deep_filters, "PARSE ERROR: InvalidArgument: chat template line 1, column "},
      {"operator chain", deep_sum, "PARSE ERROR: InvalidArgument: chat template line 1, column "},
      {"item chain", deep_items, "PARSE ERROR: InvalidArgument: chat template line 1, column "},
  };
  ExpectStoppedAtTheirBudgets(cases);
  // Just under the limits, the same constructs render.
  std::string attrs = "{{ d";
  for (int i = 0; i < 150; ++i) attrs += ".items";
  EXPECT_NE(R(attrs + " }}").find("ERROR"), std::string::npos);  // an error of values, not of nesting
  EXPECT_EQ(R(attrs + " }}").find("nests too deeply"), std::string::npos);
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 150; ++i) filters += "|upper";
  EXPECT_EQ(R(filters + " }}"), "X");
  // A template of one long line lexed in quadratic time (each token's
  // column counted from the line's start): 100,000 tags took minutes.
  std::string one_line;
  for (int i = 0; i < 100000; ++i) one_line += "{{ 'a' }}";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(R(one_line), std::string(100000, 'a'));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

// Sizes: each case builds strings or lists up to their bounds (a second or
// two here; many under a sanitizer, whose builds leave it out:
// src/model/CMakeLists.txt).
TEST(ChatTemplateTest, HostileTemplatesStopAtTheSizeBudgets) {
  ExpectStoppedAtTheirBudgets({
      {"string + doubling",
       "{% set ns = namespace(s='ab') %}\n{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
       "line 2, column 44: a string longer than 64 MiB"},
      {"string ~ doubling",
       "{% set ns = namespace(s='ab') %}\n{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
       "line 2, column 39: a string longer than 64 MiB"},
      {"list + doubling",
       "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
       "a list too long"},
      {"a growing list of big strings",
       "{% set s = 'x' * 60000000 %}{% set ns = namespace(l=[]) %}"
       "{% for i in range(100) %}{% set ns.l = ns.l + [s] %}{% endfor %}",
       "the rendering builds more than 1024 MiB of strings and lists"},
      {"a list of a big string, repeated", "{{ (['x' * 60000000] * 100) | length }}", "a list larger than 1024 MiB"},
      {"replace growing a string", "{{ ('x' * 2000000).replace('', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') }}",
       "a string longer than 64 MiB"},
      {"join growing a string", "{{ ('x' * 10000000).join(['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']) }}",
       "a string longer than 64 MiB"},
      {"tojson with an indent of 64 MiB", "{{ [[1]] | tojson(indent=' ' * 40000000) }}", "a string longer than 64 MiB"},
  });
  // Just under the limits, the same constructs render.
  EXPECT_EQ(R("{% set ns = namespace(s='ab') %}{% for i in range(20) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"
              "{{ ns.s | length }}"),
            "2097152");
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% for i in range(1000) %}{% for j in range(1000) %}"
              "{% endfor %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"),
            "1000");
}

// The same for the step budget: each case runs 20 million steps before it
// stops (a few seconds; minutes under a sanitizer, whose builds leave it
// out: src/model/CMakeLists.txt).
TEST(ChatTemplateTest, HostileTemplatesStopAtTheStepBudget) {
  ExpectStoppedAtTheirBudgets({
      {"nested loops over range(100000)",
       "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
       "line 1, column 32: the rendering takes more than 20000000 steps"},
      {"a list holding one sublist twice, 40 levels, printed",
       "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
       "line 1, column 103: the rendering takes more than 20000000 steps"},
      {"the same, compared",
       "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}"
       "{{ ns.l == [ns.l[0], ns.l[1]] }}",
       "the rendering takes more than 20000000 steps"},
      {"the same, as JSON",
       "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}"
       "{{ ns.l | tojson }}",
       "the rendering takes more than 20000000 steps"},
      {"copying a big string many times",
       "{% set s = 'x' * 30000000 %}{% for i in range(100000) %}{% set t = s %}{% endfor %}",
       "the rendering takes more than 20000000 steps"},
  });
}

TEST(ChatTemplateTest, PromptFormatMakesAConversationOfAPrompt) {
  auto t = ChatTemplate::Load((kData / "qwen3").string());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  PromptFormat format;
  format.chat = std::make_shared<const ChatTemplate>(std::move(t).value());
  format.system = "S";
  format.variables["enable_thinking"] = false;
  auto text = format.Apply("Q");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(
      *text,
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(*PromptFormat{}.Apply("as is"), "as is");
}

}  // namespace
}  // namespace sluice::model
