#include "wire/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "test_util.h"
#include "wire/wire_samples.h"

// Field-by-field equality for the round-trip tests (the structs do not
// define it; tensors compare by dtype, shape and bytes).
namespace sluice {
inline bool operator==(const HostTensor& a, const HostTensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes &&
         (a.nbytes == 0 || std::memcmp(a.data, b.data, a.nbytes) == 0);
}
}  // namespace sluice

namespace sluice::transfer_queue {
#define TQ_TIED_EQ_(T, ...)                                      \
  inline bool operator==(const T& a, const T& b) {               \
    auto tie = [](const T& v) { return std::tie(__VA_ARGS__); }; \
    return tie(a) == tie(b);                                     \
  }
TQ_TIED_EQ_(RowTagPatch, v.policy_version, v.token_length, v.user)
TQ_TIED_EQ_(SamplingPolicy, v.mode, v.group_size, v.min_policy_version, v.max_policy_version, v.dp_ranks)
TQ_TIED_EQ_(RowMeta, v.id, v.tags)
TQ_TIED_EQ_(BatchMeta, v.lease_id, v.task, v.partition, v.columns, v.rows, v.rank, v.dp_ranks, v.deadline)
TQ_TIED_EQ_(TaskDepth, v.task, v.ready, v.leased, v.acked, v.acked_total, v.waiting)
TQ_TIED_EQ_(ControllerStats, v.rows, v.capacity_rows, v.bytes_held, v.bytes_committed, v.bytes_reserved,
            v.bytes_reclaiming, v.capacity_bytes, v.partitions, v.active_leases, v.open_writes, v.waiting_consumers,
            v.waiting_producers, v.tasks, v.rows_created, v.rows_freed, v.leases_granted, v.leases_acked,
            v.leases_released, v.leases_expired, v.rows_redelivered, v.writes_committed, v.writes_aborted)
TQ_TIED_EQ_(StorageStats, v.unit, v.rows, v.tensors, v.bytes)
TQ_TIED_EQ_(CapacityWait, v.block, v.timeout)
TQ_TIED_EQ_(RegisterColumnsRequest, v.columns)
TQ_TIED_EQ_(RegisterTaskRequest, v.task)
TQ_TIED_EQ_(CreatePartitionRequest, v.partition, v.group_size, v.consumers)
TQ_TIED_EQ_(CreatePartitionResponse, v.created)
TQ_TIED_EQ_(DescribeResponse, v.columns, v.tasks)
TQ_TIED_EQ_(CreateRowsRequest, v.partition, v.rows, v.keys, v.wait)
TQ_TIED_EQ_(CreateRowsResponse, v.rows)
TQ_TIED_EQ_(ColumnWriteMeta, v.column, v.rows)
TQ_TIED_EQ_(BeginWriteRequest, v.partition, v.target, v.rows, v.new_rows, v.keys, v.patches, v.columns, v.wait)
TQ_TIED_EQ_(BeginWriteResponse, v.write_id, v.rows, v.reserved_bytes)
TQ_TIED_EQ_(CommitWriteRequest, v.write_id)
TQ_TIED_EQ_(AbortWriteRequest, v.write_id)
TQ_TIED_EQ_(GetMetaRequest, v.task, v.columns, v.n, v.partition, v.policy, v.timeout, v.lease_timeout, v.holder)
TQ_TIED_EQ_(AckRequest, v.lease_id)
TQ_TIED_EQ_(ReleaseRequest, v.lease_id)
TQ_TIED_EQ_(RenewRequest, v.lease_id, v.lease_timeout)
TQ_TIED_EQ_(RenewResponse, v.deadline)
TQ_TIED_EQ_(ReleaseHolderRequest, v.holder)
TQ_TIED_EQ_(ReleaseHolderResponse, v.leases_released, v.rows_returned, v.rows_cleared)
TQ_TIED_EQ_(ReclaimTicket, v.id, v.rows, v.bytes)
TQ_TIED_EQ_(AckResponse, v.rows_acked, v.rows_cleared, v.rows_freed, v.reclaim)
TQ_TIED_EQ_(ReleaseResponse, v.rows_returned, v.rows_cleared)
TQ_TIED_EQ_(ClearPartitionRequest, v.partition)
TQ_TIED_EQ_(ClearResponse, v.rows_cleared, v.reclaim)
TQ_TIED_EQ_(KvLookupRequest, v.partition, v.keys)
TQ_TIED_EQ_(KvListRequest, v.partition)
TQ_TIED_EQ_(KvClearRequest, v.partition, v.keys)
TQ_TIED_EQ_(KvEntry, v.key, v.row, v.tags, v.columns)
TQ_TIED_EQ_(FinishReclaimRequest, v.reclaim_id)
TQ_TIED_EQ_(StorageItem, v.row, v.column, v.tensor)
TQ_TIED_EQ_(StorageWriteRequest, v.write_id, v.items)
TQ_TIED_EQ_(StorageReadRequest, v.rows, v.columns)
TQ_TIED_EQ_(StorageReadResponse, v.tensors)
TQ_TIED_EQ_(StorageDiscardRequest, v.rows, v.columns)
TQ_TIED_EQ_(StorageFreeRequest, v.rows)
namespace wire {
inline bool operator==(const Empty&, const Empty&) { return true; }
TQ_TIED_EQ_(UnitHost, v.first_unit, v.count, v.endpoint)
TQ_TIED_EQ_(ServerInfo, v.protocol_version, v.storage_units, v.max_message_bytes, v.max_batch_rows, v.max_tensor_bytes,
            v.token_required, v.shm_segment, v.shm_data_bytes, v.shm_rings, v.direct_port, v.unit_hosts)
TQ_TIED_EQ_(DeclareWriteRequest, v.write_id, v.rows, v.columns)
TQ_TIED_EQ_(RingInfo, v.name, v.capacity)
TQ_TIED_EQ_(ShmCell, v.offset, v.meta)
TQ_TIED_EQ_(ShmWriteItem, v.row, v.column, v.meta)
TQ_TIED_EQ_(ShmWriteRequest, v.write_id, v.items)
TQ_TIED_EQ_(ShmWriteReply, v.offsets)
TQ_TIED_EQ_(ShmReadReply, v.cells)
TQ_TIED_EQ_(PutRequest, v.begin, v.data)
TQ_TIED_EQ_(TakeRequest, v.ack, v.get, v.columns, v.in_place)
TQ_TIED_EQ_(TakeReply, v.meta, v.in_place, v.data, v.cells)
}  // namespace wire
#undef TQ_TIED_EQ_
}  // namespace sluice::transfer_queue

namespace sluice::transfer_queue::wire {
namespace {

using testing::kSampleToken;
using testing::Sample;
using testing::SampleNow;

WireLimits Limits() { return WireLimits{}; }

std::vector<std::byte> Bytes(const Message& m) { return {m.data.get(), m.data.get() + m.size}; }

template <typename T>
void ExpectRequestRoundTrip(MessageType type) {
  SCOPED_TRACE(MessageTypeName(type) + " request");
  const T sent = Sample<T>();
  const uint16_t target = IsStorageMessage(type) ? 2 : 0;
  Message m = EncodeRequest(type, target, 99, kSampleToken, sent, SampleNow());
  Result<Header> h = DecodeHeader(m.bytes(), Limits());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->type, type);
  EXPECT_EQ(h->target, target);
  EXPECT_EQ(h->request_id, 99u);
  EXPECT_FALSE(h->is_reply());
  EXPECT_EQ(h->body_bytes, m.size - kHeaderBytes);
  T got{};
  std::string token;
  TQ_ASSERT_OK(DecodeRequest(m.bytes(), *h, Limits(), nullptr, SampleNow(), &token, &got));
  EXPECT_EQ(token, kSampleToken);
  EXPECT_TRUE(got == sent);
  Result<std::string> only_token = DecodeRequestToken(m.bytes(), *h, Limits());
  ASSERT_TRUE(only_token.ok());
  EXPECT_EQ(*only_token, kSampleToken);
}

template <typename T>
void ExpectReplyRoundTrip(MessageType type) {
  SCOPED_TRACE(MessageTypeName(type) + " reply");
  const T sent = Sample<T>();
  Message m = EncodeReply(type, 1234, sent, SampleNow());
  Result<Header> h = DecodeHeader(m.bytes(), Limits());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->is_reply());
  EXPECT_FALSE(h->is_error());
  EXPECT_EQ(h->request_id, 1234u);
  T got{};
  TQ_ASSERT_OK(DecodeReply(m.bytes(), *h, Limits(), nullptr, SampleNow(), &got));
  EXPECT_TRUE(got == sent);
}

TEST(WireTest, EveryMessageTypeRoundTrips) {
#define TQ_ROUND_TRIP_(name, number, req, rep)       \
  ExpectRequestRoundTrip<req>(MessageType::k##name); \
  ExpectReplyRoundTrip<rep>(MessageType::k##name);
  SLUICE_TQ_WIRE_MESSAGES(TQ_ROUND_TRIP_)
#undef TQ_ROUND_TRIP_
}

TEST(WireTest, ErrorReplyCarriesCodeAndMessage) {
  for (StatusCode code : {StatusCode::kInvalidArgument, StatusCode::kTimeout, StatusCode::kNotFound,
                          StatusCode::kFailedPrecondition, StatusCode::kInternal}) {
    const Status sent(code, "lease 17 expired at 3600.250s");
    Message m = EncodeErrorReply(MessageType::kAck, 5, sent);
    Result<Header> h = DecodeHeader(m.bytes(), Limits());
    ASSERT_TRUE(h.ok());
    EXPECT_TRUE(h->is_error());
    EXPECT_EQ(DecodeErrorReply(m.bytes(), *h, Limits()), sent);
  }
  // Long messages are cut, not refused.
  Message m = EncodeErrorReply(MessageType::kAck, 5, Status::Internal(std::string(100000, 'x')));
  Result<Header> h = DecodeHeader(m.bytes(), Limits());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(DecodeErrorReply(m.bytes(), *h, Limits()).message().size(), kMaxErrorMessageBytes);
}

TEST(WireTest, LeaseDeadlineTravelsAsTimeRemaining) {
  BatchMeta meta = Sample<BatchMeta>();
  meta.deadline = SampleNow() + std::chrono::seconds(3);
  Message m = EncodeReply(MessageType::kGetMeta, 1, meta, SampleNow());
  Result<Header> h = DecodeHeader(m.bytes(), Limits());
  ASSERT_TRUE(h.ok());
  const TimePoint receiver_now = SampleNow() + std::chrono::hours(5);  // another clock
  BatchMeta got;
  TQ_ASSERT_OK(DecodeReply(m.bytes(), *h, Limits(), nullptr, receiver_now, &got));
  EXPECT_EQ(got.deadline, receiver_now + std::chrono::seconds(3));
}

TEST(WireTest, TensorsDecodeAsAlignedViewsOfTheOwner) {
  const StorageReadResponse sent = Sample<StorageReadResponse>();
  Message m = EncodeReply(MessageType::kStorageRead, 1, sent);
  Result<Header> h = DecodeHeader(m.bytes(), Limits());
  ASSERT_TRUE(h.ok());
  auto owner = std::make_shared<Message>(std::move(m));
  StorageReadResponse got;
  TQ_ASSERT_OK(DecodeReply(owner->bytes(), *h, Limits(), owner, SampleNow(), &got));
  ASSERT_TRUE(got == sent);
  const HostTensor& t = got.tensors[0][0];
  EXPECT_EQ(t.owner, owner);  // a view, no copy
  EXPECT_GE(t.data, owner->data.get());
  EXPECT_LT(t.data, owner->data.get() + owner->size);
  EXPECT_EQ((t.data - owner->data.get()) % 8, 0);  // 8-aligned in the message
  // Without an owner the decoder copies.
  StorageReadResponse copied;
  TQ_ASSERT_OK(DecodeReply(owner->bytes(), *h, Limits(), nullptr, SampleNow(), &copied));
  EXPECT_NE(copied.tensors[0][0].owner, owner);
  EXPECT_TRUE(copied == sent);
}

// Every proper prefix of every sample message fails with DataLoss: at the
// header if the frame is cut, in the body if the header is patched to match.
TEST(WireTest, TruncationAtEveryOffsetIsDataLoss) {
  for (const Message& full : testing::SampleMessages()) {
    const std::vector<std::byte> bytes = Bytes(full);
    Result<Header> h = DecodeHeader(full.bytes(), Limits());
    ASSERT_TRUE(h.ok());
    const std::string name = Describe(*h);
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      std::vector<std::byte> prefix(bytes.begin(), bytes.begin() + cut);
      Result<Header> ph = DecodeHeader(prefix, Limits());
      if (cut < 4) {
        EXPECT_EQ(ph.status().code(), StatusCode::kDataLoss) << name << " cut at " << cut;
        continue;
      }
      ASSERT_FALSE(ph.ok()) << name << " cut at " << cut;
      EXPECT_EQ(ph.status().code(), StatusCode::kDataLoss)
          << name << " cut at " << cut << ": " << ph.status().ToString();
      if (cut < kHeaderBytes) continue;
      // Patch body_bytes so the header is valid and the body is cut short.
      StoreU64(prefix.data() + 24, cut - kHeaderBytes);
      ph = DecodeHeader(prefix, Limits());
      ASSERT_TRUE(ph.ok()) << ph.status().ToString();
      Status s;
      if (h->is_error()) {
        s = DecodeErrorReply(prefix, *ph, Limits());
      } else {
        // Any body type of this message: decoding the cut body must fail.
        switch (h->type) {
#define TQ_CUT_CASE_(name_, number, req, rep)                                                    \
  case MessageType::k##name_: {                                                                  \
    std::string token;                                                                           \
    req rq{};                                                                                    \
    rep rp{};                                                                                    \
    s = h->is_reply() ? DecodeReply(prefix, *ph, Limits(), nullptr, SampleNow(), &rp)            \
                      : DecodeRequest(prefix, *ph, Limits(), nullptr, SampleNow(), &token, &rq); \
    break;                                                                                       \
  }
          SLUICE_TQ_WIRE_MESSAGES(TQ_CUT_CASE_)
#undef TQ_CUT_CASE_
        }
      }
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << name << " cut at " << cut << ": " << s.ToString();
      EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.ToString();
    }
  }
}

TEST(WireTest, HeaderChecks) {
  Message m = EncodeRequest(MessageType::kAck, 0, 1, "", AckRequest{3});
  std::vector<std::byte> bytes = Bytes(m);
  {
    auto bad = bytes;
    bad[0] = std::byte{'X'};
    TQ_EXPECT_ERROR(DecodeHeader(bad, Limits()), kInvalidArgument, "not a Sluice TransferQueue message: magic 0x");
  }
  {
    auto bad = bytes;
    StoreU16(bad.data() + 4, kProtocolVersion + 1);
    Result<Header> h = DecodeHeader(bad, Limits());
    TQ_EXPECT_ERROR(h, kUnimplemented,
                    "protocol version " + std::to_string(kProtocolVersion + 1) + " is not supported");
    TQ_EXPECT_ERROR(h, kUnimplemented, "speaks version " + std::to_string(kProtocolVersion));
  }
  {
    auto bad = bytes;
    StoreU16(bad.data() + 6, 999);
    TQ_EXPECT_ERROR(DecodeHeader(bad, Limits()), kInvalidArgument, "unknown message type 999");
  }
  {
    auto bad = bytes;
    StoreU16(bad.data() + 8, 0x10);
    TQ_EXPECT_ERROR(DecodeHeader(bad, Limits()), kInvalidArgument, "unknown flags");
  }
  {
    auto bad = bytes;
    StoreU16(bad.data() + 8, kFlagError);
    TQ_EXPECT_ERROR(DecodeHeader(bad, Limits()), kInvalidArgument, "error flag without reply flag");
  }
  {
    auto bad = bytes;
    StoreU16(bad.data() + 10, 1);
    TQ_EXPECT_ERROR(DecodeHeader(bad, Limits()), kInvalidArgument, "target 1 must be 0");
  }
  {
    auto bad = bytes;
    StoreU32(bad.data() + 12, 1);
    TQ_EXPECT_ERROR(DecodeHeader(bad, Limits()), kInvalidArgument, "reserved");
  }
  {
    auto bad = bytes;
    StoreU64(bad.data() + 24, 1u << 20);
    TQ_EXPECT_ERROR(DecodeHeader(bad, Limits()), kDataLoss, "header says 1048576 body bytes");
  }
  {
    auto bad = bytes;
    bad.push_back(std::byte{0});
    TQ_EXPECT_ERROR(DecodeHeader(bad, Limits()), kDataLoss, "body bytes");
  }
  WireLimits tiny;
  tiny.max_message_bytes = 40;
  TQ_EXPECT_ERROR(DecodeHeader(bytes, tiny), kInvalidArgument, "exceeds max_message_bytes 40");
}

// Builds a GetMeta request body by hand so counts and lengths can lie.
Message HandMadeGetMeta(uint32_t columns_count, uint32_t first_len, size_t actual_bytes) {
  WireWriter w;
  BeginMessage(w, MessageType::kGetMeta, 0, 0, 1);
  w.String("");  // token
  w.String("train");
  w.U32(columns_count);
  w.U32(first_len);
  for (size_t i = 0; i < actual_bytes; ++i) w.U8('c');
  return FinishMessage(w);
}

Status DecodeGetMeta(const Message& m, const WireLimits& limits = WireLimits{}) {
  Result<Header> h = DecodeHeader(m.bytes(), limits);
  if (!h.ok()) return h.status();
  GetMetaRequest request;
  std::string token;
  return DecodeRequest(m.bytes(), *h, limits, nullptr, SampleNow(), &token, &request);
}

TEST(WireTest, OversizedCountsAndLengthsAreRefusedBeforeAllocating) {
  TQ_EXPECT_ERROR(DecodeGetMeta(HandMadeGetMeta(1000, 1, 1)), kInvalidArgument,
                  "field 'columns' has 1000 entries, at most 64 allowed");
  TQ_EXPECT_ERROR(DecodeGetMeta(HandMadeGetMeta(0xFFFFFFFF, 1, 1)), kInvalidArgument, "at most 64 allowed");
  // A count within the limit but promising more bytes than remain.
  TQ_EXPECT_ERROR(DecodeGetMeta(HandMadeGetMeta(60, 1, 1)), kDataLoss, "field 'columns' declares 60 entries");
  TQ_EXPECT_ERROR(DecodeGetMeta(HandMadeGetMeta(1, 0xFFFFFFFF, 4)), kInvalidArgument,
                  "is 4294967295 bytes, at most 256 allowed");
  TQ_EXPECT_ERROR(DecodeGetMeta(HandMadeGetMeta(1, 200, 4)), kDataLoss, "needs 200 bytes");

  // Batch rows over the limit.
  CreateRowsRequest rows;
  rows.partition = "p";
  rows.rows.resize(5);
  Message m = EncodeRequest(MessageType::kCreateRows, 0, 1, "", rows);
  WireLimits limits;
  limits.max_batch_rows = 4;
  Result<Header> h = DecodeHeader(m.bytes(), limits);
  ASSERT_TRUE(h.ok());
  CreateRowsRequest got;
  std::string token;
  TQ_EXPECT_ERROR(DecodeRequest(m.bytes(), *h, limits, nullptr, SampleNow(), &token, &got), kInvalidArgument,
                  "field 'rows' has 5 entries, at most 4 allowed");
}

TEST(WireTest, TensorFieldsAreChecked) {
  auto decode_write = [](const StorageWriteRequest& req, const WireLimits& limits) {
    Message m = EncodeRequest(MessageType::kStorageWrite, 0, 1, "", req);
    Result<Header> h = DecodeHeader(m.bytes(), limits);
    if (!h.ok()) return h.status();
    StorageWriteRequest got;
    std::string token;
    return DecodeRequest(m.bytes(), *h, limits, nullptr, SampleNow(), &token, &got);
  };
  StorageWriteRequest req = Sample<StorageWriteRequest>();
  WireLimits limits;
  limits.max_tensor_bytes = 16;
  TQ_EXPECT_ERROR(decode_write(req, limits), kInvalidArgument, "'tensor.nbytes' is 24, max_tensor_bytes is 16");

  // nbytes that disagree with the shape: patch the first tensor's nbytes.
  Message m = EncodeRequest(MessageType::kStorageWrite, 0, 1, "", req);
  std::vector<std::byte> bytes = Bytes(m);
  // Layout: header, token (4), write_id (8), count (4), row (8), column
  // "prompt" (4 + 6), dtype (1), ndim (4), dim (8), nbytes (8).
  const size_t nbytes_at = kHeaderBytes + 4 + 8 + 4 + 8 + 10 + 1 + 4 + 8;
  ASSERT_EQ(LoadU64(bytes.data() + nbytes_at), 24u);
  StoreU64(bytes.data() + nbytes_at, 16);
  Result<Header> h = DecodeHeader(bytes, WireLimits{});
  ASSERT_TRUE(h.ok());
  StorageWriteRequest got;
  std::string token;
  TQ_EXPECT_ERROR(DecodeRequest(bytes, *h, WireLimits{}, nullptr, SampleNow(), &token, &got), kInvalidArgument,
                  "does not match shape [3] of I64");
  // Unknown dtype.
  bytes = Bytes(m);
  bytes[nbytes_at - 8 - 4 - 1] = std::byte{200};
  TQ_EXPECT_ERROR(DecodeRequest(bytes, *h, WireLimits{}, nullptr, SampleNow(), &token, &got), kInvalidArgument,
                  "'tensor.dtype' has unknown value 200");
  // Non-zero padding before the bytes.
  bytes = Bytes(m);
  const size_t pad_at = nbytes_at + 8;
  ASSERT_NE(pad_at % 8, 0u);
  bytes[pad_at] = std::byte{1};
  TQ_EXPECT_ERROR(DecodeRequest(bytes, *h, WireLimits{}, nullptr, SampleNow(), &token, &got), kInvalidArgument,
                  "non-zero padding");
}

TEST(WireTest, EnumsBooleansAndTrailingBytesAreChecked) {
  Message m = EncodeRequest(MessageType::kCreatePartition, 0, 1, "", CreatePartitionRequest{"p", 2, {"train"}});
  Result<Header> h = DecodeHeader(m.bytes(), Limits());
  ASSERT_TRUE(h.ok());
  // Trailing byte: append and fix the header.
  std::vector<std::byte> bytes = Bytes(m);
  bytes.push_back(std::byte{0});
  StoreU64(bytes.data() + 24, bytes.size() - kHeaderBytes);
  Result<Header> h2 = DecodeHeader(bytes, Limits());
  ASSERT_TRUE(h2.ok());
  CreatePartitionRequest got;
  std::string token;
  TQ_EXPECT_ERROR(DecodeRequest(bytes, *h2, Limits(), nullptr, SampleNow(), &token, &got), kDataLoss,
                  "1 unexpected bytes after the last field");

  Message reply = EncodeReply(MessageType::kCreatePartition, 1, CreatePartitionResponse{true});
  bytes = Bytes(reply);
  bytes.back() = std::byte{7};
  Result<Header> rh = DecodeHeader(bytes, Limits());
  ASSERT_TRUE(rh.ok());
  CreatePartitionResponse created;
  TQ_EXPECT_ERROR(DecodeReply(bytes, *rh, Limits(), nullptr, SampleNow(), &created), kInvalidArgument,
                  "'created' is 7, a boolean must be 0 or 1");

  GetMetaRequest get = Sample<GetMetaRequest>();
  Message gm = EncodeRequest(MessageType::kGetMeta, 0, 1, "", get);
  bytes = Bytes(gm);
  // policy.mode sits right after the partition string.
  const size_t mode_at = kHeaderBytes + 4 + (4 + 5) + 4 + (4 + 6) + (4 + 8) + 4 + (4 + 6);
  ASSERT_EQ(static_cast<uint8_t>(bytes[mode_at]), 1);
  bytes[mode_at] = std::byte{9};
  Result<Header> gh = DecodeHeader(bytes, Limits());
  ASSERT_TRUE(gh.ok());
  GetMetaRequest got_get;
  TQ_EXPECT_ERROR(DecodeRequest(bytes, *gh, Limits(), nullptr, SampleNow(), &token, &got_get), kInvalidArgument,
                  "'policy.mode' has unknown value 9");

  Message err = EncodeErrorReply(MessageType::kAck, 1, Status::NotFound("x"));
  bytes = Bytes(err);
  bytes[kHeaderBytes] = std::byte{0};  // code OK in an error reply
  Result<Header> eh = DecodeHeader(bytes, Limits());
  ASSERT_TRUE(eh.ok());
  TQ_EXPECT_ERROR(DecodeErrorReply(bytes, *eh, Limits()), kInvalidArgument, "not an error code");
}

TEST(WireTest, DuplicateUserTagsAreRefused) {
  WireWriter w;
  BeginMessage(w, MessageType::kCreateRows, 0, 0, 1);
  w.String("");   // token
  w.String("p");  // partition
  w.Count(1);     // rows
  w.I64(-1);
  w.I64(-1);
  w.I64(0);
  w.Count(2);
  w.String("a");
  w.String("1");
  w.String("a");
  w.String("2");
  w.Count(0);  // keys
  w.Bool(true);
  w.I64(10);
  Message m = FinishMessage(w);
  Result<Header> h = DecodeHeader(m.bytes(), Limits());
  ASSERT_TRUE(h.ok());
  CreateRowsRequest got;
  std::string token;
  TQ_EXPECT_ERROR(DecodeRequest(m.bytes(), *h, Limits(), nullptr, SampleNow(), &token, &got), kInvalidArgument,
                  "names a user tag twice");
}

}  // namespace
}  // namespace sluice::transfer_queue::wire
