#include "sluice/common/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "sluice/common/background_thread.h"

namespace sluice {
namespace {

constexpr size_t kMaxRequestHead = 8192;
constexpr int kRequestTimeoutMs = 2000;
constexpr int kAcceptPollMs = 100;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

void WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client went away: nothing to do
    done += static_cast<size_t>(n);
  }
}

std::string Response(int code, const char* reason, const std::string& content_type, const std::string& body) {
  return "HTTP/1.0 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

std::string Plain(int code, const char* reason) {
  return Response(code, reason, "text/plain; charset=utf-8", std::string(reason) + "\n");
}

// Reads the request head (through the blank line) within the time limit.
// Returns the status line to answer with when it cannot be read.
bool ReadHead(int fd, std::string* head, std::string* error_response) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kRequestTimeoutMs);
  char buf[1024];
  while (head->find("\r\n\r\n") == std::string::npos && head->find("\n\n") == std::string::npos) {
    if (head->size() > kMaxRequestHead) {
      *error_response = Plain(431, "Request Header Fields Too Large");
      return false;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      *error_response = Plain(408, "Request Timeout");
      return false;
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // the deadline check above ends it
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_response->clear();  // closed or failed: no one to answer
      return false;
    }
    head->append(buf, static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

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
  BackgroundThread thread{"metrics-http"};

  ~Impl() {
    thread.Stop();
    if (fd >= 0) ::close(fd);
  }

  void Serve(std::stop_token stop) {
    while (!stop.stop_requested()) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, kAcceptPollMs) <= 0) continue;
      const int client = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      Answer(client);
      ::close(client);
    }
  }

  void Answer(int client) {
    std::string head, error;
    if (!ReadHead(client, &head, &error)) {
      if (!error.empty()) WriteAll(client, error);
      return;
    }
    const std::string line = head.substr(0, head.find_first_of("\r\n"));
    const size_t sp1 = line.find(' '), sp2 = line.find(' ', sp1 == std::string::npos ? 0 : sp1 + 1);
    if (sp1 == std::string::npos || sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
      WriteAll(client, Plain(400, "Bad Request"));
      return;
    }
    const std::string method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    if (method != "GET" && method != "HEAD") {
      WriteAll(client, Plain(405, "Method Not Allowed"));
      return;
    }
    const std::string path = target.substr(0, target.find('?'));
    if (path != "/metrics") {
      WriteAll(client, Plain(404, "Not Found"));
      return;
    }
    std::string response = Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render());
    if (method == "HEAD") response.resize(response.find("\r\n\r\n") + 4);
    WriteAll(client, response);
  }
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() = default;

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen, Render render) {
  auto impl = std::make_unique<Impl>();
  SLUICE_RETURN_IF_ERROR(ParseListenAddress(listen, &impl->host, &impl->port));
  impl->render = std::move(render);
  impl->fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
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
  if (::listen(impl->fd, 8) != 0) return Status::Unavailable(Errno("metrics server: listen on " + listen));
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
