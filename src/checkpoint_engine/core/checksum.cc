#include "core/checksum.h"

#include <algorithm>
#include <cstring>

namespace sluice::checkpoint_engine {
namespace {

constexpr uint64_t kP1 = 11400714785074694791ULL;
constexpr uint64_t kP2 = 14029467366897019727ULL;
constexpr uint64_t kP3 = 1609587929392839161ULL;
constexpr uint64_t kP4 = 9650029242287828579ULL;
constexpr uint64_t kP5 = 2870177450012600261ULL;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// memcpy, not a cast: tensor bytes carry no alignment promise.
inline uint64_t Load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t Load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint64_t Round(uint64_t acc, uint64_t lane) {
  acc += lane * kP2;
  acc = Rotl(acc, 31);
  return acc * kP1;
}

inline uint64_t MergeRound(uint64_t acc, uint64_t val) {
  acc ^= Round(0, val);
  return acc * kP1 + kP4;
}

// XXH64's four lanes over 32-byte stripes.
struct Lanes {
  uint64_t v1, v2, v3, v4;
  explicit Lanes(uint64_t seed) : v1(seed + kP1 + kP2), v2(seed + kP2), v3(seed), v4(seed - kP1) {}
  void Stripes(const unsigned char* p, size_t count) {
    for (size_t i = 0; i < count; ++i, p += 32) {
      v1 = Round(v1, Load64(p));
      v2 = Round(v2, Load64(p + 8));
      v3 = Round(v3, Load64(p + 16));
      v4 = Round(v4, Load64(p + 24));
    }
  }
  uint64_t Merge() const {
    uint64_t h = Rotl(v1, 1) + Rotl(v2, 7) + Rotl(v3, 12) + Rotl(v4, 18);
    h = MergeRound(h, v1);
    h = MergeRound(h, v2);
    h = MergeRound(h, v3);
    return MergeRound(h, v4);
  }
};

// The hash after the stripes: `h` folded with the tail (< 32 bytes) and the
// total length.
uint64_t Finish(uint64_t h, const unsigned char* p, const unsigned char* end, size_t nbytes) {
  h += static_cast<uint64_t>(nbytes);
  while (p + 8 <= end) {
    h ^= Round(0, Load64(p));
    h = Rotl(h, 27) * kP1 + kP4;
    p += 8;
  }
  if (p + 4 <= end) {
    h ^= static_cast<uint64_t>(Load32(p)) * kP1;
    h = Rotl(h, 23) * kP2 + kP3;
    p += 4;
  }
  while (p < end) {
    h ^= static_cast<uint64_t>(*p) * kP5;
    h = Rotl(h, 11) * kP1;
    ++p;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t Checksum64(const void* data, size_t nbytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t stripes = nbytes / 32;
  if (stripes == 0) return Finish(seed + kP5, p, p + nbytes, nbytes);
  Lanes lanes(seed);
  lanes.Stripes(p, stripes);
  return Finish(lanes.Merge(), p + stripes * 32, p + nbytes, nbytes);
}

uint64_t CopyAndChecksum64(void* dst, const void* src, size_t nbytes, uint64_t seed) {
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  const size_t stripes = nbytes / 32;
  if (stripes == 0) {
    if (nbytes > 0) std::memcpy(out, in, nbytes);
    return Finish(seed + kP5, out, out + nbytes, nbytes);
  }
  // Copy a block, then hash it from the copy while it is still in cache:
  // the bytes cross the memory bus once for the copy, not again for the hash.
  constexpr size_t kBlockStripes = 1024;  // 32 KiB
  Lanes lanes(seed);
  for (size_t done = 0; done < stripes; done += kBlockStripes) {
    const size_t n = std::min(kBlockStripes, stripes - done);
    std::memcpy(out + done * 32, in + done * 32, n * 32);
    lanes.Stripes(out + done * 32, n);
  }
  const size_t tail = stripes * 32;
  std::memcpy(out + tail, in + tail, nbytes - tail);
  return Finish(lanes.Merge(), out + tail, out + nbytes, nbytes);
}

}  // namespace sluice::checkpoint_engine
