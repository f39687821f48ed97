// Controller behaviour: registration, validation, readiness, tasks, sampling
// policies, leases and expiry. Bytes go through the client where a test needs
// them; metadata-only checks call the controller directly.
#include "sluice/transfer_queue/controller.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <thread>

#include "sluice/common/file_util.h"
#include "test_util.h"

namespace sluice::transfer_queue {
namespace {

using std::chrono::milliseconds;
using testing::F32Scalar;
using testing::I64;
using testing::Tags;

// prefix + i, formatted with snprintf: `"c" + std::to_string(i)` trips a
// GCC 12 -Wrestrict false positive.
std::string Numbered(const char* prefix, int i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%d", prefix, i);
  return buf;
}

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override { Reset(testing::DefaultHubOptions()); }

  void Reset(HubOptions options) {
    options.controller.clock = clock_;
    hub_ = testing::MakeHub(std::move(options));
    client_ = std::make_unique<TransferQueueClient>(hub_->client());
    TQ_ASSERT_OK(client_->CreatePartition("p"));
  }

  // n rows in `partition` with a prompt and response, tagged by `tags`.
  std::vector<RowId> Put(std::vector<RowTags> tags, const std::string& partition = "p") {
    ColumnBatch columns;
    for (size_t i = 0; i < tags.size(); ++i) {
      columns["prompt"].push_back(I64({int64_t(i)}));
      columns["response"].push_back(I64({int64_t(i), 1}));
    }
    auto rows = client_->PutRows(partition, std::move(tags), columns);
    EXPECT_TRUE(rows.ok()) << rows.status().ToString();
    return rows.ok() ? *rows : std::vector<RowId>{};
  }

  Controller& controller() { return *hub_->controller(); }

  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>();
  std::unique_ptr<TransferQueueHub> hub_;
  std::unique_ptr<TransferQueueClient> client_;
};

// ---------------------------------------------------------------- registration

TEST_F(ControllerTest, RegisterColumnsValidatesAndIsAllOrNothing) {
  TQ_EXPECT_OK(client_->RegisterColumns({{"prompt", DType::kI64, {kRaggedDim}}}));  // identical: no-op
  TQ_EXPECT_ERROR(client_->RegisterColumns({{"prompt", DType::kI32, {kRaggedDim}}}), kInvalidArgument,
                  "already registered as I64[-1]");
  TQ_EXPECT_ERROR(client_->RegisterColumns({{"x", DType::kI64, {4, kRaggedDim}}}), kInvalidArgument,
                  "only the first dimension may be ragged");
  TQ_EXPECT_ERROR(client_->RegisterColumns({{"", DType::kI64, {}}}), kInvalidArgument, "column name is empty");
  TQ_EXPECT_ERROR(client_->RegisterColumns({{"y", DType::kI64, {}}, {"y", DType::kI64, {}}}), kInvalidArgument,
                  "appears twice");
  // A bad entry after a good one registers neither.
  TQ_EXPECT_ERROR(client_->RegisterColumns({{"z", DType::kF32, {}}, {"w", DType::kF32, {-3}}}), kInvalidArgument,
                  "'w'");
  auto described = controller().Describe();
  ASSERT_TRUE(described.ok());
  EXPECT_EQ(described->columns.size(), 4u);
  std::vector<ColumnSchema> many;
  for (int i = 0; i < 61; ++i) many.push_back({Numbered("c", i), DType::kF32, {}});
  TQ_EXPECT_ERROR(client_->RegisterColumns(many), kResourceExhausted, "at most 64");
  many.pop_back();
  TQ_EXPECT_OK(client_->RegisterColumns(many));
}

TEST_F(ControllerTest, RegisterTaskAndPartition) {
  TQ_EXPECT_OK(client_->RegisterTask("train"));  // idempotent
  TQ_EXPECT_ERROR(client_->RegisterTask(""), kInvalidArgument, "task name is empty");
  TQ_EXPECT_ERROR(client_->RegisterTask(std::string(300, 'x')), kInvalidArgument, "at most 256");
  TQ_EXPECT_OK(client_->CreatePartition("p"));  // same group size: no-op
  TQ_EXPECT_ERROR(client_->CreatePartition("p", 4), kAlreadyExists, "exists with group_size 0, not 4");
  TQ_EXPECT_ERROR(client_->CreatePartition(""), kInvalidArgument, "partition name is empty");
  auto created = controller().CreatePartition({"q", 4, {}});
  ASSERT_TRUE(created.ok());
  EXPECT_TRUE(created->created);
  EXPECT_FALSE(controller().CreatePartition({"q", 4, {}})->created);
  for (int i = 0; i < 62; ++i) TQ_ASSERT_OK(client_->RegisterTask(Numbered("t", i)));
  TQ_EXPECT_ERROR(client_->RegisterTask("one-too-many"), kResourceExhausted, "64 tasks");
}

// A partition consumed by named tasks only: other tasks cannot take its rows,
// do not count them, and its rows are freed once the named tasks acked them.
TEST_F(ControllerTest, PartitionConsumedByNamedTasksOnly) {
  TQ_ASSERT_OK(client_->RegisterTask("rollout"));
  TQ_EXPECT_ERROR(client_->CreatePartition("prompts", 0, {"nobody"}), kNotFound, "unknown task 'nobody'");
  TQ_EXPECT_ERROR(client_->CreatePartition("prompts", 0, {"rollout", "rollout"}), kInvalidArgument,
                  "lists consumer 'rollout' twice");
  TQ_ASSERT_OK(client_->CreatePartition("prompts", 0, {"rollout"}));
  TQ_EXPECT_OK(client_->CreatePartition("prompts", 0, {"rollout"}));  // identical: no-op
  TQ_EXPECT_ERROR(client_->CreatePartition("prompts", 0, {"train"}), kAlreadyExists, "other consumers");
  TQ_EXPECT_ERROR(client_->CreatePartition("prompts"), kAlreadyExists, "other consumers");
  Put({Tags(), Tags()}, "prompts");
  Put({Tags()});  // "p": every task's
  TQ_EXPECT_ERROR(client_->GetMeta("train", {"prompt"}, 1, "prompts"), kInvalidArgument,
                  "task 'train' does not consume partition 'prompts'");
  auto stats = controller().Stats();
  ASSERT_TRUE(stats.ok());
  for (const TaskDepth& d : stats->tasks) {
    EXPECT_EQ(d.ready, d.task == "rollout" ? 3u : 1u) << d.task << ": its own rows only";
  }
  auto taken = client_->GetMeta("rollout", {"prompt"}, 2, "prompts");
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  auto acked = client_->Ack(taken->lease_id);
  ASSERT_TRUE(acked.ok());
  EXPECT_EQ(acked->rows_freed, 2u) << "the one consumer acked: freed, whatever the other tasks";
  stats = controller().Stats();
  EXPECT_EQ(stats->rows, 1u);
  // A task registered later does not consume a partition with named consumers.
  TQ_ASSERT_OK(client_->RegisterTask("late"));
  Put({Tags()}, "prompts");
  TQ_EXPECT_ERROR(client_->GetMeta("late", {"prompt"}, 1, "prompts"), kInvalidArgument, "does not consume");
  taken = client_->GetMeta("rollout", {"prompt"}, 1, "prompts");
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(client_->Ack(taken->lease_id)->rows_freed, 1u);
}

TEST(ControllerOptionsTest, RejectsBadOptions) {
  ControllerOptions options;
  options.capacity_rows = 0;
  TQ_EXPECT_ERROR(NewInProcessController(options), kInvalidArgument, "capacity_rows");
  options = {};
  options.default_lease_timeout = milliseconds(0);
  TQ_EXPECT_ERROR(NewInProcessController(options), kInvalidArgument, "default_lease_timeout");
  options = {};
  options.columns = {{"a", DType::kF32, {-2}}};
  TQ_EXPECT_ERROR(NewInProcessController(options), kInvalidArgument, "ControllerOptions: column 'a'");
  options = {};
  options.tasks = {""};
  TQ_EXPECT_ERROR(NewInProcessController(options), kInvalidArgument, "task name is empty");
  HubOptions hub;
  hub.storage_units = 0;
  TQ_EXPECT_ERROR(TransferQueueHub::Create(hub), kInvalidArgument, "storage_units");
}

TEST_F(ControllerTest, AckLogRecordsEachAckWithItsRowsGroupsAndHolder) {
  // Mutations tried: the Record call removed from Ack (no lines); the row ids
  // logged in place of the group ids (wrong pairs).
  const std::string path = ::testing::TempDir() + "sluice_ack_log_" + std::to_string(::getpid());
  std::remove(path.c_str());
  HubOptions options = testing::DefaultHubOptions();
  options.controller.ack_log = path;
  Reset(std::move(options));
  const auto rows = Put({Tags(5), Tags(5), Tags(7), Tags()});
  GetMetaRequest request;
  request.task = "train";
  request.columns = {"response"};
  request.n = 2;
  request.partition = "p";
  request.holder = "rank \"0\"\n\xff";
  auto first = controller().GetMeta(request);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  request.holder = "";
  auto released = controller().GetMeta(request);
  ASSERT_TRUE(released.ok()) << released.status().ToString();
  TQ_ASSERT_OK(client_->Release(released->lease_id).status());  // not an ack: not logged
  TQ_ASSERT_OK(client_->Ack(first->lease_id).status());
  auto second = controller().GetMeta(request);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  TQ_ASSERT_OK(client_->Ack(second->lease_id).status());
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text,
            "{\"ack\":" + std::to_string(first->lease_id) +
                ",\"task\":\"train\",\"holder\":\"rank \\\"0\\\"\\u000a\\u00ff\",\"partition\":\"p\",\"rows\":[[" +
                std::to_string(rows[0]) + ",5],[" + std::to_string(rows[1]) + ",5]]}\n" +
                "{\"ack\":" + std::to_string(second->lease_id) +
                ",\"task\":\"train\",\"holder\":\"\",\"partition\":\"p\",\"rows\":[[" + std::to_string(rows[2]) +
                ",7],[" + std::to_string(rows[3]) + ",-1]]}\n");
  std::remove(path.c_str());
  // Not a regular file: refused when the controller is made.
  ControllerOptions bad;
  bad.ack_log = ::testing::TempDir();
  TQ_EXPECT_ERROR(NewInProcessController(bad), kInvalidArgument, "not a regular file");
}

// ---------------------------------------------------------------- writes

TEST_F(ControllerTest, CreateRowsValidation) {
  TQ_EXPECT_ERROR(client_->CreateRows("nope", {Tags()}), kNotFound, "unknown partition 'nope'");
  TQ_EXPECT_ERROR(client_->CreateRows("p", {}), kInvalidArgument, "no rows");
  TQ_EXPECT_ERROR(client_->CreateRows("p", {Tags(kNoGroup, kNoPolicyVersion, -5)}), kInvalidArgument,
                  "negative token_length");
  TQ_EXPECT_ERROR(client_->CreateRows("p", {Tags(-7)}), kInvalidArgument, "group_id -7");
  CreateRowsRequest keyed{"p", {Tags(), Tags()}, {"k"}, {}};
  TQ_EXPECT_ERROR(controller().CreateRows(keyed), kInvalidArgument, "1 keys for 2 rows");
  keyed.keys = {"k", "k"};
  TQ_EXPECT_ERROR(controller().CreateRows(keyed), kInvalidArgument, "key 'k' appears twice");
  CreateRowsRequest negative{"p", {Tags()}, {}, {true, milliseconds(-1)}};
  TQ_EXPECT_ERROR(controller().CreateRows(negative), kInvalidArgument, "wait.timeout is negative");
  RowTags many_tags;
  for (int i = 0; i < 65; ++i) many_tags.user.emplace(Numbered("t", i), std::string(1, 'v'));
  TQ_EXPECT_ERROR(client_->CreateRows("p", {many_tags}), kInvalidArgument, "65 user tags");

  TQ_ASSERT_OK(client_->CreatePartition("g4", 4));
  TQ_EXPECT_OK(client_->CreateRows("g4", {Tags(1), Tags(1), Tags(1)}).status());
  TQ_EXPECT_ERROR(client_->CreateRows("g4", {Tags(1), Tags(1)}), kFailedPrecondition,
                  "group 1 in partition 'g4' would have 5 rows; the partition's group_size is 4");
  EXPECT_EQ(controller().Stats()->rows, 3u) << "the refused rows were not created";
}

TEST_F(ControllerTest, BeginWriteValidatesAgainstTheSchema) {
  auto rows = client_->CreateRows("p", {Tags(), Tags()});
  ASSERT_TRUE(rows.ok());
  const RowId r0 = (*rows)[0], r1 = (*rows)[1];
  auto put = [&](const std::string& column, HostTensor t) { return client_->PutColumns({r0}, {{column, {t}}}); };
  TQ_EXPECT_ERROR(put("nope", I64({1})), kNotFound, "unknown column 'nope'");
  TQ_EXPECT_ERROR(put("prompt", F32Scalar(1)), kInvalidArgument, "dtype F32, column 'prompt' is I64");
  TQ_EXPECT_ERROR(put("reward", HostTensor::Copy(DType::kF32, {1}, "abcd", 4)), kInvalidArgument,
                  "shape [1], column 'reward' expects []");
  TQ_EXPECT_ERROR(put("mask", HostTensor::Copy(DType::kU8, {3}, "abc", 3)), kInvalidArgument,
                  "column 'mask' expects [4]");
  HostTensor bad_bytes = I64({1, 2});
  bad_bytes.nbytes = 8;
  TQ_EXPECT_ERROR(put("prompt", bad_bytes), kInvalidArgument, "nbytes 8 does not match shape [2]");
  TQ_EXPECT_ERROR(client_->PutColumns({r0, r1}, {{"prompt", {I64({1})}}}), kInvalidArgument,
                  "column 'prompt' has 1 tensors for 2 rows");
  TQ_EXPECT_ERROR(client_->PutColumns({r0, r0}, {{"prompt", {I64({1}), I64({1})}}}), kInvalidArgument,
                  "row " + std::to_string(r0) + " appears twice");
  TQ_EXPECT_ERROR(client_->PutColumns({999}, {{"prompt", {I64({1})}}}), kNotFound, "row 999 does not exist");
  TQ_EXPECT_ERROR(client_->PutColumns({r0}, {}), kInvalidArgument, "nothing to write");
  TQ_EXPECT_ERROR(client_->PutColumns({}, {}), kInvalidArgument, "no target rows");
  // The ragged first dimension takes any length, including 0.
  TQ_EXPECT_OK(put("prompt", I64({})));
  TQ_EXPECT_OK(put("response", I64(std::vector<int64_t>(1000, 3))));
  // Columns are written once.
  TQ_EXPECT_ERROR(put("prompt", I64({5})), kAlreadyExists, "column 'prompt' is already written");
  // Row outside the named partition.
  TQ_ASSERT_OK(client_->CreatePartition("other"));
  BeginWriteRequest wrong;
  wrong.partition = "other";
  wrong.rows = {r1};
  wrong.columns = {{"reward", {TensorMeta{DType::kF32, {}, 4}}}};
  TQ_EXPECT_ERROR(controller().BeginWrite(wrong), kInvalidArgument, "is in partition 'p', not 'other'");
  auto stats = client_->Stats();
  EXPECT_EQ(stats->controller.bytes_reserved, 0u) << "no refused write holds a reservation";
  EXPECT_EQ(stats->controller.open_writes, 0u);
}

TEST_F(ControllerTest, ConcurrentWritesOfTheSameCellAreRefused) {
  auto rows = client_->CreateRows("p", {Tags()});
  BeginWriteRequest begin;
  begin.rows = *rows;
  begin.columns = {{"reward", {TensorMeta{DType::kF32, {}, 4}}}};
  auto first = controller().BeginWrite(begin);
  ASSERT_TRUE(first.ok());
  TQ_EXPECT_ERROR(controller().BeginWrite(begin), kAlreadyExists, "is being written by another write");
  TQ_ASSERT_OK(controller().AbortWrite({first->write_id}));
  TQ_EXPECT_ERROR(controller().AbortWrite({first->write_id}), kNotFound, "is not open");
  TQ_EXPECT_ERROR(controller().CommitWrite({first->write_id}), kNotFound, "is not open");
  auto second = controller().BeginWrite(begin);
  ASSERT_TRUE(second.ok()) << "the abort freed the cell";
  TQ_EXPECT_OK(controller().CommitWrite({second->write_id}));
  EXPECT_EQ(controller().Stats()->bytes_committed, 4u);
}

// ---------------------------------------------------------------- GetMeta

TEST_F(ControllerTest, GetMetaValidation) {
  Put({Tags(), Tags()});
  auto get = [&](GetMetaRequest r) { return client_->GetMeta(r); };
  GetMetaRequest ok{"train", {"response"}, 1, "p", {}, milliseconds(0), milliseconds(0), ""};
  auto with = [&](auto fn) {
    GetMetaRequest r = ok;
    fn(r);
    return get(r);
  };
  TQ_EXPECT_ERROR(with([](auto& r) { r.n = 0; }), kInvalidArgument, "n must be > 0");
  TQ_EXPECT_ERROR(with([](auto& r) { r.n = 70000; }), kOutOfRange, "max_batch_rows");
  TQ_EXPECT_ERROR(with([](auto& r) { r.task = "nope"; }), kNotFound, "unknown task 'nope'");
  TQ_EXPECT_ERROR(with([](auto& r) { r.partition = "nope"; }), kNotFound, "unknown partition 'nope'");
  TQ_EXPECT_ERROR(with([](auto& r) { r.columns = {"nope"}; }), kNotFound, "unknown column 'nope'");
  TQ_EXPECT_ERROR(with([](auto& r) { r.columns = {}; }), kInvalidArgument, "no columns requested");
  TQ_EXPECT_ERROR(with([](auto& r) { r.columns = {"prompt", "prompt"}; }), kInvalidArgument, "listed twice");
  TQ_EXPECT_ERROR(with([](auto& r) { r.timeout = milliseconds(-1); }), kInvalidArgument, "timeout is negative");
  TQ_EXPECT_ERROR(with([](auto& r) { r.lease_timeout = milliseconds(-1); }), kInvalidArgument,
                  "lease_timeout is negative");
  TQ_EXPECT_ERROR(with([](auto& r) { r.lease_timeout = std::chrono::hours(24 * 8); }), kOutOfRange,
                  "exceeds the 7-day maximum");
  TQ_EXPECT_ERROR(with([](auto& r) { r.policy.min_policy_version = 3, r.policy.max_policy_version = 2; }),
                  kInvalidArgument, "min_policy_version 3 > max_policy_version 2");
  TQ_EXPECT_ERROR(with([](auto& r) { r.policy.dp_ranks = 0; }), kInvalidArgument, "dp_ranks must be >= 1");
  TQ_EXPECT_ERROR(with([](auto& r) { r.policy.dp_ranks = 2; }), kInvalidArgument, "dp_ranks 2 > 1 rows");
  TQ_EXPECT_ERROR(with([](auto& r) { r.policy.mode = SamplingMode::kWholeGroup; }), kInvalidArgument,
                  "needs a group size");
  TQ_EXPECT_ERROR(with([](auto& r) { r.policy.mode = SamplingMode::kWholeGroup, r.policy.group_size = 4, r.n = 6; }),
                  kInvalidArgument, "not a multiple of the group size 4");
  TQ_ASSERT_OK(client_->CreatePartition("g4", 4));
  TQ_EXPECT_ERROR(with([](auto& r) {
                    r.partition = "g4", r.policy.mode = SamplingMode::kWholeGroup, r.policy.group_size = 2, r.n = 4;
                  }),
                  kInvalidArgument, "group size mismatch: the request asks for groups of 2, partition 'g4' declares 4");
  // Not enough rows: Timeout with the count, even for timeout 0.
  TQ_EXPECT_ERROR(with([](auto& r) { r.n = 3; }), kTimeout, "only 2 of 3 rows eligible");
  EXPECT_EQ(controller().Stats()->active_leases, 0u);
}

TEST_F(ControllerTest, RowsAreReadyOnlyWhenEveryRequestedColumnIsCommitted) {
  auto rows = client_->CreateRows("p", {Tags(), Tags()});
  ASSERT_TRUE(rows.ok());
  TQ_EXPECT_ERROR(client_->GetMeta("train", {"prompt"}, 1, "p"), kTimeout, "only 0 of 1");
  TQ_ASSERT_OK(client_->PutColumns({(*rows)[0]}, {{"prompt", {I64({1})}}}));
  TQ_EXPECT_ERROR(client_->GetMeta("train", {"prompt", "reward"}, 1, "p"), kTimeout, "only 0 of 1");
  TQ_ASSERT_OK(client_->PutColumns({(*rows)[0]}, {{"reward", {F32Scalar(0.5)}}}));
  auto meta = client_->GetMeta("train", {"reward", "prompt"}, 1, "p");
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->row_ids(), (std::vector<RowId>{(*rows)[0]}));
  EXPECT_EQ(meta->columns, (std::vector<std::string>{"prompt", "reward"})) << "in registration order";
  // The other row has no prompt yet.
  TQ_EXPECT_ERROR(client_->GetMeta("train", {"prompt"}, 1, "p"), kTimeout, "only 0 of 1");
}

TEST_F(ControllerTest, EachTaskConsumesEachRowOnceIndependently) {
  const auto rows = Put({Tags(), Tags(), Tags()});
  auto train = client_->GetMeta("train", {"response"}, 3, "p");
  ASSERT_TRUE(train.ok());
  TQ_EXPECT_ERROR(client_->GetMeta("train", {"response"}, 1, "p"), kTimeout, "only 0 of 1");
  auto reward = client_->GetMeta("reward", {"prompt"}, 2, "p");
  ASSERT_TRUE(reward.ok()) << "another task still sees every row";
  auto stats = controller().Stats();
  ASSERT_EQ(stats->tasks.size(), 2u);
  EXPECT_EQ(stats->tasks[0].task, "reward");
  EXPECT_EQ(stats->tasks[0].ready, 1u);
  EXPECT_EQ(stats->tasks[0].leased, 2u);
  EXPECT_EQ(stats->tasks[1].leased, 3u);

  auto acked = client_->Ack(train->lease_id);
  ASSERT_TRUE(acked.ok());
  EXPECT_EQ(acked->rows_acked, 3u);
  EXPECT_EQ(acked->rows_freed, 0u) << "reward has not acked yet";
  acked = client_->Ack(reward->lease_id);
  EXPECT_EQ(acked->rows_freed, 2u);
  stats = controller().Stats();
  EXPECT_EQ(stats->rows, 1u);
  EXPECT_EQ(stats->tasks[1].acked, 1u);
  EXPECT_EQ(stats->tasks[1].acked_total, 3u) << "progress counts the freed rows too";
  EXPECT_EQ(stats->tasks[0].acked_total, 2u);
  EXPECT_EQ(stats->tasks[0].ready, 1u);
  EXPECT_EQ(stats->rows_freed, 2u);
  // A task registered now sees the row that is still alive.
  TQ_ASSERT_OK(client_->RegisterTask("ref"));
  auto ref = client_->GetMeta("ref", {"prompt"}, 1, "p");
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->rows[0].id, rows[2]);
}

TEST_F(ControllerTest, FifoIsOldestPolicyVersionFirstThenCreationOrder) {
  const auto rows = Put({Tags(kNoGroup, 2), Tags(kNoGroup, 1), Tags(kNoGroup, 2), Tags(kNoGroup, 0)});
  auto meta = client_->GetMeta("train", {"prompt"}, 4, "p");
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->row_ids(), (std::vector<RowId>{rows[3], rows[1], rows[0], rows[2]}));
}

TEST_F(ControllerTest, PolicyVersionFilter) {
  const auto rows = Put({Tags(kNoGroup, 1), Tags(kNoGroup, 2), Tags(kNoGroup, 3), Tags(kNoGroup, 4)});
  SamplingPolicy policy;
  policy.min_policy_version = 2;
  policy.max_policy_version = 3;
  auto meta = client_->GetMeta("train", {"prompt"}, 2, "p", policy);
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->row_ids(), (std::vector<RowId>{rows[1], rows[2]}));
  TQ_EXPECT_ERROR(client_->GetMeta("train", {"prompt"}, 1, "p", policy), kTimeout, "only 0 of 1");
  policy.max_policy_version = 100;
  meta = client_->GetMeta("train", {"prompt"}, 1, "p", policy);
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->rows[0].tags.policy_version, 4);
}

TEST_F(ControllerTest, WholeGroupsAreServedOnlyCompleteAndNeverSplit) {
  TQ_ASSERT_OK(client_->CreatePartition("g", 3));
  // Group 1 complete; group 2 has all rows but one lacks its response;
  // group 3 has only 2 of 3 rows created.
  auto g1 = client_->CreateRows("g", {Tags(1), Tags(1), Tags(1)});
  auto g2 = client_->CreateRows("g", {Tags(2), Tags(2), Tags(2)});
  auto g3 = client_->CreateRows("g", {Tags(3), Tags(3)});
  auto fill = [&](const std::vector<RowId>& rows) {
    std::vector<HostTensor> tokens(rows.size(), I64({7}));
    TQ_ASSERT_OK(client_->PutColumns(rows, {{"response", tokens}}));
  };
  fill(*g1);
  fill({(*g2)[0], (*g2)[2]});
  fill(*g3);
  SamplingPolicy whole;
  whole.mode = SamplingMode::kWholeGroup;
  auto meta = client_->GetMeta("train", {"response"}, 3, "g", whole);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->row_ids(), *g1);
  TQ_EXPECT_ERROR(client_->GetMeta("train", {"response"}, 3, "g", whole), kTimeout, "only 0 of 1 groups of 3");
  fill({(*g2)[1]});
  meta = client_->GetMeta("train", {"response"}, 6, "g", whole, milliseconds(0));
  TQ_EXPECT_ERROR(meta, kTimeout, "only 1 of 2 groups");
  meta = client_->GetMeta("train", {"response"}, 3, "g", whole);
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->row_ids(), *g2);
  // A released group becomes complete again.
  TQ_ASSERT_OK(client_->Release(meta->lease_id).status());
  meta = client_->GetMeta("train", {"response"}, 3, "g", whole);
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->row_ids(), *g2);
  // Group size per request on a partition without a declared size.
  auto loose = client_->CreateRows("p", {Tags(9), Tags(9)});
  fill(*loose);
  SamplingPolicy two = whole;
  two.group_size = 2;
  meta = client_->GetMeta("reward", {"response"}, 2, "p", two);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->row_ids(), *loose);
}

TEST_F(ControllerTest, TokenBalancedSplitAcrossRanks) {
  std::vector<RowTags> tags;
  for (int64_t len : {100, 10, 60, 50, 20, 40}) tags.push_back(Tags(kNoGroup, kNoPolicyVersion, len));
  Put(tags);
  SamplingPolicy policy;
  policy.dp_ranks = 2;
  auto meta = client_->GetMeta("train", {"prompt"}, 6, "p", policy);
  ASSERT_TRUE(meta.ok());
  ASSERT_EQ(meta->rank.size(), 6u);
  int64_t sums[2] = {0, 0};
  for (size_t i = 0; i < 6; ++i) sums[meta->rank[i]] += meta->rows[i].tags.token_length;
  EXPECT_EQ(sums[0], 140);
  EXPECT_EQ(sums[1], 140);
  EXPECT_EQ(meta->RowsOfRank(0).size() + meta->RowsOfRank(1).size(), 6u);

  // Whole groups stay on one rank.
  TQ_ASSERT_OK(client_->CreatePartition("g", 2));
  std::vector<RowTags> grouped;
  for (GroupId g = 0; g < 4; ++g) {
    for (int i = 0; i < 2; ++i) grouped.push_back(Tags(g, kNoPolicyVersion, 10 * (g + 1)));
  }
  Put(grouped, "g");
  policy.mode = SamplingMode::kWholeGroup;
  meta = client_->GetMeta("train", {"prompt"}, 8, "g", policy);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  std::map<GroupId, std::set<uint32_t>> ranks_of_group;
  int64_t group_sums[2] = {0, 0};
  for (size_t i = 0; i < 8; ++i) {
    ranks_of_group[meta->rows[i].tags.group_id].insert(meta->rank[i]);
    group_sums[meta->rank[i]] += meta->rows[i].tags.token_length;
  }
  for (const auto& [g, ranks] : ranks_of_group) EXPECT_EQ(ranks.size(), 1u) << "group " << g << " split";
  EXPECT_EQ(group_sums[0], 100);  // {80, 20} and {60, 40}
  EXPECT_EQ(group_sums[1], 100);
}

TEST_F(ControllerTest, TagPatchesApplyAtCommitAndMoveRowsBetweenVersions) {
  auto rows = client_->CreateRows("p", {Tags(kNoGroup, 0)});
  RowTagPatch patch;
  patch.policy_version = 5;
  patch.token_length = 42;
  patch.user["source"] = "gsm8k";
  TQ_ASSERT_OK(client_->PutColumns(*rows, {{"response", {I64({1, 2})}}}, {patch}));
  SamplingPolicy policy;
  policy.min_policy_version = 5;
  auto meta = client_->GetMeta("train", {"response"}, 1, "p", policy);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->rows[0].tags.token_length, 42);
  EXPECT_EQ(meta->rows[0].tags.user.at("source"), "gsm8k");
}

// ---------------------------------------------------------------- leases

TEST_F(ControllerTest, ExpiredLeaseReturnsRowsAndRefusesTheLateAck) {
  Put({Tags(), Tags()});
  GetMetaRequest request{"train", {"prompt"}, 2, "p", {}, milliseconds(0), milliseconds(500), ""};
  auto meta = client_->GetMeta(request);
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->deadline, clock_->Now() + milliseconds(500));
  clock_->Advance(milliseconds(499));
  TQ_EXPECT_ERROR(client_->GetMeta(request), kTimeout, "only 0 of 2");
  clock_->Advance(milliseconds(1));
  auto again = client_->GetMeta(request);  // expiry is processed lazily by this call
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->row_ids(), meta->row_ids());
  EXPECT_NE(again->lease_id, meta->lease_id);
  TQ_EXPECT_ERROR(client_->Ack(meta->lease_id), kFailedPrecondition,
                  "lease " + std::to_string(meta->lease_id) + " expired at");
  TQ_EXPECT_ERROR(client_->Release(meta->lease_id), kFailedPrecondition, "expired at");
  auto acked = client_->Ack(again->lease_id);
  ASSERT_TRUE(acked.ok());
  EXPECT_EQ(acked->rows_acked, 2u);
  TQ_EXPECT_ERROR(client_->Ack(again->lease_id), kFailedPrecondition, "already acked");
  TQ_EXPECT_ERROR(client_->Ack(12345), kNotFound, "never granted");
  auto stats = controller().Stats();
  EXPECT_EQ(stats->leases_expired, 1u);
  EXPECT_EQ(stats->rows_redelivered, 2u);
  EXPECT_EQ(stats->leases_acked, 1u);
  EXPECT_EQ(stats->tasks[1].acked, 2u);
  EXPECT_EQ(stats->tasks[1].leased, 0u);
}

// A holder known to be gone: every lease it holds ends at once (its rows
// ready for others now, not at the deadline), nobody else's.
TEST_F(ControllerTest, ReleaseHolderEndsOnlyThatHoldersLeasesAtOnce) {
  Put({Tags(), Tags(), Tags(), Tags()});
  GetMetaRequest request{"train", {"prompt"}, 1, "p", {}, milliseconds(0), milliseconds(60000), "rollout-1/100"};
  auto first = client_->GetMeta(request);
  auto second = client_->GetMeta(request);
  request.holder = "rollout/200";
  auto other = client_->GetMeta(request);
  request.holder = "";
  auto anonymous = client_->GetMeta(request);
  ASSERT_TRUE(first.ok() && second.ok() && other.ok() && anonymous.ok());
  TQ_EXPECT_ERROR(client_->GetMeta(request), kTimeout, "only 0 of 1");

  auto released = controller().ReleaseHolder({"rollout-1/100"});
  ASSERT_TRUE(released.ok()) << released.status().ToString();
  EXPECT_EQ(released->leases_released, 2u);
  EXPECT_EQ(released->rows_returned, 2u);
  EXPECT_EQ(released->rows_cleared, 0u);
  // Their rows are ready again now, well before the 60 s deadline.
  request.n = 2;
  auto again = client_->GetMeta(request);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  std::vector<RowId> want = {first->row_ids()[0], second->row_ids()[0]};
  std::vector<RowId> got = again->row_ids();
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  TQ_EXPECT_ERROR(client_->Ack(first->lease_id), kFailedPrecondition, "released");
  // The other holders' leases stand; a second release finds nothing.
  TQ_ASSERT_OK(client_->Ack(other->lease_id).status());
  TQ_ASSERT_OK(client_->Ack(anonymous->lease_id).status());
  released = controller().ReleaseHolder({"rollout-1/100"});
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->leases_released, 0u);
  EXPECT_EQ(controller().Stats()->leases_released, 2u);
  // Bad input: an empty holder, one longer than a name may be.
  TQ_EXPECT_ERROR(controller().ReleaseHolder({""}), kInvalidArgument, "holder is empty");
  request.holder = std::string(kMaxNameBytes + 1, 'h');
  TQ_EXPECT_ERROR(client_->GetMeta(request), kInvalidArgument, "holder is 257 bytes");
}

// A released holder is fenced: a GetMeta it sent before it died (waiting in
// the controller, or arriving late) leases nothing, so the rows it would
// have taken stay with the living instead of waiting out a lease nobody
// renews. The fence ends after kHolderFence.
TEST_F(ControllerTest, AReleasedHolderIsFencedFromGetMeta) {
  GetMetaRequest request{"train", {"prompt"}, 1, "p", {}, milliseconds(5000), milliseconds(600000), "reward/8"};
  Status waiter_status;
  std::thread waiter([&] { waiter_status = client_->GetMeta(request).status(); });
  while (controller().Stats()->waiting_consumers == 0) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  auto released = controller().ReleaseHolder({"reward/8"});
  waiter.join();
  ASSERT_TRUE(released.ok()) << released.status().ToString();
  EXPECT_EQ(released->leases_released, 0u);
  EXPECT_EQ(waiter_status.code(), StatusCode::kFailedPrecondition) << waiter_status.ToString();
  EXPECT_NE(waiter_status.message().find("holder 'reward/8' was released as gone"), std::string::npos)
      << waiter_status.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4)) << "woken, not timed out";
  // A late request under that name gets nothing either; the row it would
  // have taken goes to someone else.
  Put({Tags()});
  request.timeout = milliseconds(0);
  TQ_EXPECT_ERROR(client_->GetMeta(request), kFailedPrecondition, "released as gone");
  request.holder = "reward/9";
  auto other = client_->GetMeta(request);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  TQ_ASSERT_OK(client_->Ack(other->lease_id).status());
  // The fence ends.
  Put({Tags()});
  request.holder = "reward/8";
  clock_->Advance(kHolderFence - milliseconds(1));
  TQ_EXPECT_ERROR(client_->GetMeta(request), kFailedPrecondition, "released as gone");
  clock_->Advance(milliseconds(1));
  TQ_ASSERT_OK(client_->GetMeta(request).status());
}

// A renewed lease lives past its first deadline; one that is no longer
// renewed expires at the last deadline it was given.
TEST_F(ControllerTest, RenewMovesTheDeadline) {
  Put({Tags()});
  GetMetaRequest request{"train", {"prompt"}, 1, "p", {}, milliseconds(0), milliseconds(500), ""};
  auto meta = client_->GetMeta(request);
  ASSERT_TRUE(meta.ok());
  for (int i = 0; i < 3; ++i) {
    clock_->Advance(milliseconds(400));
    auto renewed = client_->Renew(meta->lease_id, milliseconds(500));
    ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
    EXPECT_EQ(renewed->deadline, clock_->Now() + milliseconds(500));
  }
  clock_->Advance(milliseconds(499));  // 1.7 s after the grant: still held
  TQ_EXPECT_ERROR(client_->GetMeta(request), kTimeout, "only 0 of 1");
  clock_->Advance(milliseconds(1));
  auto again = client_->GetMeta(request);
  ASSERT_TRUE(again.ok()) << "the lease expired at its last deadline";
  EXPECT_EQ(again->row_ids(), meta->row_ids());
  TQ_EXPECT_ERROR(client_->Renew(meta->lease_id, milliseconds(500)), kFailedPrecondition, "expired at");
  // A shorter timeout brings the deadline forward; 0 is the default lease.
  auto sooner = client_->Renew(again->lease_id, milliseconds(10));
  ASSERT_TRUE(sooner.ok());
  EXPECT_EQ(sooner->deadline, clock_->Now() + milliseconds(10));
  auto by_default = client_->Renew(again->lease_id);
  ASSERT_TRUE(by_default.ok());
  EXPECT_EQ(by_default->deadline, clock_->Now() + testing::DefaultHubOptions().controller.default_lease_timeout);
  TQ_EXPECT_ERROR(client_->Renew(again->lease_id, milliseconds(-1)), kInvalidArgument, "lease_timeout");
  TQ_EXPECT_ERROR(client_->Renew(again->lease_id, kMaxLeaseTimeout + milliseconds(1)), kOutOfRange, "longest lease");
  TQ_ASSERT_OK(client_->Ack(again->lease_id).status());
  TQ_EXPECT_ERROR(client_->Renew(again->lease_id), kFailedPrecondition, "already acked");
  TQ_EXPECT_ERROR(client_->Renew(777), kNotFound, "never granted");
}

TEST_F(ControllerTest, ReleaseReturnsRowsNow) {
  const auto rows = Put({Tags(), Tags(), Tags()});
  auto meta = client_->GetMeta("train", {"prompt"}, 2, "p");
  ASSERT_TRUE(meta.ok());
  auto released = client_->Release(meta->lease_id);
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->rows_returned, 2u);
  TQ_EXPECT_ERROR(client_->Release(meta->lease_id), kFailedPrecondition, "was released");
  TQ_EXPECT_ERROR(client_->Ack(meta->lease_id), kFailedPrecondition, "was released");
  auto all = client_->GetMeta("train", {"prompt"}, 3, "p");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->row_ids(), rows) << "released rows keep their place in FIFO order";
}

TEST_F(ControllerTest, BlockedGetMetaWakesOnCommit) {
  std::thread producer([&] {
    std::this_thread::sleep_for(milliseconds(30));
    Put({Tags(), Tags()});
  });
  auto meta = client_->GetMeta("train", {"prompt"}, 2, "p", {}, milliseconds(5000));
  producer.join();
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->rows.size(), 2u);
}

TEST(ControllerRealClockTest, BlockedGetMetaWakesAtTheLeaseDeadline) {
  auto hub = testing::MakeHub();
  auto client = hub->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  ColumnBatch columns{{"prompt", {I64({1}), I64({2})}}};
  ASSERT_TRUE(client.PutRows("p", {Tags(), Tags()}, columns).ok());
  GetMetaRequest request{"train", {"prompt"}, 2, "p", {}, milliseconds(0), milliseconds(40), ""};
  auto dead = client.GetMeta(request);  // this consumer "dies": never acks
  ASSERT_TRUE(dead.ok());
  request.timeout = milliseconds(5000);
  const auto start = std::chrono::steady_clock::now();
  auto meta = client.GetMeta(request);  // nobody else calls: the waiter itself expires the lease
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->row_ids(), dead->row_ids());
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
}

TEST_F(ControllerTest, ClearWhileLeasedAndWhileWaiting) {
  const auto rows = Put({Tags(), Tags()});
  auto meta = client_->GetMeta("train", {"prompt"}, 1, "p");
  ASSERT_TRUE(meta.ok());
  auto before = client_->GetData(*meta);  // views taken before the clear
  ASSERT_TRUE(before.ok());
  Status waiter_status;
  std::thread waiter(
      [&] { waiter_status = client_->GetMeta("train", {"prompt"}, 5, "p", {}, milliseconds(5000)).status(); });
  while (controller().Stats()->waiting_consumers == 0) std::this_thread::yield();
  const auto waiting = controller().Stats();
  ASSERT_TRUE(waiting.ok());
  for (const TaskDepth& d : waiting->tasks) {
    EXPECT_EQ(d.waiting, d.task == "train" ? 1u : 0u) << "demand is per task: " << d.task;
  }
  auto cleared = client_->ClearPartition("p");
  waiter.join();
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(cleared->rows_cleared, 2u);
  EXPECT_EQ(waiter_status.code(), StatusCode::kNotFound) << waiter_status.ToString();
  EXPECT_NE(waiter_status.message().find("cleared while waiting"), std::string::npos);
  EXPECT_EQ(testing::ToI64(before->columns["prompt"][0]), (std::vector<int64_t>{0})) << "views outlive the clear";
  // Reading the cleared rows is NotFound; the lease's Ack succeeds and
  // reports them as cleared.
  TQ_EXPECT_ERROR(client_->GetData(*meta), kNotFound, "row " + std::to_string(meta->rows[0].id));
  auto acked = client_->Ack(meta->lease_id);
  ASSERT_TRUE(acked.ok()) << acked.status().ToString();
  EXPECT_EQ(acked->rows_acked, 0u);
  EXPECT_EQ(acked->rows_cleared, 1u);
  TQ_EXPECT_ERROR(client_->GetMeta("train", {"prompt"}, 1, "p"), kNotFound, "unknown partition 'p'");
  TQ_EXPECT_ERROR(client_->ClearPartition("p"), kNotFound, "unknown partition");
  auto stats = client_->Stats();
  EXPECT_EQ(stats->controller.rows, 0u);
  EXPECT_EQ(stats->controller.bytes_held, 0u);
  EXPECT_EQ(stats->storage_bytes, 0u);
  // The partition can be created again; old row ids stay dead.
  TQ_ASSERT_OK(client_->CreatePartition("p"));
  const auto fresh = Put({Tags()});
  EXPECT_GT(fresh[0], rows[1]);
}

TEST_F(ControllerTest, CloseAbortsWaitersAndLaterCalls) {
  Status waiter_status;
  std::thread waiter(
      [&] { waiter_status = client_->GetMeta("train", {"prompt"}, 1, "p", {}, milliseconds(5000)).status(); });
  while (controller().Stats()->waiting_consumers == 0) std::this_thread::yield();
  controller().Close();
  waiter.join();
  EXPECT_EQ(waiter_status.code(), StatusCode::kAborted);
  TQ_EXPECT_ERROR(client_->CreateRows("p", {Tags()}), kAborted, "closed");
}

}  // namespace
}  // namespace sluice::transfer_queue
