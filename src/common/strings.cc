#include "sluice/common/strings.h"

namespace sluice {

std::string Quoted(std::string_view name) {
  // Appended piecewise: `"'" + std::string(name)` trips a GCC 12 -Wrestrict false positive.
  std::string out;
  out.reserve(name.size() + 2);
  out.push_back('\'');
  out.append(name);
  out.push_back('\'');
  return out;
}

}  // namespace sluice
