// A small HTTP server for live counters in Prometheus's text exposition
// format: `GET /metrics` answers what `render` returns at that moment.
//
// One thread serves one connection at a time (a scrape endpoint, not a web
// server): it reads the request head (at most 8 KiB, within 2 s, else 431 /
// 408), answers GET /metrics with 200, other paths with 404, other methods
// with 405, anything unparsable with 400, and closes the connection. A
// client that connects and sends nothing holds the server for at most 2 s.
//
// Binds where `listen` says, "HOST:PORT" with HOST an IPv4 address (the
// loopback 127.0.0.1 unless the caller chooses otherwise) and PORT 0 for any
// free port (port() says which).
//
// Thread safety: construct and destroy on one thread; `render` is called on
// the server's thread and must be safe to call from there.
#ifndef SLUICE_COMMON_METRICS_SERVER_H_
#define SLUICE_COMMON_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "sluice/common/status.h"

namespace sluice {

// "HOST:PORT" -> host and port. InvalidArgument naming what is wrong: no
// colon, a host that is not a dotted IPv4 address, a port outside 0..65535.
Status ParseListenAddress(const std::string& listen, std::string* host, int* port);

class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  // Errors: InvalidArgument (the address), Unavailable (socket, bind or
  // listen failed, e.g. the port is taken; errno in the message).
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& listen, Render render);
  ~MetricsServer();  // stops serving and closes the socket
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
