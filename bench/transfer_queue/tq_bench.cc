// TransferQueue benchmark (docs/benchmarks.md). Every figure is shown
// next to a baseline measured in the same run:
//
//   1. put+get round trips of U8 rows (64 B .. 16 MiB, batches 1 and 256):
//      inproc  TransferQueueHub in this process (GetData returns views)
//      tcp     TransferQueueServer in a forked child, over loopback TCP
//      shm     the same server with a shared-memory arena (ShmMode::kRequired):
//              payloads are written into it and read in place
//      memcpy  copy in + copy out of the same bytes (the physical limit)
//      redis   redis-server on loopback, pipelined SET / GET / DEL (hiredis)
//   2. metadata operations per second with many 8-byte rows
//   3. Get latency p50/p99 at batch 1 (4 KiB), next to Redis GET
//   4. memory held when a producer outruns a consumer, against capacity
//
// Each row is a warm-up round trip plus `repeats` timed repeats (median and
// min..max printed). Every loop is bounded by a count and a time. The server
// children are forked first, before this process has a ZeroMQ context or a
// thread; the memory section runs next, while this process's heap is fresh.
// The allocator is the programs' (tcmalloc unless built with
// SLUICE_MALLOC=system, then glibc tuned as the launcher tunes it).
//
//   tq_bench [--quick] [--repeats=N] [--transports=inproc,tcp,shm,redis,memcpy]
//            [--sizes=64,4K,256K,16M] [--batches=1,256] [--max-batch-mb=256]
//            [--json=PATH]
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "sluice/runtime/flags.h"
#include "sluice/runtime/process.h"
#include "sluice/transfer_queue/remote.h"
#include "sluice/transfer_queue/server.h"
#include "tq_measure.h"
#include "tq_redis.h"
#include "tq_report.h"
#include "tq_support.h"

namespace sluice::bench::tq {
namespace {

using transfer_queue::RemoteOptions;
using transfer_queue::ServerOptions;
using transfer_queue::TransferQueueClient;

const std::vector<std::string> kTransports = {"memcpy", "redis", "inproc", "tcp", "shm"};
constexpr std::chrono::milliseconds kChildTimeout{10000};

struct Settings {
  bool quick = false;
  LoopBounds bounds;
  std::vector<uint64_t> sizes;
  std::vector<uint32_t> batches;
  std::set<std::string> transports;
  std::set<std::string> sections;
  bool steps = false;  // get = GetMeta + GetData + Ack instead of Take
  uint64_t max_batch_bytes = 0;
  std::string json_path;
  uint64_t metadata_row_bytes = 8;
  uint32_t metadata_batch = 64;
  uint64_t latency_row_bytes = 4096;
  int latency_samples = 3000;
  double latency_seconds = 3;
  BackpressureConfig memory;
};

Result<Settings> ParseSettings(const runtime::FlagSet& flags) {
  Settings s;
  if (!flags.positional().empty()) {
    return Status::InvalidArgument("unexpected argument '" + flags.positional().front() + "'");
  }
  SLUICE_ASSIGN_OR_RETURN(s.quick, flags.GetBool("quick"));
  s.bounds = s.quick ? LoopBounds{3, 0.05, 20000} : LoopBounds{5, 0.25, 100000};
  SLUICE_ASSIGN_OR_RETURN(std::string repeats, flags.GetString("repeats"));
  if (!repeats.empty()) {
    SLUICE_ASSIGN_OR_RETURN(int64_t n, flags.GetInt("repeats", 1, 100));
    s.bounds.repeats = static_cast<int>(n);
  }
  SLUICE_ASSIGN_OR_RETURN(std::string transports, flags.GetString("transports"));
  Result<std::vector<std::string>> names = SplitList(transports);
  if (!names.ok()) return names.status().WithContext("--transports");
  for (const std::string& t : *names) {
    if (std::find(kTransports.begin(), kTransports.end(), t) == kTransports.end()) {
      return Status::InvalidArgument("--transports: unknown '" + t + "' (inproc, tcp, shm, redis, memcpy)");
    }
    s.transports.insert(t);
  }
  SLUICE_ASSIGN_OR_RETURN(std::string sections, flags.GetString("sections"));
  Result<std::vector<std::string>> section_names = SplitList(sections);
  if (!section_names.ok()) return section_names.status().WithContext("--sections");
  for (const std::string& n : *section_names) {
    if (n != "roundtrip" && n != "metadata" && n != "latency" && n != "memory") {
      return Status::InvalidArgument("--sections: unknown '" + n + "' (roundtrip, metadata, latency, memory)");
    }
    s.sections.insert(n);
  }
  SLUICE_ASSIGN_OR_RETURN(std::string get, flags.GetString("get"));
  if (get != "take" && get != "steps") return Status::InvalidArgument("--get: '" + get + "' is not take or steps");
  s.steps = get == "steps";
  SLUICE_ASSIGN_OR_RETURN(std::string sizes, flags.GetString("sizes"));
  if (sizes.empty()) sizes = s.quick ? "64,4K,256K" : "64,4K,256K,16M";
  Result<std::vector<std::string>> size_items = SplitList(sizes);
  if (!size_items.ok()) return size_items.status().WithContext("--sizes");
  for (const std::string& item : *size_items) {
    Result<uint64_t> b = ParseBytes(item);
    if (!b.ok()) return b.status().WithContext("--sizes");
    if (*b < kMinRowBytes || *b > (uint64_t{256} << 20)) {
      return Status::InvalidArgument("--sizes: '" + item + "' is outside 8 B..256 MiB");
    }
    s.sizes.push_back(*b);
  }
  SLUICE_ASSIGN_OR_RETURN(std::string batches, flags.GetString("batches"));
  Result<std::vector<std::string>> batch_items = SplitList(batches);
  if (!batch_items.ok()) return batch_items.status().WithContext("--batches");
  for (const std::string& item : *batch_items) {
    const bool digits = item.size() <= 5 && item.find_first_not_of("0123456789") == std::string::npos;
    const unsigned long n = digits ? std::stoul(item) : 0;
    if (n < 1 || n > 65536) return Status::InvalidArgument("--batches: '" + item + "' is not a row count in 1..65536");
    s.batches.push_back(static_cast<uint32_t>(n));
  }
  SLUICE_ASSIGN_OR_RETURN(int64_t max_batch_mb, flags.GetInt("max-batch-mb", 1, 4096));
  s.max_batch_bytes = static_cast<uint64_t>(max_batch_mb) << 20;
  SLUICE_ASSIGN_OR_RETURN(s.json_path, flags.GetString("json"));
  if (s.quick) {
    s.latency_samples = 300;
    s.latency_seconds = 1;
  }
  s.memory.capacity_bytes = s.quick ? (uint64_t{32} << 20) : (uint64_t{256} << 20);
  s.memory.seconds = s.quick ? 1.0 : 4.0;
  return s;
}

ServerOptions ServerFor(const std::string& transport, uint64_t capacity_bytes) {
  ServerOptions options;
  options.bind = "tcp://127.0.0.1:0";
  options.controller.capacity_bytes = capacity_bytes;
  // The arena holds every cell the capacity allows, with room above it for
  // freed cells that views still pin (see ServerOptions::shm_bytes).
  if (transport == "shm") options.shm_bytes = 2 * capacity_bytes + (uint64_t{64} << 20);
  return options;
}

RemoteOptions RemoteFor(const std::string& transport) {
  RemoteOptions options;
  options.shm = transport == "shm" ? transfer_queue::ShmMode::kRequired : transfer_queue::ShmMode::kOff;
  return options;
}

// Capacity of the server for sections 1-3: it holds two round trips'
// batches at a time (the ack of one rides on the next take), or the latency
// section's rows, with one batch more for slack.
uint64_t DataCapacity(const Settings& s) {
  uint64_t largest = s.latency_row_bytes * static_cast<uint64_t>(s.latency_samples);
  for (uint64_t size : s.sizes) {
    for (uint32_t batch : s.batches) {
      largest = std::max(largest, std::min(size * batch, std::max(size, s.max_batch_bytes)));
    }
  }
  return std::max<uint64_t>(3 * largest, uint64_t{64} << 20);
}

// Peak memory a round trip needs, as multiples of the batch's bytes (all
// copies alive at once, in this process and the server or Redis).
double CopiesNeeded(const std::string& transport) { return transport == "memcpy" || transport == "inproc" ? 3 : 6; }

void Progress(const char* what, const std::string& transport, const std::string& detail) {
  std::fprintf(stderr, "%-10s %-7s %s\n", what, transport.c_str(), detail.c_str());
}

// Everything the measurements talk to, set up once.
struct Endpoints {
  std::map<std::string, std::unique_ptr<ServerChild>> servers;         // tcp, shm: sections 1-3
  std::map<std::string, std::unique_ptr<ServerChild>> memory_servers;  // tcp, shm: section 4
  std::unique_ptr<RedisChild> redis;
};

// Forks the servers and starts Redis; whatever cannot start is noted and
// left out.
Endpoints StartChildren(const Settings& s, Report& report) {
  Endpoints e;
  for (const char* name : {"tcp", "shm"}) {
    const std::string t = name;
    if (!s.transports.count(t)) continue;
    Result<std::unique_ptr<ServerChild>> data = ServerChild::Fork(ServerFor(t, DataCapacity(s)), kChildTimeout);
    Result<std::unique_ptr<ServerChild>> memory =
        ServerChild::Fork(ServerFor(t, s.memory.capacity_bytes), kChildTimeout);
    if (!data.ok() || !memory.ok()) {
      report.notes.push_back(t + " skipped: " + (data.ok() ? memory.status() : data.status()).ToString());
      continue;
    }
    e.servers[t] = std::move(*data);
    e.memory_servers[t] = std::move(*memory);
  }
  if (s.transports.count("redis")) {
    if (!RedisClientBuilt()) {
      report.notes.push_back("redis skipped: built without hiredis (libhiredis-dev)");
    } else {
      Result<std::unique_ptr<RedisChild>> redis = RedisChild::Start(kChildTimeout);
      if (redis.ok()) {
        e.redis = std::move(*redis);
      } else {
        report.notes.push_back("redis skipped: " + redis.status().ToString());
      }
    }
  }
  for (const std::string& n : report.notes) std::fprintf(stderr, "%s\n", n.c_str());
  return e;
}

Status MeasureMemory(const Settings& s, Endpoints& e, Report& report) {
  if (s.transports.count("inproc")) {
    transfer_queue::HubOptions options;
    options.controller.capacity_bytes = s.memory.capacity_bytes;
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<transfer_queue::TransferQueueHub> hub,
                            transfer_queue::TransferQueueHub::Create(options));
    Progress("memory", "inproc", HumanBytes(s.memory.capacity_bytes) + " capacity");
    const transfer_queue::TransferQueueHub* h = hub.get();
    Result<BackpressureResult> r = MeasureBackpressure(
        hub->client(), 0, "", [h] { return h->meter().peak_bytes.load(); }, s.memory);
    if (!r.ok()) return r.status().WithContext("memory inproc");
    report.memory.push_back(MemoryRow{"inproc", s.memory, *r, false, ""});
  }
  for (const std::string& t : kTransports) {
    if (!e.memory_servers.count(t)) continue;
    ServerChild* server = e.memory_servers.at(t).get();
    Progress("memory", t, HumanBytes(s.memory.capacity_bytes) + " capacity");
    SLUICE_ASSIGN_OR_RETURN(transfer_queue::RemoteQueue queue,
                            transfer_queue::ConnectTransferQueue(server->endpoint(), RemoteFor(t)));
    Result<BackpressureResult> r =
        MeasureBackpressure(queue.client(), server->pid(), queue.shm_segment, nullptr, s.memory);
    if (!r.ok()) return r.status().WithContext("memory " + t);
    report.memory.push_back(MemoryRow{t, s.memory, *r, false, ""});
  }
  for (auto& [t, server] : e.memory_servers) {
    Status stopped = server->Stop(kChildTimeout);
    if (!stopped.ok()) report.notes.push_back(t + " memory server: " + stopped.ToString());
  }
  return Status::Ok();
}

// A round tripper for `transport`; queues get their own partition.
Result<std::unique_ptr<RoundTripper>> MakeRoundTripper(const std::string& transport,
                                                       std::map<std::string, TransferQueueClient>& queues,
                                                       const Endpoints& e, const std::string& partition,
                                                       uint64_t row_bytes, uint32_t batch, bool steps) {
  if (transport == "memcpy") return NewMemcpyRoundTripper(row_bytes, batch);
  if (transport == "redis") return NewRedisRoundTripper(e.redis->port());
  return NewQueueRoundTripper(queues.at(transport), partition, steps);
}

bool Available(const std::string& t, const Settings& s, const Endpoints& e,
               const std::map<std::string, TransferQueueClient>& queues) {
  if (!s.transports.count(t)) return false;
  if (t == "redis") return e.redis != nullptr;
  return t == "memcpy" || queues.count(t) > 0;
}

Status MeasureRoundTrips(const Settings& s, const Endpoints& e, std::map<std::string, TransferQueueClient>& queues,
                         Report& report) {
  for (uint64_t size : s.sizes) {
    for (uint32_t asked : s.batches) {
      const uint32_t batch =
          static_cast<uint32_t>(std::clamp<uint64_t>(s.max_batch_bytes / size, 1, static_cast<uint64_t>(asked)));
      if (batch != asked) {
        report.notes.push_back(HumanBytes(size) + " x " + std::to_string(asked) + " rows capped to " +
                               std::to_string(batch) +
                               " rows (--max-batch-mb=" + std::to_string(s.max_batch_bytes >> 20) + ")");
      }
      for (const std::string& t : kTransports) {
        if (!Available(t, s, e, queues)) continue;
        RoundTripRow row{t, size, batch, asked, false, "", {}};
        const double need = CopiesNeeded(t) * static_cast<double>(size) * batch + (512.0 * (1 << 20));
        if (static_cast<double>(MemAvailableBytes()) < need) {
          row.skipped = true;
          row.note = "needs ~" + std::to_string(static_cast<int>(need / (1 << 20))) + " MiB, " +
                     std::to_string(MemAvailableBytes() >> 20) + " MiB available";
          report.round_trips.push_back(row);
          continue;
        }
        const std::string what = HumanBytes(size) + " x" + std::to_string(batch);
        Progress("round trip", t, what);
        const std::string partition = "rt-" + std::to_string(size) + "-" + std::to_string(batch);
        SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RoundTripper> rt,
                                MakeRoundTripper(t, queues, e, partition, size, batch, s.steps));
        Result<RoundTripResult> r = RunRoundTrips(*rt, size, batch, s.bounds);
        if (!r.ok()) return r.status().WithContext("round trip " + t + " " + what);
        row.result = *r;
        report.round_trips.push_back(row);
      }
    }
  }
  return Status::Ok();
}

Status MeasureMetadata(const Settings& s, const Endpoints& e, std::map<std::string, TransferQueueClient>& queues,
                       Report& report) {
  for (const std::string& t : kTransports) {
    if (t == "memcpy" || !Available(t, s, e, queues)) continue;
    Progress("metadata", t, std::to_string(s.metadata_batch) + " rows per call");
    SLUICE_ASSIGN_OR_RETURN(
        std::unique_ptr<RoundTripper> rt,
        MakeRoundTripper(t, queues, e, "metadata", s.metadata_row_bytes, s.metadata_batch, s.steps));
    Result<RoundTripResult> r = RunRoundTrips(*rt, s.metadata_row_bytes, s.metadata_batch, s.bounds);
    if (!r.ok()) return r.status().WithContext("metadata " + t);
    report.metadata.push_back(RoundTripRow{t, s.metadata_row_bytes, s.metadata_batch, s.metadata_batch, false, "", *r});
  }
  return Status::Ok();
}

Status MeasureLatency(const Settings& s, const Endpoints& e, std::map<std::string, TransferQueueClient>& queues,
                      Report& report) {
  for (const std::string& t : kTransports) {
    if (t == "memcpy" || !Available(t, s, e, queues)) continue;
    Progress("latency", t, HumanBytes(s.latency_row_bytes) + " x1");
    LatencyRow row{t, s.latency_row_bytes, {}, {}, {}, false, ""};
    for (int r = 0; r < s.bounds.repeats; ++r) {
      Result<std::vector<double>> samples =
          t == "redis"
              ? MeasureRedisGetLatency(e.redis->port(), s.latency_row_bytes, s.latency_samples, s.latency_seconds)
              : MeasureQueueGetLatency(queues.at(t), "latency-" + std::to_string(r), s.latency_row_bytes,
                                       s.latency_samples, s.latency_seconds);
      if (!samples.ok()) return samples.status().WithContext("latency " + t);
      row.p50.push_back(Quantile(*samples, 0.50));
      row.p99.push_back(Quantile(*samples, 0.99));
      row.samples.push_back(static_cast<int>(samples->size()));
    }
    report.latency.push_back(row);
  }
  return Status::Ok();
}

Status Run(const Settings& s) {
  const auto start = Clock::now();
  Report report;
  report.quick = s.quick;
  report.steps = s.steps;
  report.bounds = s.bounds;
  report.max_batch_bytes = s.max_batch_bytes;

  Endpoints endpoints = StartChildren(s, report);  // before any ZeroMQ context or thread
  if (s.sections.count("memory")) SLUICE_RETURN_IF_ERROR(MeasureMemory(s, endpoints, report));

  std::map<std::string, TransferQueueClient> queues;
  std::unique_ptr<transfer_queue::TransferQueueHub> hub;
  if (s.transports.count("inproc")) {
    SLUICE_ASSIGN_OR_RETURN(hub, transfer_queue::TransferQueueHub::Create(transfer_queue::HubOptions{}));
    queues.emplace("inproc", hub->client());
  }
  for (auto& [t, server] : endpoints.servers) {
    SLUICE_ASSIGN_OR_RETURN(transfer_queue::RemoteQueue queue,
                            transfer_queue::ConnectTransferQueue(server->endpoint(), RemoteFor(t)));
    queues.emplace(t, queue.client());
  }
  for (auto& [t, client] : queues) SLUICE_RETURN_IF_ERROR(SetUpQueue(client).WithContext(t + " setup"));

  if (s.sections.count("roundtrip")) SLUICE_RETURN_IF_ERROR(MeasureRoundTrips(s, endpoints, queues, report));
  if (s.sections.count("metadata")) SLUICE_RETURN_IF_ERROR(MeasureMetadata(s, endpoints, queues, report));
  if (s.sections.count("latency")) SLUICE_RETURN_IF_ERROR(MeasureLatency(s, endpoints, queues, report));

  queues.clear();
  for (auto& [t, server] : endpoints.servers) {
    Status stopped = server->Stop(kChildTimeout);
    if (!stopped.ok()) report.notes.push_back(t + " server: " + stopped.ToString());
  }
  if (endpoints.redis != nullptr) {
    Status stopped = endpoints.redis->Stop(kChildTimeout);
    if (!stopped.ok()) report.notes.push_back("redis-server: " + stopped.ToString());
  }
  report.total_seconds = Seconds(Clock::now() - start);
  PrintReport(report);
  if (!s.json_path.empty()) {
    std::ofstream out(s.json_path);
    out << ReportToJson(report).dump(2) << "\n";
    if (!out) return Status::Unavailable("cannot write " + s.json_path);
  }
  return Status::Ok();
}

}  // namespace
}  // namespace sluice::bench::tq

int main(int argc, char** argv) {
  sluice::runtime::FlagSet flags;
  flags.Add("quick", "false", "a short run (3 repeats, rows up to 256 KiB, 32 MiB memory test): under a minute",
            /*is_bool=*/true);
  flags.Add("repeats", "", "timed repeats per row (default 5, --quick 3)");
  flags.Add("transports", "inproc,tcp,shm,redis,memcpy", "which transports and baselines to run");
  flags.Add("sizes", "", "row sizes, binary units (default 64,4K,256K,16M; --quick 64,4K,256K)");
  flags.Add("batches", "1,256", "rows per round trip");
  flags.Add("sections", "roundtrip,metadata,latency,memory", "which parts to run (e.g. to profile one)");
  flags.Add("get", "take",
            "the queue's get: take (one Take carrying the previous ack) or steps (GetMeta, GetData, Ack)");
  flags.Add("max-batch-mb", "256", "cap on the bytes of one round trip's batch; larger batches are shrunk");
  flags.Add("json", "", "also write the results as JSON to this path");
  std::vector<std::string> args(argv + 1, argv + argc);
  sluice::Status parsed = flags.Parse(args);
  sluice::Result<sluice::bench::tq::Settings> settings =
      parsed.ok() ? sluice::bench::tq::ParseSettings(flags) : sluice::Result<sluice::bench::tq::Settings>(parsed);
  if (!settings.ok() || flags.help_requested()) {
    if (!settings.ok()) std::fprintf(stderr, "%s\n", settings.status().ToString().c_str());
    std::fprintf(stderr, "usage: tq_bench [flags]\n%s", flags.Usage().c_str());
    return settings.ok() ? 0 : 2;
  }
  ::signal(SIGPIPE, SIG_IGN);  // a dead peer is an error return, not a signal
  sluice::runtime::TuneAllocator();
  sluice::Status s = sluice::bench::tq::Run(*settings);
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
