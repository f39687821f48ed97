// An annotated mutex wrapper so clang's -Wthread-safety can check GUARDED_BY
// fields, plus a scoped lock and a condition variable that work with it.
//
// Thread safety: Mutex and CondVar are the synchronization primitives
// themselves; MutexLock is owned by a single thread.
#ifndef SLUICE_COMMON_MUTEX_H_
#define SLUICE_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define SLUICE_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define SLUICE_THREAD_ANNOTATION_(x)
#endif

#define SLUICE_CAPABILITY(x) SLUICE_THREAD_ANNOTATION_(capability(x))
#define SLUICE_SCOPED_CAPABILITY SLUICE_THREAD_ANNOTATION_(scoped_lockable)
#define SLUICE_GUARDED_BY(x) SLUICE_THREAD_ANNOTATION_(guarded_by(x))
#define SLUICE_PT_GUARDED_BY(x) SLUICE_THREAD_ANNOTATION_(pt_guarded_by(x))
#define SLUICE_REQUIRES(...) SLUICE_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define SLUICE_EXCLUDES(...) SLUICE_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define SLUICE_ACQUIRE(...) SLUICE_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define SLUICE_RELEASE(...) SLUICE_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define SLUICE_NO_THREAD_SAFETY_ANALYSIS SLUICE_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace sluice {

class SLUICE_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() SLUICE_ACQUIRE() { mu_.lock(); }
  void Unlock() SLUICE_RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

class SLUICE_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) SLUICE_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() SLUICE_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

// Condition variable bound to a Mutex. Every wait takes a deadline: nothing in
// Sluice blocks forever.
class CondVar {
 public:
  using Clock = std::chrono::steady_clock;

  // Waits until `pred()` holds or `deadline` passes; returns pred()'s final
  // value. The caller holds `mu`.
  template <typename Pred>
  bool WaitUntil(Mutex* mu, Clock::time_point deadline, Pred pred) SLUICE_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    bool result = cv_.wait_until(lock, deadline, pred);
    lock.release();  // ownership stays with the caller's MutexLock
    return result;
  }
  template <typename Pred>
  bool WaitFor(Mutex* mu, Clock::duration timeout, Pred pred) SLUICE_REQUIRES(mu) {
    return WaitUntil(mu, Clock::now() + timeout, std::move(pred));
  }

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_MUTEX_H_
