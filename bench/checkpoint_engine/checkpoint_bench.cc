// CheckpointEngine benchmark (docs/benchmarks.md): the time from
// "publish version v" to "every subscriber serves v", for several version
// sizes and subscriber counts, per transport, each next to a baseline
// measured in the same run:
//
//   memcpy  N threads each copy the bytes into a private buffer (baseline)
//   inproc  VersionStore::Publish (reuse_buffers on); N subscriber threads
//           copy the version into their standby buffers
//   shm     ShmPublisher::Publish; N subscriber processes copy it into their
//           standby buffers (CopyTo, which re-checksums the copy); segments
//           recycled (the default)
//   shm-fresh  the same with recycle_segments off: a fresh segment per version
//   tcp     one raw TCP stream of the bytes to each of N receivers, all at
//           once, between network namespaces joined by veth (baseline)
//   gloo    BroadcastPublisher::Publish to N BroadcastSubscribers (each
//           committing into its own VersionStore, reuse_buffers on) between
//           the same namespaces
//   relay   the pipeline's path to rollout replicas on other hosts: host 0's
//           ShmPublisher::Publish, then a ShmBroadcastRelay broadcasts the
//           version from that store to the same subscribers; timed from the
//           store's Publish to every subscriber serving it
//
// Every row is measured `repeats` times after two warm-up rounds (the first
// versions fault in fresh memory; their times are in the JSON); the table
// (printed last) shows the median with min..max, delivered GB/s (bytes x
// subscribers / time) and the ratio of the median time to its baseline's.
// The cross-host rows need root and `ip`; otherwise they are skipped with a
// message. Namespaces are removed on exit, on error and on SIGINT/SIGTERM.
//
//   checkpoint_bench [--sizes=10M,100M,1G] [--subscribers=1,2,4]
//                    [--transports=memcpy,inproc,shm,shm-fresh,tcp,gloo,relay]
//                    [--repeats=3]
//                    [--bucket-mb=4] [--in-flight=2] [--json=results.json]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "bench_cross_host.h"
#include "bench_local.h"
#include "bench_support.h"
#include "sluice/runtime/flags.h"

namespace sluice::bench::ce {
namespace {

// Bytes of memory a measurement needs (all buffers alive at once), as
// multiples of the version size.
double VersionsNeeded(const std::string& transport, int n) {
  if (transport == "memcpy") return 1 + n;
  if (transport == "inproc" || transport == "shm" || transport == "shm-fresh") {
    return 3 + n;  // source, latest + staging (or spare), N standby
  }
  if (transport == "tcp") return 1 + n;
  if (transport == "relay") return 3 + 2.0 * n;  // source, the host store (latest + staging); per subscriber two
  return 1 + 2.0 * n;                            // gloo: source; per subscriber staging + latest
}

Status Run(const runtime::FlagSet& flags) {
  SLUICE_ASSIGN_OR_RETURN(std::string sizes_text, flags.GetString("sizes"));
  SLUICE_ASSIGN_OR_RETURN(std::string subs_text, flags.GetString("subscribers"));
  SLUICE_ASSIGN_OR_RETURN(std::string transports_text, flags.GetString("transports"));
  SLUICE_ASSIGN_OR_RETURN(int64_t repeats, flags.GetInt("repeats", 1, 100));
  SLUICE_ASSIGN_OR_RETURN(int64_t bucket_mb, flags.GetInt("bucket-mb", 1, 1024));
  SLUICE_ASSIGN_OR_RETURN(int64_t in_flight, flags.GetInt("in-flight", 1, 16));
  SLUICE_ASSIGN_OR_RETURN(std::string json_path, flags.GetString("json"));

  std::vector<size_t> sizes;
  {
    std::stringstream in(sizes_text);
    std::string item;
    while (std::getline(in, item, ',')) {
      SLUICE_ASSIGN_OR_RETURN(size_t b, ParseBytes(item));
      sizes.push_back(b);
    }
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<int64_t> subscriber_counts, ParseIntList(subs_text));
  for (int64_t n : subscriber_counts) {
    if (n < 1 || n > 16) return Status::InvalidArgument("--subscribers: 1..16 each");
  }
  std::set<std::string> transports;
  {
    std::stringstream in(transports_text);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (item != "memcpy" && item != "inproc" && item != "shm" && item != "shm-fresh" && item != "tcp" &&
          item != "gloo" && item != "relay") {
        return Status::InvalidArgument("--transports: unknown '" + item +
                                       "' (memcpy, inproc, shm, shm-fresh, tcp, gloo, relay)");
      }
      transports.insert(item);
    }
  }

  // Cross-host needs namespaces: one topology for the largest subscriber count.
  std::unique_ptr<NetTopology> net;
  std::string cross_host_skip;
  if (transports.count("tcp") || transports.count("gloo") || transports.count("relay")) {
    Status can = CheckCanUseNetns();
    if (can.ok()) {
      SweepStaleNamespaces();
      const int hosts = 1 + static_cast<int>(*std::max_element(subscriber_counts.begin(), subscriber_counts.end()));
      Result<std::unique_ptr<NetTopology>> created = NetTopology::Create(hosts);
      if (created.ok()) {
        net = std::move(created).value();
      } else {
        cross_host_skip = created.status().ToString();
      }
    } else {
      cross_host_skip = can.message();
    }
    if (!cross_host_skip.empty()) {
      std::fprintf(stderr, "cross-host rows skipped: %s\n", cross_host_skip.c_str());
    }
  }

  const auto start = Clock::now();
  std::vector<Measurement> rows;
  const std::vector<std::string> order = {"memcpy", "inproc", "shm", "shm-fresh", "tcp", "gloo", "relay"};
  for (size_t bytes : sizes) {
    for (int64_t n : subscriber_counts) {
      RunConfig config;
      config.bytes = bytes;
      config.subscribers = static_cast<int>(n);
      config.repeats = static_cast<int>(repeats);
      for (const std::string& t : order) {
        if (!transports.count(t)) continue;
        Measurement skipped;
        skipped.transport = t;
        skipped.baseline =
            (t == "inproc" || t == "shm" || t == "shm-fresh") ? "memcpy" : (t == "gloo" || t == "relay" ? "tcp" : "");
        skipped.bytes = bytes;
        skipped.subscribers = config.subscribers;
        skipped.skipped = true;
        const double need = VersionsNeeded(t, config.subscribers) * static_cast<double>(bytes) + (512.0 * (1 << 20));
        const size_t available = MemAvailableBytes();
        if ((t == "tcp" || t == "gloo" || t == "relay") && net == nullptr) {
          skipped.note = "no network namespaces: " + cross_host_skip;
          rows.push_back(skipped);
          continue;
        }
        if (static_cast<double>(available) < need) {
          skipped.note = "needs ~" + std::to_string(static_cast<int>(need / 1e9 + 0.5)) + " GB, " +
                         std::to_string(available / 1000000000) + " GB available";
          std::fprintf(stderr, "skip %s %s x%d: %s\n", t.c_str(), HumanBytes(bytes).c_str(), config.subscribers,
                       skipped.note.c_str());
          rows.push_back(skipped);
          continue;
        }
        std::fprintf(stderr, "%-9s %-7s x%d ...", t.c_str(), HumanBytes(bytes).c_str(), config.subscribers);
        const auto t0 = Clock::now();
        Result<Measurement> m = Status::Internal("unreachable");
        if (t == "memcpy") m = MeasureMemcpy(config);
        if (t == "inproc") m = MeasureInProcess(config);
        if (t == "shm") m = MeasureSharedMemory(config, /*recycle_segments=*/true);
        if (t == "shm-fresh") m = MeasureSharedMemory(config, /*recycle_segments=*/false);
        if (t == "tcp") m = MeasureRawTcp(*net, config);
        if (t == "gloo" || t == "relay") {
          BroadcastSettings settings;
          settings.bucket_bytes = static_cast<size_t>(bucket_mb) << 20;
          settings.in_flight = static_cast<uint32_t>(in_flight);
          m = MeasureGlooBroadcast(*net, config, settings, /*relayed=*/t == "relay");
        }
        std::fprintf(stderr, " %.1f s %s\n", Seconds(Clock::now() - t0), m.ok() ? m->note.c_str() : "");
        if (!m.ok()) return m.status().WithContext(t + " " + HumanBytes(bytes) + " x" + std::to_string(n));
        rows.push_back(*m);
      }
    }
  }
  net.reset();  // namespaces go before the report
  const double total_seconds = Seconds(Clock::now() - start);

  // Ratios against the baseline of the same size and subscriber count.
  auto find_baseline = [&](const Measurement& m) -> const Measurement* {
    for (const Measurement& b : rows) {
      if (!b.skipped && b.transport == m.baseline && b.bytes == m.bytes && b.subscribers == m.subscribers) return &b;
    }
    return nullptr;
  };

  nlohmann::json results = nlohmann::json::array();
  std::ostringstream table;
  table << "\nCheckpointEngine: publish -> every subscriber serving; " << std::thread::hardware_concurrency()
        << " CPUs, median of " << repeats << " after 2 warm-up rounds [min..max]; GB/s = bytes x subscribers / time\n";
  char line[256];
  std::snprintf(line, sizeof(line), "%-8s %4s  %-9s %26s %8s  %s\n", "bytes", "subs", "transport", "time ms", "GB/s",
                "vs baseline (time ratio; aims: shm <= 1.5x memcpy, gloo >= 80% of tcp)");
  table << line;
  for (const Measurement& m : rows) {
    nlohmann::json j = {{"transport", m.transport},
                        {"baseline", m.baseline},
                        {"bytes", m.bytes},
                        {"subscribers", m.subscribers},
                        {"skipped", m.skipped}};
    if (m.skipped) {
      j["note"] = m.note;
      results.push_back(j);
      std::snprintf(line, sizeof(line), "%-8s %4d  %-9s %26s %8s  skipped: %s\n", HumanBytes(m.bytes).c_str(),
                    m.subscribers, m.transport.c_str(), "-", "-", m.note.c_str());
      table << line;
      continue;
    }
    const Stats s = Summarize(m.seconds);
    const double gbps = static_cast<double>(m.bytes) * m.subscribers / s.median / 1e9;
    j["seconds"] = m.seconds;
    j["warmup_seconds"] = m.warmup_seconds;
    j["median_seconds"] = s.median;
    j["min_seconds"] = s.min;
    j["max_seconds"] = s.max;
    j["gb_per_s"] = gbps;
    if (!m.publish_seconds.empty()) j["publish_call_median_seconds"] = Summarize(m.publish_seconds).median;
    if (!m.note.empty()) j["note"] = m.note;
    std::string versus = m.baseline.empty() ? "(baseline)" : "";
    if (const Measurement* b = find_baseline(m)) {
      const double ratio = s.median / Summarize(b->seconds).median;
      j["time_ratio_vs_baseline"] = ratio;
      char buf[96];
      std::snprintf(buf, sizeof(buf), "%.2fx %s (%.0f%% of its throughput)", ratio, m.baseline.c_str(), 100 / ratio);
      versus = buf;
    } else if (!m.baseline.empty()) {
      versus = "no " + m.baseline + " baseline";
    }
    char time[64];
    std::snprintf(time, sizeof(time), "%.1f [%.1f..%.1f]", s.median * 1e3, s.min * 1e3, s.max * 1e3);
    std::snprintf(line, sizeof(line), "%-8s %4d  %-9s %26s %8.2f  %s\n", HumanBytes(m.bytes).c_str(), m.subscribers,
                  m.transport.c_str(), time, gbps, versus.c_str());
    table << line;
    results.push_back(j);
  }
  std::snprintf(line, sizeof(line), "(%.0f s in all)\n", total_seconds);
  table << line;
  std::fputs(table.str().c_str(), stdout);

  if (!json_path.empty()) {
    nlohmann::json doc = {{"benchmark", "checkpoint_engine"},
                          {"cpus", std::thread::hardware_concurrency()},
                          {"repeats", repeats},
                          {"bucket_bytes", bucket_mb << 20},
                          {"in_flight", in_flight},
                          {"total_seconds", total_seconds},
                          {"results", results}};
    std::ofstream out(json_path);
    out << doc.dump(2) << "\n";
    if (!out) return Status::Unavailable("cannot write " + json_path);
  }
  return Status::Ok();
}

// Children: --role=<name> with --key=value arguments.
int RunRole(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.find('=') == std::string::npos) continue;
    args[a.substr(2, a.find('=') - 2)] = a.substr(a.find('=') + 1);
  }
  const std::string role = args["role"];
  try {
    if (role == "shm-sub") return ShmSubscriberMain(args);
    if (role == "bc-pub") return BroadcastPublisherMain(args);
    if (role == "bc-relay") return RelayPublisherMain(args);
    if (role == "bc-sub") return BroadcastSubscriberMain(args);
    if (role == "tcp-send") return TcpSenderMain(args);
    if (role == "tcp-recv") return TcpReceiverMain(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "role %s: %s\n", role.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown role '%s'\n", role.c_str());
  return 2;
}

}  // namespace
}  // namespace sluice::bench::ce

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind("--role=", 0) == 0) return sluice::bench::ce::RunRole(argc, argv);
  }
  sluice::runtime::FlagSet flags;
  flags.Add("sizes", "10M,100M,1G", "version sizes (decimal units: K, M, G); 1G only runs if memory allows");
  flags.Add("subscribers", "1,2,4", "subscriber counts");
  flags.Add("transports", "memcpy,inproc,shm,tcp,gloo",
            "which rows to measure (also shm-fresh: shm with recycle_segments off; relay: the pipeline's path to "
            "rollout replicas on other hosts)");
  flags.Add("repeats", "3", "measured rounds per row (after two warm-up rounds, reported apart in the JSON)");
  flags.Add("bucket-mb", "4", "broadcast bucket size in MiB");
  flags.Add("in-flight", "2", "broadcast buckets in flight");
  flags.Add("json", "", "also write the results as JSON to this path");
  std::vector<std::string> args(argv + 1, argv + argc);
  sluice::Status parsed = flags.Parse(args);
  if (!parsed.ok() || flags.help_requested()) {
    if (!parsed.ok()) std::fprintf(stderr, "%s\n", parsed.ToString().c_str());
    std::fprintf(stderr, "usage: checkpoint_bench [flags]\n%s", flags.Usage().c_str());
    return parsed.ok() ? 0 : 2;
  }
  sluice::bench::ce::CleanupRegistry::InstallSignalCleanup();
  sluice::Status s = sluice::bench::ce::Run(flags);
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
