// Deadlines for blocking calls that take a timeout.
#ifndef SLUICE_COMMON_DEADLINE_H_
#define SLUICE_COMMON_DEADLINE_H_

#include <algorithm>
#include <chrono>

namespace sluice {

// Now plus `timeout` (>= 0), capped at a year: "forever" for every blocking
// call here, clear of overflow.
inline std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  const auto cap = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::hours(24 * 365));
  return std::chrono::steady_clock::now() + std::min(timeout, cap);
}

}  // namespace sluice

#endif  // SLUICE_COMMON_DEADLINE_H_
