// Many producers and consumers on one hub, bounded in rows and time: every
// row is delivered to every task exactly once (counted by successful acks),
// groups are never split, dead consumers' leases expire and their rows are
// redelivered, and memory never exceeds capacity.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "sluice/common/random.h"
#include "test_util.h"

namespace sluice::transfer_queue {
namespace {

using std::chrono::milliseconds;
using testing::I64;
using testing::ToI64;
using Clock = std::chrono::steady_clock;

constexpr int kProducers = 4;
constexpr int kConsumersPerTask = 2;
constexpr int kGroupSize = 4;
constexpr int kGroups = 240;  // 960 rows
constexpr int kRows = kGroups * kGroupSize;
constexpr uint64_t kCapacityRows = 96;
constexpr uint64_t kCapacityBytes = 16 << 10;
constexpr auto kLeaseTimeout = milliseconds(150);
constexpr auto kTimeCap = std::chrono::seconds(60);

struct Tally {
  std::mutex mu;
  std::unordered_map<RowId, int> acked[2];  // by task index
  int done[2] = {0, 0};
  std::vector<std::string> errors;

  void Error(std::string e) {
    std::lock_guard<std::mutex> lock(mu);
    if (errors.size() < 20) errors.push_back(std::move(e));
  }
};

// Row k of group g: prompt {g, k}; response of 1 + (g*7 + k) % 32 tokens, all
// equal to g * 1000 + k; tags: group g, version g / 40, token_length = response length.
int64_t ResponseLength(int64_t g, int64_t k) { return 1 + (g * 7 + k) % 32; }

std::string CheckResponse(const RowMeta& row, const HostTensor& response) {
  const GroupId g = row.tags.group_id;
  const std::vector<int64_t> r = ToI64(response);
  if (r.empty()) return "row " + std::to_string(row.id) + ": empty response";
  const int64_t k = r[0] - g * 1000;
  if (k < 0 || k >= kGroupSize) return "row " + std::to_string(row.id) + ": response of another group";
  if (int64_t(r.size()) != ResponseLength(g, k) || row.tags.token_length != int64_t(r.size())) {
    return "row " + std::to_string(row.id) + ": response length mismatch";
  }
  for (int64_t v : r) {
    if (v != g * 1000 + k) return "row " + std::to_string(row.id) + ": response of another row";
  }
  return "";
}

std::string CheckRow(const RowMeta& row, const HostTensor& prompt, const HostTensor& response) {
  const std::vector<int64_t> p = ToI64(prompt);
  if (p.size() != 2 || p[0] != row.tags.group_id) return "row " + std::to_string(row.id) + ": prompt of another group";
  const std::vector<int64_t> r = ToI64(response);
  if (r.empty() || r[0] != p[0] * 1000 + p[1]) return "row " + std::to_string(row.id) + ": prompt and response differ";
  return CheckResponse(row, response);
}

TEST(TransferQueueStressTest, ExactlyOnceWholeGroupsUnderBackpressureAndDeadConsumers) {
  HubOptions options = testing::DefaultHubOptions();
  options.controller.capacity_rows = kCapacityRows;
  options.controller.capacity_bytes = kCapacityBytes;
  options.controller.default_lease_timeout = kLeaseTimeout;
  auto hub = testing::MakeHub(options);
  TransferQueueClient client = hub->client();
  TQ_ASSERT_OK(client.CreatePartition("stress", kGroupSize));
  const std::vector<std::string> tasks = {"reward", "train"};
  const auto deadline = Clock::now() + kTimeCap;
  Tally tally;
  std::atomic<bool> stop{false};
  std::atomic<int> abandoned{0}, late_acks{0}, blocked_puts{0};

  std::vector<std::thread> threads;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      for (int64_t g = p; g < kGroups && !stop; g += kProducers) {
        std::vector<RowTags> tags(kGroupSize);
        ColumnBatch batch;
        for (int64_t k = 0; k < kGroupSize; ++k) {
          tags[k] = testing::Tags(g, g / 40, ResponseLength(g, k));
          batch["prompt"].push_back(I64({g, k}));
          batch["response"].push_back(I64(std::vector<int64_t>(ResponseLength(g, k), g * 1000 + k)));
        }
        while (!stop) {
          auto rows = client.PutRows("stress", tags, batch, {true, milliseconds(100)});
          if (rows.ok()) break;
          if (rows.status().code() != StatusCode::kTimeout) {
            tally.Error("put: " + rows.status().ToString());
            return;
          }
          ++blocked_puts;
        }
      }
    });
  }

  for (int t = 0; t < 2; ++t) {
    for (int c = 0; c < kConsumersPerTask; ++c) {
      threads.emplace_back([&, t, c] {
        GetMetaRequest request;
        request.task = tasks[t];
        request.partition = "stress";
        request.timeout = milliseconds(50);
        if (t == 0) {
          request.columns = {"response"};
          request.n = 6;  // 960 is a multiple of 6: the tail is always servable
        } else {
          request.columns = {"prompt", "response"};
          request.n = 2 * kGroupSize;
          request.policy.mode = SamplingMode::kWholeGroup;
          request.policy.dp_ranks = 2;
        }
        for (uint64_t iter = 0; !stop; ++iter) {
          {
            std::lock_guard<std::mutex> lock(tally.mu);
            if (tally.done[t] == kRows) return;
          }
          auto meta = client.GetMeta(request);
          if (!meta.ok()) {
            if (meta.status().code() != StatusCode::kTimeout) tally.Error("get_meta: " + meta.status().ToString());
            continue;
          }
          const uint64_t dice = SplitMix64(HashCombine(t * 10 + c, iter));
          // Consumer 0 of each task "dies" on its first lease; everyone
          // abandons about one lease in 16.
          if ((c == 0 && iter == 0) || dice % 16 == 0) {
            ++abandoned;
            continue;
          }
          auto data = client.GetData(*meta);
          if (!data.ok()) {
            tally.Error("get_data: " + data.status().ToString());
            continue;
          }
          for (size_t i = 0; i < meta->rows.size(); ++i) {
            const RowMeta& row = meta->rows[i];
            const std::string err = t == 1 ? CheckRow(row, data->columns["prompt"][i], data->columns["response"][i])
                                           : CheckResponse(row, data->columns["response"][i]);
            if (!err.empty()) tally.Error(err);
          }
          if (t == 1) {
            // Whole groups, consecutive, each on one rank.
            for (size_t i = 0; i < meta->rows.size(); i += kGroupSize) {
              for (size_t k = 0; k < kGroupSize; ++k) {
                if (meta->rows[i + k].tags.group_id != meta->rows[i].tags.group_id ||
                    meta->rank[i + k] != meta->rank[i]) {
                  tally.Error("split group " + std::to_string(meta->rows[i].tags.group_id));
                }
              }
            }
          }
          if (dice % 16 == 1) {
            // A slow consumer: its lease expires before it acks.
            std::this_thread::sleep_for(kLeaseTimeout + milliseconds(20));
            auto late = client.Ack(meta->lease_id);
            if (late.ok()) {
              tally.Error("a late ack succeeded");
            } else if (late.status().code() != StatusCode::kFailedPrecondition ||
                       late.status().message().find("expired at") == std::string::npos) {
              tally.Error("late ack: " + late.status().ToString());
            }
            ++late_acks;
            continue;
          }
          auto acked = client.Ack(meta->lease_id);
          if (!acked.ok()) {
            // Only an expiry (a consumer slower than the lease under a
            // sanitizer) may refuse an ack; the rows come back.
            if (acked.status().code() != StatusCode::kFailedPrecondition) {
              tally.Error("ack: " + acked.status().ToString());
            }
            continue;
          }
          std::lock_guard<std::mutex> lock(tally.mu);
          for (const RowMeta& row : meta->rows) ++tally.acked[t][row.id];
          tally.done[t] += int(meta->rows.size());
        }
      });
    }
  }

  // Monitor: capacity holds at every sample.
  uint64_t max_rows = 0, max_bytes = 0;
  int samples = 0;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(tally.mu);
      if ((tally.done[0] == kRows && tally.done[1] == kRows) || !tally.errors.empty()) break;
    }
    if (Clock::now() > deadline) break;
    auto stats = client.Stats();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_LE(stats->controller.rows, kCapacityRows);
    EXPECT_LE(stats->controller.bytes_held, kCapacityBytes);
    EXPECT_LE(hub->meter().bytes.load(), kCapacityBytes);
    max_rows = std::max(max_rows, stats->controller.rows);
    max_bytes = std::max(max_bytes, stats->controller.bytes_held);
    ++samples;
    std::this_thread::sleep_for(milliseconds(2));
  }
  stop = true;
  for (auto& t : threads) t.join();

  for (const std::string& e : tally.errors) ADD_FAILURE() << e;
  ASSERT_TRUE(tally.errors.empty());
  ASSERT_EQ(tally.done[0], kRows) << "time cap hit";
  ASSERT_EQ(tally.done[1], kRows) << "time cap hit";
  for (int t = 0; t < 2; ++t) {
    ASSERT_EQ(tally.acked[t].size(), size_t(kRows)) << tasks[t];
    for (const auto& [row, count] : tally.acked[t]) ASSERT_EQ(count, 1) << tasks[t] << " row " << row;
  }
  EXPECT_LE(hub->meter().peak_bytes.load(), kCapacityBytes);
  auto stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->controller.rows, 0u) << "every row was freed after both tasks acked it";
  EXPECT_EQ(stats->controller.bytes_held, 0u);
  EXPECT_EQ(stats->storage_bytes, 0u);
  EXPECT_EQ(stats->controller.rows_created, uint64_t(kRows));
  EXPECT_GE(stats->controller.leases_expired, uint64_t(abandoned + late_acks));
  EXPECT_GT(stats->controller.rows_redelivered, 0u);
  EXPECT_GE(abandoned.load(), 2);
  EXPECT_GT(blocked_puts.load() + int(max_rows >= kCapacityRows - kGroupSize), 0) << "backpressure never engaged";
  std::printf(
      "stress: %d samples, max rows %llu/%llu, max bytes %llu/%llu, peak storage %llu, %d abandoned, "
      "%d late acks, %d blocked puts, %llu leases expired\n",
      samples, (unsigned long long)max_rows, (unsigned long long)kCapacityRows, (unsigned long long)max_bytes,
      (unsigned long long)kCapacityBytes, (unsigned long long)hub->meter().peak_bytes.load(), abandoned.load(),
      late_acks.load(), blocked_puts.load(), (unsigned long long)stats->controller.leases_expired);
}

}  // namespace
}  // namespace sluice::transfer_queue
