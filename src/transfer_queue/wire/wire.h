// The TransferQueue wire format: how the Controller and StorageUnit
// request/response structs (controller.h, storage.h) travel between a client
// and a TransferQueueServer. docs/transfer_queue.md has the tables.
//
// A message is one ZeroMQ frame: a fixed 32-byte header, then a body.
//
//   offset size field
//   0      4    magic       "SLTQ" (0x51544C53 little-endian)
//   4      2    version     kProtocolVersion
//   6      2    type        MessageType
//   8      2    flags       bit 0 reply, bit 1 error (replies only)
//   10     2    target      storage unit index (storage messages), else 0
//   12     4    reserved    0
//   16     8    request_id  echoed by the reply
//   24     8    body_bytes  = frame size - 32
//
// A request body is the client's token (string, may be empty) followed by
// the request struct; a reply body is the reply struct, or for an error
// reply the Status (u8 code, string message). Integers are little-endian,
// strings and counts carry a u32 length, tensors carry dtype, shape and
// nbytes followed by the bytes at an 8-aligned offset. Never a
// code-executing serializer: every field is decoded by hand, and every
// length, count and enum is checked against WireLimits and the bytes left
// before anything is allocated.
//
// Thread safety: pure functions.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_WIRE_H_
#define SLUICE_SRC_TRANSFER_QUEUE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/transfer_queue/controller.h"
#include "sluice/transfer_queue/storage.h"
#include "sluice/transfer_queue/types.h"
#include "wire/wire_codec.h"

namespace sluice::transfer_queue::wire {

inline constexpr uint32_t kMagic = 0x51544C53;  // bytes 'S' 'L' 'T' 'Q'
// 2: ServerInfo names the shared-memory arena; ShmStorageWrite/ShmStorageRead.
// 4: OpenRing (same-host shared-memory rings); ServerInfo.shm_rings and
//    direct_port (direct TCP connections); PutRows and TakeBatch (a put or
//    a take in one round trip).
// 6: ServerInfo.unit_hosts (storage units served by other servers);
//    DeclareWrite (a controller telling those servers of a write).
inline constexpr uint16_t kProtocolVersion = 6;
inline constexpr size_t kHeaderBytes = 32;
inline constexpr uint16_t kFlagReply = 1;
inline constexpr uint16_t kFlagError = 2;
inline constexpr size_t kMaxTokenBytes = 256;
inline constexpr size_t kMaxErrorMessageBytes = 16384;
inline constexpr size_t kMaxTensorDims = 16;
inline constexpr uint32_t kMaxStorageUnits = 1024;

// An empty body.
struct Empty {};

// Storage units [first_unit, first_unit + count) served by the server at
// `endpoint` (a storage server, ServerOptions::storage_of).
struct UnitHost {
  uint32_t first_unit = 0;
  uint32_t count = 0;
  std::string endpoint;
};

// What a server tells a client at connect time.
struct ServerInfo {
  uint16_t protocol_version = kProtocolVersion;
  uint32_t storage_units = 0;
  uint64_t max_message_bytes = 0;
  uint32_t max_batch_rows = 0;
  uint64_t max_tensor_bytes = 0;
  bool token_required = false;
  // The server's shared-memory arena (shm_arena.h), empty if it has none.
  std::string shm_segment;
  uint64_t shm_data_bytes = 0;
  // Shared-memory rings the server serves at once (shm_ring.h); 0: none.
  uint32_t shm_rings = 0;
  // The port of the server's direct TCP listener (same address as the
  // ZeroMQ endpoint; length-prefixed messages); 0: none.
  uint32_t direct_port = 0;
  // Storage units served elsewhere: a client reads and writes their bytes
  // there (and puts and takes in steps, not in one round trip).
  std::vector<UnitHost> unit_hosts;
};

// A controller's server telling a storage server of an open write that
// stores cells there (the cells storage writes may then fill): the write's
// rows and its declared columns, as in BeginWriteRequest.
struct DeclareWriteRequest {
  WriteId write_id = 0;
  std::vector<RowId> rows;
  std::vector<ColumnWriteMeta> columns;
};

// Reply to OpenRing: the ring segment made for this client (shm_ring.h).
struct RingInfo {
  std::string name;
  uint64_t capacity = 0;  // bytes per direction
};

// Shared-memory data plane (same-host clients). A cell's bytes live in the
// arena at `offset` (from the start of its data area); only metadata travels.
struct ShmCell {
  uint64_t offset = 0;
  TensorMeta meta;
};
struct ShmWriteItem {
  RowId row = 0;
  std::string column;
  TensorMeta meta;
};
// Allocates arena blocks for cells of an open write; the client then copies
// the bytes into them before CommitWrite.
struct ShmWriteRequest {
  WriteId write_id = 0;
  std::vector<ShmWriteItem> items;
};
struct ShmWriteReply {
  std::vector<uint64_t> offsets;  // one per item
};
// Reply to ShmStorageRead (a StorageReadRequest): cells[c][i] is column c of row i.
struct ShmReadReply {
  std::vector<std::vector<ShmCell>> cells;
};

// A whole write in one round trip: BeginWrite, the bytes, CommitWrite.
// data[c][i] is the tensor of begin.columns[c].rows[i] (same dtype, shape
// and nbytes). Reply: the BeginWriteResponse of the committed write.
struct PutRequest {
  BeginWriteRequest begin;
  std::vector<std::vector<HostTensor>> data;
};
// A take in one round trip: Ack of lease `ack` (0: none; if it fails nothing
// is taken), GetMeta, and a read of `columns` of the leased rows (empty: the
// batch's columns). in_place: the reply names arena cells (the client pinned
// the arena before sending) instead of carrying the bytes.
struct TakeRequest {
  LeaseId ack = 0;
  GetMetaRequest get;
  std::vector<std::string> columns;
  bool in_place = false;
};
// data[c][i] / cells[c][i]: column c of meta.rows[i], in the order of
// `columns` as asked (or the batch's).
struct TakeReply {
  BatchMeta meta;
  bool in_place = false;
  std::vector<std::vector<HostTensor>> data;  // !in_place
  std::vector<std::vector<ShmCell>> cells;    // in_place
};

using KvEntries = std::vector<KvEntry>;

// Every message: X(name, type number, request body, reply body).
#define SLUICE_TQ_WIRE_MESSAGES(X)                                        \
  X(ServerInfo, 1, Empty, ServerInfo)                                     \
  X(OpenRing, 2, Empty, RingInfo)                                         \
  X(RegisterColumns, 16, RegisterColumnsRequest, Empty)                   \
  X(RegisterTask, 17, RegisterTaskRequest, Empty)                         \
  X(Describe, 18, Empty, DescribeResponse)                                \
  X(CreatePartition, 19, CreatePartitionRequest, CreatePartitionResponse) \
  X(CreateRows, 20, CreateRowsRequest, CreateRowsResponse)                \
  X(BeginWrite, 21, BeginWriteRequest, BeginWriteResponse)                \
  X(CommitWrite, 22, CommitWriteRequest, Empty)                           \
  X(AbortWrite, 23, AbortWriteRequest, Empty)                             \
  X(GetMeta, 24, GetMetaRequest, BatchMeta)                               \
  X(Ack, 25, AckRequest, AckResponse)                                     \
  X(Release, 26, ReleaseRequest, ReleaseResponse)                         \
  X(ClearPartition, 27, ClearPartitionRequest, ClearResponse)             \
  X(KvLookup, 28, KvLookupRequest, KvEntries)                             \
  X(KvList, 29, KvListRequest, KvEntries)                                 \
  X(KvClear, 30, KvClearRequest, ClearResponse)                           \
  X(FinishReclaim, 31, FinishReclaimRequest, Empty)                       \
  X(Stats, 32, Empty, ControllerStats)                                    \
  X(Renew, 33, RenewRequest, RenewResponse)                               \
  X(PutRows, 34, PutRequest, BeginWriteResponse)                          \
  X(TakeBatch, 35, TakeRequest, TakeReply)                                \
  X(ReleaseHolder, 36, ReleaseHolderRequest, ReleaseHolderResponse)       \
  X(DeclareWrite, 37, DeclareWriteRequest, Empty)                         \
  X(StorageWrite, 64, StorageWriteRequest, Empty)                         \
  X(StorageRead, 65, StorageReadRequest, StorageReadResponse)             \
  X(StorageDiscard, 66, StorageDiscardRequest, Empty)                     \
  X(StorageFreeRows, 67, StorageFreeRequest, Empty)                       \
  X(StorageStats, 68, Empty, StorageStats)                                \
  X(ShmStorageWrite, 69, ShmWriteRequest, ShmWriteReply)                  \
  X(ShmStorageRead, 70, StorageReadRequest, ShmReadReply)

enum class MessageType : uint16_t {
#define SLUICE_TQ_WIRE_ENUM_(name, number, req, rep) k##name = number,
  SLUICE_TQ_WIRE_MESSAGES(SLUICE_TQ_WIRE_ENUM_)
#undef SLUICE_TQ_WIRE_ENUM_
};

// Request and reply body types of each message type.
template <MessageType T>
struct MessageTraits;
#define SLUICE_TQ_WIRE_TRAITS_(name, number, req, rep) \
  template <>                                          \
  struct MessageTraits<MessageType::k##name> {         \
    using Request = req;                               \
    using Reply = rep;                                 \
  };
SLUICE_TQ_WIRE_MESSAGES(SLUICE_TQ_WIRE_TRAITS_)
#undef SLUICE_TQ_WIRE_TRAITS_

bool IsKnownMessageType(uint16_t type);
// "GetMeta"; "message type 99" for an unknown one.
std::string MessageTypeName(MessageType type);
// Storage messages address unit `target`; the others must have target 0.
bool IsStorageMessage(MessageType type);

struct Header {
  uint16_t version = kProtocolVersion;
  MessageType type = MessageType::kServerInfo;
  uint16_t flags = 0;
  uint16_t target = 0;
  uint64_t request_id = 0;
  uint64_t body_bytes = 0;

  bool is_reply() const { return (flags & kFlagReply) != 0; }
  bool is_error() const { return (flags & kFlagError) != 0; }
};

// Checks, in order: the frame holds a header (DataLoss), the magic
// (InvalidArgument), the version (Unimplemented, naming both versions), the
// frame size against max_message_bytes (InvalidArgument), the type, flags
// and reserved bits (InvalidArgument), body_bytes == frame size - 32
// (DataLoss).
Result<Header> DecodeHeader(std::span<const std::byte> message, const WireLimits& limits);

// An encoded message; release `data` to the transport.
struct Message {
  std::unique_ptr<std::byte[]> data;
  size_t size = 0;
  size_t capacity = 0;  // the buffer's real size (large_buffers::Give takes it back)
  std::span<const std::byte> bytes() const { return {data.get(), size}; }
};

// ------------------------------------------------------------ body codecs
// Encode writes a struct; Decode reads one into *out (sticky errors, see
// WireReader). Tensors decode as views into the reader's owner when it has
// one and the bytes are aligned for the dtype, as copies otherwise.

#define SLUICE_TQ_WIRE_CODEC_(T)          \
  void Encode(WireWriter& w, const T& v); \
  void Decode(WireReader& r, T* out);
SLUICE_TQ_WIRE_CODEC_(Empty)
SLUICE_TQ_WIRE_CODEC_(ServerInfo)
SLUICE_TQ_WIRE_CODEC_(DeclareWriteRequest)
SLUICE_TQ_WIRE_CODEC_(RingInfo)
SLUICE_TQ_WIRE_CODEC_(ColumnSchema)
SLUICE_TQ_WIRE_CODEC_(TensorMeta)
SLUICE_TQ_WIRE_CODEC_(RowTags)
SLUICE_TQ_WIRE_CODEC_(RowTagPatch)
SLUICE_TQ_WIRE_CODEC_(SamplingPolicy)
SLUICE_TQ_WIRE_CODEC_(CapacityWait)
SLUICE_TQ_WIRE_CODEC_(HostTensor)
SLUICE_TQ_WIRE_CODEC_(RegisterColumnsRequest)
SLUICE_TQ_WIRE_CODEC_(RegisterTaskRequest)
SLUICE_TQ_WIRE_CODEC_(DescribeResponse)
SLUICE_TQ_WIRE_CODEC_(CreatePartitionRequest)
SLUICE_TQ_WIRE_CODEC_(CreatePartitionResponse)
SLUICE_TQ_WIRE_CODEC_(CreateRowsRequest)
SLUICE_TQ_WIRE_CODEC_(CreateRowsResponse)
SLUICE_TQ_WIRE_CODEC_(BeginWriteRequest)
SLUICE_TQ_WIRE_CODEC_(BeginWriteResponse)
SLUICE_TQ_WIRE_CODEC_(CommitWriteRequest)
SLUICE_TQ_WIRE_CODEC_(AbortWriteRequest)
SLUICE_TQ_WIRE_CODEC_(GetMetaRequest)
SLUICE_TQ_WIRE_CODEC_(BatchMeta)
SLUICE_TQ_WIRE_CODEC_(AckRequest)
SLUICE_TQ_WIRE_CODEC_(AckResponse)
SLUICE_TQ_WIRE_CODEC_(ReleaseRequest)
SLUICE_TQ_WIRE_CODEC_(ReleaseResponse)
SLUICE_TQ_WIRE_CODEC_(RenewRequest)
SLUICE_TQ_WIRE_CODEC_(RenewResponse)
SLUICE_TQ_WIRE_CODEC_(ReleaseHolderRequest)
SLUICE_TQ_WIRE_CODEC_(ReleaseHolderResponse)
SLUICE_TQ_WIRE_CODEC_(ClearPartitionRequest)
SLUICE_TQ_WIRE_CODEC_(ClearResponse)
SLUICE_TQ_WIRE_CODEC_(ReclaimTicket)
SLUICE_TQ_WIRE_CODEC_(KvLookupRequest)
SLUICE_TQ_WIRE_CODEC_(KvListRequest)
SLUICE_TQ_WIRE_CODEC_(KvClearRequest)
SLUICE_TQ_WIRE_CODEC_(KvEntries)
SLUICE_TQ_WIRE_CODEC_(FinishReclaimRequest)
SLUICE_TQ_WIRE_CODEC_(ControllerStats)
SLUICE_TQ_WIRE_CODEC_(StorageWriteRequest)
SLUICE_TQ_WIRE_CODEC_(StorageReadRequest)
SLUICE_TQ_WIRE_CODEC_(StorageReadResponse)
SLUICE_TQ_WIRE_CODEC_(StorageDiscardRequest)
SLUICE_TQ_WIRE_CODEC_(StorageFreeRequest)
SLUICE_TQ_WIRE_CODEC_(StorageStats)
SLUICE_TQ_WIRE_CODEC_(ShmWriteRequest)
SLUICE_TQ_WIRE_CODEC_(ShmWriteReply)
SLUICE_TQ_WIRE_CODEC_(ShmReadReply)
SLUICE_TQ_WIRE_CODEC_(PutRequest)
SLUICE_TQ_WIRE_CODEC_(TakeRequest)
SLUICE_TQ_WIRE_CODEC_(TakeReply)
#undef SLUICE_TQ_WIRE_CODEC_

// A size hint for the writer (payload bytes dominate storage messages).
inline size_t EncodedSizeHint(const StorageWriteRequest& v) {
  size_t n = 64;
  for (const StorageItem& item : v.items)
    n += 64 + item.column.size() + 8 * item.tensor.shape.size() + item.tensor.nbytes;
  return n;
}
inline size_t EncodedSizeHint(const std::vector<std::vector<HostTensor>>& columns) {
  size_t n = 64;
  for (const auto& column : columns) {
    for (const HostTensor& t : column) n += 48 + 8 * t.shape.size() + t.nbytes;
  }
  return n;
}
inline size_t EncodedSizeHint(const StorageReadResponse& v) { return EncodedSizeHint(v.tensors); }
inline size_t EncodedSizeHint(const PutRequest& v) {
  return 256 + 64 * v.begin.new_rows.size() + EncodedSizeHint(v.data);
}
inline size_t EncodedSizeHint(const TakeReply& v) {
  return 256 + 96 * v.meta.rows.size() + EncodedSizeHint(v.data) + 48 * v.meta.rows.size() * v.cells.size();
}
template <typename T>
size_t EncodedSizeHint(const T&) {
  return 256;
}

// ------------------------------------------------------------ messages

// Starts a message: writes a header with body_bytes to be patched by
// FinishMessage.
void BeginMessage(WireWriter& w, MessageType type, uint16_t flags, uint16_t target, uint64_t request_id);
Message FinishMessage(WireWriter& w);

template <typename T>
Message EncodeRequest(MessageType type, uint16_t target, uint64_t request_id, std::string_view token, const T& body,
                      TimePoint now = std::chrono::steady_clock::now()) {
  WireWriter w(now);
  w.Reserve(kHeaderBytes + 4 + token.size() + EncodedSizeHint(body));
  BeginMessage(w, type, 0, target, request_id);
  w.String(token);
  Encode(w, body);
  return FinishMessage(w);
}

template <typename T>
Message EncodeReply(MessageType type, uint64_t request_id, const T& body,
                    TimePoint now = std::chrono::steady_clock::now()) {
  WireWriter w(now);
  w.Reserve(kHeaderBytes + EncodedSizeHint(body));
  BeginMessage(w, type, kFlagReply, 0, request_id);
  Encode(w, body);
  return FinishMessage(w);
}

// An error reply carrying `status` (precondition: not OK); the message is
// cut to kMaxErrorMessageBytes.
Message EncodeErrorReply(MessageType type, uint64_t request_id, const Status& status);

// "GetMeta request" / "GetMeta reply": names the message in errors.
std::string Describe(const Header& header);

// Reads a request's token and body. `message` is the whole frame, `header`
// its DecodeHeader result.
template <typename T>
Status DecodeRequest(std::span<const std::byte> message, const Header& header, const WireLimits& limits,
                     std::shared_ptr<const void> owner, TimePoint now, std::string* token, T* out) {
  WireReader r(message.subspan(kHeaderBytes), kHeaderBytes, Describe(header), limits, std::move(owner), now);
  *token = r.String("token", kMaxTokenBytes);
  Decode(r, out);
  return r.Finish();
}

// Reads only a request's token (the server checks it before queueing work).
Result<std::string> DecodeRequestToken(std::span<const std::byte> message, const Header& header,
                                       const WireLimits& limits);

template <typename T>
Status DecodeReply(std::span<const std::byte> message, const Header& header, const WireLimits& limits,
                   std::shared_ptr<const void> owner, TimePoint now, T* out) {
  WireReader r(message.subspan(kHeaderBytes), kHeaderBytes, Describe(header), limits, std::move(owner), now);
  Decode(r, out);
  return r.Finish();
}

// The Status an error reply carries (never OK), or DataLoss/InvalidArgument
// if the error body itself is malformed.
Status DecodeErrorReply(std::span<const std::byte> message, const Header& header, const WireLimits& limits);

}  // namespace sluice::transfer_queue::wire

#endif  // SLUICE_SRC_TRANSFER_QUEUE_WIRE_H_
