// Small string helpers for messages.
#ifndef SLUICE_COMMON_STRINGS_H_
#define SLUICE_COMMON_STRINGS_H_

#include <string>
#include <string_view>

namespace sluice {

// `name` in single quotes, as error messages name keys, tensors and children.
std::string Quoted(std::string_view name);

// Whether `text` is well-formed UTF-8: no stray continuation bytes, no
// truncated, overlong or surrogate sequences, nothing past U+10FFFF.
bool IsValidUtf8(std::string_view text);
// `text` with each byte that is not part of a well-formed sequence replaced
// by U+FFFD.
std::string ValidUtf8(std::string_view text);

}  // namespace sluice

#endif  // SLUICE_COMMON_STRINGS_H_
