// Data-parallel trainer ranks as threads of this process, each with its own
// c10d TCPStore client and Gloo group over loopback (the store served here,
// as torchrun's agent serves it). Ranks as processes run in the pipeline's
// and the benchmark's tests.
#include "sluice/trainer/data_parallel.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <thread>

#include "sluice/trainer/trainer.h"

namespace sluice::trainer {
namespace {

using model::ModelConfig;
using model::Transformer;
using std::chrono::milliseconds;

TEST(DataParallelShardTest, RanksPartitionEveryMiniBatch) {
  for (size_t n : {1, 2, 5, 7, 16}) {
    for (int64_t minis : {1, 2, 3}) {
      for (int64_t world : {1, 2, 3}) {
        const auto whole = DataParallelShard(n, minis, 0, 1);
        std::vector<std::vector<size_t>> merged(whole.size());
        for (int64_t r = 0; r < world; ++r) {
          const auto part = DataParallelShard(n, minis, r, world);
          ASSERT_EQ(part.size(), whole.size());
          for (size_t k = 0; k < part.size(); ++k) merged[k].insert(merged[k].end(), part[k].begin(), part[k].end());
        }
        size_t next = 0;
        for (size_t k = 0; k < whole.size(); ++k) {
          std::sort(merged[k].begin(), merged[k].end());
          EXPECT_EQ(merged[k], whole[k]) << "n " << n << " minis " << minis << " world " << world;
          for (size_t i : whole[k]) EXPECT_EQ(i, next++);  // consecutive, as RlStep splits
        }
        EXPECT_EQ(next, n);
      }
    }
  }
}

// A store for one test's ranks, on a free loopback port, served as a
// launcher serves it.
class Store {
 public:
  Store() : server_(std::move(DataParallelStore::Serve("127.0.0.1", 0, milliseconds(20000))).value()) {}
  DataParallelOptions Options(int64_t rank, int64_t world, milliseconds timeout = milliseconds(20000)) const {
    DataParallelOptions o;
    o.rank = rank;
    o.world_size = world;
    o.master_port = server_->port();
    o.store_served_by_launcher = true;
    o.timeout = timeout;
    o.bucket_bytes = 4096;  // several buckets for the tiny model
    return o;
  }

 private:
  std::unique_ptr<DataParallelStore> server_;
};

// Runs fn(rank) on `world` threads at once; returns each rank's result.
template <typename T>
std::vector<T> OnRanks(int64_t world, const std::function<T(int64_t)>& fn) {
  std::vector<std::future<T>> futures;
  for (int64_t r = 0; r < world; ++r) futures.push_back(std::async(std::launch::async, fn, r));
  std::vector<T> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

std::shared_ptr<Transformer> TinyModel(uint64_t seed) {
  ModelConfig c = *model::PresetModelConfig("tiny");
  c.max_position_embeddings = 64;
  return std::make_shared<Transformer>(c, seed);
}

RolloutSample MakeSample(uint64_t id, size_t prompt_len, size_t response_len, double advantage) {
  RolloutSample s;
  s.id = id;
  s.group_id = id / 2;
  for (size_t i = 0; i < prompt_len; ++i) s.prompt.push_back(static_cast<TokenId>(1 + (id * 7 + i * 3) % 250));
  for (size_t i = 0; i < response_len; ++i) s.response.push_back(static_cast<TokenId>(1 + (id * 5 + i * 11) % 250));
  s.behavior_logprobs.assign(response_len, -5.0f);
  s.versions.assign(response_len, 0);
  s.advantage = advantage;
  return s;
}

// Seven samples of uneven lengths: two mini-batches of 3 and 4, which two
// ranks split 2+1 and 2+2.
std::vector<RolloutSample> Batch(uint64_t salt) {
  std::vector<RolloutSample> out;
  for (uint64_t i = 0; i < 7; ++i) {
    out.push_back(MakeSample(salt * 10 + i, 2 + (i * 3 + salt) % 5, 2 + (i * 5 + salt) % 9, (i % 3) - 1.0));
  }
  return out;
}

TrainerOptions Options() {
  TrainerOptions o;
  o.optimizer.lr = 1e-2;
  o.mini_batches = 2;
  o.micro_batch_tokens = 24;  // several micro-batches per rank
  o.loss.kl_coef = 0.05;      // the reference model is broadcast too
  return o;
}

struct RankRun {
  Status status;
  std::vector<StepMetrics> metrics;
  std::map<std::string, torch::Tensor> weights;
  Trainer::GradientSums sums;
};

// Two RL steps and one SFT step on `world` ranks; rank r's model starts
// from seed 1 + r (rank 0's weights must win). `overlap`: gradient buckets
// sent during the backward passes, on `threads` micro-batch workers.
RankRun Train(const Store* store, int64_t rank, int64_t world, LossAggregation aggregation, bool overlap = true,
              int32_t threads = 1) {
  RankRun run;
  std::shared_ptr<DataParallelGroup> group;
  if (store != nullptr) {
    auto connected = DataParallelGroup::Connect(store->Options(rank, world));
    if (!connected.ok()) return {connected.status(), {}, {}, {}};
    group = std::move(connected).value();
  }
  TrainerOptions o = Options();
  o.loss.aggregation = aggregation;
  o.overlap_gradient_sum = overlap;
  o.micro_batch_threads = threads;
  auto trainer = Trainer::Create(TinyModel(1 + rank), TinyModel(100 + rank), o, group);
  if (!trainer.ok()) return {trainer.status(), {}, {}, {}};
  for (uint64_t salt : {1, 2}) {
    auto m = (*trainer)->RlStep(Batch(salt));
    if (!m.ok()) return {m.status(), {}, {}, {}};
    run.metrics.push_back(*m);
  }
  std::vector<SftExample> sft;
  for (const RolloutSample& s : Batch(3)) sft.push_back({s.prompt, s.response});
  auto m = (*trainer)->SftStep(sft);
  if (!m.ok()) return {m.status(), {}, {}, {}};
  run.metrics.push_back(*m);
  for (auto& p : (*trainer)->policy().named_parameters()) run.weights[p.key()] = p.value().detach().clone();
  run.sums = (*trainer)->gradient_sums();
  return run;
}

void ExpectSameRun(const RankRun& one, const RankRun& dp, const std::string& what) {
  ASSERT_TRUE(one.status.ok()) << one.status.ToString();
  ASSERT_TRUE(dp.status.ok()) << what << ": " << dp.status.ToString();
  ASSERT_EQ(one.metrics.size(), dp.metrics.size());
  for (size_t i = 0; i < one.metrics.size(); ++i) {
    const StepMetrics &a = one.metrics[i], &b = dp.metrics[i];
    EXPECT_EQ(a.tokens, b.tokens) << what << " step " << i;
    EXPECT_EQ(a.sequences, b.sequences) << what << " step " << i;
    EXPECT_EQ(a.optimizer_steps, b.optimizer_steps) << what << " step " << i;
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * (1 + std::abs(a.loss))) << what << " step " << i;
    EXPECT_NEAR(a.pg_loss, b.pg_loss, 1e-5) << what << " step " << i;
    EXPECT_NEAR(a.kl, b.kl, 1e-6) << what << " step " << i;
    EXPECT_NEAR(a.entropy, b.entropy, 1e-5 * a.entropy) << what << " step " << i;
    EXPECT_NEAR(a.clip_frac, b.clip_frac, 1e-9) << what << " step " << i;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * a.grad_norm) << what << " step " << i;
    EXPECT_NEAR(a.rollout_logprob_gap_mean, b.rollout_logprob_gap_mean, 1e-5) << what << " step " << i;
    EXPECT_NEAR(a.rollout_logprob_gap_max, b.rollout_logprob_gap_max, 1e-5) << what << " step " << i;
  }
  ASSERT_EQ(one.weights.size(), dp.weights.size());
  double worst = 0, moved = 0;
  const auto start = TinyModel(1)->named_parameters();
  for (const auto& [name, w] : one.weights) {
    worst = std::max(worst, (w - dp.weights.at(name)).abs().max().item<double>());
    moved = std::max(moved, (w - start[name]).abs().max().item<double>());
  }
  // Sums in another order round differently, and Adam divides by the
  // gradient's own scale, so a weight whose gradient is near zero moves by
  // up to lr either way on such noise; a missing all-reduce moves hundreds.
  EXPECT_LT(worst, 5e-3 * Options().optimizer.lr) << what << ": the largest weight difference from one process";
  EXPECT_GT(moved, 1e-3) << "the steps changed the weights (so the comparison means something)";
}

TEST(DataParallelTrainerTest, TwoAndThreeRanksTakeTheStepsOneProcessTakes) {
  struct Variant {
    int64_t world;
    bool overlap;
    int32_t threads;
  };
  for (LossAggregation aggregation : {LossAggregation::kTokenMean, LossAggregation::kSequenceMean}) {
    const RankRun one = Train(nullptr, 0, 1, aggregation);
    for (const Variant v : {Variant{2, true, 1}, Variant{2, true, 2}, Variant{2, false, 1}, Variant{3, true, 1}}) {
      Store store;
      const std::vector<RankRun> runs = OnRanks<RankRun>(
          v.world, [&](int64_t rank) { return Train(&store, rank, v.world, aggregation, v.overlap, v.threads); });
      for (int64_t r = 0; r < v.world; ++r) {
        const std::string what = std::to_string(v.world) + " ranks, rank " + std::to_string(r) +
                                 (v.overlap ? ", sums during backward" : ", one sum after backward") + ", " +
                                 std::to_string(v.threads) + " micro-batch thread(s)";
        ExpectSameRun(one, runs[r], what);
        // Five sums (two updates per RL step, one SFT step), every bucket
        // counted; with the overlap most leave while the passes still run
        // (or as the last one returns), not after them.
        if (v.overlap) {
          EXPECT_GT(runs[r].sums.buckets, 0) << what;
          EXPECT_GT(runs[r].sums.sent_during_backward, runs[r].sums.buckets / 2) << what;
        } else {
          EXPECT_EQ(runs[r].sums.buckets, 0) << what;
        }
      }
    }
  }
}

TEST(DataParallelTrainerTest, RanksThatDisagreeFailOnEveryRank) {
  {  // different options
    Store store;
    auto statuses = OnRanks<Status>(2, [&](int64_t rank) -> Status {
      SLUICE_ASSIGN_OR_RETURN(auto group, DataParallelGroup::Connect(store.Options(rank, 2)));
      TrainerOptions o = Options();
      if (rank == 1) o.optimizer.lr = 2e-2;
      return Trainer::Create(TinyModel(1), TinyModel(100), o, std::move(group)).status();
    });
    for (const Status& s : statuses) {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
      EXPECT_NE(s.message().find("ranks 1 differ from rank 0 in trainer options"), std::string::npos) << s.ToString();
    }
  }
  {  // one rank sums gradients during backward, the other after: their
     // buckets would not pair up
    Store store;
    auto statuses = OnRanks<Status>(2, [&](int64_t rank) -> Status {
      SLUICE_ASSIGN_OR_RETURN(auto group, DataParallelGroup::Connect(store.Options(rank, 2)));
      TrainerOptions o = Options();
      o.overlap_gradient_sum = rank == 0;
      return Trainer::Create(TinyModel(1), TinyModel(100), o, std::move(group)).status();
    });
    for (const Status& s : statuses) {
      EXPECT_NE(s.message().find("ranks 1 differ from rank 0 in trainer options"), std::string::npos) << s.ToString();
    }
  }
  {  // different batch sizes, then a bad sample in rank 1's shard
    Store store;
    auto statuses = OnRanks<std::vector<Status>>(2, [&](int64_t rank) -> std::vector<Status> {
      auto group = DataParallelGroup::Connect(store.Options(rank, 2));
      if (!group.ok()) return {group.status()};
      auto trainer = Trainer::Create(TinyModel(1), TinyModel(100), Options(), std::move(group).value());
      if (!trainer.ok()) return {trainer.status()};
      std::vector<RolloutSample> batch = Batch(1);
      if (rank == 1) batch.pop_back();
      std::vector<Status> out = {(*trainer)->RlStep(batch).status()};
      batch = Batch(1);
      batch[1].response.push_back(100000);  // sample 1: rank 1's in mini-batch 0
      batch[1].behavior_logprobs.push_back(0);
      batch[1].versions.push_back(0);
      out.push_back((*trainer)->RlStep(batch).status());
      // And the ranks still step together afterwards.
      out.push_back((*trainer)->RlStep(Batch(2)).status());
      return out;
    });
    for (int64_t r = 0; r < 2; ++r) {
      ASSERT_EQ(statuses[r].size(), 3u) << statuses[r][0].ToString();
      EXPECT_EQ(statuses[r][0].code(), StatusCode::kFailedPrecondition) << statuses[r][0].ToString();
      EXPECT_NE(statuses[r][0].message().find("batches of different sizes (6 to 7"), std::string::npos);
      EXPECT_TRUE(statuses[r][2].ok()) << statuses[r][2].ToString();
    }
    EXPECT_EQ(statuses[1][1].code(), StatusCode::kInvalidArgument) << statuses[1][1].ToString();
    EXPECT_NE(statuses[1][1].message().find("outside the vocabulary"), std::string::npos);
    EXPECT_EQ(statuses[0][1].code(), StatusCode::kFailedPrecondition) << statuses[0][1].ToString();
    EXPECT_NE(statuses[0][1].message().find("another data-parallel rank refused its shard"), std::string::npos);
  }
}

TEST(DataParallelTrainerTest, PendingSumsPairUpWhateverOrderTensorsBecomeFinal) {
  // Three tensors of 8000 bytes: a bucket each (4096-byte buckets). Rank 0
  // marks them final last to first, rank 1 first to last and the middle
  // one twice; rank 1 leaves the third for Finish. Each bucket leaves in
  // bucket order on both, so the sums pair up.
  Store store;
  auto sums = OnRanks<Result<std::vector<double>>>(2, [&](int64_t rank) -> Result<std::vector<double>> {
    SLUICE_ASSIGN_OR_RETURN(auto group, DataParallelGroup::Connect(store.Options(rank, 2)));
    std::vector<at::Tensor> values;
    for (int k = 0; k < 3; ++k) values.push_back(torch::full({2000}, 1.0f + k + 10.0f * rank));
    SLUICE_ASSIGN_OR_RETURN(auto pending, group->BeginSum(values));
    if (pending->buckets() != 3) return Status::Internal("buckets: " + std::to_string(pending->buckets()));
    int64_t sent = 0;
    if (rank == 0) {
      for (size_t k : {2, 1, 0}) sent += pending->Ready(k, values[k]);
    } else {
      for (size_t k : {0, 1, 1}) sent += pending->Ready(k, values[k]);
    }
    // Rank 0: nothing until the first was ready, then all three; rank 1:
    // the first two (the third waits for Finish).
    if (sent != (rank == 0 ? 3 : 2)) return Status::Internal("sent early: " + std::to_string(sent));
    values[2].fill_(3.0f + 10.0f * rank);  // what Finish takes for rank 1's third
    SLUICE_RETURN_IF_ERROR(pending->Finish(values));
    std::vector<double> out;
    for (const at::Tensor& v : values) out.push_back(v.sum().item<double>() / 2000);
    return out;
  });
  for (int64_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(sums[r].ok()) << sums[r].status().ToString();
    EXPECT_EQ(*sums[r], (std::vector<double>{1 + 11, 2 + 12, 3 + 13})) << "rank " << r;
  }
  {  // the other rank leaves with a bucket in flight: Finish fails in bounded time
    Store gone;
    auto statuses = OnRanks<Status>(2, [&](int64_t rank) -> Status {
      SLUICE_ASSIGN_OR_RETURN(auto group, DataParallelGroup::Connect(gone.Options(rank, 2, milliseconds(3000))));
      std::vector<double> v = {1.0};
      SLUICE_RETURN_IF_ERROR(group->AllReduce(v, DataParallelGroup::Reduce::kSum));  // both joined
      if (rank == 1) return Status::Ok();
      std::this_thread::sleep_for(milliseconds(200));
      std::vector<at::Tensor> values = {torch::ones({2000}), torch::ones({2000})};
      SLUICE_ASSIGN_OR_RETURN(auto pending, group->BeginSum(values));
      pending->Ready(0, values[0]);
      return pending->Finish(values);
    });
    EXPECT_TRUE(statuses[1].ok()) << statuses[1].ToString();
    EXPECT_EQ(statuses[0].code(), StatusCode::kUnavailable) << statuses[0].ToString();
  }
}

TEST(DataParallelTrainerTest, AMissingOrDeadRankIsAnErrorNotAHang) {
  {  // rank 1 never joins: the rendezvous ends in a bounded time
    Store store;
    const auto start = std::chrono::steady_clock::now();
    auto group = DataParallelGroup::Connect(store.Options(0, 2, milliseconds(1500)));
    ASSERT_FALSE(group.ok());
    EXPECT_EQ(group.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(group.status().message().find("rank 0 of 2: the group did not form"), std::string::npos)
        << group.status().ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  }
  {  // rank 1 leaves after joining: rank 0's next all-reduce fails
    Store store;
    auto statuses = OnRanks<Status>(2, [&](int64_t rank) -> Status {
      SLUICE_ASSIGN_OR_RETURN(auto group, DataParallelGroup::Connect(store.Options(rank, 2, milliseconds(3000))));
      std::vector<double> v = {1.0 + rank};
      SLUICE_RETURN_IF_ERROR(group->AllReduce(v, DataParallelGroup::Reduce::kSum));
      if (v[0] != 3.0) return Status::Internal("sum " + std::to_string(v[0]));
      if (rank == 1) return Status::Ok();  // the group is destroyed: its sockets close
      std::this_thread::sleep_for(milliseconds(200));
      return group->AllReduce(v, DataParallelGroup::Reduce::kSum);
    });
    EXPECT_TRUE(statuses[1].ok()) << statuses[1].ToString();
    EXPECT_EQ(statuses[0].code(), StatusCode::kUnavailable) << statuses[0].ToString();
    EXPECT_NE(statuses[0].message().find("all-reduce failed"), std::string::npos) << statuses[0].ToString();
  }
}

TEST(DataParallelTrainerTest, RanksShareValuesThroughTheStore) {
  Store store;
  auto statuses = OnRanks<Status>(2, [&](int64_t rank) -> Status {
    SLUICE_ASSIGN_OR_RETURN(auto group, DataParallelGroup::Connect(store.Options(rank, 2)));
    if (rank == 0) {
      std::this_thread::sleep_for(milliseconds(100));  // the other rank waits for it
      return group->SetShared("plan/1", std::string("a\0b", 3));
    }
    auto missing = group->GetShared("plan/0", milliseconds(50));
    if (missing.status().code() != StatusCode::kTimeout) return Status::Internal(missing.status().ToString());
    SLUICE_ASSIGN_OR_RETURN(std::string value, group->GetShared("plan/1", milliseconds(10000)));
    if (value != std::string("a\0b", 3)) return Status::Internal("read '" + value + "'");
    return group->DeleteShared("plan/1");
  });
  for (const Status& s : statuses) EXPECT_TRUE(s.ok()) << s.ToString();
}

// A store that outlives a run attempt (torchrun's agent store across
// --max-restarts): each attempt's keys live apart, so a new attempt never
// reads the last one's plans or its "ended".
TEST(DataParallelTrainerTest, AttemptsKeepTheirKeysApartInOneStore) {
  auto served = DataParallelStore::Serve("127.0.0.1", 0, milliseconds(20000), "sluice/attempt-0");
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  Status set = (*served)->SetShared("ended", "1");
  ASSERT_TRUE(set.ok()) << set.ToString();
  auto next = DataParallelStore::Connect("127.0.0.1", (*served)->port(), milliseconds(20000), "sluice/attempt-1");
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ((*next)->GetShared("ended", milliseconds(50)).status().code(), StatusCode::kTimeout);
  auto same = DataParallelStore::Connect("127.0.0.1", (*served)->port(), milliseconds(20000), "sluice/attempt-0");
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  Result<std::string> ended = (*same)->GetShared("ended", milliseconds(5000));
  ASSERT_TRUE(ended.ok()) << ended.status().ToString();
  EXPECT_EQ(*ended, "1");
  // Deleted (by a client), gone for every client; deleting again is fine.
  ASSERT_TRUE((*same)->DeleteShared("ended").ok());
  EXPECT_EQ((*served)->GetShared("ended", milliseconds(50)).status().code(), StatusCode::kTimeout);
  EXPECT_TRUE((*served)->DeleteShared("ended").ok());
  // A group of the new attempt forms and shares values beside the old keys.
  DataParallelOptions o;
  o.master_port = (*served)->port();
  o.store_served_by_launcher = true;
  o.key_prefix = "sluice/attempt-1";
  o.timeout = milliseconds(20000);
  auto group = DataParallelGroup::Connect(o);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  EXPECT_EQ((*group)->GetShared("ended", milliseconds(50)).status().code(), StatusCode::kTimeout);
  o.key_prefix = "";
  EXPECT_EQ(DataParallelGroup::Connect(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(DataParallelTrainerTest, RanksOnOneHostMeetThroughAFileStore) {
  const std::string path = ::testing::TempDir() + "/ranks-" + std::to_string(::getpid()) + ".store";
  std::remove(path.c_str());
  auto statuses = OnRanks<Status>(2, [&](int64_t rank) -> Status {
    DataParallelOptions o;
    o.rank = rank;
    o.world_size = 2;
    o.store_file = path;
    o.timeout = milliseconds(20000);
    SLUICE_ASSIGN_OR_RETURN(auto group, DataParallelGroup::Connect(o));
    std::vector<double> v = {1.0 + rank};
    SLUICE_RETURN_IF_ERROR(group->AllReduce(v, DataParallelGroup::Reduce::kSum));
    if (v[0] != 3.0) return Status::Internal("sum " + std::to_string(v[0]));
    if (rank == 0) SLUICE_RETURN_IF_ERROR(group->SetShared("plan/1", "x"));
    SLUICE_ASSIGN_OR_RETURN(std::string value, group->GetShared("plan/1", milliseconds(10000)));
    if (value != "x") return Status::Internal("read '" + value + "'");
    SLUICE_RETURN_IF_ERROR(group->AllReduce(v, DataParallelGroup::Reduce::kSum));  // both have read it
    return group->DeleteShared("plan/1");
  });
  for (const Status& s : statuses) EXPECT_TRUE(s.ok()) << s.ToString();
  std::remove(path.c_str());
}

TEST(DataParallelTrainerTest, BadOptionsAreRefused) {
  EXPECT_EQ(DataParallelStore::Serve("127.0.0.1", 70000, milliseconds(100)).status().code(),
            StatusCode::kInvalidArgument);
  DataParallelOptions o;
  o.world_size = 2;
  o.rank = 2;
  EXPECT_EQ(DataParallelGroup::Connect(o).status().code(), StatusCode::kInvalidArgument);
  o.rank = 1;
  o.master_port = 0;
  EXPECT_NE(DataParallelGroup::Connect(o).status().message().find("port 0"), std::string::npos);
  o.master_port = 29500;
  o.timeout = milliseconds(0);
  EXPECT_EQ(DataParallelGroup::Connect(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::trainer
