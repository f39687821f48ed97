// Direct TCP connections: a listener next to the ZeroMQ socket whose
// connections each get a thread that reads a length-prefixed wire message,
// runs it (Answer: the door, then Execute) and writes the reply the same way.
// Two thread wake-ups per call instead of ZeroMQ's six or more.
//
// Framing, both ways: u64 little-endian length, then that many bytes (one
// wire message). On accept the server sends an 8-byte greeting,
// kDirectAccepted or kDirectRefused (every connection taken), so a client
// never sends a request the server will not read.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "net/rpc_channel.h"
#include "net/server_impl.h"
#include "sluice/common/large_buffers.h"
#include "sluice/common/logging.h"

namespace sluice::transfer_queue {

using Steady = std::chrono::steady_clock;

namespace {

// The first request must come this soon after accept.
constexpr auto kFirstRequestTimeout = std::chrono::seconds(10);
// How long a started frame (or a reply) may take to cross, plus 1 s per 10 MB.
constexpr auto kFrameTimeout = std::chrono::seconds(30);

Steady::time_point FrameDeadline(uint64_t bytes) {
  return Steady::now() + kFrameTimeout + std::chrono::seconds(bytes / 10'000'000);
}

// The IPv4 address of a tcp://A.B.C.D:PORT endpoint, or "" for any other.
std::string Ipv4HostOf(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return "";
  const std::string rest = endpoint.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return "";
  const std::string host = rest.substr(0, colon);
  in_addr addr{};
  return inet_pton(AF_INET, host.c_str(), &addr) == 1 ? host : "";
}

// Waits until `fd` is readable, `stop` is set or `until` passes; true if readable.
bool WaitReadable(int fd, const std::atomic<bool>& stop, Steady::time_point until) {
  while (!stop.load() && Steady::now() < until) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, 100);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
  return false;
}

}  // namespace

Status TransferQueueServer::Impl::StartDirect() {
  if (options_.direct_connections == 0) return Status::Ok();
  // ZeroMQ reports the address it bound (an interface name resolved, * as 0.0.0.0).
  const std::string host = Ipv4HostOf(endpoint_);
  if (host.empty()) return Status::Ok();  // ipc:// or IPv6: ZeroMQ only
  SLUICE_ASSIGN_OR_RETURN(direct_listener_, net::ListenTcp(host, 0, 128));
  SLUICE_ASSIGN_OR_RETURN(direct_port_, net::LocalPort(direct_listener_.get()));
  return direct_acceptor_.Start([this](std::stop_token stop) { AcceptLoop(stop); });
}

void TransferQueueServer::Impl::AcceptLoop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    pollfd p{direct_listener_.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    net::UniqueFd fd(::accept4(direct_listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) continue;
    int on = 1;
    (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    MutexLock lock(&direct_mu_);
    std::erase_if(direct_, [](const std::unique_ptr<DirectConnection>& c) { return c->done.load(); });
    const bool room = direct_.size() < options_.direct_connections;
    const uint64_t greeting = room ? internal::kDirectAccepted : internal::kDirectRefused;
    if (!net::SendAll(fd.get(), &greeting, sizeof(greeting), Steady::now() + std::chrono::seconds(1)).ok() || !room) {
      continue;  // closed; a refused client uses ZeroMQ
    }
    auto connection = std::make_unique<DirectConnection>();
    connection->fd = std::move(fd);
    DirectConnection* raw = connection.get();
    if (!raw->thread.Start([this, raw](std::stop_token s) { DirectLoop(raw, s); }).ok()) continue;
    direct_.push_back(std::move(connection));
  }
}

void TransferQueueServer::Impl::DirectLoop(DirectConnection* connection, std::stop_token stop) {
  const int fd = connection->fd.get();
  std::atomic<bool> stopping{false};
  std::stop_callback on_stop(stop, [&] {
    stopping.store(true);
    ::shutdown(fd, SHUT_RDWR);  // wakes a poll or a blocked read
  });
  bool authenticated = false;
  Steady::time_point first_by = Steady::now() + kFirstRequestTimeout;
  for (;;) {
    if (!WaitReadable(fd, stopping, authenticated ? Steady::time_point::max() : first_by)) break;
    uint64_t size = 0;
    if (!net::RecvAll(fd, &size, sizeof(size), FrameDeadline(0)).ok()) break;
    if (size < wire::kHeaderBytes || size > limits_.max_message_bytes) {
      // The stream cannot be resynchronised: this connection ends.
      counters_.malformed.fetch_add(1);
      SLUICE_LOG(WARNING) << "TransferQueue server: closing a direct connection that sent a frame of " << size
                          << " bytes (" << wire::kHeaderBytes << ".." << limits_.max_message_bytes << " allowed)";
      break;
    }
    // Large frames land in recycled buffers: a fresh one would fault in every
    // page as the socket copies into it.
    std::shared_ptr<std::byte[]> bytes = large_buffers::TakeShared(size);
    if (!net::RecvAll(fd, bytes.get(), size, FrameDeadline(size)).ok()) break;
    bool admitted = false;
    const std::span<const std::byte> request(bytes.get(), size);
    wire::Message reply = Answer(std::move(bytes), request, &admitted);
    if (admitted) counters_.direct_requests.fetch_add(1, std::memory_order_relaxed);
    const uint64_t reply_size = reply.size;
    if (!net::SendAllParts(fd, &reply_size, sizeof(reply_size), reply.data.get(), reply.size, FrameDeadline(reply.size))
             .ok()) {
      break;
    }
    large_buffers::Give(std::move(reply.data), reply.capacity);
    // A connection that starts with a refused request gets no second try.
    if (!admitted && !authenticated) break;
    authenticated = true;
  }
  // The peer sees the end now; the descriptor is closed when the connection
  // is reaped (never while the stop callback may still use it).
  ::shutdown(fd, SHUT_RDWR);
  connection->done.store(true);
}

void TransferQueueServer::Impl::StopDirect() {
  direct_acceptor_.Stop();
  std::vector<std::unique_ptr<DirectConnection>> connections;
  {
    MutexLock lock(&direct_mu_);
    connections.swap(direct_);
  }
  for (auto& c : connections) c->thread.Stop();
  direct_listener_.Reset();
}

}  // namespace sluice::transfer_queue
