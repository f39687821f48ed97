// Seeded byte-level mutations for the fuzz smoke tests: the libFuzzer bodies
// of the wire formats run, in the default suite (gcc, sanitizers), on
// random inputs and on valid messages with a few edits, so the decoders'
// error paths run without clang.
#ifndef SLUICE_SRC_COMMON_TESTING_BYTE_MUTATOR_H_
#define SLUICE_SRC_COMMON_TESTING_BYTE_MUTATOR_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "sluice/common/random.h"

namespace sluice::testing {

class ByteRng {
 public:
  explicit ByteRng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return state_ = SplitMix64(state_); }
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(Next() % n); }
  std::vector<uint8_t> Bytes(size_t n) {
    std::vector<uint8_t> out(n);
    for (auto& b : out) b = static_cast<uint8_t>(Next());
    return out;
  }

 private:
  uint64_t state_;
};

// One to four edits: a byte flipped, a truncation, random bytes inserted, a
// boundary little-endian u32 written over (counts and lengths), a chunk
// duplicated.
inline std::vector<uint8_t> MutateBytes(std::vector<uint8_t> in, ByteRng& rng) {
  const int edits = 1 + static_cast<int>(rng.Below(4));
  for (int e = 0; e < edits; ++e) {
    switch (rng.Below(5)) {
      case 0:
        if (!in.empty()) in[rng.Below(in.size())] ^= static_cast<uint8_t>(1 + rng.Below(255));
        break;
      case 1:
        in.resize(rng.Below(in.size() + 1));
        break;
      case 2:
        for (size_t i = 0, n = 1 + rng.Below(8); i < n; ++i) {
          in.insert(in.begin() + static_cast<std::ptrdiff_t>(rng.Below(in.size() + 1)),
                    static_cast<uint8_t>(rng.Next()));
        }
        break;
      case 3: {
        if (in.size() < 4) break;
        static constexpr uint32_t kValues[] = {0xFFFFFFFFu, 0x80000000u, 65537, 65, 257, 0};
        const uint32_t v = kValues[rng.Below(std::size(kValues))];
        const size_t at = rng.Below(in.size() - 3);
        for (int i = 0; i < 4; ++i) in[at + i] = static_cast<uint8_t>(v >> (8 * i));
        break;
      }
      default:
        if (!in.empty()) {
          const size_t from = rng.Below(in.size());
          const size_t len = 1 + rng.Below(std::min<size_t>(16, in.size() - from));
          std::vector<uint8_t> chunk(in.begin() + static_cast<std::ptrdiff_t>(from),
                                     in.begin() + static_cast<std::ptrdiff_t>(from + len));
          in.insert(in.begin() + static_cast<std::ptrdiff_t>(rng.Below(in.size() + 1)), chunk.begin(), chunk.end());
        }
        break;
    }
  }
  return in;
}

}  // namespace sluice::testing

#endif  // SLUICE_SRC_COMMON_TESTING_BYTE_MUTATOR_H_
