// The chat template's lexer: Jinja's text, tags and expression tokens.
#ifndef SLUICE_MODEL_CHAT_TEMPLATE_LEXER_H_
#define SLUICE_MODEL_CHAT_TEMPLATE_LEXER_H_

#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "chat_template/values.h"

namespace sluice::model::jinja {

// ----------------------------------------------------------------- lexer

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type = Tok::kEof;
  std::string text;  // data, a name, a string's value, an operator
  int64_t i = 0;
  double f = 0;
  Pos pos;
};

std::string Describe(const Token& t);

// The template's tokens: text, and the tags' names, literals and operators
// (InvalidArgument naming the line and column of what it cannot read).
Result<std::vector<Token>> Lex(std::string_view source);

}  // namespace sluice::model::jinja

#endif  // SLUICE_MODEL_CHAT_TEMPLATE_LEXER_H_
