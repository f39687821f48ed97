#include "sluice/common/check.h"

#include <cstdio>
#include <cstdlib>

namespace sluice::internal {

void CheckFailed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "%s:%d: SLUICE_CHECK(%s) failed. %s\n", file, line, condition, message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace sluice::internal
