#include "core/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace sluice::checkpoint_engine {
namespace {

// Published XXH64 test vectors (seed 0): the implementation is the real algorithm.
TEST(Checksum64Test, MatchesXxh64Vectors) {
  EXPECT_EQ(Checksum64("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(Checksum64("a", 1), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(Checksum64("abc", 3), 0x44BC2CF5AD770999ULL);
}

TEST(Checksum64Test, EverySingleBitFlipChangesTheSum) {
  // 67 bytes: exercises the 32-byte lanes, the 8-, 4- and 1-byte tails.
  std::vector<unsigned char> buf(67);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 37 + 11);
  const uint64_t base = Checksum64(buf.data(), buf.size());
  std::set<uint64_t> seen{base};
  for (size_t i = 0; i < buf.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      buf[i] ^= static_cast<unsigned char>(1u << bit);
      seen.insert(Checksum64(buf.data(), buf.size()));
      buf[i] ^= static_cast<unsigned char>(1u << bit);
    }
  }
  EXPECT_EQ(seen.size(), 1 + buf.size() * 8);
  EXPECT_EQ(Checksum64(buf.data(), buf.size()), base);
}

TEST(Checksum64Test, LengthSeedAndAlignmentMatter) {
  std::vector<unsigned char> zeros(128, 0);
  std::set<uint64_t> by_length;
  for (size_t n = 0; n <= 128; ++n) by_length.insert(Checksum64(zeros.data(), n));
  EXPECT_EQ(by_length.size(), 129u) << "zero buffers of different lengths must differ";
  EXPECT_NE(Checksum64(zeros.data(), 64, 0), Checksum64(zeros.data(), 64, 1));
  // Unaligned input gives the same sum as the same bytes aligned.
  std::vector<unsigned char> a(100), b(101);
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i + 1] = static_cast<unsigned char>(i * 7);
  EXPECT_EQ(Checksum64(a.data(), a.size()), Checksum64(b.data() + 1, a.size()));
}

}  // namespace
}  // namespace sluice::checkpoint_engine

namespace sluice::checkpoint_engine {
namespace {

// The fused copy gives the bytes and the sum of copying then hashing, at
// every length around the stripe and block boundaries and at odd offsets.
TEST(Checksum64Test, CopyAndChecksumEqualsCopyThenChecksum) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> src(3 * 32768 + 100), dst(src.size() + 8), want(src.size() + 8);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 100; ++n) sizes.push_back(n);
  for (size_t n : {size_t{32767}, size_t{32768}, size_t{32769}, size_t{65535}, size_t{65600}, src.size() - 3}) {
    sizes.push_back(n);
  }
  for (size_t n : sizes) {
    for (size_t offset : {size_t{0}, size_t{3}}) {
      std::fill(dst.begin(), dst.end(), 0xAB);
      std::fill(want.begin(), want.end(), 0xAB);
      std::memcpy(want.data() + offset, src.data() + 1, n);
      const uint64_t sum = CopyAndChecksum64(dst.data() + offset, src.data() + 1, n, 42);
      EXPECT_EQ(sum, Checksum64(src.data() + 1, n, 42)) << "n " << n;
      EXPECT_EQ(dst, want) << "n " << n << " offset " << offset;
    }
  }
}

}  // namespace
}  // namespace sluice::checkpoint_engine
