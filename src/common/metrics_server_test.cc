#include "sluice/common/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

namespace sluice {
namespace {

// Connects to the server on loopback, sends `request` (shut for writing
// after it unless keep_open), and returns everything it answers.
std::string Exchange(int port, const std::string& request, bool keep_open = false) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (!request.empty()) (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  if (!keep_open) ::shutdown(fd, SHUT_WR);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

std::string StatusLine(const std::string& response) { return response.substr(0, response.find("\r\n")); }

using Clock = std::chrono::steady_clock;

// Starts a non-blocking connect to 127.0.0.1:port; -1 if it failed at once.
int ConnectNonBlocking(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Waits (until `deadline`) for `fd` to be ready for `events`; false if not in time.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (int turn = 0; turn < 1000; ++turn) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
  }
  return false;
}

// Clients that connect and then send nothing, closed when it goes out of scope.
struct IdleClients {
  std::vector<int> fds;
  IdleClients(int port, int n) {
    for (int i = 0; i < n; ++i) fds.push_back(ConnectNonBlocking(port));
    // Give every connect up to 1 s in all to complete (a server that accepts
    // promptly completes them at once); not asserted: the scrape is.
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(1);
    for (int fd : fds) {
      if (fd >= 0) (void)WaitFor(fd, POLLOUT, deadline);
    }
  }
  ~IdleClients() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  IdleClients(const IdleClients&) = delete;
  IdleClients& operator=(const IdleClients&) = delete;
};

// GET /metrics, all of it (connect, send, the whole answer) within `budget`;
// what was answered by then ("" if nothing).
std::string ScrapeWithin(int port, std::chrono::milliseconds budget) {
  const Clock::time_point deadline = Clock::now() + budget;
  const int fd = ConnectNonBlocking(port);
  if (fd < 0) return "";
  std::string out;
  if (WaitFor(fd, POLLOUT, deadline)) {
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (int turn = 0; turn < 1000 && WaitFor(fd, POLLIN, deadline); ++turn) {
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) break;
        out.append(buf, static_cast<size_t>(n));
      }
    }
  }
  ::close(fd);
  return out;
}

TEST(MetricsServerTest, ServesWhatRenderReturnsAtEachScrape) {
  std::atomic<int> scrapes{0};
  auto server = MetricsServer::Start("127.0.0.1:0", [&] {
    return "# TYPE sluice_scrapes counter\nsluice_scrapes " + std::to_string(++scrapes) + "\n";
  });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  EXPECT_GT(port, 0);
  EXPECT_EQ((*server)->url(), "http://127.0.0.1:" + std::to_string(port) + "/metrics");
  std::string first = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(StatusLine(first), "HTTP/1.0 200 OK");
  EXPECT_NE(first.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << first;
  EXPECT_NE(first.find("\r\n\r\n# TYPE sluice_scrapes counter\nsluice_scrapes 1\n"), std::string::npos) << first;
  EXPECT_NE(Exchange(port, "GET /metrics?x=1 HTTP/1.0\n\n").find("sluice_scrapes 2\n"), std::string::npos);
  std::string head = Exchange(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(StatusLine(head), "HTTP/1.0 200 OK");
  EXPECT_EQ(head.find("sluice_scrapes"), std::string::npos);
}

TEST(MetricsServerTest, BadRequestsGetErrorsAndTheServerGoesOn) {
  auto server = MetricsServer::Start("127.0.0.1:0", [] { return std::string("ok 1\n"); });
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  EXPECT_EQ(StatusLine(Exchange(port, "GET /other HTTP/1.0\r\n\r\n")), "HTTP/1.0 404 Not Found");
  EXPECT_EQ(StatusLine(Exchange(port, "POST /metrics HTTP/1.0\r\n\r\n")), "HTTP/1.0 405 Method Not Allowed");
  EXPECT_EQ(StatusLine(Exchange(port, "garbage\r\n\r\n")), "HTTP/1.0 400 Bad Request");
  EXPECT_EQ(StatusLine(Exchange(port, "GET /metrics SMTP/1.0\r\n\r\n")), "HTTP/1.0 400 Bad Request");
  EXPECT_EQ(StatusLine(Exchange(port, "GET /metrics HTTP/1.0\r\n" + std::string(20000, 'x'))),
            "HTTP/1.0 431 Request Header Fields Too Large");
  EXPECT_EQ(Exchange(port, "GET /met"), "");  // closed before the head ended: nothing to answer
  // A client that sends nothing is dropped after 2 s with 408; the next is served.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(StatusLine(Exchange(port, "", /*keep_open=*/true)), "HTTP/1.0 408 Request Timeout");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(StatusLine(Exchange(port, "GET /metrics HTTP/1.0\r\n\r\n")), "HTTP/1.0 200 OK");
}

TEST(MetricsServerTest, BadAddressesAndATakenPortAreErrors) {
  std::string host;
  int port = 0;
  EXPECT_TRUE(ParseListenAddress("127.0.0.1:9400", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 9400);
  for (const char* bad :
       {"9400", "localhost:9400", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:-1", "1.2.3:80", "127.0.0.1:80x", ""}) {
    Status s = ParseListenAddress(bad, &host, &port);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("listen address"), std::string::npos) << s.ToString();
    EXPECT_EQ(MetricsServer::Start(bad, [] { return std::string(); }).status().code(), StatusCode::kInvalidArgument);
  }
  auto first = MetricsServer::Start("127.0.0.1:0", [] { return std::string(); });
  ASSERT_TRUE(first.ok());
  auto second = MetricsServer::Start("127.0.0.1:" + std::to_string((*first)->port()), [] { return std::string(); });
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("cannot bind"), std::string::npos) << second.status().ToString();
}

// Regression: the endpoint served one connection at a time, each allowed 2 s
// to send its request, so 50 clients that connected and sent nothing delayed
// a scrape by 20 s (and a few hundred locked scrapers out).
TEST(MetricsServerTest, IdleConnectionsDoNotDelayAScrape) {
  auto server = MetricsServer::Start("127.0.0.1:0", [] { return std::string("sluice_up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  IdleClients idle(port, 50);
  const Clock::time_point t0 = Clock::now();
  const std::string scraped = ScrapeWithin(port, std::chrono::milliseconds(3000));
  const auto took = Clock::now() - t0;
  EXPECT_EQ(StatusLine(scraped), "HTTP/1.0 200 OK");
  EXPECT_NE(scraped.find("\r\n\r\nsluice_up 1\n"), std::string::npos) << scraped;
  EXPECT_LT(took, std::chrono::seconds(1));
}

// Regression (same defect): beyond max_connections open at once, the oldest
// is closed to make room, so idle clients cannot fill the server up.
TEST(MetricsServerTest, IdleConnectionsBeyondTheBoundCloseTheOldest) {
  MetricsServerOptions options;
  options.max_connections = 8;
  options.request_timeout = std::chrono::seconds(30);  // nothing here waits for it
  auto server = MetricsServer::Start(
      "127.0.0.1:0", [] { return std::string("sluice_up 1\n"); }, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  IdleClients idle(port, 20);
  ASSERT_GE(idle.fds.front(), 0);
  const std::string scraped = ScrapeWithin(port, std::chrono::milliseconds(1000));
  EXPECT_EQ(StatusLine(scraped), "HTTP/1.0 200 OK");
  // The oldest idle client was closed without an answer, long before its 30 s were up.
  ASSERT_TRUE(WaitFor(idle.fds.front(), POLLIN, Clock::now() + std::chrono::seconds(2)));
  char byte = 0;
  EXPECT_LE(::recv(idle.fds.front(), &byte, 1, 0), 0);
}

// Regression: run.metrics_listen=0.0.0.0:0 served the counters, without
// authentication, on every interface, and nothing said so.
TEST(MetricsServerTest, NonLoopbackAddressesAreRefusedUnlessAllowed) {
  auto render = [] { return std::string(); };
  for (const char* listen : {"0.0.0.0:0", "10.1.2.3:9400", "192.0.2.1:0"}) {
    auto refused = MetricsServer::Start(listen, render);
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << listen;
    const std::string host = std::string(listen).substr(0, std::string(listen).find(':'));
    EXPECT_NE(refused.status().message().find("metrics endpoint: " + host + " is not a loopback address"),
              std::string::npos)
        << refused.status().ToString();
  }
  // All of 127.0.0.0/8 is loopback.
  auto loopback = MetricsServer::Start("127.0.0.2:0", render);
  ASSERT_TRUE(loopback.ok()) << loopback.status().ToString();
  EXPECT_EQ((*loopback)->url(), "http://127.0.0.2:" + std::to_string((*loopback)->port()) + "/metrics");
  // Opted in, the address is tried (192.0.2.1 is a documentation address no
  // host here has, so the bind fails rather than serving beyond loopback).
  MetricsServerOptions anywhere;
  anywhere.allow_non_loopback = true;
  auto tried = MetricsServer::Start("192.0.2.1:0", render, anywhere);
  EXPECT_EQ(tried.status().code(), StatusCode::kUnavailable) << tried.status().ToString();
  EXPECT_NE(tried.status().message().find("cannot bind 192.0.2.1:0"), std::string::npos) << tried.status().ToString();
}

}  // namespace
}  // namespace sluice
