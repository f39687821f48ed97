// The clock that lease deadlines are measured on, injected so tests can
// expire leases deterministically (ManualClock) instead of sleeping.
//
// Blocking calls (GetMeta, puts waiting for capacity, admission) always wait
// in real time: their timeouts are real durations whatever the clock.
//
// Thread safety: implementations are thread-safe.
#ifndef SLUICE_TRANSFER_QUEUE_CLOCK_H_
#define SLUICE_TRANSFER_QUEUE_CLOCK_H_

#include <atomic>
#include <chrono>

namespace sluice::transfer_queue {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

// Time moves only when Advance() is called. Starts at the steady clock's
// epoch plus one hour, so deadlines are never near the epoch.
class ManualClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(std::chrono::nanoseconds(now_ns_.load())); }
  void Advance(std::chrono::nanoseconds d) { now_ns_.fetch_add(d.count()); }

 private:
  std::atomic<int64_t> now_ns_{std::chrono::nanoseconds(std::chrono::hours(1)).count()};
};

}  // namespace sluice::transfer_queue

#endif  // SLUICE_TRANSFER_QUEUE_CLOCK_H_
