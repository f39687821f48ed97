// The client side of the TransferQueue transport: a pool of ZeroMQ DEALER
// sockets connected to one server, and a typed request/reply call over it.
//
// Each call checks a socket out of the pool, sends one request, waits for
// the reply with the matching request id, and checks the socket back in. A
// socket whose call timed out or saw a malformed reply is closed instead:
// a late reply can never be read as the answer to a later call.
//
// Thread safety: Call may run on any number of threads at once; sockets
// never cross threads while in use (the pool mutex hands them over).
#ifndef SLUICE_SRC_TRANSFER_QUEUE_RPC_CHANNEL_H_
#define SLUICE_SRC_TRANSFER_QUEUE_RPC_CHANNEL_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "sluice/common/mutex.h"
#include "sluice/common/status.h"
#include "sluice/transfer_queue/remote.h"
#include "wire/wire.h"

namespace sluice::transfer_queue::internal {

// InvalidArgument unless `endpoint` is tcp://HOST:PORT or ipc://PATH.
Status ValidateEndpoint(const std::string& endpoint);

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
    const std::span<const std::byte> bytes(static_cast<const std::byte*>(reply.message->data()), reply.message->size());
    if (reply.header.is_error()) return wire::DecodeErrorReply(bytes, reply.header, limits);
    Reply out{};
    Status decoded =
        wire::DecodeReply(bytes, reply.header, limits, reply.message, std::chrono::steady_clock::now(), &out);
    if (!decoded.ok()) return decoded.WithContext("malformed reply from " + endpoint_);
    return out;
  }

  // Raises the reply limits to the server's (ServerInfo), never lowers them.
  void RaiseLimits(const wire::ServerInfo& info);
  wire::WireLimits limits() const;
  const std::string& endpoint() const { return endpoint_; }

 private:
  struct Received {
    std::shared_ptr<zmq::message_t> message;
    wire::Header header;
  };
  RpcChannel(std::string endpoint, RemoteOptions options);
  Result<Received> RoundTrip(wire::MessageType type, uint64_t id, wire::Message request,
                             std::chrono::milliseconds blocking, const wire::WireLimits& limits);
  Result<std::unique_ptr<zmq::socket_t>> Checkout();
  void Checkin(std::unique_ptr<zmq::socket_t> socket);

  const std::string endpoint_;
  const RemoteOptions options_;
  std::atomic<uint64_t> next_request_id_{1};
  zmq::context_t context_;  // declared before the sockets: destroyed after them
  mutable Mutex mu_;
  wire::WireLimits limits_ SLUICE_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<zmq::socket_t>> idle_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_RPC_CHANNEL_H_
