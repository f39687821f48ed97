// `sluice tokenize`: a model directory's tokenizer on text, for users
// checking what their data pipeline feeds the model.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sluice/launch/commands.h"
#include "sluice/model/chat_format.h"
#include "sluice/runtime/flags.h"

namespace sluice::launch {

namespace {

using nlohmann::json;
using runtime::FlagSet;

// The model's conversation format: its directory's tokenizer.json and chat
// template, or, for "" and a built-in model's directory (config.json, no
// tokenizer.json), the byte tokenizer and the built-in template.
Result<model::ChatFormat> FormatFor(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path d(dir);
  if (!dir.empty() && !std::filesystem::exists(d / "tokenizer.json", ec) &&
      !std::filesystem::exists(d / "config.json", ec)) {
    return Status::NotFound(dir + " has no tokenizer.json (a Hugging Face model) or config.json (a built-in one)");
  }
  return model::ChatFormat::Load(dir);
}

Status Tokenize(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Add("model", "",
            "model directory: its tokenizer.json (and chat template); a built-in model's (no tokenizer.json), or "
            "none: the byte tokenizer and the built-in chat template");
  flags.Add("text", "", "text to encode; empty: read stdin, one JSON string per line");
  flags.Add("decode", "false",
            "decode instead: read stdin, one JSON array of ids per line, and print each as a JSON string", true);
  flags.Add("keep-special", "false", "--decode: keep special tokens in the text", true);
  flags.Add("chat", "false",
            "render the chat template instead: read stdin, one JSON object per line ({\"messages\": [...], "
            "\"add_generation_prompt\": true, ...}; every key is a template variable), and print each rendering "
            "as a JSON string",
            true);
  flags.Add("ids", "false", "--chat: print the rendering's token ids instead of its text", true);
  SLUICE_ASSIGN_OR_RETURN(
      const bool helped,
      flags.ParseOrHelp(args, "sluice tokenize [--model=DIR] [--text=TEXT | --decode | --chat [--ids]] [flags]"));
  if (helped) return Status::Ok();
  SLUICE_RETURN_IF_ERROR(flags.RejectPositional());
  SLUICE_ASSIGN_OR_RETURN(std::string dir, flags.GetString("model"));
  SLUICE_ASSIGN_OR_RETURN(std::string text, flags.GetString("text"));
  SLUICE_ASSIGN_OR_RETURN(bool decode, flags.GetBool("decode"));
  SLUICE_ASSIGN_OR_RETURN(bool keep_special, flags.GetBool("keep-special"));
  if (decode && !text.empty()) return Status::InvalidArgument("--decode reads ids from stdin; --text is for encoding");
  SLUICE_ASSIGN_OR_RETURN(bool chat, flags.GetBool("chat"));
  SLUICE_ASSIGN_OR_RETURN(bool chat_ids, flags.GetBool("ids"));
  if (chat && (decode || !text.empty())) return Status::InvalidArgument("--chat reads conversations from stdin alone");
  if (chat_ids && !chat) return Status::InvalidArgument("--ids goes with --chat");
  SLUICE_ASSIGN_OR_RETURN(const model::ChatFormat format, FormatFor(dir));
  if (chat) {
    std::string line;
    for (int64_t n = 1; std::getline(std::cin, line); ++n) {
      if (line.empty()) continue;
      const std::string where = "stdin:" + std::to_string(n);
      auto context = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (context.is_discarded() || !context.is_object() || !context.contains("messages") ||
          !context["messages"].is_array()) {
        return Status::InvalidArgument(where + ": expected a JSON object with a \"messages\" list");
      }
      Result<std::string> rendered = format.Render(context);
      if (!rendered.ok()) return rendered.status().WithContext(where);
      if (chat_ids) {
        Result<std::vector<model::TokenId>> ids = format.Encode(*rendered);
        if (!ids.ok()) return ids.status().WithContext(where);
        std::printf("%s\n", json(*ids).dump().c_str());
      } else {
        std::printf("%s\n", json(*rendered).dump(-1, ' ', false, json::error_handler_t::replace).c_str());
      }
    }
    return Status::Ok();
  }
  const model::Tokenizer* tokenizer = &format.tokenizer();

  auto encode = [&](const std::string& s) -> Status {
    SLUICE_ASSIGN_OR_RETURN(const std::vector<model::TokenId> ids, tokenizer->Encode(s));
    std::printf("%s\n", json(ids).dump().c_str());
    return Status::Ok();
  };
  if (!text.empty()) return encode(text);
  std::string line;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    if (line.empty()) continue;
    const std::string where = "stdin:" + std::to_string(n);
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!decode) {
      if (!j.is_string()) return Status::InvalidArgument(where + ": expected a JSON string, e.g. \"Hello\"");
      SLUICE_RETURN_IF_ERROR(encode(j.get<std::string>()).WithContext(where));
      continue;
    }
    if (!j.is_array()) return Status::InvalidArgument(where + ": expected a JSON array of token ids, e.g. [9707, 11]");
    std::vector<model::TokenId> ids;
    for (const json& id : j) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return Status::InvalidArgument(where + ": " + id.dump() + " is not a token id");
      }
      ids.push_back(id.get<model::TokenId>());
    }
    auto decoded = tokenizer->Decode(ids, !keep_special);
    if (!decoded.ok()) return decoded.status().WithContext(where);
    // Invalid UTF-8 (a token cut inside a character) is shown as U+FFFD.
    std::printf("%s\n", json(*decoded).dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  }
  return Status::Ok();
}

}  // namespace

int RunTokenizeCommand(const std::vector<std::string>& args) { return RunCommand(Tokenize, args); }

}  // namespace sluice::launch
