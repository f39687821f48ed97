// TransferQueueServer's implementation (see server.h for the contract):
//   server.cc           start/stop, the I/O thread, the front door (framing,
//                       header, token, routing to a pool), replies
//   server_dispatch.cc  running a decoded request against the controller and
//                       the storage units
//   server_ring.cc      same-host clients' shared-memory rings, one thread each
//   server_direct.cc    direct TCP connections, one thread each
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

#include <sys/types.h>

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "net/open_writes.h"
#include "net/shm_arena.h"
#include "net/shm_ring.h"
#include "net/storage_hosts.h"
#include "net/worker_pool.h"
#include "sluice/common/background_thread.h"
#include "sluice/common/mutex.h"
#include "sluice/common/socket_util.h"
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
  // One received request, handed from the I/O thread to a worker (or run
  // by a ring's thread: no identity then).
  struct Job {
    zmq::message_t identity;
    std::shared_ptr<const void> owner;  // keeps `data` alive
    std::span<const std::byte> data;
    wire::Header header;
    // It carried the peer token (the controller's server, to a storage server).
    bool peer = false;
    std::span<const std::byte> bytes() const { return data; }
  };
  // A direct TCP connection and the thread serving it.
  struct DirectConnection {
    net::UniqueFd fd;
    std::atomic<bool> done{false};
    BackgroundThread thread{"tq-direct"};
  };
  // A same-host client's ring and the thread serving it.
  struct RingConnection {
    std::unique_ptr<internal::ShmRingServerEnd> ring;
    std::atomic<bool> stop{false};
    std::atomic<bool> done{false};
    BackgroundThread thread{"tq-ring"};
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
  // The front door's checks (framing, header, target, token), cheapest
  // first: nullopt and *header filled if the request may run, else the
  // error reply to send.
  std::optional<wire::Message> Admit(std::span<const std::byte> bytes, size_t frames, wire::Header* header, bool* peer);
  // An error reply refusing a frame at the door (counted as malformed).
  wire::Message Reject(std::span<const std::byte> bytes, const Status& status);
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
  // A controller's server: tells the storage servers holding any of the
  // write's rows what it may store there.
  Status DeclareElsewhere(WriteId id, const BeginWriteRequest& request, const std::vector<RowId>& rows);
  // Where unit `u` is served, if elsewhere (null: here).
  const internal::StorageHostLink* ServedElsewhere(uint32_t u) const;

  // Runs one request read from a ring or a direct connection (its own
  // thread, no hop): the door, then Execute. *admitted: it passed the door.
  wire::Message Answer(std::shared_ptr<const void> owner, std::span<const std::byte> bytes, bool* admitted);

  // ---- server_direct.cc
  Status StartDirect();
  void AcceptLoop(std::stop_token stop);
  void DirectLoop(DirectConnection* connection, std::stop_token stop);
  void StopDirect();

  // ---- server_ring.cc
  Result<wire::RingInfo> OpenRing();
  void RingLoop(RingConnection* connection, std::stop_token stop);
  // Joins the threads of rings that ended.
  void ReapRingsLocked() SLUICE_REQUIRES(rings_mu_);
  void StopRings();
  // The shared-memory data plane (null arena_: FailedPrecondition).
  Result<wire::ShmWriteReply> ShmWrite(const wire::ShmWriteRequest& request, uint32_t unit);
  Result<wire::ShmReadReply> ShmRead(const StorageReadRequest& request, uint32_t unit);
  // One-round-trip calls (PutRows, TakeBatch): what the client would do in
  // steps, done here against the controller and the units directly.
  Result<BeginWriteResponse> Put(const wire::PutRequest& request);
  Result<wire::TakeReply> Take(const wire::TakeRequest& request);

  // Set by Init, read-only afterwards.
  ServerOptions options_;
  wire::WireLimits limits_;
  std::string endpoint_;
  std::shared_ptr<const Clock> clock_;  // the controller's lease clock
  std::shared_ptr<Controller> controller_;
  std::vector<std::shared_ptr<StorageUnit>> units_;                // storage_only: null for units held elsewhere
  std::vector<std::unique_ptr<internal::StorageHostLink>> hosts_;  // storage_hosts
  std::unique_ptr<internal::OpenWrites> open_writes_;
  std::shared_ptr<internal::ShmArena> arena_;  // null without shm_bytes

  struct Counters {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> error_replies{0};
    std::atomic<uint64_t> malformed{0};
    std::atomic<uint64_t> unauthenticated{0};
    std::atomic<uint64_t> busy{0};
    std::atomic<uint64_t> writes_expired{0};
    std::atomic<uint64_t> ring_requests{0};
    std::atomic<uint64_t> direct_requests{0};
    // The steady clock (ns) when the I/O thread last went round its loop.
    std::atomic<int64_t> io_turn_ns{0};
  } counters_;

  zmq::context_t context_;
  std::unique_ptr<zmq::socket_t> router_;  // I/O thread only, once started
  // The file an ipc:// bind created, removed at Stop if it is still that one.
  struct IpcSocket {
    std::string path;
    dev_t dev = 0;
    ino_t ino = 0;
  };
  std::optional<IpcSocket> ipc_socket_;  // owner thread only
  int wake_fd_ = -1;
  Mutex outbox_mu_;
  std::deque<std::pair<zmq::message_t, wire::Message>> outbox_ SLUICE_GUARDED_BY(outbox_mu_);
  std::unique_ptr<internal::WorkerPool> quick_pool_;
  std::unique_ptr<internal::WorkerPool> blocking_pool_;
  std::atomic<uint32_t> blocking_in_flight_{0};  // admitted blocking calls not yet answered
  std::atomic<bool> expiring_{false};            // an expiry runs on a worker (units elsewhere)
  BackgroundThread io_thread_{"tq-server-io"};
  net::UniqueFd direct_listener_;
  uint16_t direct_port_ = 0;  // 0: no direct connections
  BackgroundThread direct_acceptor_{"tq-direct-acc"};
  mutable Mutex direct_mu_;
  std::vector<std::unique_ptr<DirectConnection>> direct_ SLUICE_GUARDED_BY(direct_mu_);
  mutable Mutex rings_mu_;
  std::vector<std::unique_ptr<RingConnection>> rings_ SLUICE_GUARDED_BY(rings_mu_);
  bool rings_closed_ SLUICE_GUARDED_BY(rings_mu_) = false;
  bool stopped_ = false;  // owner thread only
};

}  // namespace sluice::transfer_queue

#endif  // SLUICE_SRC_TRANSFER_QUEUE_SERVER_IMPL_H_
