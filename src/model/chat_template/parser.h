// The chat template's parser: Jinja's grammar for the statements and
// expressions chat templates use.
#ifndef SLUICE_MODEL_CHAT_TEMPLATE_PARSER_H_
#define SLUICE_MODEL_CHAT_TEMPLATE_PARSER_H_

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

#include "chat_template/ast.h"
#include "chat_template/lexer.h"

namespace sluice::model::jinja {

// The statements of a template's tokens (InvalidArgument naming the line and
// column of what it cannot parse, or of nesting past the bounds).
Result<Body> ParseTemplate(std::vector<Token> tokens);

}  // namespace sluice::model::jinja

#endif  // SLUICE_MODEL_CHAT_TEMPLATE_PARSER_H_
