// The key-value view: rows named by string keys within a partition.
#include <gtest/gtest.h>

#include "test_util.h"

namespace sluice::transfer_queue {
namespace {

using testing::F32Scalar;
using testing::I64;
using testing::Tags;
using testing::ToI64;

class KvTest : public ::testing::Test {
 protected:
  void SetUp() override { TQ_ASSERT_OK(client_.CreatePartition("kv")); }
  std::unique_ptr<TransferQueueHub> hub_ = testing::MakeHub();
  TransferQueueClient client_ = hub_->client();
};

TEST_F(KvTest, PutGetListClear) {
  RowTags tags = Tags(kNoGroup, 3, 7);
  tags.user["split"] = "train";
  TQ_ASSERT_OK(client_.KvPut("kv", "b", tags, {{"prompt", I64({1, 2})}}));
  TQ_ASSERT_OK(client_.KvPut("kv", "a", Tags(), {{"prompt", I64({9})}, {"reward", F32Scalar(1)}}));
  auto b = client_.KvGet("kv", "b");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->entry.key, "b");
  EXPECT_EQ(b->entry.tags.policy_version, 3);
  EXPECT_EQ(b->entry.tags.user.at("split"), "train");
  EXPECT_EQ(b->entry.columns, (std::vector<std::string>{"prompt"}));
  EXPECT_EQ(ToI64(b->columns.at("prompt")), (std::vector<int64_t>{1, 2}));
  auto a = client_.KvGet("kv", "a", {"reward"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->columns.size(), 1u);
  EXPECT_EQ(testing::ToF32(a->columns.at("reward")), 1.0f);

  auto list = client_.KvList("kv");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].key, "a");
  EXPECT_EQ((*list)[1].key, "b");

  auto cleared = client_.KvClear("kv", {"a"});
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(cleared->rows_cleared, 1u);
  TQ_EXPECT_ERROR(client_.KvGet("kv", "a"), kNotFound, "key 'a' not found in partition 'kv'");
  EXPECT_EQ(client_.KvList("kv")->size(), 1u);
  auto stats = client_.Stats();
  EXPECT_EQ(stats->controller.rows, 1u);
  EXPECT_EQ(stats->storage_bytes, 16u);
  EXPECT_EQ(stats->controller.bytes_held, 16u);
}

TEST_F(KvTest, PutToAnExistingKeyAddsColumnsAndPatchesTags) {
  RowTags first = Tags(5, 1, 0);
  first.user["a"] = "1";
  TQ_ASSERT_OK(client_.KvPut("kv", "k", first, {{"prompt", I64({1})}}));
  RowTags second = Tags(6, 2, 11);
  second.user["b"] = "2";
  TQ_ASSERT_OK(client_.KvPut("kv", "k", second, {{"response", I64({2, 3})}}));
  auto got = client_.KvGet("kv", "k");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->entry.columns, (std::vector<std::string>{"prompt", "response"}));
  EXPECT_EQ(got->entry.tags.group_id, 5) << "the group id is kept";
  EXPECT_EQ(got->entry.tags.policy_version, 2);
  EXPECT_EQ(got->entry.tags.token_length, 11);
  EXPECT_EQ(got->entry.tags.user, (std::map<std::string, std::string>{{"a", "1"}, {"b", "2"}}));
  // A column is written once; clear the key to replace it.
  TQ_EXPECT_ERROR(client_.KvPut("kv", "k", Tags(), {{"prompt", I64({4})}}), kAlreadyExists,
                  "key 'k' column 'prompt' is already written");
  TQ_ASSERT_OK(client_.KvClear("kv", {"k"}).status());
  TQ_ASSERT_OK(client_.KvPut("kv", "k", Tags(), {{"prompt", I64({4})}}));
  EXPECT_EQ(ToI64(client_.KvGet("kv", "k")->columns.at("prompt")), (std::vector<int64_t>{4}));
}

TEST_F(KvTest, BadInput) {
  TQ_ASSERT_OK(client_.KvPut("kv", "k", Tags(), {{"prompt", I64({1})}}));
  TQ_EXPECT_ERROR(client_.KvPut("nope", "k", Tags(), {{"prompt", I64({1})}}), kNotFound, "unknown partition");
  TQ_EXPECT_ERROR(client_.KvPut("kv", "", Tags(), {{"prompt", I64({1})}}), kInvalidArgument, "key name is empty");
  TQ_EXPECT_ERROR(client_.KvPut("kv", "x", Tags(), {{"prompt", F32Scalar(1)}}), kInvalidArgument, "dtype F32");
  TQ_EXPECT_ERROR(client_.KvGet("kv", "missing"), kNotFound, "key 'missing' not found");
  TQ_EXPECT_ERROR(client_.KvGet("kv", "k", {"reward"}), kNotFound,
                  "key 'k' in partition 'kv' has no column 'reward' (its columns: 'prompt')");
  TQ_EXPECT_ERROR(client_.KvGet("kv", "k", {"prompt", "prompt"}), kInvalidArgument, "listed twice");
  // All-or-nothing clear.
  TQ_EXPECT_ERROR(client_.KvClear("kv", {"k", "missing"}), kNotFound, "nothing was cleared");
  EXPECT_TRUE(client_.KvGet("kv", "k").ok());
  TQ_EXPECT_ERROR(client_.KvClear("kv", {}), kInvalidArgument, "no keys");
  TQ_EXPECT_ERROR(client_.KvClear("kv", {"k", "k"}), kInvalidArgument, "appears twice");
  EXPECT_EQ(client_.Stats()->controller.rows, 1u) << "failed puts created no rows";
}

TEST_F(KvTest, BatchPutAndGet) {
  TQ_ASSERT_OK(client_.KvPut("kv", "old", Tags(kNoGroup, 4, 9), {{"prompt", I64({7})}}));
  RowTagPatch patch;
  patch.user["status"] = "done";
  ColumnBatch columns;
  columns["reward"] = {F32Scalar(0.5f), F32Scalar(1.5f)};
  columns["prompt"] = {I64({1, 2, 3}), I64({8})};
  // "old" exists (gets only the new column); "new" is created with its tags.
  TQ_EXPECT_ERROR(client_.KvPutBatch("kv", {"new", "old"}, {Tags(3, 5, 0), Tags()}, columns), kAlreadyExists,
                  "key 'old' column 'prompt' is already written");
  EXPECT_EQ(client_.KvList("kv")->size(), 1u) << "the failed batch created nothing";
  columns.erase("prompt");
  columns["response"] = {I64({1, 2, 3}), I64({})};
  TQ_ASSERT_OK(client_.KvPutBatch("kv", {"new", "old"}, {Tags(3, 5, 0), Tags()}, columns, {patch, patch}));

  auto got = client_.KvGetBatch("kv", {"old", "new"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->entries.size(), 2u);
  EXPECT_EQ(got->entries[0].key, "old");
  EXPECT_EQ(got->entries[0].tags.policy_version, 4) << "an existing key's tags change only through its patch";
  EXPECT_EQ(got->entries[0].tags.token_length, 9);
  EXPECT_EQ(got->entries[0].tags.user.at("status"), "done");
  EXPECT_EQ(got->entries[1].tags.group_id, 3);
  EXPECT_EQ(got->entries[1].tags.policy_version, 5);
  EXPECT_EQ(got->entries[1].tags.user.at("status"), "done");
  // No columns asked: those both keys have ("prompt" only "old" has).
  ASSERT_EQ(got->columns.size(), 2u);
  EXPECT_EQ(testing::ToF32(got->columns.at("reward")[0]), 1.5f);
  EXPECT_EQ(testing::ToF32(got->columns.at("reward")[1]), 0.5f);
  EXPECT_EQ(ToI64(got->columns.at("response")[1]), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(ToI64(got->columns.at("response")[0]).empty());

  auto one = client_.KvGetBatch("kv", {"new"}, {"reward"});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->columns.size(), 1u);
  TQ_EXPECT_ERROR(client_.KvGetBatch("kv", {"old", "new"}, {"prompt"}), kNotFound,
                  "key 'new' in partition 'kv' has no column 'prompt'");
  TQ_EXPECT_ERROR(client_.KvGetBatch("kv", {"old", "missing"}), kNotFound, "key 'missing' not found");
  TQ_EXPECT_ERROR(client_.KvGetBatch("kv", {"old", "old"}), kInvalidArgument, "listed twice");
  TQ_EXPECT_ERROR(client_.KvGetBatch("kv", {}), kInvalidArgument, "no keys");
  TQ_EXPECT_ERROR(client_.KvGetBatch("kv", {"old"}, {"reward", "reward"}), kInvalidArgument, "listed twice");
  TQ_EXPECT_ERROR(client_.KvPutBatch("kv", {"a", "a"}, {}, {{"reward", {F32Scalar(1), F32Scalar(2)}}}),
                  kInvalidArgument, "key 'a' appears twice");
  TQ_EXPECT_ERROR(client_.KvPutBatch("kv", {"a", "b"}, {Tags()}, {{"reward", {F32Scalar(1), F32Scalar(2)}}}),
                  kInvalidArgument, "1 tags for 2 keys");
  TQ_EXPECT_ERROR(client_.KvPutBatch("kv", {"a", "b"}, {}, {{"reward", {F32Scalar(1)}}}), kInvalidArgument,
                  "1 tensors for 2 rows");
  EXPECT_EQ(client_.KvList("kv")->size(), 2u) << "failed puts created no rows";
}

TEST_F(KvTest, KeyedRowsAreOrdinaryRowsForTasks) {
  TQ_ASSERT_OK(client_.KvPut("kv", "k1", Tags(), {{"prompt", I64({1})}}));
  auto meta = client_.GetMeta("train", {"prompt"}, 1, "kv");
  ASSERT_TRUE(meta.ok());
  auto entry = client_.KvGet("kv", "k1");
  EXPECT_EQ(meta->rows[0].id, entry->entry.row);
}

}  // namespace
}  // namespace sluice::transfer_queue
