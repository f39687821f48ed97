// The first error of several threads: each reports its outcome, the first
// error is kept, and any thread may ask whether one has happened yet (to
// stop early). OK outcomes are ignored. Thread-safe.
#ifndef SLUICE_COMMON_FIRST_ERROR_H_
#define SLUICE_COMMON_FIRST_ERROR_H_

#include <atomic>

#include "sluice/common/mutex.h"
#include "sluice/common/status.h"

namespace sluice {

class FirstError {
 public:
  // Keeps `s` if it is an error and none was kept before.
  void Set(Status s);
  // Whether an error was kept (lock-free: for loops that poll it).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The first error, or OK.
  Status Get() const;

 private:
  mutable Mutex mu_;
  Status first_ SLUICE_GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
};

}  // namespace sluice

#endif  // SLUICE_COMMON_FIRST_ERROR_H_
