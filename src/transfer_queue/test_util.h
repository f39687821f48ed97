// Helpers shared by the TransferQueue unit tests.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_TEST_UTIL_H_
#define SLUICE_SRC_TRANSFER_QUEUE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/testing/status_macros.h"
#include "sluice/common/host_tensor.h"
#include "sluice/transfer_queue/client.h"

namespace sluice::transfer_queue::testing {

// (The TransferQueue tests' names for common/testing/status_macros.h's checks.)
#define TQ_ASSERT_OK SLUICE_ASSERT_OK
#define TQ_EXPECT_OK SLUICE_EXPECT_OK
#define TQ_EXPECT_ERROR SLUICE_EXPECT_ERROR
using ::sluice::status_testing::StatusOf;

inline HostTensor I64(std::vector<int64_t> values) {
  return HostTensor::Copy(DType::kI64, {static_cast<int64_t>(values.size())}, values.data(),
                          values.size() * sizeof(int64_t));
}
inline HostTensor F32Scalar(float v) { return HostTensor::Copy(DType::kF32, {}, &v, sizeof(v)); }

inline std::vector<int64_t> ToI64(const HostTensor& t) {
  std::vector<int64_t> out(t.nbytes / sizeof(int64_t));
  if (!out.empty()) std::memcpy(out.data(), t.data, t.nbytes);
  return out;
}
inline float ToF32(const HostTensor& t) {
  float v = 0;
  std::memcpy(&v, t.data, sizeof(v));
  return v;
}

// prompt/response: ragged I64 tokens; reward: F32 scalar; mask: fixed [4] U8.
inline std::vector<ColumnSchema> DefaultColumns() {
  return {{"prompt", DType::kI64, {kRaggedDim}},
          {"response", DType::kI64, {kRaggedDim}},
          {"reward", DType::kF32, {}},
          {"mask", DType::kU8, {4}}};
}

inline HubOptions DefaultHubOptions() {
  HubOptions options;
  options.controller.columns = DefaultColumns();
  options.controller.tasks = {"reward", "train"};
  options.storage_units = 3;
  return options;
}

inline std::unique_ptr<TransferQueueHub> MakeHub(HubOptions options = DefaultHubOptions()) {
  auto hub = TransferQueueHub::Create(std::move(options));
  EXPECT_TRUE(hub.ok()) << hub.status().ToString();
  return std::move(hub).value();
}

inline RowTags Tags(GroupId group = kNoGroup, PolicyVersion version = kNoPolicyVersion, int64_t tokens = 0) {
  RowTags t;
  t.group_id = group;
  t.policy_version = version;
  t.token_length = tokens;
  return t;
}

}  // namespace sluice::transfer_queue::testing

#endif  // SLUICE_SRC_TRANSFER_QUEUE_TEST_UTIL_H_
