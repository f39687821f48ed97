// ShmBroadcastRelay: carries a host's weight versions to other hosts. It
// reads every version committed to the host's shared-memory store (an
// ShmSubscriber of it; the store's publisher, e.g. a trainer process, never
// waits for the network) and publishes it to a broadcast group
// (BroadcastPublisher, broadcast.h), whose subscribers stage it into stores
// of their own under the two-phase contract. So a version reaches another
// host after it was committed here, never before.
//
//   trainer ── ShmPublisher ──> host store ──> relay ── Gloo ──> subscriber hosts
//
// * The first version waits up to first_timeout for
//   broadcast.min_subscribers subscribers (tried a second at a time, so that
//   the relay stops promptly); later versions go to whoever is in the group.
// * Only the newest version is sent: one superseded before the relay got to
//   it is skipped (a subscriber only ever needs the newest).
// * A subscriber that joins between versions (late, or started again after
//   it died) makes the group change; the relay then sends the current
//   version again at once (members serving it take part without staging it).
// * A later version that could not be delivered (the group broke under
//   every attempt, e.g. subscribers dying one after another, or a
//   subscriber rejected it) is logged, and the newest version is sent again
//   a second later: the members keep serving what they have meanwhile.
//   Deliveries failing for retry_for on end stop the relay, as does the
//   first version not reaching min_subscribers within first_timeout:
//   status() says why.
//
// Built with the broadcast transport (sluice_checkpoint_engine_broadcast).
//
// Thread safety: status() and stats() from any thread; the relay runs on
// its own thread, joined on destruction.
#ifndef SLUICE_CHECKPOINT_ENGINE_RELAY_H_
#define SLUICE_CHECKPOINT_ENGINE_RELAY_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "sluice/checkpoint_engine/broadcast.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine {

struct RelayOptions {
  // The host's store (ShmSubscriberOptions): attached as soon as it exists.
  std::string store_name;
  std::string shm_prefix = "sluice";
  // The group to publish to; broadcast.layout must be the store's.
  // broadcast.join_timeout is ignored (see first_timeout).
  BroadcastPublisherOptions broadcast;
  std::chrono::milliseconds first_timeout{600000};
  // How long later deliveries may keep failing before the relay stops.
  std::chrono::milliseconds retry_for{60000};
};

struct RelayStats {
  uint64_t deliveries = 0;              // Publish calls that succeeded, repeats included
  int64_t last_delivered = kNoVersion;  // the newest version every member serves
  double last_seconds = 0;              // of the last delivery: its Publish call
  uint64_t failed_deliveries = 0;       // Publish calls that failed and were tried again
};

class ShmBroadcastRelay {
 public:
  // Starts the broadcast publisher (errors as BroadcastPublisher::Start)
  // and the relay's thread.
  static Result<std::unique_ptr<ShmBroadcastRelay>> Start(RelayOptions options);
  ~ShmBroadcastRelay();  // stops: a delivery in progress finishes or fails first
  ShmBroadcastRelay(const ShmBroadcastRelay&) = delete;
  ShmBroadcastRelay& operator=(const ShmBroadcastRelay&) = delete;

  // OK while relaying; the error it stopped on.
  Status status() const;
  RelayStats stats() const;

  struct Impl;

 private:
  explicit ShmBroadcastRelay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::checkpoint_engine

#endif  // SLUICE_CHECKPOINT_ENGINE_RELAY_H_
