#include "sluice/common/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <thread>

namespace sluice::net {
namespace {

std::string Errno(int err) { return std::string(std::strerror(err)); }

int MillisUntil(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count(), 1000));  // re-check the clock at least every second
}

// Waits for `events` on fd until the deadline. OK when ready.
Status WaitFd(int fd, short events, Deadline deadline, const char* what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int timeout = MillisUntil(deadline);
    const int r = ::poll(&p, 1, timeout);
    if (r > 0) return Status::Ok();
    if (r < 0 && errno != EINTR) return Status::Unavailable(std::string(what) + ": poll: " + Errno(errno));
    if (r == 0 && std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout(std::string(what) + " did not complete before the deadline");
    }
  }
}

}  // namespace

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    return Status::InvalidArgument("address '" + std::string(address) + "' is not of the form host:port");
  }
  unsigned port = 0;
  std::string_view digits = address.substr(colon + 1);
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc() || end != digits.data() + digits.size() || port == 0 || port > 65535) {
    return Status::InvalidArgument("address '" + std::string(address) + "' has no valid port (1..65535)");
  }
  return std::make_pair(std::string(address.substr(0, colon)), static_cast<uint16_t>(port));
}

Result<UniqueFd> ListenTcp(const std::string& address, uint16_t port, int backlog) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    return Status::InvalidArgument("'" + address + "' is not an IPv4 address");
  }
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::Unavailable("socket: " + Errno(errno));
  int on = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::Unavailable("cannot bind " + address + ":" + std::to_string(port) + ": " + Errno(errno));
  }
  if (::listen(fd.get(), backlog) != 0) return Status::Unavailable("listen: " + Errno(errno));
  return fd;
}

Result<uint16_t> LocalPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::Unavailable("getsockname: " + Errno(errno));
  }
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return Status::Unavailable("getsockname: unexpected address family");
}

Result<std::string> LocalAddressToward(const std::string& host) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);  // any port: nothing is sent
  if (::inet_pton(AF_INET, host.c_str(), &to.sin_addr) != 1) {
    return Status::InvalidArgument("not an IPv4 address: '" + host + "'");
  }
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::Unavailable("socket: " + Errno(errno));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    return Status::Unavailable("no route to " + host + ": " + Errno(errno));
  }
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&me), &len) != 0) {
    return Status::Unavailable("getsockname: " + Errno(errno));
  }
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &me.sin_addr, text, sizeof(text));
  return std::string(text);
}

Result<UniqueFd> ConnectTcp(const std::string& host, uint16_t port, Deadline deadline, bool* refused) {
  if (refused != nullptr) *refused = false;
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int r = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); r != 0) {
    return Status::Unavailable("cannot resolve " + where + ": " + ::gai_strerror(r));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(found, ::freeaddrinfo);
  std::string last_error = "no address";
  int last_errno = 0;
  auto backoff = std::chrono::milliseconds(2);
  while (true) {
    for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
      if (!fd.valid()) {
        last_error = "socket: " + Errno(errno);
        continue;
      }
      int err = 0;
      if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
          last_errno = errno;
          last_error = Errno(errno);
          continue;
        }
        Status ready = WaitFd(fd.get(), POLLOUT, deadline, "connect");
        if (!ready.ok()) {
          last_errno = 0;
          last_error = ready.message();
          continue;
        }
        socklen_t len = sizeof(err);
        if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
      if (err != 0) {
        last_errno = err;
        last_error = Errno(err);
        continue;
      }
      // Blocking from here on; every read and write is still poll-bounded.
      const int flags = ::fcntl(fd.get(), F_GETFL);
      (void)::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
      int on = 1;
      (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      return fd;
    }
    if (refused != nullptr && last_errno == ECONNREFUSED) break;  // (the caller's to retry)
    if (std::chrono::steady_clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
  if (refused != nullptr) *refused = last_errno == ECONNREFUSED;
  return Status::Unavailable("cannot connect to " + where + ": " + last_error);
}

Status SendAll(int fd, const void* data, size_t n, Deadline deadline) {
  return SendAllParts(fd, data, n, nullptr, 0, deadline);
}

Status SendAllParts(int fd, const void* a, size_t na, const void* b, size_t nb, Deadline deadline) {
  iovec parts[2] = {{const_cast<void*>(a), na}, {const_cast<void*>(b), nb}};
  size_t first = 0;  // the first part with bytes left
  size_t left = na + nb;
  while (left > 0) {
    while (parts[first].iov_len == 0) ++first;
    // Try first, wait only when the socket's buffer is full.
    msghdr msg{};
    msg.msg_iov = parts + first;
    msg.msg_iovlen = 2 - first;
    const ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        SLUICE_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, "send"));
        continue;
      }
      return Status::Unavailable("send: " + Errno(errno));
    }
    size_t sent = static_cast<size_t>(w);
    left -= sent;
    for (size_t i = first; i < 2 && sent > 0; ++i) {
      const size_t taken = std::min(sent, parts[i].iov_len);
      parts[i].iov_base = static_cast<char*>(parts[i].iov_base) + taken;
      parts[i].iov_len -= taken;
      sent -= taken;
    }
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* data, size_t n, Deadline deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    // Try first, wait only when nothing has arrived yet.
    const ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r == 0) return Status::Unavailable("the peer closed the connection");
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        SLUICE_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, "receive"));
        continue;
      }
      return Status::Unavailable("recv: " + Errno(errno));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace sluice::net
