// The results of the TransferQueue benchmark and how they are shown: tables
// (printed last, every figure next to its same-run baseline and the target
// it is held to) and JSON for plots.
#ifndef SLUICE_BENCH_TRANSFER_QUEUE_TQ_REPORT_H_
#define SLUICE_BENCH_TRANSFER_QUEUE_TQ_REPORT_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tq_measure.h"

namespace sluice::bench::tq {

// One (transport, row size, batch) of round trips, or of metadata cycles.
struct RoundTripRow {
  std::string transport;  // memcpy, redis, inproc, tcp, shm
  uint64_t row_bytes = 0;
  uint32_t batch = 0;        // rows per round trip, as measured
  uint32_t batch_asked = 0;  // as asked; larger when capped by --max-batch-mb
  bool skipped = false;
  std::string note;
  RoundTripResult result;
};

struct LatencyRow {
  std::string transport;
  uint64_t row_bytes = 0;
  std::vector<double> p50, p99;  // seconds, one per repeat
  std::vector<int> samples;      // per repeat
  bool skipped = false;
  std::string note;
};

struct MemoryRow {
  std::string transport;
  BackpressureConfig config;
  BackpressureResult result;
  bool skipped = false;
  std::string note;
};

struct Report {
  bool quick = false;
  bool steps = false;  // the queue's get was GetMeta + GetData + Ack (--get=steps)
  LoopBounds bounds;
  uint64_t max_batch_bytes = 0;
  std::vector<std::string> notes;  // skipped transports, capped batches
  std::vector<RoundTripRow> round_trips;
  std::vector<RoundTripRow> metadata;
  std::vector<LatencyRow> latency;
  std::vector<MemoryRow> memory;
  double total_seconds = 0;
};

// The tables, then the targets with their verdicts, on stdout.
void PrintReport(const Report& report);
nlohmann::json ReportToJson(const Report& report);

}  // namespace sluice::bench::tq

#endif  // SLUICE_BENCH_TRANSFER_QUEUE_TQ_REPORT_H_
