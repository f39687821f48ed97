// Small string helpers for messages.
#ifndef SLUICE_COMMON_STRINGS_H_
#define SLUICE_COMMON_STRINGS_H_

#include <string>
#include <string_view>

namespace sluice {

// `name` in single quotes, as error messages name keys, tensors and children.
std::string Quoted(std::string_view name);

}  // namespace sluice

#endif  // SLUICE_COMMON_STRINGS_H_
