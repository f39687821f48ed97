#include "sluice/common/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "sluice/common/background_thread.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxRequestHead = 8192;
// How soon the serving thread notices a stop request.
constexpr int kStopPollMs = 100;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string Response(int code, const char* reason, const std::string& content_type, const std::string& body) {
  return "HTTP/1.0 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

std::string Plain(int code, const char* reason) {
  return Response(code, reason, "text/plain; charset=utf-8", std::string(reason) + "\n");
}

bool HeadComplete(const std::string& head) {
  return head.find("\r\n\r\n") != std::string::npos || head.find("\n\n") != std::string::npos;
}

// One client, from accept to close. It never blocks the serving thread: its
// socket is non-blocking and it is read or written only when poll says so.
struct Connection {
  int fd = -1;
  Clock::time_point deadline;  // for the request head, then for the answer
  std::string head;            // the request head read so far
  bool answering = false;      // the answer is being sent
  std::string response;
  size_t sent = 0;
};

enum class Next { kKeep, kClose };

// Sends what the socket takes now; kClose once all is sent or the client went away.
Next SendSome(Connection& c) {
  while (c.sent < c.response.size()) {
    const ssize_t n = ::send(c.fd, c.response.data() + c.sent, c.response.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Next::kKeep;
    if (n <= 0) return Next::kClose;  // the client went away: nothing to do
    c.sent += static_cast<size_t>(n);
  }
  return Next::kClose;
}

}  // namespace

bool IsLoopbackAddress(const std::string& host) {
  in_addr addr{};
  return ::inet_pton(AF_INET, host.c_str(), &addr) == 1 && (ntohl(addr.s_addr) >> 24) == 127;
}

Status ParseListenAddress(const std::string& listen, std::string* host, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return Status::InvalidArgument("listen address '" + listen + "' is not HOST:PORT (e.g. 127.0.0.1:9400)");
  }
  const std::string h = listen.substr(0, colon), p = listen.substr(colon + 1);
  in_addr addr{};
  if (::inet_pton(AF_INET, h.c_str(), &addr) != 1) {
    return Status::InvalidArgument("listen address '" + listen + "': host '" + h +
                                   "' is not an IPv4 address (e.g. 127.0.0.1)");
  }
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos || std::stoi(p) > 65535) {
    return Status::InvalidArgument("listen address '" + listen + "': port '" + p + "' is not in 0..65535");
  }
  *host = h;
  *port = std::stoi(p);
  return Status::Ok();
}

struct MetricsServer::Impl {
  int fd = -1;
  std::string host;
  int port = 0;
  Render render;
  MetricsServerOptions options;
  BackgroundThread thread{"metrics-http"};

  ~Impl() {
    thread.Stop();
    if (fd >= 0) ::close(fd);
  }

  // One poll over the listening socket and every open connection, each with
  // its own deadline: a client that sends nothing (or reads nothing) costs a
  // slot, never another client's time.
  void Serve(std::stop_token stop) {
    std::deque<Connection> open;  // oldest first
    std::vector<pollfd> fds;
    while (!stop.stop_requested()) {
      fds.assign(1, pollfd{fd, POLLIN, 0});
      const Clock::time_point now = Clock::now();
      int timeout_ms = kStopPollMs;
      for (const Connection& c : open) {
        fds.push_back(pollfd{c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(c.deadline - now).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, timeout_ms));
      }
      const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) continue;  // transient (ENOMEM): the next turn retries
      const Clock::time_point after = Clock::now();
      std::deque<Connection> kept;
      for (size_t i = 0; i < open.size(); ++i) {
        Connection& c = open[i];
        Next next = Next::kKeep;
        if (ready > 0 && fds[i + 1].revents != 0) next = c.answering ? SendSome(c) : ReadSome(c);
        if (next == Next::kKeep && after >= c.deadline) {
          if (!c.answering) {
            Answer(c, Plain(408, "Request Timeout"));
            (void)SendSome(c);  // one try: an idle client's send buffer takes it
          }
          next = Next::kClose;
        }
        if (next == Next::kClose) {
          ::close(c.fd);
        } else {
          kept.push_back(std::move(c));
        }
      }
      open.swap(kept);
      if (ready > 0 && (fds[0].revents & POLLIN) != 0) AcceptNew(&open);
    }
    for (const Connection& c : open) ::close(c.fd);
  }

  // Accepts what is waiting (at most max_connections per turn), closing the
  // oldest connections to stay within max_connections.
  void AcceptNew(std::deque<Connection>* open) {
    for (int i = 0; i < options.max_connections; ++i) {
      const int client = ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (client < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN: none left; EMFILE and the like: the next turn retries
      }
      if (open->size() >= static_cast<size_t>(options.max_connections)) {
        ::close(open->front().fd);
        open->pop_front();
      }
      Connection c;
      c.fd = client;
      c.deadline = Clock::now() + options.request_timeout;
      open->push_back(std::move(c));
    }
  }

  // Reads what the client sent (a bounded number of reads, so others get
  // their turn) and answers once the head is complete.
  Next ReadSome(Connection& c) {
    char buf[4096];
    for (int i = 0; i < 4; ++i) {
      const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Next::kKeep;
      if (n <= 0) return Next::kClose;  // closed before the head ended, or failed: no one to answer
      c.head.append(buf, static_cast<size_t>(n));
      if (HeadComplete(c.head)) {
        Answer(c, ResponseTo(c.head));
        return SendSome(c);
      }
      if (c.head.size() > kMaxRequestHead) {
        Answer(c, Plain(431, "Request Header Fields Too Large"));
        return SendSome(c);
      }
    }
    return Next::kKeep;
  }

  // Switches `c` to sending `response`, with a fresh deadline for it.
  void Answer(Connection& c, std::string response) {
    c.answering = true;
    c.response = std::move(response);
    c.sent = 0;
    c.deadline = Clock::now() + options.request_timeout;
  }

  std::string ResponseTo(const std::string& head) {
    const std::string line = head.substr(0, head.find_first_of("\r\n"));
    const size_t sp1 = line.find(' '), sp2 = line.find(' ', sp1 == std::string::npos ? 0 : sp1 + 1);
    if (sp1 == std::string::npos || sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
      return Plain(400, "Bad Request");
    }
    const std::string method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    if (method != "GET" && method != "HEAD") return Plain(405, "Method Not Allowed");
    const std::string path = target.substr(0, target.find('?'));
    if (path != "/metrics") return Plain(404, "Not Found");
    std::string response = Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render());
    if (method == "HEAD") response.resize(response.find("\r\n\r\n") + 4);
    return response;
  }
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() = default;

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen, Render render,
                                                            MetricsServerOptions options) {
  auto impl = std::make_unique<Impl>();
  SLUICE_RETURN_IF_ERROR(ParseListenAddress(listen, &impl->host, &impl->port));
  if (!options.allow_non_loopback && !IsLoopbackAddress(impl->host)) {
    return Status::InvalidArgument("metrics endpoint: " + impl->host +
                                   " is not a loopback address; the counters are served without authentication, so "
                                   "bind 127.0.0.1 (and tunnel to it) or opt in to other addresses explicitly "
                                   "(allow_non_loopback)");
  }
  if (options.max_connections < 1 || options.max_connections > 4096) {
    return Status::InvalidArgument("metrics endpoint: max_connections is " + std::to_string(options.max_connections) +
                                   ", must be in 1..4096");
  }
  if (options.request_timeout.count() <= 0) {
    return Status::InvalidArgument("metrics endpoint: request_timeout must be > 0");
  }
  impl->options = options;
  impl->render = std::move(render);
  impl->fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (impl->fd < 0) return Status::Unavailable(Errno("metrics server: socket"));
  const int one = 1;
  ::setsockopt(impl->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(impl->port));
  ::inet_pton(AF_INET, impl->host.c_str(), &addr.sin_addr);
  if (::bind(impl->fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::Unavailable(Errno("metrics server: cannot bind " + listen));
  }
  if (::listen(impl->fd, SOMAXCONN) != 0) return Status::Unavailable(Errno("metrics server: listen on " + listen));
  socklen_t len = sizeof(addr);
  if (::getsockname(impl->fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::Unavailable(Errno("metrics server: getsockname"));
  }
  impl->port = ntohs(addr.sin_port);
  Impl* raw = impl.get();
  SLUICE_RETURN_IF_ERROR(raw->thread.Start([raw](std::stop_token stop) { raw->Serve(stop); }));
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

int MetricsServer::port() const { return impl_->port; }

std::string MetricsServer::url() const {
  return "http://" + impl_->host + ":" + std::to_string(impl_->port) + "/metrics";
}

}  // namespace sluice
