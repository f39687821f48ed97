#include "net/worker_pool.h"

#include <utility>

#include "sluice/common/check.h"

namespace sluice::transfer_queue::internal {

WorkerPool::WorkerPool(std::string name, size_t min_threads, size_t max_threads, size_t max_queue)
    : name_(std::move(name)), min_threads_(min_threads), max_threads_(max_threads), max_queue_(max_queue) {
  SLUICE_CHECK(max_threads_ > 0 && min_threads_ <= max_threads_) << name_;
}

WorkerPool::~WorkerPool() { Stop(); }

Status WorkerPool::Start() {
  MutexLock lock(&mu_);
  while (threads_.size() < min_threads_) SLUICE_RETURN_IF_ERROR(StartThreadLocked());
  return Status::Ok();
}

Status WorkerPool::StartThreadLocked() {
  auto thread = std::make_unique<BackgroundThread>(name_ + "-" + std::to_string(threads_.size()));
  // The body takes mu_ first thing; it waits until the caller releases it.
  SLUICE_RETURN_IF_ERROR(thread->Start([this](std::stop_token) { Run(); }));
  threads_.push_back(std::move(thread));
  return Status::Ok();
}

bool WorkerPool::TrySubmit(Job job) {
  MutexLock lock(&mu_);
  if (stopping_) return false;
  // Idle threads not yet claimed by queued jobs take it at once.
  if (idle_ <= queue_.size()) {
    if (threads_.size() < max_threads_) {
      if (!StartThreadLocked().ok()) return false;
    } else if (queue_.size() >= max_queue_ + idle_) {
      return false;
    }
  }
  queue_.push_back(std::move(job));
  work_.NotifyOne();
  return true;
}

void WorkerPool::Run() {
  for (;;) {
    Job job;
    {
      MutexLock lock(&mu_);
      ++idle_;
      // Stop() notifies; the timeout only bounds a missed wake-up.
      work_.WaitFor(&mu_, std::chrono::seconds(1),
                    [this]() SLUICE_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      --idle_;
      if (stopping_) return;
      if (queue_.empty()) continue;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

void WorkerPool::Stop() {
  std::vector<std::unique_ptr<BackgroundThread>> threads;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    queue_.clear();
    threads.swap(threads_);
    work_.NotifyAll();
  }
  for (auto& t : threads) t->Stop();
}

size_t WorkerPool::threads() const {
  MutexLock lock(&mu_);
  return threads_.size();
}

}  // namespace sluice::transfer_queue::internal
