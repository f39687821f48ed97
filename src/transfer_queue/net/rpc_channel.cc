#include "net/rpc_channel.h"

#include <algorithm>
#include <cerrno>
#include <limits>
#include <utility>

#include "sluice/common/large_buffers.h"
#include "sluice/common/logging.h"

namespace sluice::transfer_queue::internal {
namespace {

using Steady = std::chrono::steady_clock;

// rpc_timeout + blocking, saturated: a caller's "wait forever" stays finite
// arithmetic.
std::chrono::milliseconds AddTimeouts(std::chrono::milliseconds a, std::chrono::milliseconds b) {
  const auto cap = std::chrono::milliseconds(std::chrono::hours(24 * 365));
  a = std::clamp(a, std::chrono::milliseconds(0), cap);
  b = std::clamp(b, std::chrono::milliseconds(0), cap);
  return std::min(a + b, cap);
}

void FreeMessage(void* data, void* /*hint*/) { delete[] static_cast<std::byte*>(data); }

// The header of the reply to request `id` of `type` on a ring or a direct
// connection, where nothing else can arrive: anything else is DataLoss.
Result<wire::Header> ReplyHeader(std::span<const std::byte> bytes, wire::MessageType type, uint64_t id,
                                 const wire::WireLimits& limits) {
  SLUICE_ASSIGN_OR_RETURN(wire::Header header, wire::DecodeHeader(bytes, limits));
  if (!header.is_reply() || header.request_id != id || header.type != type) {
    return Status::DataLoss("it is a " + wire::Describe(header) + " for request " + std::to_string(header.request_id) +
                            ", not the reply to request " + std::to_string(id));
  }
  return header;
}

}  // namespace

Status ValidateEndpoint(const std::string& endpoint) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("endpoint '" + endpoint + "': " + why + " (expected tcp://HOST:PORT or ipc://PATH)");
  };
  if (endpoint.rfind("ipc://", 0) == 0) {
    if (endpoint.size() == 6) return bad("empty ipc path");
    return Status::Ok();
  }
  if (endpoint.rfind("tcp://", 0) != 0) return bad("unsupported transport");
  const std::string rest = endpoint.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("missing host or port");
  const std::string port = rest.substr(colon + 1);
  if (port == "*") return Status::Ok();
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](unsigned char ch) { return ch >= '0' && ch <= '9'; });
  if (!digits || std::stoi(port) > 65535) {
    return bad("port '" + port + "' is not a number in 0..65535");
  }
  return Status::Ok();
}

RpcChannel::RpcChannel(std::string endpoint, RemoteOptions options)
    : endpoint_(std::move(endpoint)), options_(std::move(options)), context_(1) {
  MutexLock lock(&mu_);
  limits_.max_message_bytes = options_.max_message_bytes;
  limits_.max_batch_rows = options_.max_batch_rows;
  limits_.max_tensor_bytes = options_.max_tensor_bytes;
}

RpcChannel::~RpcChannel() {
  MutexLock lock(&mu_);
  idle_.clear();  // sockets (linger 0) close before the context
  rings_.idle.clear();
  direct_.idle.clear();
}

Result<std::shared_ptr<RpcChannel>> RpcChannel::Create(std::string endpoint, RemoteOptions options) {
  SLUICE_RETURN_IF_ERROR(ValidateEndpoint(endpoint));
  if (options.rpc_timeout.count() <= 0) {
    return Status::InvalidArgument("RemoteOptions.rpc_timeout must be > 0 (got " +
                                   std::to_string(options.rpc_timeout.count()) + " ms)");
  }
  if (options.token.size() > wire::kMaxTokenBytes) {
    return Status::InvalidArgument("RemoteOptions.token has " + std::to_string(options.token.size()) +
                                   " bytes, at most " + std::to_string(wire::kMaxTokenBytes) + " allowed");
  }
  if (options.max_message_bytes < 4096 || options.max_message_bytes > uint64_t{INT64_MAX}) {
    return Status::InvalidArgument("RemoteOptions.max_message_bytes must be in [4096, 2^63)");
  }
  if (options.max_batch_rows == 0) return Status::InvalidArgument("RemoteOptions.max_batch_rows must be > 0");
  if (options.shm_ring_spin.count() < 0 || options.shm_ring_spin > std::chrono::seconds(1)) {
    return Status::InvalidArgument("RemoteOptions.shm_ring_spin must be in 0..1 s");
  }
  return std::shared_ptr<RpcChannel>(new RpcChannel(std::move(endpoint), std::move(options)));
}

void RpcChannel::RaiseLimits(const wire::ServerInfo& info) {
  MutexLock lock(&mu_);
  limits_.max_message_bytes = std::max(limits_.max_message_bytes, info.max_message_bytes);
  limits_.max_batch_rows = std::max(limits_.max_batch_rows, info.max_batch_rows);
  limits_.max_tensor_bytes = std::max(limits_.max_tensor_bytes, info.max_tensor_bytes);
  // Idle sockets carry the old ZMQ_MAXMSGSIZE: new ones get the new limit.
  idle_.clear();
}

void RpcChannel::EnableRings() {
  MutexLock lock(&mu_);
  rings_enabled_ = options_.shm_rings > 0;
}

uint32_t RpcChannel::rings_open() const {
  MutexLock lock(&mu_);
  return rings_.open;
}

std::unique_ptr<ShmRingClientEnd> RpcChannel::CheckoutRing() {
  {
    MutexLock lock(&mu_);
    if (!rings_enabled_) return nullptr;
    std::unique_ptr<ShmRingClientEnd> idle;
    const auto taken = rings_.Take(options_.shm_rings, &idle);
    if (taken != HandlePool<std::unique_ptr<ShmRingClientEnd>>::Taken::kOpenOne) return idle;
  }
  Result<wire::RingInfo> info = Call<wire::RingInfo>(wire::MessageType::kOpenRing, 0, wire::Empty{}, {});
  Result<std::unique_ptr<ShmRingClientEnd>> ring = info.ok() ? ShmRingClientEnd::Open(info->name, info->capacity)
                                                             : Result<std::unique_ptr<ShmRingClientEnd>>(info.status());
  if (ring.ok()) return std::move(*ring);
  SLUICE_LOG(DEBUG) << "TransferQueue " << endpoint_ << ": no shared-memory ring (" << ring.status().ToString()
                    << "); this call uses the socket";
  MutexLock lock(&mu_);
  rings_.Refused();  // the server's rings are all taken (or refused)
  return nullptr;
}

void RpcChannel::CheckinRing(std::unique_ptr<ShmRingClientEnd> ring) {
  MutexLock lock(&mu_);
  rings_.idle.push_back(std::move(ring));
}

void RpcChannel::DropRing(std::unique_ptr<ShmRingClientEnd> ring) {
  ring.reset();  // the server's thread for it ends
  MutexLock lock(&mu_);
  --rings_.open;
}

Result<RpcChannel::Received> RpcChannel::RingRoundTrip(std::unique_ptr<ShmRingClientEnd> ring, wire::MessageType type,
                                                       uint64_t id, const wire::Message& request,
                                                       std::chrono::milliseconds timeout,
                                                       const wire::WireLimits& limits) {
  const std::string what = wire::MessageTypeName(type) + " request";
  Result<RingMessage> reply =
      ring->Call(request.bytes(), limits.max_message_bytes, Steady::now() + timeout, RingSpin{options_.shm_ring_spin});
  if (!reply.ok()) {
    DropRing(std::move(ring));
    if (reply.status().code() == StatusCode::kTimeout) {
      return Status::Unavailable("no reply to " + what + " from " + endpoint_ + " within " +
                                 std::to_string(timeout.count()) +
                                 " ms (the server is down, unreachable or overloaded)");
    }
    if (reply.status().code() == StatusCode::kAborted) {
      return Status::Unavailable(what + " to " + endpoint_ + " failed: " + reply.status().message());
    }
    return reply.status().WithContext("malformed reply to " + what + " from " + endpoint_);
  }
  const std::span<const std::byte> bytes = reply->bytes();
  Result<wire::Header> header = ReplyHeader(bytes, type, id, limits);
  if (!header.ok()) {
    DropRing(std::move(ring));
    return header.status().WithContext("malformed reply to " + what + " from " + endpoint_);
  }
  CheckinRing(std::move(ring));
  return Received{reply->data, bytes, *header};
}

void RpcChannel::EnableDirect(uint16_t port) {
  MutexLock lock(&mu_);
  if (options_.direct_connections > 0) direct_port_ = port;
}

uint32_t RpcChannel::direct_open() const {
  MutexLock lock(&mu_);
  return direct_.open;
}

net::UniqueFd RpcChannel::CheckoutDirect(Status* down) {
  uint16_t port = 0;
  {
    MutexLock lock(&mu_);
    if (direct_port_ == 0) return net::UniqueFd();
    net::UniqueFd idle;
    switch (direct_.Take(options_.direct_connections, &idle)) {
      case HandlePool<net::UniqueFd>::Taken::kIdle:
        return idle;
      case HandlePool<net::UniqueFd>::Taken::kNone:
        *down = down_;  // (OK unless the last try was refused)
        return idle;
      case HandlePool<net::UniqueFd>::Taken::kOpenOne:
        break;
    }
    port = direct_port_;
  }
  const Steady::time_point deadline =
      Steady::now() + std::min<std::chrono::milliseconds>(options_.rpc_timeout, std::chrono::seconds(2));
  const std::string host = endpoint_.substr(6, endpoint_.rfind(':') - 6);
  bool refused = false;
  Result<net::UniqueFd> fd = net::ConnectTcp(host, port, deadline, &refused);
  uint64_t greeting = 0;
  Status ready = fd.ok() ? net::RecvAll(fd->get(), &greeting, sizeof(greeting), deadline) : fd.status();
  if (ready.ok() && greeting != kDirectAccepted) {
    ready = Status::ResourceExhausted(greeting == kDirectRefused ? "every direct connection is taken"
                                                                 : "not a TransferQueue direct listener");
  }
  MutexLock lock(&mu_);
  if (ready.ok()) {
    direct_taken_ = true;
    down_ = Status::Ok();
    return std::move(*fd);
  }
  direct_.Refused();  // (the calls of the next second do not try)
  if (refused && direct_taken_) {
    down_ = Status::Unavailable("the server is down: its direct port " + std::to_string(port) +
                                " took connections and now refuses them (" + ready.message() + ")");
    *down = down_;
    return net::UniqueFd();
  }
  SLUICE_LOG(DEBUG) << "TransferQueue " << endpoint_ << ": no direct connection (" << ready.ToString()
                    << "); this call uses ZeroMQ";
  return net::UniqueFd();
}

void RpcChannel::CheckinDirect(net::UniqueFd connection) {
  MutexLock lock(&mu_);
  direct_.idle.push_back(std::move(connection));
}

void RpcChannel::DropDirect(net::UniqueFd connection) {
  connection.Reset();
  MutexLock lock(&mu_);
  --direct_.open;
}

Result<RpcChannel::Received> RpcChannel::DirectRoundTrip(net::UniqueFd connection, wire::MessageType type, uint64_t id,
                                                         wire::Message request, std::chrono::milliseconds timeout,
                                                         const wire::WireLimits& limits) {
  const std::string what = wire::MessageTypeName(type) + " request";
  const Steady::time_point deadline = Steady::now() + timeout;
  auto failed = [&](const Status& why) {
    DropDirect(std::move(connection));
    if (why.code() == StatusCode::kTimeout) {
      return Status::Unavailable("no reply to " + what + " from " + endpoint_ + " within " +
                                 std::to_string(timeout.count()) +
                                 " ms (the server is down, unreachable or overloaded)");
    }
    return Status::Unavailable(what + " to " + endpoint_ + " failed: " + why.message());
  };
  const uint64_t size = request.size;
  if (Status sent =
          net::SendAllParts(connection.get(), &size, sizeof(size), request.data.get(), request.size, deadline);
      !sent.ok()) {
    return failed(sent);
  }
  uint64_t reply_size = 0;
  if (Status got = net::RecvAll(connection.get(), &reply_size, sizeof(reply_size), deadline); !got.ok()) {
    return failed(got);
  }
  if (reply_size < wire::kHeaderBytes || reply_size > limits.max_message_bytes) {
    DropDirect(std::move(connection));
    return Status::DataLoss("malformed reply to " + what + " from " + endpoint_ + ": a frame of " +
                            std::to_string(reply_size) + " bytes");
  }
  // Large replies land in recycled buffers (see large_buffers.h); the request's
  // is recycled first, so a put's buffer can carry the next take's reply.
  large_buffers::Give(std::move(request.data), request.capacity);
  std::shared_ptr<std::byte[]> bytes = large_buffers::TakeShared(reply_size);
  if (Status got = net::RecvAll(connection.get(), bytes.get(), reply_size, deadline); !got.ok()) return failed(got);
  const std::span<const std::byte> view(bytes.get(), reply_size);
  Result<wire::Header> header = ReplyHeader(view, type, id, limits);
  if (!header.ok()) {
    DropDirect(std::move(connection));
    return header.status().WithContext("malformed reply to " + what + " from " + endpoint_);
  }
  CheckinDirect(std::move(connection));
  return Received{bytes, view, *header};
}

wire::WireLimits RpcChannel::limits() const {
  MutexLock lock(&mu_);
  return limits_;
}

Result<std::unique_ptr<zmq::socket_t>> RpcChannel::Checkout() {
  {
    MutexLock lock(&mu_);
    if (!idle_.empty()) {
      std::unique_ptr<zmq::socket_t> socket = std::move(idle_.back());
      idle_.pop_back();
      return socket;
    }
  }
  try {
    auto socket = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
    socket->set(zmq::sockopt::linger, 0);
    socket->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits().max_message_bytes));
    socket->connect(endpoint_);
    return socket;
  } catch (const zmq::error_t& e) {
    return Status::Unavailable("cannot open a connection to " + endpoint_ + ": " + e.what());
  }
}

void RpcChannel::Checkin(std::unique_ptr<zmq::socket_t> socket) {
  MutexLock lock(&mu_);
  if (idle_.size() < options_.max_idle_sockets) idle_.push_back(std::move(socket));
}

Result<RpcChannel::Received> RpcChannel::RoundTrip(wire::MessageType type, uint64_t id, wire::Message request,
                                                   std::chrono::milliseconds blocking, const wire::WireLimits& limits) {
  const std::string what = wire::MessageTypeName(type) + " request";
  if (request.size > limits.max_message_bytes) {
    return Status::OutOfRange(what + " of " + std::to_string(request.size) + " bytes exceeds max_message_bytes " +
                              std::to_string(limits.max_message_bytes) + "; send fewer or smaller rows per call");
  }
  const std::chrono::milliseconds timeout = AddTimeouts(options_.rpc_timeout, blocking);
  if (type != wire::MessageType::kOpenRing) {
    if (std::unique_ptr<ShmRingClientEnd> ring = CheckoutRing()) {
      return RingRoundTrip(std::move(ring), type, id, request, timeout, limits);
    }
    Status down;
    if (net::UniqueFd direct = CheckoutDirect(&down); direct.valid()) {
      return DirectRoundTrip(std::move(direct), type, id, std::move(request), timeout, limits);
    }
    if (!down.ok()) return Status::Unavailable(what + " to " + endpoint_ + " failed: " + down.message());
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<zmq::socket_t> socket, Checkout());
  try {
    const size_t size = request.size;
    zmq::message_t out(request.data.release(), size, &FreeMessage, nullptr);
    if (!socket->send(out, zmq::send_flags::dontwait)) {
      return Status::Unavailable("cannot send " + what + " to " + endpoint_ + ": send queue full");
    }
    const Steady::time_point deadline = Steady::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Steady::now());
      if (left.count() <= 0) {
        // The socket is dropped: a late reply must not answer a later call.
        return Status::Unavailable("no reply to " + what + " from " + endpoint_ + " within " +
                                   std::to_string(timeout.count()) +
                                   " ms (the server is down, unreachable or overloaded)");
      }
      zmq::pollitem_t item{static_cast<void*>(*socket), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, std::min(left, std::chrono::milliseconds(std::numeric_limits<int>::max())));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        throw;
      }
      if ((item.revents & ZMQ_POLLIN) == 0) continue;
      auto reply = std::make_shared<zmq::message_t>();
      if (!socket->recv(*reply, zmq::recv_flags::dontwait)) continue;
      if (reply->more()) {
        return Status::DataLoss("malformed reply to " + what + " from " + endpoint_ + ": more than one frame");
      }
      const std::span<const std::byte> bytes(static_cast<const std::byte*>(reply->data()), reply->size());
      Result<wire::Header> header = wire::DecodeHeader(bytes, limits);
      if (!header.ok()) return header.status().WithContext("malformed reply to " + what + " from " + endpoint_);
      if (!header->is_reply() || header->request_id != id) continue;  // not ours: stale
      if (header->type != type) {
        return Status::DataLoss("malformed reply to " + what + " from " + endpoint_ + ": it is a " +
                                wire::Describe(*header));
      }
      Checkin(std::move(socket));
      return Received{reply, bytes, *header};
    }
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(what + " to " + endpoint_ + " failed: " + e.what());
  }
}

}  // namespace sluice::transfer_queue::internal
