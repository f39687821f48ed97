#include "sluice/rollout/standby_slots.h"

#include <algorithm>
#include <utility>

namespace sluice::rollout {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

StandbySlots::StandbySlots(PolicyVersion serving_version) {
  MutexLock lock(&mu_);
  version_ = {serving_version, serving_version};
}

std::optional<StandbySlots::Handed> StandbySlots::OnStep(PolicyVersion current) {
  const auto start = Clock::now();
  std::optional<Handed> out;
  MutexLock lock(&mu_);
  if (handed_ && version_[*handed_] == current) {
    // The engine serves the handed buffer now: the old one is free.
    serving_ = *handed_;
    handed_.reset();
    changed_.NotifyAll();
  }
  if (!handed_ && ready_ && version_[*ready_] > current) {
    handed_ = *ready_;
    ready_.reset();
    ++stats_.handed;
    stats_.ready_version = -1;
    out = Handed{*handed_, version_[*handed_]};
    changed_.NotifyAll();
  }
  stats_.max_hook_seconds =
      std::max(stats_.max_hook_seconds, std::chrono::duration<double>(Clock::now() - start).count());
  return out;
}

PolicyVersion StandbySlots::serving_version() const {
  MutexLock lock(&mu_);
  return version_[serving_];
}

std::optional<int> StandbySlots::FreeBuffer() const {
  const int other = 1 - serving_;
  if (handed_ && *handed_ == other) return std::nullopt;
  return other;
}

void StandbySlots::Saw(PolicyVersion version) {
  MutexLock lock(&mu_);
  stats_.newest_seen = version;
}

std::optional<int> StandbySlots::TakeFreeBuffer(const std::stop_token& stop, std::chrono::milliseconds poll) {
  MutexLock lock(&mu_);
  while (!FreeBuffer() && !stop.stop_requested()) {
    changed_.WaitFor(&mu_, poll, [&]() SLUICE_REQUIRES(mu_) { return FreeBuffer().has_value(); });
  }
  if (stop.stop_requested()) return std::nullopt;
  const int target = *FreeBuffer();
  if (ready_ && *ready_ == target) {
    ready_.reset();  // superseded before it was handed: overwritten
    stats_.ready_version = -1;
  }
  return target;
}

void StandbySlots::Filled(int buffer, PolicyVersion version, double seconds) {
  MutexLock lock(&mu_);
  version_[buffer] = version;
  ready_ = buffer;
  ++stats_.fills;
  stats_.ready_version = version;
  stats_.last_fill_seconds = seconds;
  changed_.NotifyAll();
}

void StandbySlots::FillFailed(std::string error) {
  MutexLock lock(&mu_);
  ++stats_.fill_errors;
  stats_.last_error = std::move(error);
}

Status StandbySlots::WaitUntilReady(PolicyVersion v, std::chrono::milliseconds timeout) {
  MutexLock lock(&mu_);
  const bool ok = changed_.WaitFor(&mu_, timeout, [&]() SLUICE_REQUIRES(mu_) {
    return (ready_ && version_[*ready_] >= v) || (handed_ && version_[*handed_] >= v) || version_[serving_] >= v;
  });
  if (ok) return Status::Ok();
  return Status::Timeout("standby weights: version " + std::to_string(v) + " not ready after " +
                         std::to_string(timeout.count()) + " ms (newest seen " + std::to_string(stats_.newest_seen) +
                         (stats_.last_error.empty() ? "" : ", last error: " + stats_.last_error) + ")");
}

StandbyStats StandbySlots::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace sluice::rollout
