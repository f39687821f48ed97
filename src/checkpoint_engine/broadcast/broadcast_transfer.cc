#include "broadcast/broadcast_transfer.h"

#include <cstring>
#include <deque>
#include <thread>

#include "sluice/common/first_error.h"
#include "sluice/common/mutex.h"

namespace sluice::checkpoint_engine::internal {
namespace {

// Tensors whose last piece landed, handed from the network threads to the
// verifier.
class CompletionQueue {
 public:
  void Push(size_t tensor) {
    MutexLock lock(&mu_);
    ready_.push_back(tensor);
    cv_.NotifyAll();
  }
  void Close() {
    MutexLock lock(&mu_);
    closed_ = true;
    cv_.NotifyAll();
  }
  // False once closed and drained.
  bool Pop(size_t* tensor) {
    MutexLock lock(&mu_);
    while (true) {
      if (!ready_.empty()) {
        *tensor = ready_.front();
        ready_.pop_front();
        return true;
      }
      if (closed_) return false;
      // Bounded wait: Close() always notifies, this only guards a lost wakeup.
      cv_.WaitFor(&mu_, std::chrono::milliseconds(100),
                  [this]() SLUICE_NO_THREAD_SAFETY_ANALYSIS { return closed_ || !ready_.empty(); });
    }
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::deque<size_t> ready_ SLUICE_GUARDED_BY(mu_);
  bool closed_ SLUICE_GUARDED_BY(mu_) = false;
};

}  // namespace

void BucketScratch::Ensure(size_t pipelines, size_t bucket_bytes) {
  if (bucket_bytes != bucket_bytes_) {
    buffers_.clear();
    bucket_bytes_ = bucket_bytes;
  }
  while (buffers_.size() < pipelines) buffers_.emplace_back(new std::byte[bucket_bytes]);
}

Status SendVersion(GlooGroup& group, const bcast::StreamPlan& plan, const std::vector<const std::byte*>& tensors,
                   uint32_t max_in_flight, BucketScratch& scratch,
                   const std::function<void(size_t bucket, size_t buckets)>& after_bucket) {
  const size_t pipelines = std::min<size_t>(max_in_flight, std::max<size_t>(plan.buckets.size(), 1));
  FirstError error;
  {
    std::vector<std::jthread> threads;
    for (size_t p = 0; p < pipelines; ++p) {
      threads.emplace_back([&, p] {
        for (size_t j = p; j < plan.buckets.size() && !error.failed(); j += pipelines) {
          const bcast::Bucket& bucket = plan.buckets[j];
          std::byte* data;
          if (bucket.packed) {
            data = scratch.data(p);
            for (const bcast::Piece& piece : bucket.pieces) {
              std::memcpy(data + piece.bucket_offset, tensors[piece.tensor] + piece.tensor_offset, piece.nbytes);
            }
          } else {
            // Gloo only reads the root's buffer.
            const bcast::Piece& piece = bucket.pieces[0];
            data = const_cast<std::byte*>(tensors[piece.tensor] + piece.tensor_offset);
          }
          Status s = group.Broadcast(data, bucket.nbytes, bcast::kFirstBucketTag + static_cast<uint32_t>(p));
          if (!s.ok()) {
            error.Set(s.WithContext("bucket " + std::to_string(j) + " of " + std::to_string(plan.buckets.size())));
            group.Abort();  // the other pipelines' operations fail now, not at the timeout
            break;
          }
          if (after_bucket) after_bucket(j, plan.buckets.size());
        }
      });
    }
  }  // joins
  return error.Get();
}

ReceiveResult ReceiveVersion(GlooGroup& group, const bcast::StreamPlan& plan, uint32_t max_in_flight,
                             BucketScratch& scratch, const ReceiveOptions& options) {
  const bool discard = options.destinations.empty();
  const size_t pipelines = std::min<size_t>(max_in_flight, std::max<size_t>(plan.buckets.size(), 1));
  const size_t num_tensors = plan.pieces_per_tensor.size();
  FirstError network;
  FirstError sealed;
  CompletionQueue completed;
  std::vector<std::atomic<uint32_t>> remaining(num_tensors);
  for (size_t t = 0; t < num_tensors; ++t) {
    remaining[t].store(plan.pieces_per_tensor[t], std::memory_order_relaxed);
    if (!discard && plan.pieces_per_tensor[t] == 0) completed.Push(t);  // empty tensors are complete already
  }
  {
    // The verifier checksums tensors while later buckets are still arriving.
    std::jthread verifier;
    if (!discard) {
      verifier = std::jthread([&] {
        size_t t;
        while (completed.Pop(&t)) {
          if (sealed.failed() || network.failed()) continue;  // drain; the version is lost anyway
          Status s = options.seal(t);
          if (!s.ok()) sealed.Set(s);
        }
      });
    }
    std::vector<std::jthread> threads;
    for (size_t p = 0; p < pipelines; ++p) {
      threads.emplace_back([&, p] {
        for (size_t j = p; j < plan.buckets.size() && !network.failed(); j += pipelines) {
          if (options.cancel != nullptr && options.cancel->load(std::memory_order_acquire)) {
            network.Set(Status::Aborted("the transfer was abandoned (subscriber stopping)"));
            group.Abort();
            break;
          }
          const bcast::Bucket& bucket = plan.buckets[j];
          std::byte* data = scratch.data(p);
          if (!discard && !bucket.packed) {
            const bcast::Piece& piece = bucket.pieces[0];
            data = options.destinations[piece.tensor].data() + piece.tensor_offset;  // straight into staging
          }
          Status s = group.Broadcast(data, bucket.nbytes, bcast::kFirstBucketTag + static_cast<uint32_t>(p));
          if (!s.ok()) {
            network.Set(s.WithContext("bucket " + std::to_string(j) + " of " + std::to_string(plan.buckets.size())));
            group.Abort();  // the other pipelines' operations fail now, not at the timeout
            break;
          }
          if (!discard) {
            for (const bcast::Piece& piece : bucket.pieces) {
              if (bucket.packed) {
                std::memcpy(options.destinations[piece.tensor].data() + piece.tensor_offset, data + piece.bucket_offset,
                            piece.nbytes);
              }
              if (remaining[piece.tensor].fetch_sub(1, std::memory_order_acq_rel) == 1) completed.Push(piece.tensor);
            }
          }
          if (options.after_bucket) options.after_bucket(j, plan.buckets.size());
        }
      });
    }
    for (std::jthread& t : threads) t.join();
    completed.Close();
  }  // joins the verifier
  return {network.Get(), sealed.Get()};
}

}  // namespace sluice::checkpoint_engine::internal
