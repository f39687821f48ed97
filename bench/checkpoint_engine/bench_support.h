// Shared pieces of the CheckpointEngine benchmark (checkpoint_bench.cc):
// weight layouts of a given size, weights whose bytes change per version,
// summary statistics, memory checks and child processes.
#ifndef SLUICE_BENCH_CHECKPOINT_ENGINE_BENCH_SUPPORT_H_
#define SLUICE_BENCH_CHECKPOINT_ENGINE_BENCH_SUPPORT_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../bench_stats.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"

namespace sluice::bench::ce {

using Clock = std::chrono::steady_clock;
using checkpoint_engine::Layout;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

using sluice::bench::Stats;
using sluice::bench::Summarize;

// One measured configuration, printed as a table row and written as JSON.
struct Measurement {
  std::string transport;  // memcpy, inproc, shm, tcp, gloo
  std::string baseline;   // the transport this row is compared with ("" for baselines)
  size_t bytes = 0;       // one version
  int subscribers = 0;
  std::vector<double> seconds;          // publish -> every subscriber serving, per repeat
  std::vector<double> warmup_seconds;   // the same for the warm-up rounds
  std::vector<double> publish_seconds;  // until the publisher's call returned (local stores)
  bool skipped = false;
  std::string note;
};

// A model-like layout of `bytes` (a multiple of 4): F32 matrices of at most
// 16 MiB, each followed by a 4 KiB F32 norm vector (the small tensors a
// transformer has per layer).
Layout LayoutForBytes(size_t bytes);

// The publisher's weights: one buffer per tensor, filled once; Stamp writes
// the version into the first bytes of every tensor, so every version's bytes
// (and checksums) differ without rewriting them all.
class Weights {
 public:
  explicit Weights(const Layout& layout);
  void Stamp(int64_t version);
  const TensorMap& tensors() const { return tensors_; }
  size_t bytes() const { return bytes_; }

 private:
  std::vector<std::shared_ptr<std::byte[]>> buffers_;
  std::vector<size_t> sizes_;
  TensorMap tensors_;
  size_t bytes_ = 0;
};

// A buffer of `n` bytes with every page touched (no page faults inside a
// timed region).
std::unique_ptr<std::byte[]> AllocateTouched(size_t n);

// MemAvailable from /proc/meminfo, in bytes (0 if unreadable).
size_t MemAvailableBytes();

// "10 MB" / "1 GB" (decimal units, as in docs/benchmarks.md).
std::string HumanBytes(size_t bytes);
// Parses "10M", "100M", "1G", "4096" (decimal units).
Result<size_t> ParseBytes(const std::string& text);
Result<std::vector<int64_t>> ParseIntList(const std::string& text);

// A child process (posix_spawnp of `argv`), optionally with its stdout and a
// signal pipe (the child's fd 3) read by the parent. SIGKILLed and reaped on
// destruction if still running.
class Child {
 public:
  static Result<Child> Spawn(const std::vector<std::string>& argv, bool capture_stdout, bool signal_pipe);
  Child(Child&& other) noexcept;
  Child& operator=(Child&&) = delete;
  ~Child();

  pid_t pid() const { return pid_; }
  // Reads one 8-byte message from the signal pipe. Timeout / Unavailable (closed).
  Result<int64_t> ReadSignal(Clock::time_point deadline);
  // Waits for exit (killing the child at the deadline); collects stdout.
  // OK if it exited with status 0; else Internal naming how it ended.
  Status Wait(Clock::time_point deadline);
  const std::string& output() const { return output_; }

 private:
  Child(pid_t pid, int out_fd, int signal_fd) : pid_(pid), out_fd_(out_fd), signal_fd_(signal_fd) {}
  void DrainOutput(int timeout_ms);
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int signal_fd_ = -1;
  bool reaped_ = false;
  std::string output_;
};

// In a child: writes one 8-byte message to fd 3.
void SignalParent(int64_t value);

// The path of this executable.
std::string SelfExe();

}  // namespace sluice::bench::ce

#endif  // SLUICE_BENCH_CHECKPOINT_ENGINE_BENCH_SUPPORT_H_
