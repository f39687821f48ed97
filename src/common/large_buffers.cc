#include "sluice/common/large_buffers.h"

#include <algorithm>
#include <bit>
#include <deque>
#include <utility>

#include "sluice/common/mutex.h"

namespace sluice::large_buffers {
namespace {

struct Cached {
  std::unique_ptr<std::byte[]> buffer;
  size_t capacity = 0;
};

struct Cache {
  Mutex mu;
  std::deque<Cached> idle SLUICE_GUARDED_BY(mu);  // oldest first
  size_t idle_bytes SLUICE_GUARDED_BY(mu) = 0;
  uint64_t reused SLUICE_GUARDED_BY(mu) = 0;
  uint64_t allocated SLUICE_GUARDED_BY(mu) = 0;
};

// Never destroyed: buffers may come back from other threads' destructors at
// exit.
Cache& TheCache() {
  static Cache* cache = new Cache();
  return *cache;
}

}  // namespace

std::unique_ptr<std::byte[]> Take(size_t bytes, size_t* capacity) {
  if (bytes >= kMinBytes) {
    Cache& c = TheCache();
    MutexLock lock(&c.mu);
    auto best = c.idle.end();
    for (auto it = c.idle.begin(); it != c.idle.end(); ++it) {
      if (it->capacity < bytes || it->capacity / 4 > bytes) continue;
      if (best == c.idle.end() || it->capacity < best->capacity) best = it;
    }
    if (best != c.idle.end()) {
      std::unique_ptr<std::byte[]> buffer = std::move(best->buffer);
      *capacity = best->capacity;
      c.idle_bytes -= best->capacity;
      c.idle.erase(best);
      ++c.reused;
      return buffer;
    }
    ++c.allocated;
    const size_t step = std::max(kMinBytes, std::bit_floor(bytes) / 8);
    bytes = (bytes + step - 1) / step * step;
  }
  *capacity = bytes;
  // new[] without (): no memset of bytes the caller overwrites anyway.
  return std::unique_ptr<std::byte[]>(new std::byte[bytes > 0 ? bytes : 1]);
}

void Give(std::unique_ptr<std::byte[]> buffer, size_t capacity) {
  if (buffer == nullptr || capacity < kMinBytes || capacity > kMaxCachedBytes) return;
  std::deque<Cached> evicted;  // freed after the lock is dropped
  {
    Cache& c = TheCache();
    MutexLock lock(&c.mu);
    while (!c.idle.empty() && (c.idle.size() >= kMaxCachedBuffers || c.idle_bytes + capacity > kMaxCachedBytes)) {
      c.idle_bytes -= c.idle.front().capacity;
      evicted.push_back(std::move(c.idle.front()));
      c.idle.pop_front();
    }
    c.idle.push_back(Cached{std::move(buffer), capacity});
    c.idle_bytes += capacity;
  }
}

std::shared_ptr<std::byte[]> TakeShared(size_t bytes) {
  size_t capacity = 0;
  std::unique_ptr<std::byte[]> buffer = Take(bytes, &capacity);
  if (capacity < kMinBytes) return std::shared_ptr<std::byte[]>(std::move(buffer));
  return std::shared_ptr<std::byte[]>(buffer.release(),
                                      [capacity](std::byte* p) { Give(std::unique_ptr<std::byte[]>(p), capacity); });
}

Stats GetStats() {
  Cache& c = TheCache();
  MutexLock lock(&c.mu);
  return Stats{c.idle.size(), c.idle_bytes, c.reused, c.allocated};
}

void ReleaseCached() {
  std::deque<Cached> evicted;
  Cache& c = TheCache();
  MutexLock lock(&c.mu);
  evicted.swap(c.idle);
  c.idle_bytes = 0;
}

}  // namespace sluice::large_buffers
