#include "sluice/common/first_error.h"

#include <utility>

namespace sluice {

void FirstError::Set(Status s) {
  if (s.ok()) return;
  MutexLock lock(&mu_);
  if (first_.ok()) first_ = std::move(s);
  failed_.store(true, std::memory_order_release);
}

Status FirstError::Get() const {
  MutexLock lock(&mu_);
  return first_;
}

}  // namespace sluice
