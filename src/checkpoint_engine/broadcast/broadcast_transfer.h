// The data plane of one version over a GlooGroup: the stream plan's buckets,
// max_in_flight at a time. Thread t of every rank runs buckets t, t+K,
// t+2K, ... with Gloo tag kFirstBucketTag + t, so the K pipelines match up
// across ranks without any other coordination.
//
// Thread safety: each call owns its threads and joins them before returning.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_TRANSFER_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_TRANSFER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "broadcast/broadcast_wire.h"
#include "broadcast/gloo_group.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine::internal {

// Scratch buffers for packed buckets (and for buckets a receiver discards),
// one per pipeline; reused across versions.
class BucketScratch {
 public:
  void Ensure(size_t pipelines, size_t bucket_bytes);
  std::byte* data(size_t pipeline) { return buffers_[pipeline].get(); }

 private:
  std::vector<std::unique_ptr<std::byte[]>> buffers_;
  size_t bucket_bytes_ = 0;
};

// Rank 0: sends every bucket of `plan`; tensors[t] points at tensor t's
// bytes (read only). The first network error (the group is then broken).
// `after_bucket` (a test hook, may be empty) runs on the sending thread after
// each bucket.
Status SendVersion(GlooGroup& group, const bcast::StreamPlan& plan, const std::vector<const std::byte*>& tensors,
                   uint32_t max_in_flight, BucketScratch& scratch,
                   const std::function<void(size_t bucket, size_t buckets)>& after_bucket);

struct ReceiveOptions {
  // Destination of each tensor (its staging memory). Empty: discard every
  // byte (still taking part in the collective, which Gloo requires).
  std::vector<std::span<std::byte>> destinations;
  // Called for each tensor once all its bytes landed, on the verifier
  // thread, in completion order; the first error stops further calls.
  std::function<Status(size_t tensor)> seal;
  // Test hook: after each bucket landed, on its receiving thread.
  std::function<void(size_t bucket, size_t buckets)> after_bucket;
  // Set by the caller to abandon the transfer (checked between buckets).
  const std::atomic<bool>* cancel = nullptr;
};

struct ReceiveResult {
  Status network;  // first network error (or Aborted when cancelled): the group is broken
  Status sealed;   // first seal error: the version must be aborted, the group is fine
};

// Ranks 1..N-1: receives every bucket of `plan`.
ReceiveResult ReceiveVersion(GlooGroup& group, const bcast::StreamPlan& plan, uint32_t max_in_flight,
                             BucketScratch& scratch, const ReceiveOptions& options);

}  // namespace sluice::checkpoint_engine::internal

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_TRANSFER_H_
