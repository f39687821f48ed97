// A small counter-based PRNG for the generated tasks. Each example gets its
// own stream keyed by (seed, split, index, attempt), so Get(split, index)
// needs no shared state and no sequential replay. Deliberately not a
// <random> distribution: those are implementation-defined, and datasets must
// be identical across standard libraries.
#ifndef SLUICE_REWARD_RNG_H_
#define SLUICE_REWARD_RNG_H_

#include <cstdint>

#include "sluice/common/check.h"
#include "sluice/common/random.h"

namespace sluice::reward::internal {

using ::sluice::Mix64;

class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream, uint64_t index, uint64_t attempt)
      : state_(Mix64(Mix64(Mix64(Mix64(seed) ^ stream) ^ index) ^ attempt)) {}

  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return Mix64(state_);
  }

  // Uniform in [lo, hi] without modulo bias. Precondition: lo <= hi.
  int64_t Uniform(int64_t lo, int64_t hi) {
    SLUICE_CHECK_LE(lo, hi);
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
    if (span == 0) return static_cast<int64_t>(Next());  // the full 64-bit range
    const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
    uint64_t x;
    do {
      x = Next();
    } while (x >= limit);
    return lo + static_cast<int64_t>(x % span);
  }

  // Uniform in [0, 1) with 53 bits of precision.
  double UniformDouble() { return UnitInterval(Next()); }

  bool Coin() { return (Next() >> 63) != 0; }

 private:
  uint64_t state_;
};

}  // namespace sluice::reward::internal

#endif  // SLUICE_REWARD_RNG_H_
