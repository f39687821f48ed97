#include <string>
#include <string_view>

#include "sluice/reward/task.h"

namespace sluice::reward {
namespace {

// ASCII only: responses are bytes, and locale-dependent classification would
// make rewards depend on the environment.
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view Trim(std::string_view text) {
  while (!text.empty() && IsSpace(text.front())) text.remove_prefix(1);
  while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
  return text;
}

}  // namespace

std::string_view SplitName(Split split) { return split == Split::kTrain ? "train" : "eval"; }

std::string ExtractFinalAnswer(std::string_view response) {
  const size_t marker = response.rfind(kAnswerMarker);
  if (marker != std::string_view::npos) response.remove_prefix(marker + 1);
  return std::string(Trim(response));
}

std::string NormalizeAnswer(std::string_view answer) {
  std::string out;
  bool pending_space = false;
  for (char c : Trim(answer)) {
    if (IsSpace(c)) {
      pending_space = true;
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  return out;
}

}  // namespace sluice::reward
