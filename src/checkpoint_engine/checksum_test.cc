#include "checksum.h"

#include <gtest/gtest.h>

#include <cstring>
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
