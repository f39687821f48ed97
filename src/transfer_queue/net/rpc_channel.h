// The client side of the TransferQueue transport: a pool of ZeroMQ DEALER
// sockets connected to one server, and a typed request/reply call over it.
//
// Each call checks a socket out of the pool, sends one request, waits for
// the reply with the matching request id, and checks the socket back in. A
// socket whose call timed out or saw a malformed reply is closed instead:
// a late reply can never be read as the answer to a later call.
//
// With direct connections enabled (EnableDirect: the server listens for
// them), a call checks out a plain TCP connection instead of a socket,
// opening one when none is idle and fewer than
// RemoteOptions::direct_connections are open (kDirectRefused, or no
// connection: the call uses ZeroMQ, and connecting is tried again later).
// A server that took a direct connection before and now refuses one (no
// listener on the port: its process is gone) is down: the call fails at
// once instead of waiting out its timeout on ZeroMQ, and so do the calls of
// the next second (then a call tries to connect again). A port that never
// took one (a firewall) falls back to ZeroMQ as above.
//
// With rings enabled (EnableRings: a client on the server's host), a call
// checks out a shared-memory ring instead (shm_ring.h), opening one through
// the socket when none is idle and fewer than RemoteOptions::shm_rings are
// open; a ring that failed is dropped like a socket. When the server has no
// ring to spare, calls use the socket and rings are asked for again later.
//
// Thread safety: Call may run on any number of threads at once; sockets and
// rings never cross threads while in use (the pool mutex hands them over).
#ifndef SLUICE_SRC_TRANSFER_QUEUE_RPC_CHANNEL_H_
#define SLUICE_SRC_TRANSFER_QUEUE_RPC_CHANNEL_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "net/shm_ring.h"
#include "sluice/common/mutex.h"
#include "sluice/common/socket_util.h"
#include "sluice/common/status.h"
#include "sluice/transfer_queue/remote.h"
#include "wire/wire.h"

namespace sluice::transfer_queue::internal {

// A direct connection's greeting (server_direct.cc): "SLTQDIR1" when the
// server took it, "SLTQDIR0" when every connection is taken.
inline constexpr uint64_t kDirectAccepted = 0x315249445154'4c53ULL;
inline constexpr uint64_t kDirectRefused = 0x305249445154'4c53ULL;

// InvalidArgument unless `endpoint` is tcp://HOST:PORT or ipc://PATH.
Status ValidateEndpoint(const std::string& endpoint);

// Idle handles of one kind (rings, direct connections) and how many are
// open. The owner locks around every use.
template <typename T>
struct HandlePool {
  std::vector<T> idle;
  uint32_t open = 0;
  // After a refusal, opening another waits until then (not tried per call).
  std::chrono::steady_clock::time_point retry_after;

  enum class Taken { kIdle, kOpenOne, kNone };
  // An idle handle into *out (kIdle); or kOpenOne: the caller may open a new
  // one, counted open meanwhile (Refused() if that fails); else kNone.
  Taken Take(uint32_t max_open, T* out) {
    if (!idle.empty()) {
      *out = std::move(idle.back());
      idle.pop_back();
      return Taken::kIdle;
    }
    if (open >= max_open || std::chrono::steady_clock::now() < retry_after) return Taken::kNone;
    ++open;
    return Taken::kOpenOne;
  }
  void Refused() {
    --open;
    retry_after = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  }
};

class RpcChannel {
 public:
  // InvalidArgument for a bad endpoint or options. Connects lazily.
  static Result<std::shared_ptr<RpcChannel>> Create(std::string endpoint, RemoteOptions options);
  ~RpcChannel();
  RpcChannel(const RpcChannel&) = delete;
  RpcChannel& operator=(const RpcChannel&) = delete;

  // Sends `request` as a `type` message to `target` and decodes the reply.
  // `blocking` is how long the server may legitimately hold the request
  // (added to rpc_timeout). Errors: the server's error reply as sent;
  // Unavailable (no reply in time, socket failure); DataLoss/InvalidArgument
  // (a malformed reply); OutOfRange (the request exceeds max_message_bytes).
  template <typename Reply, typename Request>
  Result<Reply> Call(wire::MessageType type, uint16_t target, const Request& request,
                     std::chrono::milliseconds blocking) {
    const wire::WireLimits limits = this->limits();
    const uint64_t id = next_request_id_.fetch_add(1);
    wire::Message message = wire::EncodeRequest(type, target, id, options_.token, request);
    SLUICE_ASSIGN_OR_RETURN(Received reply, RoundTrip(type, id, std::move(message), blocking, limits));
    if (reply.header.is_error()) return wire::DecodeErrorReply(reply.bytes, reply.header, limits);
    Reply out{};
    Status decoded =
        wire::DecodeReply(reply.bytes, reply.header, limits, reply.owner, std::chrono::steady_clock::now(), &out);
    if (!decoded.ok()) return decoded.WithContext("malformed reply from " + endpoint_);
    return out;
  }

  // Raises the reply limits to the server's (ServerInfo), never lowers them.
  void RaiseLimits(const wire::ServerInfo& info);
  // Sends calls through shared-memory rings from now on (up to
  // RemoteOptions::shm_rings of them). Only for a server on this host.
  void EnableRings();
  // Rings open now (idle or in a call).
  uint32_t rings_open() const;
  // Sends calls through direct TCP connections to `port` on the endpoint's
  // host from now on (up to RemoteOptions::direct_connections).
  void EnableDirect(uint16_t port);
  uint32_t direct_open() const;
  wire::WireLimits limits() const;
  const std::string& endpoint() const { return endpoint_; }

 private:
  struct Received {
    std::shared_ptr<const void> owner;  // keeps `bytes` alive
    std::span<const std::byte> bytes;
    wire::Header header;
  };
  RpcChannel(std::string endpoint, RemoteOptions options);
  Result<Received> RoundTrip(wire::MessageType type, uint64_t id, wire::Message request,
                             std::chrono::milliseconds blocking, const wire::WireLimits& limits);
  Result<std::unique_ptr<zmq::socket_t>> Checkout();
  void Checkin(std::unique_ptr<zmq::socket_t> socket);
  Result<Received> RingRoundTrip(std::unique_ptr<ShmRingClientEnd> ring, wire::MessageType type, uint64_t id,
                                 const wire::Message& request, std::chrono::milliseconds timeout,
                                 const wire::WireLimits& limits);
  // An idle ring, or a new one; null when the call should use a socket.
  std::unique_ptr<ShmRingClientEnd> CheckoutRing();
  void CheckinRing(std::unique_ptr<ShmRingClientEnd> ring);
  void DropRing(std::unique_ptr<ShmRingClientEnd> ring);
  Result<Received> DirectRoundTrip(net::UniqueFd connection, wire::MessageType type, uint64_t id, wire::Message request,
                                   std::chrono::milliseconds timeout, const wire::WireLimits& limits);
  // An idle direct connection, or a new one; invalid when the call should
  // use ZeroMQ, or fail with *down (the server is down).
  net::UniqueFd CheckoutDirect(Status* down);
  void CheckinDirect(net::UniqueFd connection);
  void DropDirect(net::UniqueFd connection);

  const std::string endpoint_;
  const RemoteOptions options_;
  std::atomic<uint64_t> next_request_id_{1};
  zmq::context_t context_;  // declared before the sockets: destroyed after them
  mutable Mutex mu_;
  wire::WireLimits limits_ SLUICE_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<zmq::socket_t>> idle_ SLUICE_GUARDED_BY(mu_);
  bool rings_enabled_ SLUICE_GUARDED_BY(mu_) = false;
  HandlePool<std::unique_ptr<ShmRingClientEnd>> rings_ SLUICE_GUARDED_BY(mu_);
  uint16_t direct_port_ SLUICE_GUARDED_BY(mu_) = 0;  // 0: not enabled
  HandlePool<net::UniqueFd> direct_ SLUICE_GUARDED_BY(mu_);
  bool direct_taken_ SLUICE_GUARDED_BY(mu_) = false;  // the server took a direct connection once
  Status down_ SLUICE_GUARDED_BY(mu_);                // why, while its last connection was refused
};

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_RPC_CHANNEL_H_
