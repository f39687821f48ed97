// The measurements of the TransferQueue benchmark (tq_bench.cc). A round
// trip (put rows, read them back, free them) is one interface with an
// implementation per transport, so the queue and its baselines (memcpy here,
// Redis in tq_redis.h) run under the same loop, stamps and bounds.
#ifndef SLUICE_BENCH_TRANSFER_QUEUE_TQ_MEASURE_H_
#define SLUICE_BENCH_TRANSFER_QUEUE_TQ_MEASURE_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/transfer_queue/client.h"

namespace sluice::bench::tq {

// The one column and the one consumer task every measurement uses: a ragged
// U8 column, so a row of any size is one tensor of shape {nbytes}.
inline constexpr char kColumn[] = "payload";
inline constexpr char kTask[] = "bench";

// Registers kColumn and kTask (idempotent).
Status SetUpQueue(transfer_queue::TransferQueueClient& client);

// One transport's round trip: store `batch` rows, then read them back
// (checking their stamps) and free them.
class RoundTripper {
 public:
  virtual ~RoundTripper() = default;
  // Stores rows 0..batch-1; row i is source[i * row_bytes, (i + 1) * row_bytes).
  virtual Status Put(const std::shared_ptr<std::byte[]>& source, size_t row_bytes, uint32_t batch) = 0;
  // Reads back the rows of the last Put, checks row i carries stamp
  // first_stamp + i (DataLoss otherwise) and frees them.
  virtual Status Get(size_t row_bytes, uint32_t batch, uint64_t first_stamp) = 0;
  // After the last round trip: drops whatever the transport still holds.
  virtual Status Finish() { return Status::Ok(); }
};

// The two sides of a work queue, for the ceiling benchmark (tq_ceiling.cc):
// producers put batches of stamped rows, consumers take them and ack them.
class QueueProducer {
 public:
  virtual ~QueueProducer() = default;
  // Stores `batch` rows; row i is rows[i * row_bytes, (i + 1) * row_bytes).
  virtual Status Put(const std::byte* rows, size_t row_bytes, uint32_t batch) = 0;
};
class QueueConsumer {
 public:
  virtual ~QueueConsumer() = default;
  // Takes up to `batch` rows, waiting up to ~100 ms for some; acks the rows
  // of the previous Take on the way. The rows taken (0: none came), each
  // checked to be `row_bytes` long with matching stamps at both ends
  // (DataLoss otherwise).
  virtual Result<uint32_t> Take(uint32_t batch, size_t row_bytes) = 0;
  // Acks the last Take's rows.
  virtual Status Finish() = 0;
};

// The queue through `client`: PutRows into `partition`; Take (ack riding)
// of kTask. The partition must exist.
std::unique_ptr<QueueProducer> NewQueueProducer(transfer_queue::TransferQueueClient client, std::string partition);
std::unique_ptr<QueueConsumer> NewQueueConsumer(transfer_queue::TransferQueueClient client, std::string partition);

// How long one measurement runs: each repeat iterates until it has run
// `seconds_per_repeat` or done `max_iterations`, whichever comes first
// (always at least once).
struct LoopBounds {
  int repeats = 5;
  double seconds_per_repeat = 0.25;
  int64_t max_iterations = 100000;
};

struct RoundTripResult {
  // Mean time of one round trip (a repeat's wall time, stamping the rows
  // included, / its round trips), one entry per repeat.
  std::vector<double> round_trip_seconds;
  // The same split into put and get; empty where a round trip is so short
  // (under kSplitMinSeconds) that reading the clock around each half would
  // distort it.
  std::vector<double> put_seconds;
  std::vector<double> get_seconds;
  std::vector<int64_t> iterations;
  double warmup_seconds = 0;  // the first round trip (faults in memory), apart
};
inline constexpr double kSplitMinSeconds = 20e-6;

// One warm-up round trip, then bounds.repeats timed repeats, then Finish.
Result<RoundTripResult> RunRoundTrips(RoundTripper& transport, size_t row_bytes, uint32_t batch,
                                      const LoopBounds& bounds);

// Baseline: put = memcpy of each row into a preallocated store, get = memcpy
// out into a preallocated buffer (the physical limit on one host).
std::unique_ptr<RoundTripper> NewMemcpyRoundTripper(size_t row_bytes, uint32_t batch);

// The queue through `client`, in a fresh partition: put = PutRows, get =
// Take (GetMeta + GetData in one call) carrying the ack of the previous
// get's lease, as a consumer loop does; one task, so an ack frees the rows.
// Finish acks the last lease and checks every row was freed. With `steps`,
// get = GetMeta + GetData + Ack instead, three calls (as a client without
// Take, e.g. the Python one's get_meta, get_data, ack, makes them).
Result<std::unique_ptr<RoundTripper>> NewQueueRoundTripper(transfer_queue::TransferQueueClient client,
                                                           std::string partition, bool steps = false);

// Get latency at batch 1: puts `samples` rows of `row_bytes` into a fresh
// partition, then times GetMeta(n = 1) + GetData (+ stamp check) of each
// (Ack untimed). Stops early after `max_seconds`. Seconds per sample.
Result<std::vector<double>> MeasureQueueGetLatency(transfer_queue::TransferQueueClient client,
                                                   const std::string& partition, size_t row_bytes, int samples,
                                                   double max_seconds);

// Producers outrunning consumers: one producer thread puts rows as fast as
// the capacity lets it, one consumer thread takes them slower; the main
// thread samples the controller's bytes_held and the server's RSS.
struct BackpressureConfig {
  uint64_t capacity_bytes = 0;  // what the queue was configured with
  size_t row_bytes = 256 << 10;
  uint32_t rows_per_call = 4;  // per PutRows and per GetMeta
  std::chrono::milliseconds consumer_pause{2};
  double seconds = 4;
};
struct BackpressureResult {
  uint64_t peak_bytes_held = 0;   // max of sampled ControllerStats::bytes_held
  uint64_t exact_peak_bytes = 0;  // the storage high-water mark where known (in process), else 0
  uint64_t rss_before = 0;        // of the process holding the storage, without shared memory
  uint64_t rss_peak = 0;
  uint64_t shm_before = 0;  // pages of the shared-memory arena, if there is one
  uint64_t shm_peak = 0;
  uint64_t rows_put = 0;
  uint64_t rows_got = 0;
  uint64_t producer_waits = 0;  // PutRows calls that timed out on a full queue
  uint64_t samples = 0;
};
// `rss_pid`: the process whose RSS to sample (0: this one). `shm_segment`:
// the arena whose pages to sample ("" if none). `exact_peak`: optional,
// read at the end.
Result<BackpressureResult> MeasureBackpressure(transfer_queue::TransferQueueClient client, pid_t rss_pid,
                                               const std::string& shm_segment,
                                               const std::function<uint64_t()>& exact_peak,
                                               const BackpressureConfig& config);

}  // namespace sluice::bench::tq

#endif  // SLUICE_BENCH_TRANSFER_QUEUE_TQ_MEASURE_H_
