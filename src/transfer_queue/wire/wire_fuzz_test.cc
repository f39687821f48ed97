// WireFuzzSmokeTest: the libFuzzer body (wire_fuzz_body.h) run on a few
// thousand seeded random and mutated inputs, so the default suite (gcc,
// sanitizers) exercises the decoders' error paths without clang.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "sluice/common/random.h"
#include "wire/wire_fuzz_body.h"
#include "wire/wire_samples.h"

namespace sluice::transfer_queue::wire {
namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return state_ = SplitMix64(state_); }
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(Next() % n); }

 private:
  uint64_t state_;
};

std::vector<uint8_t> Mutate(std::vector<uint8_t> in, Rng& rng) {
  const int edits = 1 + static_cast<int>(rng.Below(4));
  for (int e = 0; e < edits; ++e) {
    switch (rng.Below(6)) {
      case 0:  // flip a byte
        if (!in.empty()) in[rng.Below(in.size())] ^= static_cast<uint8_t>(1 + rng.Below(255));
        break;
      case 1:  // truncate
        in.resize(rng.Below(in.size() + 1));
        break;
      case 2:  // insert random bytes
        for (size_t i = 0, n = 1 + rng.Below(8); i < n; ++i) {
          in.insert(in.begin() + static_cast<std::ptrdiff_t>(rng.Below(in.size() + 1)),
                    static_cast<uint8_t>(rng.Next()));
        }
        break;
      case 3: {  // a huge or boundary little-endian u32 somewhere (counts, lengths)
        if (in.size() < 4) break;
        static constexpr uint32_t kValues[] = {0xFFFFFFFFu, 0x80000000u, 65537, 65, 257, 0};
        const uint32_t v = kValues[rng.Below(std::size(kValues))];
        const size_t at = rng.Below(in.size() - 3);
        for (int i = 0; i < 4; ++i) in[at + i] = static_cast<uint8_t>(v >> (8 * i));
        break;
      }
      case 4:  // duplicate a chunk
        if (!in.empty()) {
          const size_t from = rng.Below(in.size());
          const size_t len = 1 + rng.Below(std::min<size_t>(16, in.size() - from));
          std::vector<uint8_t> chunk(in.begin() + static_cast<std::ptrdiff_t>(from),
                                     in.begin() + static_cast<std::ptrdiff_t>(from + len));
          in.insert(in.begin() + static_cast<std::ptrdiff_t>(rng.Below(in.size() + 1)), chunk.begin(), chunk.end());
        }
        break;
      default:  // fix up body_bytes so the header passes and the body is exercised
        if (in.size() >= 32) {
          const uint64_t body = in.size() - 32;
          for (int i = 0; i < 8; ++i) in[24 + i] = static_cast<uint8_t>(body >> (8 * i));
        }
        break;
    }
  }
  return in;
}

TEST(WireFuzzSmokeTest, SeededRandomAndMutatedInputsNeverCrash) {
  std::vector<std::vector<uint8_t>> seeds;
  for (const Message& m : testing::SampleMessages()) {
    const auto* p = reinterpret_cast<const uint8_t*>(m.data.get());
    seeds.emplace_back(p, p + m.size);
  }
  // Every unmutated sample decodes (as a frame, and as a body behind a header).
  int valid = 0;
  for (const auto& s : seeds) valid += FuzzWireDecoders(s.data(), s.size()) > 0 ? 1 : 0;
  EXPECT_EQ(valid, static_cast<int>(seeds.size()));

  Rng rng(20240601);
  int decoded = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> input;
    if (i % 4 == 0) {
      input.resize(rng.Below(200));
      for (auto& b : input) b = static_cast<uint8_t>(rng.Next());
    } else {
      input = Mutate(seeds[rng.Below(seeds.size())], rng);
    }
    decoded += FuzzWireDecoders(input.data(), input.size());
  }
  // Sanity: mutations are not all fatal (the fixed-point checks ran).
  EXPECT_GT(decoded, 100);
}

}  // namespace
}  // namespace sluice::transfer_queue::wire
