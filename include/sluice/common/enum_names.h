// An enum's names written once, in the order of its values (0, 1, 2, ...):
// the name of a value and the value of a name both come from that one list.
//
//   constexpr const char* kModeNames[] = {"direct", "sync", "one_step_off", "async"};
//   EnumName(kModeNames, PipelineMode::kSync)           // "sync"
//   EnumNamed<PipelineMode>(kModeNames, "async")       // PipelineMode::kAsync
//
// Thread safety: pure functions.
#ifndef SLUICE_COMMON_ENUM_NAMES_H_
#define SLUICE_COMMON_ENUM_NAMES_H_

#include <cstddef>
#include <optional>
#include <string_view>

namespace sluice {

// The name of `value`, or `unknown` for a value past the list (one cast
// from a number read elsewhere; a list that lacks a newer value is caught by
// the static_assert on its size that each list has).
template <typename E, size_t N>
constexpr const char* EnumName(const char* const (&names)[N], E value, const char* unknown = "?") {
  const auto i = static_cast<size_t>(value);
  return i < N ? names[i] : unknown;
}

// The value named `name`, or nullopt (the caller says what the names are).
template <typename E, size_t N>
constexpr std::optional<E> EnumNamed(const char* const (&names)[N], std::string_view name) {
  for (size_t i = 0; i < N; ++i) {
    if (name == names[i]) return static_cast<E>(i);
  }
  return std::nullopt;
}

}  // namespace sluice

#endif  // SLUICE_COMMON_ENUM_NAMES_H_
