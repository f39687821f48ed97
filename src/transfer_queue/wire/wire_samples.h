// Sample values of every wire message body, with every field set to a
// non-default value: the round-trip tests compare them field by field and
// the fuzzers start from their encodings.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_WIRE_SAMPLES_H_
#define SLUICE_SRC_TRANSFER_QUEUE_WIRE_SAMPLES_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "wire/wire.h"

namespace sluice::transfer_queue::wire::testing {

// The clock reading used to encode and decode samples (BatchMeta deadlines).
inline TimePoint SampleNow() { return TimePoint(std::chrono::hours(100)); }

inline HostTensor SampleTensor(int seed, size_t n) {
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = seed * 1000 + static_cast<int64_t>(i);
  return HostTensor::Copy(DType::kI64, {static_cast<int64_t>(n)}, v.data(), n * sizeof(int64_t));
}

inline RowTags SampleTags(int seed) {
  RowTags t;
  t.group_id = 10 + seed;
  t.policy_version = 3 + seed;
  t.token_length = 100 + seed;
  t.user = {{"source", "gsm8k"}, {"idx", std::to_string(seed)}};
  return t;
}

inline void MakeSample(Empty*) {}
inline void MakeSample(ServerInfo* v) {
  v->storage_units = 3;
  v->max_message_bytes = 1 << 20;
  v->max_batch_rows = 512;
  v->max_tensor_bytes = 1 << 16;
  v->token_required = true;
  v->shm_segment = "/sluice.tq.123-456.0";
  v->shm_data_bytes = 1 << 20;
  v->shm_rings = 64;
  v->direct_port = 40001;
  v->unit_hosts = {{1, 2, "tcp://10.0.0.2:40100"}, {3, 1, "tcp://10.0.0.3:40100"}};
}
inline void MakeSample(RingInfo* v) {
  v->name = "/sluice.tqring.123-456.7";
  v->capacity = 1 << 18;
}
inline void MakeSample(RegisterColumnsRequest* v) {
  v->columns = {{"prompt", DType::kI64, {kRaggedDim}}, {"reward", DType::kF32, {}}, {"mask", DType::kU8, {4, 2}}};
}
inline void MakeSample(RegisterTaskRequest* v) { v->task = "reward"; }
inline void MakeSample(DescribeResponse* v) {
  v->columns = {{"prompt", DType::kI64, {kRaggedDim}}, {"reward", DType::kBF16, {}}};
  v->tasks = {"reward", "train"};
}
inline void MakeSample(CreatePartitionRequest* v) {
  v->partition = "step-7";
  v->group_size = 4;
}
inline void MakeSample(CreatePartitionResponse* v) { v->created = true; }
inline void MakeSample(CreateRowsRequest* v) {
  v->partition = "step-7";
  v->rows = {SampleTags(1), SampleTags(2)};
  v->keys = {"a", "b"};
  v->wait = CapacityWait{false, std::chrono::milliseconds(250)};
}
inline void MakeSample(CreateRowsResponse* v) { v->rows = {5, 6, 1u << 31}; }
inline void MakeSample(BeginWriteRequest* v) {
  v->partition = "step-7";
  v->target = WriteTarget::kKeys;
  v->rows = {1, 2};
  v->new_rows = {SampleTags(3), SampleTags(4)};
  v->keys = {"k1", "k2"};
  RowTagPatch patch;
  patch.policy_version = 9;
  patch.user = {{"judge", "ok"}};
  RowTagPatch patch2;
  patch2.token_length = 77;
  v->patches = {patch, patch2};
  v->columns = {{"prompt", {TensorMeta{DType::kI64, {3}, 24}, TensorMeta{DType::kI64, {0}, 0}}},
                {"reward", {TensorMeta{DType::kF32, {}, 4}, TensorMeta{DType::kF32, {}, 4}}}};
  v->wait = CapacityWait{true, std::chrono::milliseconds(1500)};
}
inline void MakeSample(BeginWriteResponse* v) {
  v->write_id = 42;
  v->rows = {7, 8};
  v->reserved_bytes = 4096;
}
inline void MakeSample(CommitWriteRequest* v) { v->write_id = 42; }
inline void MakeSample(AbortWriteRequest* v) { v->write_id = 43; }
inline void MakeSample(GetMetaRequest* v) {
  v->task = "train";
  v->columns = {"prompt", "response"};
  v->n = 8;
  v->partition = "step-7";
  v->policy.mode = SamplingMode::kWholeGroup;
  v->policy.group_size = 4;
  v->policy.min_policy_version = 2;
  v->policy.max_policy_version = 5;
  v->policy.dp_ranks = 2;
  v->timeout = std::chrono::milliseconds(300);
  v->lease_timeout = std::chrono::milliseconds(60000);
  v->holder = "rollout-1/4242";
}
inline void MakeSample(BatchMeta* v) {
  v->lease_id = 17;
  v->task = "train";
  v->partition = "step-7";
  v->columns = {"prompt", "response"};
  v->rows = {RowMeta{1, SampleTags(1)}, RowMeta{2, SampleTags(2)}};
  v->rank = {1, 0};
  v->dp_ranks = 2;
  v->deadline = SampleNow() + std::chrono::milliseconds(2500);
}
inline void MakeSample(AckRequest* v) { v->lease_id = 17; }
inline void MakeSample(ReleaseRequest* v) { v->lease_id = 18; }
inline void MakeSample(RenewRequest* v) {
  v->lease_id = 19;
  v->lease_timeout = std::chrono::milliseconds(30000);
}
inline void MakeSample(ReleaseHolderRequest* v) { v->holder = "reward-2/31337"; }
inline void MakeSample(DeclareWriteRequest* v) {
  v->write_id = 41;
  v->rows = {7, 8};
  v->columns = {{"response", {{DType::kI32, {3}, 12}, {DType::kI32, {1}, 4}}}};
}
inline void MakeSample(ReleaseHolderResponse* v) {
  v->leases_released = 2;
  v->rows_returned = 7;
  v->rows_cleared = 1;
}
inline void MakeSample(RenewResponse* v) { v->deadline = SampleNow() + std::chrono::milliseconds(30000); }
inline void MakeSample(ReclaimTicket* v) {
  v->id = 3;
  v->rows = {1, 2, 3};
  v->bytes = 96;
}
inline void MakeSample(AckResponse* v) {
  v->rows_acked = 6;
  v->rows_cleared = 2;
  v->rows_freed = 3;
  MakeSample(&v->reclaim);
}
inline void MakeSample(ReleaseResponse* v) {
  v->rows_returned = 5;
  v->rows_cleared = 1;
}
inline void MakeSample(ClearPartitionRequest* v) { v->partition = "step-6"; }
inline void MakeSample(ClearResponse* v) {
  v->rows_cleared = 9;
  MakeSample(&v->reclaim);
}
inline void MakeSample(KvLookupRequest* v) {
  v->partition = "kv";
  v->keys = {"a", "b"};
}
inline void MakeSample(KvListRequest* v) { v->partition = "kv"; }
inline void MakeSample(KvClearRequest* v) {
  v->partition = "kv";
  v->keys = {"c"};
}
inline void MakeSample(KvEntries* v) {
  *v = {KvEntry{"a", 11, SampleTags(5), {"prompt"}}, KvEntry{"b", 12, SampleTags(6), {"prompt", "reward"}}};
}
inline void MakeSample(FinishReclaimRequest* v) { v->reclaim_id = 3; }
inline void MakeSample(ControllerStats* v) {
  uint64_t x = 1;
  for (uint64_t* f : {&v->rows,
                      &v->capacity_rows,
                      &v->bytes_held,
                      &v->bytes_committed,
                      &v->bytes_reserved,
                      &v->bytes_reclaiming,
                      &v->capacity_bytes,
                      &v->partitions,
                      &v->active_leases,
                      &v->open_writes,
                      &v->waiting_consumers,
                      &v->waiting_producers,
                      &v->rows_created,
                      &v->rows_freed,
                      &v->leases_granted,
                      &v->leases_acked,
                      &v->leases_released,
                      &v->leases_expired,
                      &v->rows_redelivered,
                      &v->writes_committed,
                      &v->writes_aborted}) {
    *f = x++;
  }
  v->tasks = {TaskDepth{"reward", 1, 2, 3}, TaskDepth{"train", 4, 5, 6}};
}
inline void MakeSample(StorageWriteRequest* v) {
  v->write_id = 42;
  v->items = {StorageItem{7, "prompt", SampleTensor(1, 3)}, StorageItem{8, "prompt", SampleTensor(2, 0)},
              StorageItem{7, "reward", HostTensor::Copy(DType::kF32, {}, "\0\0\x80?", 4)}};
}
inline void MakeSample(StorageReadRequest* v) {
  v->rows = {7, 8};
  v->columns = {"prompt"};
}
inline void MakeSample(StorageReadResponse* v) {
  v->tensors = {{SampleTensor(1, 3), SampleTensor(2, 5)}, {HostTensor::Copy(DType::kU8, {2}, "ab", 2)}};
}
inline void MakeSample(StorageDiscardRequest* v) {
  v->rows = {7};
  v->columns = {"prompt", "reward"};
}
inline void MakeSample(StorageFreeRequest* v) { v->rows = {7, 8, 9}; }
inline void MakeSample(StorageStats* v) {
  v->unit = 2;
  v->rows = 3;
  v->tensors = 4;
  v->bytes = 5;
}
inline void MakeSample(ShmWriteRequest* v) {
  v->write_id = 44;
  v->items = {ShmWriteItem{7, "prompt", TensorMeta{DType::kI64, {3}, 24}},
              ShmWriteItem{8, "reward", TensorMeta{DType::kF32, {}, 4}}};
}
inline void MakeSample(ShmWriteReply* v) { v->offsets = {0, 64, uint64_t{1} << 40}; }
inline void MakeSample(ShmReadReply* v) {
  v->cells = {{ShmCell{128, TensorMeta{DType::kI64, {3}, 24}}, ShmCell{192, TensorMeta{DType::kI64, {0}, 0}}},
              {ShmCell{256, TensorMeta{DType::kU8, {2}, 2}}}};
}

inline void MakeSample(PutRequest* v) {
  MakeSample(&v->begin);
  v->data = {{SampleTensor(1, 3), SampleTensor(2, 0)}, {SampleTensor(3, 1)}};
}
inline void MakeSample(TakeRequest* v) {
  v->ack = 91;
  MakeSample(&v->get);
  v->columns = {"response"};
  v->in_place = true;
}
inline void MakeSample(TakeReply* v) {
  MakeSample(&v->meta);
  v->in_place = true;
  v->cells = {{ShmCell{64, TensorMeta{DType::kI64, {3}, 24}}}, {ShmCell{0, TensorMeta{DType::kU8, {0}, 0}}}};
}

template <typename T>
T Sample() {
  T v{};
  MakeSample(&v);
  return v;
}

inline constexpr char kSampleToken[] = "sample-token";

// One valid request, reply and error reply of every message type.
inline std::vector<Message> SampleMessages() {
  std::vector<Message> out;
  uint64_t id = 1;
#define SLUICE_TQ_SAMPLE_(name, number, req, rep)                                                         \
  out.push_back(EncodeRequest(MessageType::k##name, IsStorageMessage(MessageType::k##name) ? 1 : 0, id++, \
                              kSampleToken, Sample<req>(), SampleNow()));                                 \
  out.push_back(EncodeReply(MessageType::k##name, id++, Sample<rep>(), SampleNow()));                     \
  out.push_back(EncodeErrorReply(MessageType::k##name, id++, Status::NotFound("sample " #name)));
  SLUICE_TQ_WIRE_MESSAGES(SLUICE_TQ_SAMPLE_)
#undef SLUICE_TQ_SAMPLE_
  return out;
}

}  // namespace sluice::transfer_queue::wire::testing

#endif  // SLUICE_SRC_TRANSFER_QUEUE_WIRE_SAMPLES_H_
