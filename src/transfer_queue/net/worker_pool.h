// A pool of owned worker threads for the TransferQueue server: a bounded
// queue, at least `min_threads` threads, more started on demand up to
// `max_threads` when every thread is busy. Threads are kept until Stop.
//
// The server runs two: a fixed pool for quick requests, and an on-demand
// pool with no queue for requests that may block (GetMeta waiting for rows,
// producers waiting for capacity), so a blocked call never delays a quick one.
//
// Thread safety: TrySubmit may be called from any thread; Start and Stop by
// the owner. Lock order: mu_ only.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_WORKER_POOL_H_
#define SLUICE_SRC_TRANSFER_QUEUE_WORKER_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/background_thread.h"
#include "sluice/common/mutex.h"
#include "sluice/common/status.h"

namespace sluice::transfer_queue::internal {

class WorkerPool {
 public:
  using Job = std::function<void()>;

  // Precondition: min_threads <= max_threads, max_threads > 0.
  WorkerPool(std::string name, size_t min_threads, size_t max_threads, size_t max_queue);
  ~WorkerPool();  // Stop()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  Status Start();
  // Queues `job` for a free thread, starting one if every thread is busy and
  // there are fewer than max_threads; false (job dropped) if the pool is
  // stopped, or busy with max_threads running and max_queue waiting.
  bool TrySubmit(Job job);
  // Stops taking jobs, drops queued ones, joins every thread (waiting for
  // running jobs to return). Idempotent.
  void Stop();

  size_t threads() const;

 private:
  void Run();
  Status StartThreadLocked() SLUICE_REQUIRES(mu_);

  const std::string name_;
  const size_t min_threads_;
  const size_t max_threads_;
  const size_t max_queue_;

  mutable Mutex mu_;
  CondVar work_;
  std::deque<Job> queue_ SLUICE_GUARDED_BY(mu_);
  size_t idle_ SLUICE_GUARDED_BY(mu_) = 0;
  bool stopping_ SLUICE_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<BackgroundThread>> threads_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_WORKER_POOL_H_
