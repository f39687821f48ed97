// Same-host clients' shared-memory rings (shm_ring.h): OpenRing makes one
// and starts its thread; the thread reads a request, puts it through the
// same door as the socket's (Admit), runs it (Execute) and writes the reply,
// until the client closes the ring or dies, or the server stops.
#include "net/server_impl.h"
#include "sluice/common/logging.h"

namespace sluice::transfer_queue {

using Steady = std::chrono::steady_clock;

Result<wire::RingInfo> TransferQueueServer::Impl::OpenRing() {
  if (!arena_ || options_.shm_rings == 0) {
    return Status::FailedPrecondition(
        "this TransferQueue server serves no shared-memory rings (it needs shm_bytes > 0 and shm_rings > 0)");
  }
  MutexLock lock(&rings_mu_);
  if (rings_closed_) return Status::Aborted("the TransferQueue server is stopping");
  ReapRingsLocked();
  if (rings_.size() >= options_.shm_rings) {
    return Status::ResourceExhausted(std::to_string(rings_.size()) +
                                     " shared-memory rings are open (shm_rings); use the socket");
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<internal::ShmRingServerEnd> ring,
                          internal::ShmRingServerEnd::Create(options_.shm_ring_bytes));
  auto connection = std::make_unique<RingConnection>();
  connection->ring = std::move(ring);
  RingConnection* raw = connection.get();
  SLUICE_RETURN_IF_ERROR(raw->thread.Start([this, raw](std::stop_token stop) { RingLoop(raw, stop); }));
  wire::RingInfo info{raw->ring->name(), raw->ring->capacity()};
  rings_.push_back(std::move(connection));
  return info;
}

void TransferQueueServer::Impl::RingLoop(RingConnection* connection, std::stop_token stop) {
  internal::ShmRingServerEnd& ring = *connection->ring;
  std::stop_callback on_stop(stop, [connection] {
    connection->stop.store(true);
    connection->ring->Close();
  });
  const internal::RingSpin spin{options_.shm_ring_spin};
  for (;;) {
    internal::RingEnd end = internal::RingEnd::kNone;
    Result<internal::RingMessage> request =
        ring.Receive(limits_.max_message_bytes, Steady::now() + std::chrono::seconds(1), spin, connection->stop, &end);
    if (!request.ok()) {
      if (end == internal::RingEnd::kIdle) continue;
      if (end == internal::RingEnd::kNone) {
        // The client broke the ring's protocol: this ring ends, nobody else notices.
        counters_.malformed.fetch_add(1);
        SLUICE_LOG(WARNING) << "TransferQueue server: closing shared-memory ring " << ring.name() << ": "
                            << request.status().ToString();
      }
      break;
    }
    bool admitted = false;
    const wire::Message reply = Answer(request->data, request->bytes(), &admitted);
    if (admitted) counters_.ring_requests.fetch_add(1, std::memory_order_relaxed);
    if (!ring.Send(reply.bytes(), spin, connection->stop).ok()) break;
  }
  ring.Close();
  connection->done.store(true);
}

void TransferQueueServer::Impl::ReapRingsLocked() {
  std::erase_if(rings_, [](const std::unique_ptr<RingConnection>& c) { return c->done.load(); });
}

void TransferQueueServer::Impl::StopRings() {
  std::vector<std::unique_ptr<RingConnection>> rings;
  {
    MutexLock lock(&rings_mu_);
    rings_closed_ = true;
    rings.swap(rings_);
  }
  for (auto& c : rings) c->thread.Stop();
}

}  // namespace sluice::transfer_queue
