#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
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

namespace sluice::reward {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// The contents of the last \boxed{...} in `text` (or \fbox{...}), braces
// balanced; nullopt when there is none (or it is never closed).
std::optional<std::string> LastBoxed(std::string_view text) {
  size_t at = std::string_view::npos;
  for (std::string_view command : {"\\boxed{", "\\fbox{"}) {
    const size_t p = text.rfind(command);
    if (p != std::string_view::npos && (at == std::string_view::npos || p > at)) at = p;
  }
  if (at == std::string_view::npos) return std::nullopt;
  const size_t open = text.find('{', at);
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return std::string(text.substr(open + 1, i - open - 1));
  }
  return std::nullopt;
}

// Removes every occurrence of `what` from *s.
void EraseAll(std::string* s, std::string_view what) {
  for (size_t p; (p = s->find(what)) != std::string::npos;) s->erase(p, what.size());
}

void ReplaceAll(std::string* s, std::string_view what, std::string_view with) {
  for (size_t p = 0; (p = s->find(what, p)) != std::string::npos; p += with.size()) s->replace(p, what.size(), with);
}

// A plain number ("-12", "3.50", "1/2" after normalization) as a double.
std::optional<double> AsNumber(const std::string& s) {
  if (s.empty()) return std::nullopt;
  const size_t slash = s.find('/');
  if (slash != std::string::npos) {
    auto a = AsNumber(s.substr(0, slash)), b = AsNumber(s.substr(slash + 1));
    if (!a || !b || *b == 0) return std::nullopt;
    return *a / *b;
  }
  size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  bool digits = false, dot = false;
  for (; i < s.size(); ++i) {
    if (IsDigit(s[i])) {
      digits = true;
    } else if (s[i] == '.' && !dot) {
      dot = true;
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  return std::strtod(s.c_str(), nullptr);
}

}  // namespace

std::string ExtractMathAnswer(std::string_view response) {
  if (auto boxed = LastBoxed(response)) return std::string(Trim(*boxed));
  const size_t hashes = response.rfind("####");
  if (hashes != std::string_view::npos) return std::string(Trim(response.substr(hashes + 4)));
  if (response.find(kAnswerMarker) != std::string_view::npos) return ExtractFinalAnswer(response);
  // The last number: digits with internal commas or one point, and a sign.
  size_t end = response.size();
  while (end > 0 && !IsDigit(response[end - 1])) --end;
  if (end == 0) return "";
  size_t begin = end;
  while (begin > 0 && (IsDigit(response[begin - 1]) || ((response[begin - 1] == ',' || response[begin - 1] == '.') &&
                                                        begin >= 2 && IsDigit(response[begin - 2])))) {
    --begin;
  }
  if (begin > 0 && response[begin - 1] == '-') --begin;
  return std::string(response.substr(begin, end - begin));
}

std::string NormalizeMathAnswer(std::string_view answer) {
  std::string s(Trim(answer));
  // \text{...} is a unit or a word around the value: dropped, braces and all.
  for (std::string_view command : {"\\text{", "\\mbox{", "\\mathrm{"}) {
    for (size_t p; (p = s.find(command)) != std::string::npos;) {
      size_t depth = 0, e = p + command.size() - 1;
      for (; e < s.size(); ++e) {
        if (s[e] == '{') ++depth;
        if (s[e] == '}' && --depth == 0) break;
      }
      s.erase(p, std::min(e + 1, s.size()) - p);
    }
  }
  for (std::string_view what :
       {"\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "$", "^\\circ", "^{\\circ}", "\xC2\xB0", "\\%", "%"}) {
    EraseAll(&s, what);
  }
  ReplaceAll(&s, "\\dfrac", "\\frac");
  ReplaceAll(&s, "\\tfrac", "\\frac");
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (IsSpace(c)) continue;
    // A comma between digits with three digits after it: a thousands separator.
    if (c == ',' && !out.empty() && IsDigit(out.back()) && i + 3 < s.size() && IsDigit(s[i + 1]) && IsDigit(s[i + 2]) &&
        IsDigit(s[i + 3]) && (i + 4 >= s.size() || !IsDigit(s[i + 4]))) {
      continue;
    }
    out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  while (!out.empty() && out.back() == '.') out.pop_back();
  // \frac{a}{b} and \frac ab with single-character operands: a/b.
  if (out.rfind("\\frac{", 0) == 0) {
    const size_t mid = out.find("}{");
    if (mid != std::string::npos && out.back() == '}' && out.find('{', 6) == mid + 1) {
      out = out.substr(6, mid - 6) + "/" + out.substr(mid + 2, out.size() - mid - 3);
    }
  } else if (out.size() == 7 && out.rfind("\\frac", 0) == 0) {
    out = std::string(1, out[5]) + "/" + out[6];
  }
  if (out.size() > 1 && out[0] == '-' && out.rfind("-\\frac{", 0) == 0) {
    const std::string rest = NormalizeMathAnswer(out.substr(1));
    out = "-" + rest;
  }
  return out;
}

bool MathAnswersMatch(std::string_view response_answer, std::string_view reference) {
  const std::string a = NormalizeMathAnswer(response_answer), b = NormalizeMathAnswer(reference);
  if (a.empty() || b.empty()) return false;
  if (a == b) return true;
  const std::optional<double> x = AsNumber(a), y = AsNumber(b);
  return x && y && std::fabs(*x - *y) <= 1e-6 * std::max(1.0, std::fabs(*y));
}

}  // namespace sluice::reward
