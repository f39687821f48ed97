#include <gtest/gtest.h>

#include "sluice/transfer_queue/storage.h"
#include "test_util.h"

namespace sluice::transfer_queue {
namespace {

using testing::I64;
using testing::ToI64;

std::shared_ptr<StorageUnit> MakeUnit(std::shared_ptr<StorageMeter> meter = nullptr, uint64_t max_tensor = 1 << 20) {
  return NewInProcessStorageUnit(StorageUnitOptions{1, max_tensor, std::move(meter), nullptr});
}

TEST(StorageUnitTest, WriteThenReadGivesZeroCopyViewsThatOutliveTheRow) {
  auto meter = std::make_shared<StorageMeter>();
  auto unit = MakeUnit(meter);
  TQ_ASSERT_OK(unit->Write({7, {{1, "a", I64({1, 2, 3})}, {2, "a", I64({4})}, {1, "b", I64({})}}}));
  TQ_EXPECT_ERROR(unit->Read({{2, 1}, {"a", "b"}}), kNotFound, "row 2 has no column 'b'");
  auto read = unit->Read({{2, 1}, {"a"}});
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->tensors.size(), 1u);
  EXPECT_EQ(ToI64(read->tensors[0][0]), (std::vector<int64_t>{4}));
  EXPECT_EQ(ToI64(read->tensors[0][1]), (std::vector<int64_t>{1, 2, 3}));
  auto b = unit->Read({{1}, {"b", "a"}});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->tensors[0][0].shape, (std::vector<int64_t>{0}));
  EXPECT_EQ(b->tensors[1][0].data, read->tensors[0][1].data);
  // Zero copy: a second read points at the same bytes.
  auto again = unit->Read({{1}, {"a"}});
  EXPECT_EQ(again->tensors[0][0].data, read->tensors[0][1].data);
  EXPECT_EQ(meter->bytes.load(), 32u);
  EXPECT_EQ(meter->peak_bytes.load(), 32u);

  TQ_ASSERT_OK(unit->FreeRows({{1, 2}}));
  EXPECT_EQ(meter->bytes.load(), 0u);
  EXPECT_EQ(meter->peak_bytes.load(), 32u);
  EXPECT_EQ(ToI64(read->tensors[0][1]), (std::vector<int64_t>{1, 2, 3})) << "the view keeps its bytes alive";
  auto gone = unit->Read({{1}, {"a"}});
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("row 1 has no column 'a'"), std::string::npos) << gone.status().ToString();
  TQ_EXPECT_OK(unit->FreeRows({{1, 2}}));  // idempotent
}

TEST(StorageUnitTest, WriteIsAllOrNothing) {
  auto unit = MakeUnit();
  TQ_ASSERT_OK(unit->Write({1, {{1, "a", I64({1})}}}));
  // The second item collides: nothing of this write is stored.
  TQ_EXPECT_ERROR(unit->Write({2, {{2, "a", I64({2})}, {1, "a", I64({3})}}}), kAlreadyExists,
                  "row 1 column 'a' is already stored");
  EXPECT_EQ(unit->Read({{2}, {"a"}}).status().code(), StatusCode::kNotFound);
  TQ_EXPECT_ERROR(unit->Write({3, {{5, "a", I64({1})}, {5, "a", I64({1})}}}), kAlreadyExists, "appears twice");
  auto stats = unit->Stats();
  EXPECT_EQ(stats->tensors, 1u);
  EXPECT_EQ(stats->bytes, 8u);
}

TEST(StorageUnitTest, RejectsMalformedTensors) {
  auto unit = MakeUnit(nullptr, /*max_tensor=*/64);
  HostTensor t = I64({1, 2});
  t.nbytes = 12;
  TQ_EXPECT_ERROR(unit->Write({1, {{1, "a", t}}}), kInvalidArgument, "nbytes 12 does not match shape [2]");
  HostTensor null_data = I64({1});
  null_data.data = nullptr;
  TQ_EXPECT_ERROR(unit->Write({1, {{1, "a", null_data}}}), kInvalidArgument, "data is null");
  TQ_EXPECT_ERROR(unit->Write({1, {{1, "", I64({1})}}}), kInvalidArgument, "column name is empty");
  TQ_EXPECT_ERROR(unit->Write({1, {{1, "a", I64(std::vector<int64_t>(9, 0))}}}), kOutOfRange, "max_tensor_bytes");
  HostTensor negative = I64({1});
  negative.shape = {-1};
  TQ_EXPECT_ERROR(unit->Write({1, {{1, "a", negative}}}), kInvalidArgument, "negative dimension");
  EXPECT_EQ(unit->Stats()->bytes, 0u);
}

TEST(StorageUnitTest, DiscardDropsOnlyTheNamedCells) {
  auto meter = std::make_shared<StorageMeter>();
  auto unit = MakeUnit(meter);
  TQ_ASSERT_OK(unit->Write({1, {{1, "a", I64({1})}, {1, "b", I64({2})}, {2, "a", I64({3})}}}));
  TQ_ASSERT_OK(unit->Discard({{1, 3}, {"a"}}));
  EXPECT_EQ(unit->Read({{1}, {"a"}}).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(unit->Read({{1}, {"b"}}).ok());
  EXPECT_TRUE(unit->Read({{2}, {"a"}}).ok());
  EXPECT_EQ(meter->bytes.load(), 16u);
  TQ_EXPECT_OK(unit->Discard({{1}, {"a"}}));  // idempotent
  EXPECT_EQ(unit->Stats()->rows, 2u);
}

}  // namespace
}  // namespace sluice::transfer_queue
