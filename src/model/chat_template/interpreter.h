// The chat template's interpreter: runs a parsed template as Jinja does
// (as transformers' apply_chat_template configures it).
#ifndef SLUICE_MODEL_CHAT_TEMPLATE_INTERPRETER_H_
#define SLUICE_MODEL_CHAT_TEMPLATE_INTERPRETER_H_

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

namespace sluice::model::jinja {

// Runs `body` with `globals` (the template's variables) and `now` (what
// strftime_now formats), appending what it outputs to `out`, within the
// budgets of one rendering. Errors: InvalidArgument naming the line and
// column of the statement or expression that failed.
Status Render(const Body& body, const std::vector<std::pair<std::string, Value>>& globals, const std::tm& now,
              std::string* out);

}  // namespace sluice::model::jinja

#endif  // SLUICE_MODEL_CHAT_TEMPLATE_INTERPRETER_H_
