// TransferQueueServer's implementation (see server.h for the contract):
//   server.cc           start/stop, the I/O thread, the front door (framing,
//                       header, token, routing to a pool), replies
//   server_dispatch.cc  running a decoded request against the controller and
//                       the storage units
//
// Threads: one I/O thread owns the ROUTER socket and is the only one to
// touch it. Workers never see the socket: they post replies to outbox_ and
// wake the I/O thread through an eventfd it polls along with the socket.
//
// Thread safety: see server.h. Locks: outbox_mu_ (leaf); OpenWrites has its
// own (open_writes.h); no lock is held while calling the controller or a
// storage unit except a write's op lock in OpenWrites.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_SERVER_IMPL_H_
#define SLUICE_SRC_TRANSFER_QUEUE_SERVER_IMPL_H_

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "net/open_writes.h"
#include "net/shm_arena.h"
#include "net/worker_pool.h"
#include "sluice/common/background_thread.h"
#include "sluice/common/mutex.h"
#include "sluice/transfer_queue/server.h"
#include "wire/wire.h"

namespace sluice::transfer_queue {

class TransferQueueServer::Impl {
 public:
  explicit Impl(ServerOptions options);
  ~Impl();

  Status Init();
  void Stop();

  const std::string& endpoint() const { return endpoint_; }
  ServerCounters counters() const;
  const std::shared_ptr<Controller>& controller() const { return controller_; }
  const std::vector<std::shared_ptr<StorageUnit>>& storage() const { return units_; }

 private:
  // One received request, handed from the I/O thread to a worker.
  struct Job {
    zmq::message_t identity;
    std::shared_ptr<zmq::message_t> payload;
    wire::Header header;
    std::span<const std::byte> bytes() const {
      return {static_cast<const std::byte*>(payload->data()), payload->size()};
    }
  };

  // ---- server.cc (I/O thread)
  void IoLoop(std::stop_token stop);
  void ReceiveBatch();
  void HandleFrame(zmq::message_t identity, std::shared_ptr<zmq::message_t> payload, size_t frames);
  void SendNow(const zmq::message_t& identity, wire::Message reply);
  void FlushOutbox();
  void ExpireOpenWrites();
  // A worker's reply: queued for the I/O thread, which is woken.
  void Post(zmq::message_t identity, wire::Message reply);
  void Wake();
  // Refuses a frame at the door with an error reply (counted as malformed).
  void Reject(const zmq::message_t& identity, std::span<const std::byte> bytes, const Status& status);
  // Refuses a well-formed request for lack of capacity (ResourceExhausted).
  void Busy(const Job& job, const std::string& why);

  // ---- server_dispatch.cc (worker threads, and the I/O thread for expiry)
  wire::Message Execute(const Job& job);
  template <typename Req, typename Fn>
  wire::Message Serve(const Job& job, Fn&& fn);
  wire::Message ReplyTo(const Job& job, const Status& status);
  template <typename T>
  wire::Message ReplyTo(const Job& job, const Result<T>& result);
  wire::Message ErrorTo(const Job& job, const Status& status);
  // Drops a write's cells from every unit (expiry, abort).
  void DiscardCells(const internal::WriteCells& cells);
  // Frees a ticket's rows from the units and finishes it at the controller;
  // leaves *ticket empty (replies carry no ticket).
  void ReclaimNow(ReclaimTicket* ticket);
  wire::ServerInfo Info() const;
  // The shared-memory data plane (null arena_: FailedPrecondition).
  Result<wire::ShmWriteReply> ShmWrite(const wire::ShmWriteRequest& request, uint32_t unit);
  Result<wire::ShmReadReply> ShmRead(const StorageReadRequest& request, uint32_t unit);

  // Set by Init, read-only afterwards.
  ServerOptions options_;
  wire::WireLimits limits_;
  std::string endpoint_;
  std::shared_ptr<const Clock> clock_;  // the controller's lease clock
  std::shared_ptr<Controller> controller_;
  std::vector<std::shared_ptr<StorageUnit>> units_;
  std::unique_ptr<internal::OpenWrites> open_writes_;
  std::shared_ptr<internal::ShmArena> arena_;  // null without shm_bytes

  struct Counters {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> error_replies{0};
    std::atomic<uint64_t> malformed{0};
    std::atomic<uint64_t> unauthenticated{0};
    std::atomic<uint64_t> busy{0};
    std::atomic<uint64_t> writes_expired{0};
  } counters_;

  zmq::context_t context_;
  std::unique_ptr<zmq::socket_t> router_;  // I/O thread only, once started
  int wake_fd_ = -1;
  Mutex outbox_mu_;
  std::deque<std::pair<zmq::message_t, wire::Message>> outbox_ SLUICE_GUARDED_BY(outbox_mu_);
  std::unique_ptr<internal::WorkerPool> quick_pool_;
  std::unique_ptr<internal::WorkerPool> blocking_pool_;
  std::atomic<uint32_t> blocking_in_flight_{0};  // admitted blocking calls not yet answered
  BackgroundThread io_thread_{"tq-server-io"};
  bool stopped_ = false;  // owner thread only
};

}  // namespace sluice::transfer_queue

#endif  // SLUICE_SRC_TRANSFER_QUEUE_SERVER_IMPL_H_
