// Client behaviour: the two-phase write (with fault injection between the
// phases), zero-copy reads, row lifetime and backpressure.
#include "sluice/transfer_queue/client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "test_util.h"

namespace sluice::transfer_queue {
namespace {

using std::chrono::milliseconds;
using testing::F32Scalar;
using testing::I64;
using testing::Tags;
using testing::ToI64;

// Forwards to a real controller; fails or interferes on request.
class FaultyController final : public Controller {
 public:
  explicit FaultyController(std::shared_ptr<Controller> inner) : inner_(std::move(inner)) {}

  std::atomic<bool> fail_commit{false};
  std::atomic<bool> clear_before_commit{false};

  Status RegisterColumns(const RegisterColumnsRequest& r) override { return inner_->RegisterColumns(r); }
  Status RegisterTask(const RegisterTaskRequest& r) override { return inner_->RegisterTask(r); }
  Result<DescribeResponse> Describe() override { return inner_->Describe(); }
  Result<CreatePartitionResponse> CreatePartition(const CreatePartitionRequest& r) override {
    return inner_->CreatePartition(r);
  }
  Result<CreateRowsResponse> CreateRows(const CreateRowsRequest& r) override { return inner_->CreateRows(r); }
  Result<BeginWriteResponse> BeginWrite(const BeginWriteRequest& r) override { return inner_->BeginWrite(r); }
  Status CommitWrite(const CommitWriteRequest& r) override {
    if (fail_commit) return Status::Unavailable("injected commit failure");
    if (clear_before_commit) {
      // A ClearPartition racing between the two phases (its reclaim is
      // finished by hand: the real client would drop the bytes first).
      auto cleared = inner_->ClearPartition({"p"});
      if (!cleared.ok()) return cleared.status();
      if (cleared->reclaim.id != 0) SLUICE_CHECK_OK(inner_->FinishReclaim({cleared->reclaim.id}));
    }
    return inner_->CommitWrite(r);
  }
  Status AbortWrite(const AbortWriteRequest& r) override { return inner_->AbortWrite(r); }
  Result<BatchMeta> GetMeta(const GetMetaRequest& r) override { return inner_->GetMeta(r); }
  Result<AckResponse> Ack(const AckRequest& r) override { return inner_->Ack(r); }
  Result<ReleaseResponse> Release(const ReleaseRequest& r) override { return inner_->Release(r); }
  Result<RenewResponse> Renew(const RenewRequest& r) override { return inner_->Renew(r); }
  Result<ClearResponse> ClearPartition(const ClearPartitionRequest& r) override { return inner_->ClearPartition(r); }
  Result<std::vector<KvEntry>> KvLookup(const KvLookupRequest& r) override { return inner_->KvLookup(r); }
  Result<std::vector<KvEntry>> KvList(const KvListRequest& r) override { return inner_->KvList(r); }
  Result<ClearResponse> KvClear(const KvClearRequest& r) override { return inner_->KvClear(r); }
  Status FinishReclaim(const FinishReclaimRequest& r) override { return inner_->FinishReclaim(r); }
  Result<ControllerStats> Stats() override { return inner_->Stats(); }
  void Close() override { inner_->Close(); }

 private:
  std::shared_ptr<Controller> inner_;
};

class FailingStorage final : public StorageUnit {
 public:
  explicit FailingStorage(std::shared_ptr<StorageUnit> inner) : inner_(std::move(inner)) {}
  std::atomic<bool> fail_write{false};

  Status Write(const StorageWriteRequest& r) override {
    if (fail_write) return Status::Unavailable("injected storage failure");
    return inner_->Write(r);
  }
  Result<StorageReadResponse> Read(const StorageReadRequest& r) override { return inner_->Read(r); }
  Status Discard(const StorageDiscardRequest& r) override { return inner_->Discard(r); }
  Status FreeRows(const StorageFreeRequest& r) override { return inner_->FreeRows(r); }
  Result<StorageStats> Stats() override { return inner_->Stats(); }

 private:
  std::shared_ptr<StorageUnit> inner_;
};

ColumnBatch Prompts(size_t n, int64_t base = 0) {
  ColumnBatch batch;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int64_t> tokens(i + 1, base + int64_t(i));  // row i: i+1 tokens, all equal to base+i
    batch["prompt"].push_back(I64(tokens));
  }
  return batch;
}

TEST(ClientTest, PutRowsThenGetDataIsZeroCopyAndOutlivesTheRows) {
  auto hub = testing::MakeHub();
  auto client = hub->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  ColumnBatch batch = Prompts(5, 100);
  for (int i = 0; i < 5; ++i) batch["reward"].push_back(F32Scalar(0.25f * i));
  auto rows = client.PutRows("p", std::vector<RowTags>(5), batch);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  auto meta = client.GetMeta("train", {"prompt", "reward"}, 5, "p");
  ASSERT_TRUE(meta.ok());
  auto data = client.GetData(*meta);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  ASSERT_EQ(data->rows, *rows);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(ToI64(data->columns["prompt"][i]), std::vector<int64_t>(i + 1, 100 + int64_t(i)));
    EXPECT_EQ(testing::ToF32(data->columns["reward"][i]), 0.25f * i);
  }
  auto only_reward = client.GetData(*meta, {"reward"});
  ASSERT_TRUE(only_reward.ok());
  EXPECT_EQ(only_reward->columns.size(), 1u);
  auto again = client.GetData(*meta, {"prompt"});
  EXPECT_EQ(again->columns["prompt"][3].data, data->columns["prompt"][3].data) << "views, not copies";

  // Freed by both tasks' acks: the views still read the right bytes.
  auto reward = client.GetMeta("reward", {"prompt"}, 5, "p");
  ASSERT_TRUE(reward.ok());
  ASSERT_TRUE(client.Ack(reward->lease_id).ok());
  auto acked = client.Ack(meta->lease_id);
  ASSERT_TRUE(acked.ok());
  EXPECT_EQ(acked->rows_freed, 5u);
  EXPECT_EQ(hub->meter().bytes.load(), 0u);
  EXPECT_EQ(ToI64(data->columns["prompt"][4]), std::vector<int64_t>(5, 104));
  // A freed row is NotFound, never another row's data.
  TQ_EXPECT_ERROR(client.GetData(*meta), kNotFound, "freed");
}

TEST(ClientTest, GetDataChecksColumnsAgainstTheBatch) {
  auto hub = testing::MakeHub();
  auto client = hub->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  ColumnBatch batch = Prompts(1);
  batch["reward"].push_back(F32Scalar(1));
  ASSERT_TRUE(client.PutRows("p", {Tags()}, batch).ok());
  auto meta = client.GetMeta("train", {"prompt"}, 1, "p");
  ASSERT_TRUE(meta.ok());
  TQ_EXPECT_ERROR(client.GetData(*meta, {"reward"}), kInvalidArgument,
                  "column 'reward' is not in the batch (its columns: 'prompt')");
  TQ_EXPECT_ERROR(client.GetData(*meta, {"prompt", "prompt"}), kInvalidArgument, "listed twice");
}

struct FaultyHub {
  std::unique_ptr<TransferQueueHub> hub = testing::MakeHub();
  std::shared_ptr<FaultyController> controller = std::make_shared<FaultyController>(hub->controller());
  std::shared_ptr<FailingStorage> storage1 = std::make_shared<FailingStorage>(hub->storage()[1]);
  TransferQueueClient client{controller, {hub->storage()[0], storage1, hub->storage()[2]}};

  void ExpectNothingHeld() {
    auto stats = client.Stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->storage_bytes, 0u);
    EXPECT_EQ(stats->controller.bytes_held, 0u);
    EXPECT_EQ(stats->controller.open_writes, 0u);
  }
};

TEST(ClientTest, FailedCommitDiscardsTheBytesAndReturnsTheError) {
  FaultyHub f;
  TQ_ASSERT_OK(f.client.CreatePartition("p"));
  f.controller->fail_commit = true;
  TQ_EXPECT_ERROR(f.client.PutRows("p", std::vector<RowTags>(6), Prompts(6)), kUnavailable,
                  "rolled back: injected commit failure");
  f.ExpectNothingHeld();
  EXPECT_EQ(f.client.Stats()->controller.rows, 0u) << "rows created by the failed write are gone";
  EXPECT_EQ(f.client.Stats()->controller.writes_aborted, 1u);
  EXPECT_GT(f.hub->meter().peak_bytes.load(), 0u) << "the bytes did reach storage before the commit";

  // Existing rows: the cells are free again after the failed write.
  auto rows = f.client.CreateRows("p", std::vector<RowTags>(3));
  ASSERT_TRUE(rows.ok());
  TQ_EXPECT_ERROR(f.client.PutColumns(*rows, Prompts(3)), kUnavailable, "injected");
  f.ExpectNothingHeld();
  TQ_EXPECT_ERROR(f.client.GetMeta("train", {"prompt"}, 1, "p"), kTimeout, "only 0 of 1");
  f.controller->fail_commit = false;
  TQ_EXPECT_OK(f.client.PutColumns(*rows, Prompts(3)));
  EXPECT_TRUE(f.client.GetMeta("train", {"prompt"}, 3, "p").ok());
}

TEST(ClientTest, FailedStorageWriteRollsBackTheOtherUnits) {
  FaultyHub f;
  TQ_ASSERT_OK(f.client.CreatePartition("p"));
  f.storage1->fail_write = true;
  TQ_EXPECT_ERROR(f.client.PutRows("p", std::vector<RowTags>(6), Prompts(6)), kUnavailable, "injected storage failure");
  f.ExpectNothingHeld();
  EXPECT_EQ(f.client.Stats()->controller.rows, 0u);
  f.storage1->fail_write = false;
  EXPECT_TRUE(f.client.PutRows("p", std::vector<RowTags>(6), Prompts(6)).ok());
}

TEST(ClientTest, ClearBetweenTheTwoPhasesFailsTheCommit) {
  FaultyHub f;
  TQ_ASSERT_OK(f.client.CreatePartition("p"));
  auto rows = f.client.CreateRows("p", std::vector<RowTags>(2));
  ASSERT_TRUE(rows.ok());
  f.controller->clear_before_commit = true;
  TQ_EXPECT_ERROR(f.client.PutColumns(*rows, Prompts(2)), kNotFound, "was cleared before the write committed");
  f.ExpectNothingHeld();
  TQ_ASSERT_OK(f.client.CreatePartition("p"));
  TQ_EXPECT_ERROR(f.client.PutRows("p", std::vector<RowTags>(2), Prompts(2)), kNotFound, "was cleared");
  f.ExpectNothingHeld();
}

TEST(ClientTest, RowCapacityBlocksProducers) {
  HubOptions options = testing::DefaultHubOptions();
  options.controller.capacity_rows = 4;
  auto hub = testing::MakeHub(options);
  auto client = hub->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  ASSERT_TRUE(client.PutRows("p", std::vector<RowTags>(4), Prompts(4)).ok());
  TQ_EXPECT_ERROR(client.PutRows("p", {Tags()}, Prompts(1), {false, milliseconds(0)}), kResourceExhausted,
                  "the queue is full (4/4 rows");
  TQ_EXPECT_ERROR(client.CreateRows("p", {Tags()}, {true, milliseconds(30)}), kTimeout, "no capacity within 30 ms");
  TQ_EXPECT_ERROR(client.CreateRows("p", std::vector<RowTags>(5)), kResourceExhausted, "can never fit");
  TQ_EXPECT_ERROR(client.GetMeta("train", {"prompt"}, 5, "p"), kOutOfRange, "capacity_rows=4");

  // A blocked producer proceeds once both tasks have acked two rows.
  std::atomic<bool> done{false};
  Status produced;
  std::thread producer([&] {
    produced = client.PutRows("p", std::vector<RowTags>(2), Prompts(2), {true, milliseconds(5000)}).status();
    done = true;
  });
  while (client.Stats()->controller.waiting_producers == 0) std::this_thread::yield();
  EXPECT_FALSE(done);
  for (const char* task : {"train", "reward"}) {
    auto meta = client.GetMeta(task, {"prompt"}, 2, "p");
    ASSERT_TRUE(meta.ok());
    ASSERT_TRUE(client.Ack(meta->lease_id).ok());
  }
  producer.join();
  TQ_EXPECT_OK(produced);
  EXPECT_EQ(client.Stats()->controller.rows, 4u);
}

TEST(ClientTest, ByteCapacityBlocksProducersAndCountsReclaimingBytes) {
  HubOptions options = testing::DefaultHubOptions();
  options.controller.capacity_bytes = 64;
  options.controller.tasks = {"train"};
  auto hub = testing::MakeHub(options);
  auto client = hub->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  ColumnBatch four_tokens{{"prompt", {I64({1, 2, 3, 4})}}};  // 32 bytes
  ASSERT_TRUE(client.PutRows("p", {Tags()}, four_tokens).ok());
  ASSERT_TRUE(client.PutRows("p", {Tags()}, four_tokens).ok());
  TQ_EXPECT_ERROR(client.PutRows("p", {Tags()}, four_tokens, {false, milliseconds(0)}), kResourceExhausted,
                  "64/64 bytes held");
  ColumnBatch too_big{{"prompt", {I64(std::vector<int64_t>(9, 0))}}};
  TQ_EXPECT_ERROR(client.PutRows("p", {Tags()}, too_big), kResourceExhausted, "can never fit");
  EXPECT_EQ(client.Stats()->controller.rows, 2u) << "a refused PutRows creates no row";

  // Freed rows stay counted until their storage bytes are dropped.
  auto meta = client.GetMeta("train", {"prompt"}, 1, "p");
  ASSERT_TRUE(meta.ok());
  auto acked = hub->controller()->Ack({meta->lease_id});  // controller only: bytes not dropped yet
  ASSERT_TRUE(acked.ok());
  ASSERT_NE(acked->reclaim.id, 0u);
  EXPECT_EQ(acked->reclaim.bytes, 32u);
  auto stats = client.Stats();
  EXPECT_EQ(stats->controller.bytes_reclaiming, 32u);
  EXPECT_EQ(stats->controller.bytes_held, 64u);
  TQ_EXPECT_ERROR(client.PutRows("p", {Tags()}, four_tokens, {false, milliseconds(0)}), kResourceExhausted, "full");
  TQ_ASSERT_OK(hub->storage()[acked->reclaim.rows[0] % 3]->FreeRows({acked->reclaim.rows}));
  TQ_ASSERT_OK(hub->controller()->FinishReclaim({acked->reclaim.id}));
  TQ_EXPECT_ERROR(hub->controller()->FinishReclaim({acked->reclaim.id}), kNotFound, "not open");
  EXPECT_TRUE(client.PutRows("p", {Tags()}, four_tokens, {false, milliseconds(0)}).ok());
  EXPECT_LE(hub->meter().peak_bytes.load(), 64u);
}

TEST(ClientTest, WithoutTasksRowsLiveUntilCleared) {
  HubOptions options = testing::DefaultHubOptions();
  options.controller.tasks = {};
  auto hub = testing::MakeHub(options);
  auto client = hub->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  ASSERT_TRUE(client.PutRows("p", std::vector<RowTags>(3), Prompts(3)).ok());
  EXPECT_EQ(client.Stats()->controller.rows, 3u);
  auto cleared = client.ClearPartition("p");
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(cleared->rows_cleared, 3u);
  auto stats = client.Stats();
  EXPECT_EQ(stats->controller.rows, 0u);
  EXPECT_EQ(stats->controller.bytes_held, 0u);
  EXPECT_EQ(stats->storage_bytes, 0u);
}

TEST(ClientTest, ConcurrentWritersOfOneCellExactlyOneWins) {
  auto hub = testing::MakeHub();
  auto client = hub->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  auto rows = client.CreateRows("p", std::vector<RowTags>(20));
  ASSERT_TRUE(rows.ok());
  std::atomic<int> wins{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&, w] {
      for (RowId row : *rows) {
        Status s = client.PutColumns({row}, {{"reward", {F32Scalar(float(w))}}});
        if (s.ok()) {
          ++wins;
        } else {
          EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.ToString();
        }
      }
    });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(wins.load(), 20);
  auto stats = client.Stats();
  EXPECT_EQ(stats->controller.bytes_held, 20u * 4);
  EXPECT_EQ(stats->storage_bytes, 20u * 4) << "losing writers left no bytes behind";
}

}  // namespace
}  // namespace sluice::transfer_queue
