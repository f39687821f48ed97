// Counter-based randomness shared by the whole project: deterministic
// functions of (seed, counters), so results never depend on call order,
// batch composition or the standard library's distributions.
#ifndef SLUICE_COMMON_RANDOM_H_
#define SLUICE_COMMON_RANDOM_H_

#include <cstdint>
#include <string_view>

namespace sluice {

// The SplitMix64 finalizer: a bijective 64-bit mixer.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// One SplitMix64 step from state x.
inline uint64_t SplitMix64(uint64_t x) { return Mix64(x + 0x9e3779b97f4a7c15ULL); }

// Hashes two words into one (order matters): seeds for sub-streams.
inline uint64_t HashCombine(uint64_t a, uint64_t b) { return SplitMix64(SplitMix64(a) ^ (b + 0x632be59bd9b4e019ULL)); }

// 64-bit FNV-1a of `bytes`, continuing from `h`: the same on every platform
// and library version (std::hash is not), for reproducible splits and
// fingerprints.
inline constexpr uint64_t kFnv1aStart = 0xcbf29ce484222325ull;
inline uint64_t Fnv1a(std::string_view bytes, uint64_t h = kFnv1aStart) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// The top 53 bits of `bits` as a double uniform in [0, 1).
inline double UnitInterval(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

}  // namespace sluice

#endif  // SLUICE_COMMON_RANDOM_H_
