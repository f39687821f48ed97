#include "sluice/checkpoint_engine/relay.h"

#include <atomic>
#include <thread>
#include <utility>

#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/common/background_thread.h"
#include "sluice/common/logging.h"
#include "sluice/common/mutex.h"

namespace sluice::checkpoint_engine {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

struct ShmBroadcastRelay::Impl {
  RelayOptions options;
  std::unique_ptr<BroadcastPublisher> publisher;
  Clock::time_point first_deadline;
  mutable Mutex mu;
  Status status SLUICE_GUARDED_BY(mu);
  RelayStats stats SLUICE_GUARDED_BY(mu);
  BackgroundThread thread{"weight relay"};

  Status Run(const std::stop_token& stop);
  // Publishes `pinned`; Unavailable (the first version's subscribers not
  // all there yet) is for the caller to try again.
  Status Deliver(const PinnedWeights& pinned);
};

Status ShmBroadcastRelay::Impl::Deliver(const PinnedWeights& pinned) {
  const auto start = Clock::now();
  Status published = publisher->Publish(pinned.version, pinned.tensors);
  if (!published.ok()) return published;
  MutexLock lock(&mu);
  ++stats.deliveries;
  stats.last_delivered = pinned.version;
  stats.last_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return Status::Ok();
}

Status ShmBroadcastRelay::Impl::Run(const std::stop_token& stop) {
  std::unique_ptr<ShmSubscriber> reader;
  while (!reader) {  // the store's publisher creates it when it is ready
    if (stop.stop_requested()) return Status::Ok();
    ShmSubscriberOptions sub;
    sub.store_name = options.store_name;
    sub.shm_prefix = options.shm_prefix;
    sub.expected_layout = options.broadcast.layout;
    sub.attach_timeout = milliseconds(500);
    Result<std::unique_ptr<ShmSubscriber>> attached = ShmSubscriber::Attach(sub);
    if (attached.ok()) {
      reader = std::move(attached).value();
    } else if (attached.status().code() != StatusCode::kTimeout && attached.status().code() != StatusCode::kNotFound) {
      return attached.status().WithContext("the relay's reader of store '" + options.store_name + "'");
    }
  }
  int64_t sent = kNoVersion;
  bool failing = false;  // later deliveries, since failing_since
  Clock::time_point failing_since;
  while (!stop.stop_requested()) {
    Result<PinnedWeights> pinned = reader->WaitAndPin(sent + 1, milliseconds(200));
    if (!pinned.ok() && pinned.status().code() == StatusCode::kTimeout && sent != kNoVersion) {
      // No new version: one that joined since gets the current one now.
      SLUICE_ASSIGN_OR_RETURN(const bool changed, publisher->GroupChanged());
      if (changed) pinned = reader->PinLatest();
    }
    if (!pinned.ok()) {
      if (pinned.status().code() == StatusCode::kTimeout) continue;
      return pinned.status().WithContext("the relay's reader of store '" + options.store_name + "'");
    }
    Status delivered = Deliver(*pinned);
    if (delivered.code() == StatusCode::kUnavailable && sent == kNoVersion && Clock::now() < first_deadline) {
      continue;  // the first version waits for min_subscribers
    }
    delivered = delivered.WithContext("relaying version " + std::to_string(pinned->version) + " to broadcast group '" +
                                      options.broadcast.group + "'");
    if (!delivered.ok() && sent != kNoVersion) {
      // The members serve what they have; the newest goes out again soon.
      const auto now = Clock::now();
      if (!failing) failing_since = now;
      failing = true;
      {
        MutexLock lock(&mu);
        ++stats.failed_deliveries;
      }
      if (now - failing_since >= options.retry_for) {
        return delivered.WithContext("deliveries failing for " + std::to_string(options.retry_for.count()) + " ms");
      }
      SLUICE_LOG(WARNING) << delivered.ToString() << "; trying again in a second";
      for (int i = 0; i < 20 && !stop.stop_requested(); ++i) std::this_thread::sleep_for(milliseconds(50));
      continue;
    }
    SLUICE_RETURN_IF_ERROR(delivered);
    failing = false;
    sent = pinned->version;
  }
  return Status::Ok();
}

Result<std::unique_ptr<ShmBroadcastRelay>> ShmBroadcastRelay::Start(RelayOptions options) {
  if (options.store_name.empty()) return Status::InvalidArgument("RelayOptions.store_name is empty");
  if (options.first_timeout.count() < 0) return Status::InvalidArgument("RelayOptions.first_timeout is negative");
  if (options.retry_for.count() < 0) return Status::InvalidArgument("RelayOptions.retry_for is negative");
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  BroadcastPublisherOptions bo = impl->options.broadcast;
  bo.join_timeout = milliseconds(1000);  // the first version is tried again until first_timeout
  SLUICE_ASSIGN_OR_RETURN(impl->publisher, BroadcastPublisher::Start(bo));
  impl->first_deadline = Clock::now() + impl->options.first_timeout;
  Impl* m = impl.get();
  SLUICE_RETURN_IF_ERROR(m->thread.Start([m](std::stop_token stop) {
    Status ran = m->Run(stop);
    MutexLock lock(&m->mu);
    m->status = ran;
  }));
  return std::unique_ptr<ShmBroadcastRelay>(new ShmBroadcastRelay(std::move(impl)));
}

ShmBroadcastRelay::ShmBroadcastRelay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ShmBroadcastRelay::~ShmBroadcastRelay() {
  impl_->thread.Stop();  // before the publisher goes
}

Status ShmBroadcastRelay::status() const {
  MutexLock lock(&impl_->mu);
  return impl_->status;
}

RelayStats ShmBroadcastRelay::stats() const {
  MutexLock lock(&impl_->mu);
  return impl_->stats;
}

}  // namespace sluice::checkpoint_engine
