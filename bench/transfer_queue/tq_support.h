// Shared pieces of the TransferQueue benchmark (tq_bench.cc): statistics,
// sizes, row stamps, memory readings, and the child processes it measures
// against: a TransferQueueServer forked before any ZeroMQ context exists, and
// a redis-server on loopback.
#ifndef SLUICE_BENCH_TRANSFER_QUEUE_TQ_SUPPORT_H_
#define SLUICE_BENCH_TRANSFER_QUEUE_TQ_SUPPORT_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../bench_stats.h"
#include "sluice/common/status.h"
#include "sluice/transfer_queue/server.h"

namespace sluice::bench::tq {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

using sluice::bench::Stats;
using sluice::bench::Summarize;
// The q-quantile (0..1, nearest rank) of `v`; 0 for an empty vector.
double Quantile(std::vector<double> v, double q);

// "64 B", "4 KiB", "16 MiB" (binary units, as the row sizes are).
std::string HumanBytes(uint64_t bytes);
// Parses "64", "4K", "256K", "16M", "1G" (binary units).
Result<uint64_t> ParseBytes(const std::string& text);
// Comma-separated items, none empty.
Result<std::vector<std::string>> SplitList(const std::string& text);

// Row stamps: every row carries a number in its first and last 8 bytes, so a
// read can check it got the right row without touching the rest. Rows are at
// least 8 bytes (the two stamps may overlap).
inline constexpr size_t kMinRowBytes = 8;
void StampRow(std::byte* row, size_t row_bytes, uint64_t stamp);
bool RowHasStamp(const std::byte* row, size_t row_bytes, uint64_t stamp);
// The stamp in a row's first 8 bytes.
uint64_t LoadStamp(const std::byte* row);

// A buffer of `n` bytes with every page touched (no page faults inside a
// timed region), shared so HostTensors can keep it alive.
std::shared_ptr<std::byte[]> AllocateTouched(size_t n);

// Resident memory of `pid` (0: this process) from /proc, in bytes, without
// shared-memory pages (RssAnon + RssFile), so that an arena is counted once,
// by ShmSegmentBytes; 0 if unreadable.
uint64_t ResidentBytes(pid_t pid = 0);
// Pages a POSIX shared-memory segment ("/name") has allocated in /dev/shm,
// in bytes; 0 if it does not exist.
uint64_t ShmSegmentBytes(const std::string& name);
// MemAvailable from /proc/meminfo, in bytes (0 if unreadable).
uint64_t MemAvailableBytes();

// A TransferQueueServer in a forked child. Fork before this process creates
// any ZeroMQ context or thread: the child inherits neither safely. The child
// serves until the parent closes its end of a pipe (or dies), then stops the
// server and exits.
class ServerChild {
 public:
  // Forks, starts the server in the child and waits (bounded) for the
  // endpoint it reports. Errors: Unavailable (fork failed, the child died or
  // did not report in time), or the child's TransferQueueServer::Start error.
  static Result<std::unique_ptr<ServerChild>> Fork(const transfer_queue::ServerOptions& options,
                                                   std::chrono::milliseconds timeout);
  ~ServerChild();
  ServerChild(const ServerChild&) = delete;
  ServerChild& operator=(const ServerChild&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }
  // Asks the child to stop and reaps it; SIGKILL after `timeout`. OK if it
  // exited with status 0. Idempotent.
  Status Stop(std::chrono::milliseconds timeout);

 private:
  ServerChild() = default;
  pid_t pid_ = -1;
  int lifetime_fd_ = -1;  // parent's write end; the child exits on EOF
  bool reaped_ = false;
  std::string endpoint_;
};

// A redis-server on 127.0.0.1 at a free port, without persistence. Stopped
// (SIGTERM, then SIGKILL) and reaped by Stop or the destructor.
class RedisChild {
 public:
  // NotFound if redis-server is not on PATH; Unavailable if it does not
  // answer PING within `timeout`.
  static Result<std::unique_ptr<RedisChild>> Start(std::chrono::milliseconds timeout);
  ~RedisChild();
  RedisChild(const RedisChild&) = delete;
  RedisChild& operator=(const RedisChild&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  Status Stop(std::chrono::milliseconds timeout);

 private:
  RedisChild() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  bool reaped_ = false;
};

}  // namespace sluice::bench::tq

#endif  // SLUICE_BENCH_TRANSFER_QUEUE_TQ_SUPPORT_H_
