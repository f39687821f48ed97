// A process-wide cache of large, transient byte buffers (a message of a MiB
// or more, received or encoded, then dropped).
//
// A fresh allocation of many MiB comes from mmap and faults in every page on
// first touch, and freeing it unmaps it again, so a stream of large messages
// pays the kernel's page-fault path once per page per message: measured on
// the development VM, a 64 MiB put+take round trip over TCP spent most of
// its time there (40k faults per round trip). Buffers handed back here are
// kept (a few, bounded in bytes) and handed out again to the next large
// request that fits them, already faulted in.
//
// Requests under kMinBytes are plain new[]: malloc's heap already recycles
// those. Buffers are allocated with new std::byte[], so one that is never
// handed back is freed correctly by its unique_ptr.
//
// Thread safety: every function is thread-safe.
#ifndef SLUICE_COMMON_LARGE_BUFFERS_H_
#define SLUICE_COMMON_LARGE_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace sluice::large_buffers {

// Smallest request served from the cache.
inline constexpr size_t kMinBytes = size_t{1} << 20;
// What the cache holds at most while buffers are idle: enough for a request
// and a reply of 256 MiB, or a batch of freed storage cells.
inline constexpr size_t kMaxCachedBuffers = 64;
inline constexpr size_t kMaxCachedBytes = size_t{512} << 20;

// A buffer of at least `bytes` (contents unspecified): a cached one when one
// fits (the smallest, and never one over four times the request), else a new
// one rounded up to an eighth of the request's power of two (so a request and
// a reply a few bytes apart fit the same buffer; pages never touched cost no
// memory). *capacity is the buffer's real size.
std::unique_ptr<std::byte[]> Take(size_t bytes, size_t* capacity);

// Hands a buffer back; `capacity` is its real size (as Take reported it).
// Kept when it is at least kMinBytes and fits the bounds (the oldest cached
// buffers are freed to make room), freed otherwise. Null is ignored.
void Give(std::unique_ptr<std::byte[]> buffer, size_t capacity);

// Take, owned by a shared_ptr whose last owner hands the buffer back.
std::shared_ptr<std::byte[]> TakeShared(size_t bytes);

struct Stats {
  size_t cached_buffers = 0;
  size_t cached_bytes = 0;
  uint64_t reused = 0;     // Take calls served from the cache
  uint64_t allocated = 0;  // Take calls of at least kMinBytes that allocated
};
Stats GetStats();

// Frees every cached buffer (for a process about to idle long; tests start
// from an empty cache with it).
void ReleaseCached();

}  // namespace sluice::large_buffers

#endif  // SLUICE_COMMON_LARGE_BUFFERS_H_
