// The TransferQueue's ceiling at tiny batches and high rates: rows/s and
// latency percentiles of a work queue (producers put batches of stamped
// rows; consumers take them and ack them, the ack riding on the next take)
// for each row size, batch size and number of clients (P producers and P
// consumers, threads of this process, each with its own connection), against
// Redis Streams with a consumer group (XADD / XREADGROUP / XACK + XDEL) and
// the memcpy limit, all in one run. The queue servers run in child processes
// (tcp: direct TCP connections; shm: shared-memory rings and arena), as in
// a deployment. Every system gets the same bound on rows in flight, so no
// producer runs away from its consumers. docs/benchmarks.md shows the curves.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "sluice/runtime/flags.h"
#include "sluice/runtime/process.h"
#include "sluice/transfer_queue/remote.h"
#include "sluice/transfer_queue/server.h"
#include "tq_measure.h"
#include "tq_redis.h"
#include "tq_support.h"

namespace sluice::bench::tq {
namespace {

using transfer_queue::RemoteOptions;
using transfer_queue::ServerOptions;

const std::vector<std::string> kSystems = {"memcpy", "redis", "tcp", "shm"};
constexpr std::chrono::milliseconds kChildTimeout{10000};
constexpr uint64_t kCapacityBytes = uint64_t{256} << 20;

struct Settings {
  std::set<std::string> systems;
  std::vector<uint64_t> sizes;
  std::vector<uint32_t> batches;
  std::vector<int> clients;
  double seconds = 0.5;
  std::string json_path;
  std::string svg_path;
};

struct Cell {
  std::string system;
  uint64_t row_bytes = 0;
  uint32_t batch = 0;
  int clients = 0;
  uint64_t rows = 0;  // consumed
  double seconds = 0;
  double rows_per_second = 0;
  double put_p50 = 0, put_p99 = 0, take_p50 = 0, take_p99 = 0;  // seconds
  bool skipped = false;
  std::string note;
};

// What a cell's threads share.
struct Shared {
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> in_flight{0};  // put, not yet taken
  std::atomic<uint64_t> consumed{0};
  int64_t max_in_flight = 0;
};

// Rows in flight at most: enough to keep every consumer busy, bounded in bytes.
int64_t InFlightBound(uint64_t row_bytes, uint32_t batch, int clients) {
  const int64_t rows = std::max<int64_t>(4LL * batch * clients, 1024);
  const int64_t by_bytes = static_cast<int64_t>((uint64_t{64} << 20) / row_bytes);
  return std::max<int64_t>(std::min(rows, by_bytes), 2LL * batch * clients);
}

// One producer thread: puts batches until stop; per-put latencies.
Status ProduceLoop(QueueProducer& producer, Shared& shared, uint64_t row_bytes, uint32_t batch, uint64_t stamp_base,
                   std::vector<double>* latencies) {
  std::shared_ptr<std::byte[]> rows = AllocateTouched(row_bytes * batch);
  while (!shared.go.load()) std::this_thread::yield();
  for (uint64_t seq = 0; !shared.stop.load(); ++seq) {
    while (shared.in_flight.load() + batch > shared.max_in_flight && !shared.stop.load()) std::this_thread::yield();
    if (shared.stop.load()) break;
    for (uint32_t i = 0; i < batch; ++i) StampRow(rows.get() + i * row_bytes, row_bytes, stamp_base + seq * batch + i);
    shared.in_flight.fetch_add(batch);
    const auto t0 = Clock::now();
    SLUICE_RETURN_IF_ERROR(producer.Put(rows.get(), row_bytes, batch));
    latencies->push_back(Seconds(Clock::now() - t0));
  }
  return Status::Ok();
}

// One consumer thread: takes until stop; per-take latencies (takes that got rows).
Status ConsumeLoop(QueueConsumer& consumer, Shared& shared, uint64_t row_bytes, uint32_t batch,
                   std::vector<double>* latencies) {
  while (!shared.go.load()) std::this_thread::yield();
  while (!shared.stop.load()) {
    const auto t0 = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(uint32_t n, consumer.Take(batch, row_bytes));
    if (n == 0) continue;
    latencies->push_back(Seconds(Clock::now() - t0));
    shared.in_flight.fetch_sub(n);
    shared.consumed.fetch_add(n);
  }
  return consumer.Finish();
}

// P producers and P consumers made by the factories, run for `seconds`.
Status RunWorkQueue(const std::function<Result<std::unique_ptr<QueueProducer>>()>& new_producer,
                    const std::function<Result<std::unique_ptr<QueueConsumer>>(int)>& new_consumer, const Settings& s,
                    Cell* cell) {
  Shared shared;
  shared.max_in_flight = InFlightBound(cell->row_bytes, cell->batch, cell->clients);
  std::vector<std::unique_ptr<QueueProducer>> producers;
  std::vector<std::unique_ptr<QueueConsumer>> consumers;
  for (int i = 0; i < cell->clients; ++i) {
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<QueueProducer> p, new_producer());
    producers.push_back(std::move(p));
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<QueueConsumer> c, new_consumer(i));
    consumers.push_back(std::move(c));
  }
  std::vector<std::vector<double>> put_latency(cell->clients), take_latency(cell->clients);
  std::vector<Status> results(2 * cell->clients, Status::Ok());
  std::vector<std::thread> threads;
  for (int i = 0; i < cell->clients; ++i) {
    threads.emplace_back([&, i] {
      results[2 * i] = ProduceLoop(*producers[i], shared, cell->row_bytes, cell->batch,
                                   (static_cast<uint64_t>(i) + 1) << 40, &put_latency[i]);
      if (!results[2 * i].ok()) shared.stop.store(true);
    });
    threads.emplace_back([&, i] {
      results[2 * i + 1] = ConsumeLoop(*consumers[i], shared, cell->row_bytes, cell->batch, &take_latency[i]);
      if (!results[2 * i + 1].ok()) shared.stop.store(true);
    });
  }
  const auto start = Clock::now();
  shared.go.store(true);
  while (Seconds(Clock::now() - start) < s.seconds && !shared.stop.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const uint64_t consumed = shared.consumed.load();
  cell->seconds = Seconds(Clock::now() - start);
  shared.stop.store(true);
  for (auto& t : threads) t.join();
  for (const Status& r : results) SLUICE_RETURN_IF_ERROR(r);
  std::vector<double> puts, takes;
  for (auto& v : put_latency) puts.insert(puts.end(), v.begin(), v.end());
  for (auto& v : take_latency) takes.insert(takes.end(), v.begin(), v.end());
  cell->rows = consumed;
  cell->rows_per_second = consumed / cell->seconds;
  cell->put_p50 = Quantile(puts, 0.5);
  cell->put_p99 = Quantile(puts, 0.99);
  cell->take_p50 = Quantile(takes, 0.5);
  cell->take_p99 = Quantile(takes, 0.99);
  return Status::Ok();
}

// The memcpy limit: each client copies a batch into a buffer and out again.
void RunMemcpy(const Settings& s, Cell* cell) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rows{0};
  std::vector<std::vector<double>> lat(cell->clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < cell->clients; ++i) {
    threads.emplace_back([&, i] {
      const size_t bytes = cell->row_bytes * cell->batch;
      std::shared_ptr<std::byte[]> src = AllocateTouched(bytes), mid = AllocateTouched(bytes),
                                   dst = AllocateTouched(bytes);
      while (!stop.load()) {
        const auto t0 = Clock::now();
        std::memcpy(mid.get(), src.get(), bytes);
        std::memcpy(dst.get(), mid.get(), bytes);
        lat[i].push_back(Seconds(Clock::now() - t0));
        rows.fetch_add(cell->batch);
      }
    });
  }
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(s.seconds));
  const uint64_t done = rows.load();
  cell->seconds = Seconds(Clock::now() - start);
  stop.store(true);
  for (auto& t : threads) t.join();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  cell->rows = done;
  cell->rows_per_second = done / cell->seconds;
  cell->put_p50 = cell->take_p50 = Quantile(all, 0.5) / 2;
  cell->put_p99 = cell->take_p99 = Quantile(all, 0.99) / 2;
}

// An SVG chart: one panel per row size, rows/s (log) over batch (log), a
// line per system and client count (solid: the fewest clients, then ever
// shorter dashes), the legend wrapped under the panels.
std::string CeilingSvg(const std::vector<Cell>& cells, const Settings& s) {
  const double panel_w = 420, panel_h = 300, left = 70, top = 40, plot_w = 320, plot_h = 210;
  double y_min = 1e12, y_max = 1;
  for (const Cell& c : cells) {
    if (c.skipped || c.rows_per_second <= 0) continue;
    y_min = std::min(y_min, c.rows_per_second);
    y_max = std::max(y_max, c.rows_per_second);
  }
  const double lo = std::floor(std::log10(std::max(y_min, 1.0))), hi = std::ceil(std::log10(std::max(y_max, 10.0)));
  const double b_lo = std::log2(*std::min_element(s.batches.begin(), s.batches.end()));
  const double b_hi = std::max(b_lo + 1, std::log2(*std::max_element(s.batches.begin(), s.batches.end())));
  const std::map<std::string, std::string> color = {
      {"memcpy", "#888888"}, {"redis", "#d62728"}, {"tcp", "#1f77b4"}, {"shm", "#2ca02c"}};
  std::vector<int> counts = s.clients;
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  auto dash_for = [&](int clients) -> std::string {
    static constexpr const char* kDashes[] = {"8,3", "4,3", "2,2", "8,2,2,2"};
    const size_t rank = std::find(counts.begin(), counts.end(), clients) - counts.begin();
    if (rank == 0) return "";
    return std::string(" stroke-dasharray=\"") + kDashes[std::min<size_t>(rank - 1, 3)] + "\"";
  };
  const double legend_w = 105;
  const size_t per_row = std::max<size_t>(1, static_cast<size_t>(panel_w * s.sizes.size() / legend_w));
  const size_t legend_rows = (kSystems.size() * counts.size() + per_row - 1) / per_row;
  std::string svg;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" "
                "fill=\"white\"/>\n",
                panel_w * s.sizes.size(), panel_h + 22 + 18.0 * legend_rows);
  svg += buf;
  for (size_t p = 0; p < s.sizes.size(); ++p) {
    const double x0 = p * panel_w + left;
    auto X = [&](uint32_t batch) { return x0 + plot_w * (std::log2(batch) - b_lo) / (b_hi - b_lo); };
    auto Y = [&](double rate) { return top + plot_h * (1 - (std::log10(rate) - lo) / (hi - lo)); };
    std::snprintf(buf, sizeof(buf), "<text x=\"%.0f\" y=\"20\" font-size=\"13\">rows/s, %s rows</text>\n", x0,
                  HumanBytes(s.sizes[p]).c_str());
    svg += buf;
    std::snprintf(buf, sizeof(buf),
                  "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#ccc\"/>\n", x0,
                  top, plot_w, plot_h);
    svg += buf;
    for (double e = lo; e <= hi; ++e) {
      std::snprintf(buf, sizeof(buf),
                    "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/><text x=\"%.0f\" "
                    "y=\"%.1f\" text-anchor=\"end\">1e%.0f</text>\n",
                    x0, x0 + plot_w, Y(std::pow(10, e)), Y(std::pow(10, e)), x0 - 4, Y(std::pow(10, e)) + 4, e);
      svg += buf;
    }
    for (uint32_t b : s.batches) {
      std::snprintf(buf, sizeof(buf), "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%u</text>\n", X(b),
                    top + plot_h + 14, b);
      svg += buf;
    }
    std::snprintf(buf, sizeof(buf), "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">rows per batch</text>\n",
                  x0 + plot_w / 2, top + plot_h + 30);
    svg += buf;
    size_t legend = 0;
    for (const std::string& system : kSystems) {
      for (int clients : s.clients) {
        std::string points;
        for (const Cell& c : cells) {
          if (c.skipped || c.system != system || c.clients != clients || c.row_bytes != s.sizes[p] ||
              c.rows_per_second <= 0) {
            continue;
          }
          std::snprintf(buf, sizeof(buf), "%.1f,%.1f ", X(c.batch), Y(c.rows_per_second));
          points += buf;
        }
        if (points.empty()) continue;
        const std::string dash = dash_for(clients);
        std::snprintf(buf, sizeof(buf), "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                      points.c_str(), color.at(system).c_str(), dash.c_str());
        svg += buf;
        if (p == 0) {
          const double ly = top + plot_h + 48 + 18.0 * (legend / per_row);
          const double lx = 10 + legend_w * (legend % per_row);
          std::snprintf(buf, sizeof(buf),
                        "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"%s/>"
                        "<text x=\"%.0f\" y=\"%.0f\">%s %d+%d</text>\n",
                        lx, lx + 20, ly, ly, color.at(system).c_str(), dash.c_str(), lx + 24, ly + 4, system.c_str(),
                        clients, clients);
          svg += buf;
        }
        ++legend;
      }
    }
  }
  return svg + "</svg>\n";
}

std::string CellKey(const Cell& c) {
  return std::to_string(c.row_bytes) + "-" + std::to_string(c.batch) + "-" + std::to_string(c.clients);
}

Status Run(const Settings& s) {
  const auto started = Clock::now();
  std::map<std::string, std::unique_ptr<ServerChild>> servers;
  std::vector<std::string> notes;
  for (const char* t : {"tcp", "shm"}) {
    if (!s.systems.count(t)) continue;
    ServerOptions o;
    o.controller.capacity_bytes = kCapacityBytes;
    if (std::string(t) == "shm") o.shm_bytes = 2 * kCapacityBytes + (uint64_t{64} << 20);
    Result<std::unique_ptr<ServerChild>> child = ServerChild::Fork(o, kChildTimeout);
    if (!child.ok()) {
      notes.push_back(std::string(t) + " skipped: " + child.status().ToString());
      continue;
    }
    servers[t] = std::move(*child);
  }
  std::unique_ptr<RedisChild> redis;
  if (s.systems.count("redis")) {
    Result<std::unique_ptr<RedisChild>> started_redis =
        RedisClientBuilt() ? RedisChild::Start(kChildTimeout)
                           : Result<std::unique_ptr<RedisChild>>(Status::Unimplemented("built without hiredis"));
    if (started_redis.ok()) {
      redis = std::move(*started_redis);
    } else {
      notes.push_back("redis skipped: " + started_redis.status().ToString());
    }
  }
  std::map<std::string, RemoteOptions> remote;
  remote["tcp"].shm = transfer_queue::ShmMode::kOff;
  remote["shm"].shm = transfer_queue::ShmMode::kRequired;
  for (auto& [t, server] : servers) {
    SLUICE_ASSIGN_OR_RETURN(transfer_queue::RemoteQueue q,
                            transfer_queue::ConnectTransferQueue(server->endpoint(), remote[t]));
    transfer_queue::TransferQueueClient client = q.client();
    SLUICE_RETURN_IF_ERROR(SetUpQueue(client));
  }

  std::vector<Cell> cells;
  int cell_index = 0;
  for (uint64_t size : s.sizes) {
    for (uint32_t batch : s.batches) {
      for (int clients : s.clients) {
        for (const std::string& system : kSystems) {
          if (!s.systems.count(system)) continue;
          Cell cell;
          cell.system = system;
          cell.row_bytes = size;
          cell.batch = batch;
          cell.clients = clients;
          std::fprintf(stderr, "%-7s %s x%u, %d+%d clients\n", system.c_str(), HumanBytes(size).c_str(), batch, clients,
                       clients);
          const std::string name = "ceiling-" + std::to_string(cell_index++);
          Status ran = Status::Ok();
          if (system == "memcpy") {
            RunMemcpy(s, &cell);
          } else if (system == "redis") {
            if (!redis) {
              cell.skipped = true;
              cell.note = "no redis";
            } else {
              const int port = redis->port();
              SLUICE_RETURN_IF_ERROR(CreateRedisStream(port, name, "g"));
              ran = RunWorkQueue(
                  [&] { return NewRedisStreamProducer(port, name); },
                  [&](int i) { return NewRedisStreamConsumer(port, name, "g", "c" + std::to_string(i)); }, s, &cell);
              SLUICE_RETURN_IF_ERROR(DropRedisStream(port, name));
            }
          } else if (!servers.count(system)) {
            cell.skipped = true;
            cell.note = "no server";
          } else {
            const std::string endpoint = servers[system]->endpoint();
            const RemoteOptions options = remote[system];
            SLUICE_ASSIGN_OR_RETURN(transfer_queue::RemoteQueue setup,
                                    transfer_queue::ConnectTransferQueue(endpoint, options));
            SLUICE_RETURN_IF_ERROR(setup.client().CreatePartition(name));
            // Each producer and consumer has a connection of its own, as separate processes would.
            auto connect = [&]() -> Result<transfer_queue::TransferQueueClient> {
              SLUICE_ASSIGN_OR_RETURN(transfer_queue::RemoteQueue q,
                                      transfer_queue::ConnectTransferQueue(endpoint, options));
              return q.client();
            };
            ran = RunWorkQueue(
                [&]() -> Result<std::unique_ptr<QueueProducer>> {
                  SLUICE_ASSIGN_OR_RETURN(transfer_queue::TransferQueueClient c, connect());
                  return NewQueueProducer(std::move(c), name);
                },
                [&](int) -> Result<std::unique_ptr<QueueConsumer>> {
                  SLUICE_ASSIGN_OR_RETURN(transfer_queue::TransferQueueClient c, connect());
                  return NewQueueConsumer(std::move(c), name);
                },
                s, &cell);
            SLUICE_RETURN_IF_ERROR(setup.client().ClearPartition(name).status());
          }
          if (!ran.ok()) return ran.WithContext(system + " " + HumanBytes(size) + " x" + std::to_string(batch));
          cells.push_back(cell);
        }
      }
    }
  }
  for (auto& [t, server] : servers) {
    if (Status stopped = server->Stop(kChildTimeout); !stopped.ok()) notes.push_back(t + ": " + stopped.ToString());
  }
  if (redis) (void)redis->Stop(kChildTimeout);

  // ---- report
  std::printf(
      "\nTransferQueue ceiling (docs/benchmarks.md): %u CPUs; P producers + P consumers, threads of this process "
      "with a\nconnection each; servers in child processes (tcp: direct TCP connections, shm: rings + arena); "
      "%.2f s per cell;\nrows in flight bounded alike for every system. Queue: PutRows / Take carrying the previous "
      "ack. Redis Streams:\npipelined XADD / XACK + XDEL pipelined with XREADGROUP. memcpy: copy in and out, no "
      "queue (the limit).\n",
      std::thread::hardware_concurrency(), s.seconds);
  for (const std::string& n : notes) std::printf("note: %s\n", n.c_str());
  std::map<std::string, double> redis_rate;
  for (const Cell& c : cells) {
    if (c.system == "redis" && !c.skipped) redis_rate[CellKey(c)] = c.rows_per_second;
  }
  std::printf("%-7s %5s %7s  %-7s %12s %9s %20s %20s\n", "row", "batch", "clients", "system", "rows/s", "vs redis",
              "put p50/p99 us", "take p50/p99 us");
  for (const Cell& c : cells) {
    if (c.skipped) {
      std::printf("%-7s %5u %7d  %-7s skipped: %s\n", HumanBytes(c.row_bytes).c_str(), c.batch, c.clients,
                  c.system.c_str(), c.note.c_str());
      continue;
    }
    char vs[16] = "-";
    if (c.system == "redis") {
      std::snprintf(vs, sizeof(vs), "baseline");
    } else if (redis_rate.count(CellKey(c)) && redis_rate[CellKey(c)] > 0) {
      std::snprintf(vs, sizeof(vs), "%.2fx", c.rows_per_second / redis_rate[CellKey(c)]);
    }
    char put[32], take[32];
    std::snprintf(put, sizeof(put), "%.1f / %.1f", 1e6 * c.put_p50, 1e6 * c.put_p99);
    std::snprintf(take, sizeof(take), "%.1f / %.1f", 1e6 * c.take_p50, 1e6 * c.take_p99);
    std::printf("%-7s %5u %7d  %-7s %12.0f %9s %20s %20s\n", HumanBytes(c.row_bytes).c_str(), c.batch, c.clients,
                c.system.c_str(), c.rows_per_second, vs, put, take);
  }
  std::printf("\nCeiling (highest rows/s of any cell) per system and row size:\n");
  for (uint64_t size : s.sizes) {
    std::printf("  %-7s", HumanBytes(size).c_str());
    for (const std::string& system : kSystems) {
      const Cell* best = nullptr;
      for (const Cell& c : cells) {
        if (!c.skipped && c.system == system && c.row_bytes == size &&
            (best == nullptr || c.rows_per_second > best->rows_per_second)) {
          best = &c;
        }
      }
      if (best != nullptr) {
        std::printf("  %s %.0fk (x%u, %d+%d)", system.c_str(), best->rows_per_second / 1e3, best->batch, best->clients,
                    best->clients);
      }
    }
    std::printf("\n");
  }
  std::printf("(%.0f s in all)\n", Seconds(Clock::now() - started));

  if (!s.json_path.empty()) {
    nlohmann::json out = nlohmann::json::array();
    for (const Cell& c : cells) {
      out.push_back({{"system", c.system},
                     {"row_bytes", c.row_bytes},
                     {"batch", c.batch},
                     {"clients", c.clients},
                     {"skipped", c.skipped},
                     {"rows", c.rows},
                     {"seconds", c.seconds},
                     {"rows_per_second", c.rows_per_second},
                     {"put_p50_seconds", c.put_p50},
                     {"put_p99_seconds", c.put_p99},
                     {"take_p50_seconds", c.take_p50},
                     {"take_p99_seconds", c.take_p99}});
    }
    std::ofstream f(s.json_path);
    f << out.dump(2) << "\n";
    if (!f) return Status::Unavailable("cannot write " + s.json_path);
  }
  if (!s.svg_path.empty()) {
    std::ofstream f(s.svg_path);
    f << CeilingSvg(cells, s);
    if (!f) return Status::Unavailable("cannot write " + s.svg_path);
  }
  return Status::Ok();
}

}  // namespace
}  // namespace sluice::bench::tq

namespace {

sluice::Result<sluice::bench::tq::Settings> ParseSettings(const sluice::runtime::FlagSet& flags) {
  using sluice::Status;
  using namespace sluice::bench::tq;
  Settings s;
  if (!flags.positional().empty()) {
    return Status::InvalidArgument("unexpected argument '" + flags.positional().front() + "'");
  }
  SLUICE_ASSIGN_OR_RETURN(std::string systems, flags.GetString("systems"));
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> names, SplitList(systems));
  for (const std::string& n : names) {
    if (std::find(kSystems.begin(), kSystems.end(), n) == kSystems.end()) {
      return Status::InvalidArgument("--systems: unknown '" + n + "' (shm, tcp, redis, memcpy)");
    }
    s.systems.insert(n);
  }
  SLUICE_ASSIGN_OR_RETURN(std::string sizes, flags.GetString("sizes"));
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> size_items, SplitList(sizes));
  for (const std::string& item : size_items) {
    sluice::Result<uint64_t> b = ParseBytes(item);
    if (!b.ok()) return b.status().WithContext("--sizes");
    if (*b < kMinRowBytes || *b > (uint64_t{1} << 20)) {
      return Status::InvalidArgument("--sizes: '" + item + "' is outside 8 B..1 MiB");
    }
    s.sizes.push_back(*b);
  }
  auto counts = [&](const char* flag, int64_t max, auto* out) -> Status {
    SLUICE_ASSIGN_OR_RETURN(std::string text, flags.GetString(flag));
    SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> items, SplitList(text));
    for (const std::string& item : items) {
      const bool digits =
          !item.empty() && item.size() <= 6 && item.find_first_not_of("0123456789") == std::string::npos;
      const int64_t n = digits ? std::stoll(item) : 0;
      if (n < 1 || n > max) {
        return Status::InvalidArgument(std::string("--") + flag + ": '" + item + "' is not a count in 1.." +
                                       std::to_string(max));
      }
      out->push_back(static_cast<typename std::remove_pointer_t<decltype(out)>::value_type>(n));
    }
    return Status::Ok();
  };
  SLUICE_RETURN_IF_ERROR(counts("batches", 4096, &s.batches));
  SLUICE_RETURN_IF_ERROR(counts("clients", 16, &s.clients));
  SLUICE_ASSIGN_OR_RETURN(std::string seconds, flags.GetString("seconds"));
  char* end = nullptr;
  s.seconds = std::strtod(seconds.c_str(), &end);
  if (end == seconds.c_str() || *end != '\0' || !(s.seconds >= 0.05 && s.seconds <= 60)) {
    return Status::InvalidArgument("--seconds: '" + seconds + "' is not a number in 0.05..60");
  }
  SLUICE_ASSIGN_OR_RETURN(s.json_path, flags.GetString("json"));
  SLUICE_ASSIGN_OR_RETURN(s.svg_path, flags.GetString("svg"));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::runtime::FlagSet flags;
  flags.Add("systems", "shm,tcp,redis,memcpy", "queue transports and baselines to run");
  flags.Add("sizes", "8,4K", "row sizes, binary units (8 B..1 MiB)");
  flags.Add("batches", "1,4,16,64,256", "rows per put and per take");
  flags.Add("clients", "1,4,8", "producers (and as many consumers) per cell");
  flags.Add("seconds", "0.5", "how long each cell runs");
  flags.Add("json", "", "also write every cell as JSON to this path");
  flags.Add("svg", "", "also draw the curves as an SVG chart to this path");
  std::vector<std::string> args(argv + 1, argv + argc);
  sluice::Status parsed = flags.Parse(args);
  sluice::Result<sluice::bench::tq::Settings> settings =
      parsed.ok() ? ParseSettings(flags) : sluice::Result<sluice::bench::tq::Settings>(parsed);
  if (!settings.ok() || flags.help_requested()) {
    if (!settings.ok()) std::fprintf(stderr, "%s\n", settings.status().ToString().c_str());
    std::fprintf(stderr, "usage: tq_ceiling [flags]\n%s", flags.Usage().c_str());
    return settings.ok() ? 0 : 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  sluice::runtime::TuneAllocator();
  sluice::Status s = sluice::bench::tq::Run(*settings);
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
