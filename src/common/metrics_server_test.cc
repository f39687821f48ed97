#include "sluice/common/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>

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

}  // namespace
}  // namespace sluice
