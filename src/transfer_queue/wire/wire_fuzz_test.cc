// WireFuzzSmokeTest: the libFuzzer body (wire_fuzz_body.h) run on a few
// thousand seeded random and mutated inputs, so the default suite (gcc,
// sanitizers) exercises the decoders' error paths without clang.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/testing/byte_mutator.h"
#include "wire/wire_fuzz_body.h"
#include "wire/wire_samples.h"

namespace sluice::transfer_queue::wire {
namespace {

// The shared edits, and sometimes body_bytes fixed up so the header passes
// and the body is exercised.
std::vector<uint8_t> Mutate(std::vector<uint8_t> in, sluice::testing::ByteRng& rng) {
  in = sluice::testing::MutateBytes(std::move(in), rng);
  if (rng.Below(4) == 0 && in.size() >= 32) {
    const uint64_t body = in.size() - 32;
    for (int i = 0; i < 8; ++i) in[24 + i] = static_cast<uint8_t>(body >> (8 * i));
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

  sluice::testing::ByteRng rng(20240601);
  int decoded = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> input;
    if (i % 4 == 0) {
      input = rng.Bytes(rng.Below(200));
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
