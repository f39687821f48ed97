// Tables, targets and JSON of the TransferQueue benchmark; see tq_report.h.
// The targets printed next to the figures are the project's aims for the
// TransferQueue (below); docs/design.md says how it is measured.
#include "tq_report.h"

#include <cstdio>
#include <thread>

#include "tq_support.h"

namespace sluice::bench::tq {
namespace {

constexpr uint64_t kRedisTargetRow = 4096;
constexpr double kShmRedisBatch1 = 3.0;    // shm throughput / Redis, 4 KiB rows, batch 1
constexpr double kShmRedisBatch256 = 5.0;  // the same at batch 256
constexpr double kTcpRedis = 1.0;          // tcp throughput / Redis, every row size and batch
constexpr double kShmMemcpyTarget = 0.5;   // shm throughput / memcpy, large rows
constexpr uint64_t kLargeRow = 1 << 20;    // "large": this or more
constexpr double kMetadataRows = 1e6;      // rows/s across processes, 8 B rows

bool IsQueue(const std::string& t) { return t == "inproc" || t == "tcp" || t == "shm"; }

uint64_t MemoryGrowth(const BackpressureResult& r) {
  const uint64_t rss = r.rss_peak > r.rss_before ? r.rss_peak - r.rss_before : 0;
  const uint64_t shm = r.shm_peak > r.shm_before ? r.shm_peak - r.shm_before : 0;
  return rss + shm;
}

enum class Target { kShmRedis, kTcpRedis, kShmVsMemcpy, kShmP99, kMetadata, kCapacity };
constexpr Target kAllTargets[] = {Target::kShmRedis, Target::kTcpRedis, Target::kShmVsMemcpy,
                                  Target::kShmP99,   Target::kMetadata, Target::kCapacity};

const char* TargetName(Target t) {
  switch (t) {
    case Target::kShmRedis:
      return "shm 4 KiB: >= 3x Redis at batch 1, 5x at 256";
    case Target::kTcpRedis:
      return "tcp: >= Redis at every row size and batch";
    case Target::kShmVsMemcpy:
      return ">= 50% of memcpy for rows >= 1 MiB over shm";
    case Target::kShmP99:
      return "Get p99 at batch 1 over shm <= Redis's";
    case Target::kMetadata:
      return "metadata across processes >= 1M rows/s";
    case Target::kCapacity:
      return "bytes held <= capacity";
  }
  return "";
}

// The throughput target of a round-trip row against Redis (0: none).
double RedisGoal(const RoundTripRow& r) {
  if (r.transport == "tcp") return kTcpRedis;
  if (r.transport != "shm" || r.row_bytes != kRedisTargetRow) return 0;
  if (r.batch == 1) return kShmRedisBatch1;
  return r.batch >= 256 ? kShmRedisBatch256 : 0;
}

const LatencyRow* FindLatency(const Report& report, const std::string& transport) {
  for (const LatencyRow& l : report.latency) {
    if (!l.skipped && l.transport == transport) return &l;
  }
  return nullptr;
}

// One target checked against one measured figure.
struct Verdict {
  Target target;
  std::string subject;  // which row
  double value = 0;
  double goal = 0;
  bool met = false;
};

const RoundTripRow* FindRow(const std::vector<RoundTripRow>& rows, const std::string& transport, uint64_t row_bytes,
                            uint32_t batch) {
  for (const RoundTripRow& r : rows) {
    if (!r.skipped && r.transport == transport && r.row_bytes == row_bytes && r.batch == batch) return &r;
  }
  return nullptr;
}

double MedianRoundTrip(const RoundTripRow& r) { return Summarize(r.result.round_trip_seconds).median; }
double RowsPerSecond(const RoundTripRow& r) { return r.batch / MedianRoundTrip(r); }

// Throughput of `row` relative to `baseline` of the same size and batch
// (baseline time / row time), or -1 if there is none.
double Speedup(const std::vector<RoundTripRow>& rows, const RoundTripRow& row, const std::string& baseline) {
  const RoundTripRow* b = FindRow(rows, baseline, row.row_bytes, row.batch);
  if (b == nullptr || row.skipped) return -1;
  return MedianRoundTrip(*b) / MedianRoundTrip(row);
}

std::string Subject(const RoundTripRow& r) {
  return r.transport + " " + HumanBytes(r.row_bytes) + " x" + std::to_string(r.batch);
}

std::vector<Verdict> Evaluate(const Report& report) {
  std::vector<Verdict> out;
  for (const RoundTripRow& r : report.round_trips) {
    if (r.skipped || !IsQueue(r.transport)) continue;
    if (const double goal = RedisGoal(r); goal > 0) {
      const double x = Speedup(report.round_trips, r, "redis");
      const Target t = r.transport == "tcp" ? Target::kTcpRedis : Target::kShmRedis;
      if (x >= 0) out.push_back({t, Subject(r), x, goal, x >= goal});
    }
    if (r.transport == "shm" && r.row_bytes >= kLargeRow) {
      const double share = Speedup(report.round_trips, r, "memcpy");
      if (share >= 0) {
        out.push_back({Target::kShmVsMemcpy, Subject(r), share, kShmMemcpyTarget, share >= kShmMemcpyTarget});
      }
    }
  }
  const LatencyRow* shm = FindLatency(report, "shm");
  const LatencyRow* redis = FindLatency(report, "redis");
  if (shm != nullptr && redis != nullptr) {
    const double p99 = Summarize(shm->p99).median, goal = Summarize(redis->p99).median;
    out.push_back({Target::kShmP99, "shm " + HumanBytes(shm->row_bytes), p99, goal, p99 <= goal});
  }
  for (const RoundTripRow& r : report.metadata) {
    if (r.skipped || (r.transport != "tcp" && r.transport != "shm")) continue;
    const double rate = RowsPerSecond(r);
    out.push_back({Target::kMetadata, r.transport, rate, kMetadataRows, rate >= kMetadataRows});
  }
  for (const MemoryRow& m : report.memory) {
    if (m.skipped) continue;
    const uint64_t peak = std::max(m.result.peak_bytes_held, m.result.exact_peak_bytes);
    out.push_back({Target::kCapacity, m.transport, static_cast<double>(peak),
                   static_cast<double>(m.config.capacity_bytes), peak <= m.config.capacity_bytes});
  }
  return out;
}

std::string Us(double seconds) {
  char buf[32];
  const double us = seconds * 1e6;
  std::snprintf(buf, sizeof(buf), us < 10 ? "%.2f" : us < 1000 ? "%.1f" : "%.0f", us);
  return buf;
}

// A put or get median, "-" where the round trip was too short to split.
std::string SplitUs(const std::vector<double>& seconds) {
  return seconds.empty() ? "-" : Us(Summarize(seconds).median);
}

std::string Spread(double median, double min, double max) { return Us(median) + " [" + Us(min) + ".." + Us(max) + "]"; }

std::string Mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1 << 20));
  return buf;
}

void PrintRoundTrips(const Report& report) {
  if (report.steps) {
    std::printf("\n1. Put+Get round trips. Queue: put = PutRows, get = GetMeta + GetData + Ack (--get=steps).");
  } else {
    std::printf(
        "\n1. Put+Get round trips. Queue: put = PutRows, get = Take (GetMeta + GetData) carrying the Ack of the"
        " previous get\n   (one U8 tensor per row; over tcp and shm each is one request).");
  }
  std::printf(
      "\n   Redis: pipelined SETs, "
      "then GETs + one DEL. memcpy: copy in, then copy out.\n"
      "   GB/s = rows x row bytes / (put + get). inproc and shm gets return views, not copies, so they may"
      " beat memcpy.\n   Times in us per round trip, median of %d [min..max].\n",
      report.bounds.repeats);
  std::printf("%-8s %5s  %-9s %-30s %9s %9s %8s %9s %8s  %s\n", "row", "batch", "transport", "round trip us", "put us",
              "get us", "GB/s", "vs memcpy", "vs redis", "target");
  for (const RoundTripRow& r : report.round_trips) {
    if (r.skipped) {
      std::printf("%-8s %5u  %-9s skipped: %s\n", HumanBytes(r.row_bytes).c_str(), r.batch_asked, r.transport.c_str(),
                  r.note.c_str());
      continue;
    }
    const Stats rt = Summarize(r.result.round_trip_seconds);
    const double gbps = static_cast<double>(r.row_bytes) * r.batch / rt.median / 1e9;
    const double vs_memcpy = Speedup(report.round_trips, r, "memcpy");
    const double vs_redis = Speedup(report.round_trips, r, "redis");
    char memcpy_text[16] = "-", redis_text[16] = "-";
    if (r.transport == "memcpy")
      std::snprintf(memcpy_text, sizeof(memcpy_text), "baseline");
    else if (vs_memcpy >= 0)
      std::snprintf(memcpy_text, sizeof(memcpy_text), "%.1f%%", 100 * vs_memcpy);
    if (r.transport == "redis")
      std::snprintf(redis_text, sizeof(redis_text), "baseline");
    else if (vs_redis >= 0)
      std::snprintf(redis_text, sizeof(redis_text), "%.2fx", vs_redis);
    std::string target;
    if (const double goal = RedisGoal(r); goal > 0) {
      char label[32];
      std::snprintf(label, sizeof(label), ">= %.0fx redis: ", goal);
      target = std::string(label) + (vs_redis < 0 ? "no redis" : vs_redis >= goal ? "met" : "MISSED");
    }
    if (r.transport == "shm" && r.row_bytes >= kLargeRow) {
      target = vs_memcpy < 0                   ? ">= 50% memcpy: no memcpy"
               : vs_memcpy >= kShmMemcpyTarget ? ">= 50% memcpy: met"
                                               : ">= 50% memcpy: MISSED";
    }
    std::string batch = std::to_string(r.batch);
    if (r.batch != r.batch_asked) batch += "*";
    std::printf("%-8s %5s  %-9s %-30s %9s %9s %8.3f %9s %8s  %s\n", HumanBytes(r.row_bytes).c_str(), batch.c_str(),
                r.transport.c_str(), Spread(rt.median, rt.min, rt.max).c_str(), SplitUs(r.result.put_seconds).c_str(),
                SplitUs(r.result.get_seconds).c_str(), gbps, memcpy_text, redis_text, target.c_str());
  }
  for (const RoundTripRow& r : report.round_trips) {
    if (r.batch == r.batch_asked) continue;
    std::printf("   (* batch capped at --max-batch-mb=%llu MiB per round trip)\n",
                static_cast<unsigned long long>(report.max_batch_bytes >> 20));
    break;
  }
}

void PrintMetadata(const Report& report) {
  if (report.metadata.empty()) return;
  const RoundTripRow& first = report.metadata.front();
  std::printf(
      "\n2. Metadata operations: %s rows, %u per call; queue: PutRows + Take carrying the previous Ack (2 calls);"
      "\n   Redis: pipelined SETs + GETs + one DEL. Rows/s, median of %d [min..max].\n",
      HumanBytes(first.row_bytes).c_str(), first.batch, report.bounds.repeats);
  std::printf("%-9s %-34s %12s %9s\n", "transport", "rows/s", "calls/s", "vs redis");
  const RoundTripRow* redis = FindRow(report.metadata, "redis", first.row_bytes, first.batch);
  for (const RoundTripRow& r : report.metadata) {
    if (r.skipped) {
      std::printf("%-9s skipped: %s\n", r.transport.c_str(), r.note.c_str());
      continue;
    }
    std::vector<double> rate;
    for (double s : r.result.round_trip_seconds) rate.push_back(r.batch / s);
    const Stats st = Summarize(rate);
    char rows[64], vs[16] = "-";
    std::snprintf(rows, sizeof(rows), "%.0f [%.0f..%.0f]", st.median, st.min, st.max);
    if (r.transport == "redis")
      std::snprintf(vs, sizeof(vs), "baseline");
    else if (redis != nullptr)
      std::snprintf(vs, sizeof(vs), "%.2fx", MedianRoundTrip(*redis) / MedianRoundTrip(r));
    // Redis makes three calls per cycle (SETs, GETs, DEL), the queue two.
    const double calls = r.transport == "redis" ? 3 : 2;
    std::printf("%-9s %-34s %12.0f %9s\n", r.transport.c_str(), rows, calls * st.median / r.batch, vs);
  }
}

void PrintLatency(const Report& report) {
  if (report.latency.empty()) return;
  std::printf(
      "\n3. Get latency at batch 1: one %s row; queue: one Take (carrying the previous Ack); Redis: one GET."
      "\n   Per-repeat p50 and p99 in us, median of %d [min..max].\n",
      HumanBytes(report.latency.front().row_bytes).c_str(), report.bounds.repeats);
  std::printf("%-9s %8s %-26s %-26s %12s  %s\n", "transport", "samples", "p50 us", "p99 us", "p99 / redis", "target");
  const LatencyRow* redis = nullptr;
  for (const LatencyRow& l : report.latency) {
    if (!l.skipped && l.transport == "redis") redis = &l;
  }
  for (const LatencyRow& l : report.latency) {
    if (l.skipped) {
      std::printf("%-9s skipped: %s\n", l.transport.c_str(), l.note.c_str());
      continue;
    }
    const Stats p50 = Summarize(l.p50), p99 = Summarize(l.p99);
    std::vector<double> samples(l.samples.begin(), l.samples.end());
    char vs[16] = "-";
    if (l.transport == "redis")
      std::snprintf(vs, sizeof(vs), "baseline");
    else if (redis != nullptr)
      std::snprintf(vs, sizeof(vs), "%.2fx", p99.median / Summarize(redis->p99).median);
    std::string target;
    if (l.transport == "shm" && redis != nullptr) {
      target = p99.median <= Summarize(redis->p99).median ? "p99 <= redis: met" : "p99 <= redis: MISSED";
    }
    std::printf("%-9s %8.0f %-26s %-26s %12s  %s\n", l.transport.c_str(), Summarize(samples).median,
                Spread(p50.median, p50.min, p50.max).c_str(), Spread(p99.median, p99.min, p99.max).c_str(), vs,
                target.c_str());
  }
}

void PrintMemory(const Report& report) {
  if (report.memory.empty()) return;
  const BackpressureConfig& c = report.memory.front().config;
  std::printf(
      "\n4. Producers outrunning consumers: %s rows, %u per call; the consumer pauses %lld ms per call;"
      " %.1f s.\n   Peak held: sampled ControllerStats::bytes_held (in process also the exact storage"
      " high-water mark).\n   Memory growth, peak minus before: RSS without shared memory of the process"
      " holding the rows (this one for\n   inproc, the server for tcp/shm), plus the pages of the shm arena.\n",
      HumanBytes(c.row_bytes).c_str(), c.rows_per_call, static_cast<long long>(c.consumer_pause.count()), c.seconds);
  std::printf("%-9s %9s %-28s %-20s %-20s %s\n", "transport", "capacity", "peak held (% capacity)", "produced (x cap)",
              "mem growth (x cap)", "verdict");
  for (const MemoryRow& m : report.memory) {
    if (m.skipped) {
      std::printf("%-9s skipped: %s\n", m.transport.c_str(), m.note.c_str());
      continue;
    }
    const BackpressureResult& r = m.result;
    const double cap = static_cast<double>(m.config.capacity_bytes);
    const uint64_t peak = std::max(r.peak_bytes_held, r.exact_peak_bytes);
    const double produced = static_cast<double>(r.rows_put) * m.config.row_bytes;
    const double rss = static_cast<double>(MemoryGrowth(r));
    char held[64], prod[48], growth[48];
    std::snprintf(held, sizeof(held), "%s (%.0f%%)%s", Mib(static_cast<double>(peak)).c_str(), 100 * peak / cap,
                  r.exact_peak_bytes > 0 ? " exact" : "");
    std::snprintf(prod, sizeof(prod), "%s (%.1fx)", Mib(produced).c_str(), produced / cap);
    std::snprintf(growth, sizeof(growth), "%s (%.2fx)", Mib(rss).c_str(), rss / cap);
    std::string verdict = peak <= m.config.capacity_bytes ? "PASS (peak held <= capacity)" : "FAIL (over capacity)";
    if (produced < 2 * cap) verdict += "; producer never outran the consumer by 2x capacity";
    if (r.shm_before > 0) verdict += "; arena " + Mib(static_cast<double>(r.shm_before)) + " allocated at start";
    std::printf("%-9s %9s %-28s %-20s %-20s %s\n", m.transport.c_str(), HumanBytes(m.config.capacity_bytes).c_str(),
                held, prod, growth, verdict.c_str());
  }
}

}  // namespace

void PrintReport(const Report& report) {
  std::printf(
      "\nTransferQueue benchmark (docs/design.md)%s: %u CPUs; every ratio is against a baseline"
      " of this run.\n",
      report.quick ? ", --quick" : "", std::thread::hardware_concurrency());
  for (const std::string& n : report.notes) std::printf("note: %s\n", n.c_str());
  PrintRoundTrips(report);
  PrintMetadata(report);
  PrintLatency(report);
  PrintMemory(report);
  std::printf("\nTargets:\n");
  const std::vector<Verdict> verdicts = Evaluate(report);
  for (Target target : kAllTargets) {
    std::string line;
    for (const Verdict& v : verdicts) {
      if (v.target != target) continue;
      const char* verdict = v.met ? "met" : "MISSED";
      char buf[96];
      switch (target) {
        case Target::kShmRedis:
        case Target::kTcpRedis:
          std::snprintf(buf, sizeof(buf), "%s %.2fx %s", v.subject.c_str(), v.value, verdict);
          break;
        case Target::kMetadata:
          std::snprintf(buf, sizeof(buf), "%s %.0fk rows/s %s", v.subject.c_str(), v.value / 1e3, verdict);
          break;
        case Target::kShmVsMemcpy:
          std::snprintf(buf, sizeof(buf), "%s %.0f%% %s", v.subject.c_str(), 100 * v.value, verdict);
          break;
        case Target::kShmP99:
          std::snprintf(buf, sizeof(buf), "%s %s us (redis %s) %s", v.subject.c_str(), Us(v.value).c_str(),
                        Us(v.goal).c_str(), verdict);
          break;
        case Target::kCapacity:
          std::snprintf(buf, sizeof(buf), "%s %s", v.subject.c_str(), v.met ? "PASS" : "FAIL");
          break;
      }
      line += (line.empty() ? "" : "; ") + std::string(buf);
    }
    std::printf("  %-46s %s\n", TargetName(target), line.empty() ? "not measured in this run" : line.c_str());
  }
  std::printf("(%.0f s in all)\n", report.total_seconds);
}

nlohmann::json ReportToJson(const Report& report) {
  auto round_trips = [](const std::vector<RoundTripRow>& rows) {
    nlohmann::json out = nlohmann::json::array();
    for (const RoundTripRow& r : rows) {
      nlohmann::json j = {{"transport", r.transport},
                          {"row_bytes", r.row_bytes},
                          {"batch", r.batch},
                          {"batch_asked", r.batch_asked},
                          {"skipped", r.skipped}};
      if (!r.note.empty()) j["note"] = r.note;
      if (!r.skipped) {
        const Stats s = Summarize(r.result.round_trip_seconds);
        j["round_trip_seconds"] = r.result.round_trip_seconds;
        j["put_seconds"] = r.result.put_seconds;
        j["get_seconds"] = r.result.get_seconds;
        j["iterations"] = r.result.iterations;
        j["warmup_seconds"] = r.result.warmup_seconds;
        j["median_seconds"] = s.median;
        j["min_seconds"] = s.min;
        j["max_seconds"] = s.max;
        j["bytes_per_second"] = static_cast<double>(r.row_bytes) * r.batch / s.median;
        j["rows_per_second"] = r.batch / s.median;
        for (const char* b : {"memcpy", "redis"}) {
          const double x = Speedup(rows, r, b);
          if (x >= 0 && r.transport != b) j[std::string("speedup_vs_") + b] = x;
        }
      }
      out.push_back(j);
    }
    return out;
  };
  nlohmann::json latency = nlohmann::json::array();
  for (const LatencyRow& l : report.latency) {
    nlohmann::json j = {{"transport", l.transport}, {"row_bytes", l.row_bytes}, {"skipped", l.skipped}};
    if (!l.note.empty()) j["note"] = l.note;
    if (!l.skipped) {
      j["p50_seconds"] = l.p50;
      j["p99_seconds"] = l.p99;
      j["samples"] = l.samples;
      j["median_p50_seconds"] = Summarize(l.p50).median;
      j["median_p99_seconds"] = Summarize(l.p99).median;
    }
    latency.push_back(j);
  }
  nlohmann::json memory = nlohmann::json::array();
  for (const MemoryRow& m : report.memory) {
    nlohmann::json j = {{"transport", m.transport},
                        {"capacity_bytes", m.config.capacity_bytes},
                        {"row_bytes", m.config.row_bytes},
                        {"rows_per_call", m.config.rows_per_call},
                        {"consumer_pause_ms", m.config.consumer_pause.count()},
                        {"seconds", m.config.seconds},
                        {"skipped", m.skipped}};
    if (!m.note.empty()) j["note"] = m.note;
    if (!m.skipped) {
      const BackpressureResult& r = m.result;
      j["peak_bytes_held_sampled"] = r.peak_bytes_held;
      j["exact_peak_bytes"] = r.exact_peak_bytes;
      j["rss_before"] = r.rss_before;
      j["rss_peak"] = r.rss_peak;
      j["shm_before"] = r.shm_before;
      j["shm_peak"] = r.shm_peak;
      j["memory_growth"] = MemoryGrowth(r);
      j["rows_put"] = r.rows_put;
      j["rows_got"] = r.rows_got;
      j["producer_waits"] = r.producer_waits;
      j["samples"] = r.samples;
    }
    memory.push_back(j);
  }
  nlohmann::json targets = nlohmann::json::array();
  for (const Verdict& v : Evaluate(report)) {
    targets.push_back({{"target", TargetName(v.target)},
                       {"subject", v.subject},
                       {"value", v.value},
                       {"goal", v.goal},
                       {"met", v.met}});
  }
  return {{"benchmark", "transfer_queue"},
          {"cpus", std::thread::hardware_concurrency()},
          {"quick", report.quick},
          {"repeats", report.bounds.repeats},
          {"seconds_per_repeat", report.bounds.seconds_per_repeat},
          {"max_batch_bytes", report.max_batch_bytes},
          {"notes", report.notes},
          {"round_trips", round_trips(report.round_trips)},
          {"metadata", round_trips(report.metadata)},
          {"latency", latency},
          {"memory", memory},
          {"targets", targets},
          {"total_seconds", report.total_seconds}};
}

}  // namespace sluice::bench::tq
