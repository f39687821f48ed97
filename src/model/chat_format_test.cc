#include "sluice/model/chat_format.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/testing/status_macros.h"
#include "sluice/common/file_util.h"

namespace sluice::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const fs::path kData = fs::path(SLUICE_TEST_DATA);

// The built-in template renders as its documentation says: tool names, a
// line per system/user/tool message, the assistant's turn ended by <eos>,
// structured tool calls in <tool_call> markup, the generation prompt.
// Fails if a role's prefix, the end of an assistant turn or the tool-call
// markup changes.
TEST(ChatFormatTest, TheBuiltinTemplateRendersAsDocumented) {
  const ChatFormat f = ChatFormat::Builtin();
  EXPECT_TRUE(f.builtin());
  const ordered_json ctx = ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be exact."},
      {"role": "user", "content": "12*34?"},
      {"role": "assistant", "content": "",
       "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}}]},
      {"role": "tool", "tool_call_id": "call_0_0", "content": "408"},
      {"role": "assistant", "content": "#408"},
      {"role": "user", "content": "thanks"}],
    "tools": [{"type": "function", "function": {"name": "calculator"}}, {"name": "search"}],
    "add_generation_prompt": true})");
  SLUICE_ASSERT_OK_AND_ASSIGN(const std::string text, f.Render(ctx));
  EXPECT_EQ(text,
            "tools: calculator, search\nsystem: Be exact.\nuser: 12*34?\nassistant: <tool_call>{\"name\": "
            "\"calculator\", \"arguments\": {\"expression\": \"12*34\"}}</tool_call><eos>tool: 408\nassistant: "
            "#408<eos>user: thanks\nassistant: ");
  // Arguments given as a JSON string (the OpenAI wire form) are written as they are.
  SLUICE_ASSERT_OK_AND_ASSIGN(
      const std::string with_string,
      f.Render(ordered_json::parse(R"({"messages": [{"role": "assistant", "content": null, "tool_calls":
        [{"function": {"name": "c", "arguments": "{\"x\": 1}"}}]}]})")));
  EXPECT_EQ(with_string, "assistant: <tool_call>{\"name\": \"c\", \"arguments\": {\"x\": 1}}</tool_call><eos>");
  // A role the template does not know is refused by name.
  Result<std::string> odd = f.Render(ordered_json::parse(R"({"messages": [{"role": "narrator", "content": "x"}]})"));
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("narrator"), std::string::npos) << odd.status().message();
}

// The byte tokenizer reads the built-in template's <eos> as its end token
// and every other byte as itself; decoding gives the text back. Fails if
// <eos> is encoded as five bytes (the model could never end a turn the way
// its prompts show) or a byte is lost around it.
TEST(ChatFormatTest, TheBuiltinEncodingReadsEosAsTheEndToken) {
  const ChatFormat f = ChatFormat::Builtin();
  const std::string text = "assistant: hi<eos>user: <eos\n<eos><eos>";
  SLUICE_ASSERT_OK_AND_ASSIGN(const std::vector<TokenId> ids, f.Encode(text));
  std::vector<TokenId> want;
  for (char c : std::string("assistant: hi")) want.push_back(static_cast<unsigned char>(c));
  want.push_back(ByteTokenizer::kEos);
  for (char c : std::string("user: <eos\n")) want.push_back(static_cast<unsigned char>(c));
  want.push_back(ByteTokenizer::kEos);
  want.push_back(ByteTokenizer::kEos);
  EXPECT_EQ(ids, want);
  SLUICE_ASSERT_OK_AND_ASSIGN(const std::string back, f.Decode(ids));
  EXPECT_EQ(back, text);
}

class ChatFormatDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("chat_format_" + std::to_string(::getpid()));
    static_cast<void>(sluice::RemoveTree(dir_.string()));
    fs::create_directories(dir_);
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(dir_.string())); }
  fs::path dir_;
};

// A model directory picks its format: none or no tokenizer.json is a
// built-in model's; Qwen3's tokenizer and template are loaded and render
// with its special tokens read as such; a tokenizer.json with no template
// is refused, naming the directory.
TEST_F(ChatFormatDirTest, AModelDirectoryPicksItsFormat) {
  SLUICE_ASSERT_OK_AND_ASSIGN(const ChatFormat none, ChatFormat::Load(""));
  EXPECT_TRUE(none.builtin());
  SLUICE_ASSERT_OK_AND_ASSIGN(const ChatFormat empty_dir, ChatFormat::Load(dir_.string()));
  EXPECT_TRUE(empty_dir.builtin());
  SLUICE_ASSERT_OK_AND_ASSIGN(const ChatFormat qwen, ChatFormat::Load((kData / "tokenizers" / "qwen3").string()));
  EXPECT_FALSE(qwen.builtin());
  SLUICE_ASSERT_OK_AND_ASSIGN(
      const std::string text,
      qwen.Render(
          ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true})")));
  EXPECT_EQ(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  SLUICE_ASSERT_OK_AND_ASSIGN(const std::vector<TokenId> ids, qwen.Encode(text));
  EXPECT_EQ(ids.front(), 151644);  // <|im_start|>, one token
  SLUICE_ASSERT_OK_AND_ASSIGN(const std::string back, qwen.Decode(ids));
  EXPECT_EQ(back, text);
  fs::copy_file(kData / "tokenizers" / "qwen3" / "tokenizer.json", dir_ / "tokenizer.json");
  Result<ChatFormat> no_template = ChatFormat::Load(dir_.string());
  ASSERT_FALSE(no_template.ok());
  EXPECT_EQ(no_template.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(no_template.status().message().find(dir_.string()), std::string::npos);
}

}  // namespace
}  // namespace sluice::model
