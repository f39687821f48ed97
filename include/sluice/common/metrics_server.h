// A small HTTP server for live counters in Prometheus's text exposition
// format: `GET /metrics` answers what `render` returns at that moment.
//
// A scrape endpoint, not a web server: one thread serves every connection,
// none of which can hold up the others. Each connection is read without
// blocking, within its own deadline (options.request_timeout, 2 s): the
// request head (at most 8 KiB, else 431; not in time, 408), then GET
// /metrics gets 200, other paths 404, other methods 405, anything
// unparsable 400, and the connection is closed once the answer is sent
// (again within request_timeout). At most options.max_connections (64) are
// open at once; a new one beyond that closes the oldest, so idle clients
// cannot lock a scraper out however many they open.
//
// Binds where `listen` says, "HOST:PORT" with HOST an IPv4 address and PORT
// 0 for any free port (port() says which). HOST must be a loopback address
// (127.0.0.0/8) unless options.allow_non_loopback: the counters are served
// without authentication, to whoever can reach the address.
//
// Thread safety: construct and destroy on one thread; `render` is called on
// the server's thread and must be safe to call from there.
#ifndef SLUICE_COMMON_METRICS_SERVER_H_
#define SLUICE_COMMON_METRICS_SERVER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "sluice/common/status.h"

namespace sluice {

// "HOST:PORT" -> host and port. InvalidArgument naming what is wrong: no
// colon, a host that is not a dotted IPv4 address, a port outside 0..65535.
Status ParseListenAddress(const std::string& listen, std::string* host, int* port);

// True for a dotted IPv4 address in 127.0.0.0/8.
bool IsLoopbackAddress(const std::string& host);

struct MetricsServerOptions {
  // Serve on a HOST outside 127.0.0.0/8 (0.0.0.0, a NIC's address). Off by
  // default: anyone who reaches the address reads the counters, unauthenticated.
  bool allow_non_loopback = false;
  // Connections open at once (>= 1); accepting one more closes the oldest.
  int max_connections = 64;
  // How long a connection may take to send its request head, and then to
  // take the answer (> 0).
  std::chrono::milliseconds request_timeout{2000};
};

class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  // Errors: InvalidArgument (the address; a non-loopback HOST without
  // options.allow_non_loopback, naming HOST; options out of range),
  // Unavailable (socket, bind or listen failed, e.g. the port is taken;
  // errno in the message).
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& listen, Render render,
                                                      MetricsServerOptions options = {});
  ~MetricsServer();  // stops serving and closes every socket
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const;
  // "http://HOST:PORT/metrics"
  std::string url() const;

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_METRICS_SERVER_H_
