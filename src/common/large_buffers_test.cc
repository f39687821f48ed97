#include "sluice/common/large_buffers.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace sluice::large_buffers {
namespace {

// The cache is process-wide: each test starts from an empty one.
void Flush() {
  ReleaseCached();
  ASSERT_EQ(GetStats().cached_buffers, 0u);
  ASSERT_EQ(GetStats().cached_bytes, 0u);
}

TEST(LargeBuffersTest, AHandedBackBufferServesTheNextRequestThatFits) {
  Flush();
  size_t capacity = 0;
  std::unique_ptr<std::byte[]> a = Take(8 * kMinBytes, &capacity);
  ASSERT_EQ(capacity, 8 * kMinBytes);
  std::byte* const address = a.get();
  Give(std::move(a), capacity);
  // Smaller, but not under a quarter of it: the same buffer, its real size.
  const Stats before = GetStats();
  std::unique_ptr<std::byte[]> b = Take(3 * kMinBytes, &capacity);
  EXPECT_EQ(b.get(), address);
  EXPECT_EQ(capacity, 8 * kMinBytes);
  EXPECT_EQ(GetStats().reused, before.reused + 1);
  Give(std::move(b), capacity);
  // Larger than anything cached, or under a quarter of it: a new buffer.
  std::unique_ptr<std::byte[]> c = Take(9 * kMinBytes, &capacity);
  EXPECT_NE(c.get(), address);
  EXPECT_EQ(capacity, 9 * kMinBytes);
  std::unique_ptr<std::byte[]> d = Take(2 * kMinBytes - 1, &capacity);
  EXPECT_NE(d.get(), address);
  EXPECT_EQ(capacity, 2 * kMinBytes);  // rounded up to whole MiB
}

TEST(LargeBuffersTest, NewBuffersAreRoundedUpToAnEighthOfTheirPowerOfTwo) {
  Flush();
  size_t capacity = 0;
  std::unique_ptr<std::byte[]> a = Take(256 * kMinBytes + 2048, &capacity);
  EXPECT_EQ(capacity, 288 * kMinBytes);
  Give(std::move(a), capacity);
  // A reply a little larger than the request it answers fits its buffer.
  const Stats before = GetStats();
  std::unique_ptr<std::byte[]> b = Take(256 * kMinBytes + 4096, &capacity);
  EXPECT_EQ(capacity, 288 * kMinBytes);
  EXPECT_EQ(GetStats().reused, before.reused + 1);
  EXPECT_EQ(Take(3 * kMinBytes + 1, &capacity) != nullptr, true);
  EXPECT_EQ(capacity, 4 * kMinBytes);
}

TEST(LargeBuffersTest, SmallRequestsAndOversizedBuffersBypassTheCache) {
  Flush();
  const Stats before = GetStats();
  size_t capacity = 0;
  std::unique_ptr<std::byte[]> small = Take(100, &capacity);
  EXPECT_EQ(capacity, 100u);
  Give(std::move(small), capacity);  // freed, not cached
  std::unique_ptr<std::byte[]> zero = Take(0, &capacity);
  EXPECT_NE(zero, nullptr);
  Give(nullptr, kMinBytes);  // ignored
  // Over the cache's byte bound: freed (never touched, so no page is faulted in).
  Give(std::unique_ptr<std::byte[]>(new std::byte[kMaxCachedBytes + 1]), kMaxCachedBytes + 1);
  const Stats after = GetStats();
  EXPECT_EQ(after.cached_buffers, before.cached_buffers);
  EXPECT_EQ(after.cached_bytes, before.cached_bytes);
  EXPECT_EQ(after.reused, before.reused);
  EXPECT_EQ(after.allocated, before.allocated);
}

TEST(LargeBuffersTest, TheCacheStaysWithinItsBoundsAndEvictsTheOldest) {
  // The byte bound: 64 MiB buffers, all held, then all handed back in turn
  // (never touched: no page is faulted in).
  Flush();
  const size_t fit = kMaxCachedBytes / (64 * kMinBytes);
  std::vector<std::unique_ptr<std::byte[]>> held;
  std::vector<std::byte*> given;
  size_t capacity = 0;
  for (size_t i = 0; i < fit + 3; ++i) {
    held.push_back(Take(64 * kMinBytes - 1, &capacity));
    ASSERT_EQ(capacity, 64 * kMinBytes);
    given.push_back(held.back().get());
  }
  for (auto& b : held) {
    Give(std::move(b), 64 * kMinBytes);
    EXPECT_LE(GetStats().cached_bytes, kMaxCachedBytes);
  }
  EXPECT_EQ(GetStats().cached_buffers, fit);
  // The newest were kept; of equal buffers the oldest kept is served first.
  std::unique_ptr<std::byte[]> oldest_kept = Take(64 * kMinBytes, &capacity);
  EXPECT_EQ(oldest_kept.get(), given[3]);

  // The count bound: many 1 MiB buffers held at once, then all handed back.
  Flush();
  held.clear();
  for (size_t i = 0; i < kMaxCachedBuffers + 5; ++i) held.push_back(Take(kMinBytes, &capacity));
  for (auto& b : held) Give(std::move(b), kMinBytes);
  EXPECT_EQ(GetStats().cached_buffers, kMaxCachedBuffers);
  EXPECT_EQ(GetStats().cached_bytes, kMaxCachedBuffers * kMinBytes);
}

TEST(LargeBuffersTest, ASharedBufferReturnsWhenItsLastOwnerGoes) {
  Flush();
  std::shared_ptr<std::byte[]> shared = TakeShared(2 * kMinBytes);
  std::byte* const address = shared.get();
  std::shared_ptr<std::byte[]> second = shared;
  shared.reset();
  // Still owned: not back yet, so a request for it gets another buffer.
  size_t capacity = 0;
  std::unique_ptr<std::byte[]> other = Take(2 * kMinBytes, &capacity);
  EXPECT_NE(other.get(), address);
  EXPECT_EQ(GetStats().cached_buffers, 0u);
  second.reset();
  EXPECT_EQ(GetStats().cached_buffers, 1u);
  std::unique_ptr<std::byte[]> back = Take(2 * kMinBytes, &capacity);
  EXPECT_EQ(back.get(), address);
}

TEST(LargeBuffersTest, ThreadsTakeAndGiveConcurrently) {
  Flush();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        size_t capacity = 0;
        std::unique_ptr<std::byte[]> b = Take((1 + (i + t) % 3) * kMinBytes, &capacity);
        b[0] = std::byte{1};
        b[capacity - 1] = std::byte{2};
        Give(std::move(b), capacity);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const Stats s = GetStats();
  EXPECT_LE(s.cached_buffers, kMaxCachedBuffers);
  EXPECT_LE(s.cached_bytes, kMaxCachedBytes);
}

}  // namespace
}  // namespace sluice::large_buffers
