// Body codecs of the TransferQueue wire format (see wire.h). Each Decode
// reads exactly the fields its Encode writes, in the same order; minimum
// element sizes given to WireReader::Count are the smallest encoding of one
// element, so a count can never promise more elements than the bytes left.
#include "wire/wire.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "sluice/common/check.h"

namespace sluice::transfer_queue::wire {

// Enum values travel as u8: pin them, so reordering an enum breaks the build
// rather than the protocol.
static_assert(static_cast<int>(DType::kF64) == 0 && static_cast<int>(DType::kF32) == 1 &&
              static_cast<int>(DType::kF16) == 2 && static_cast<int>(DType::kBF16) == 3 &&
              static_cast<int>(DType::kI64) == 4 && static_cast<int>(DType::kI32) == 5 &&
              static_cast<int>(DType::kI16) == 6 && static_cast<int>(DType::kI8) == 7 &&
              static_cast<int>(DType::kU8) == 8 && static_cast<int>(DType::kBool) == 9);
static_assert(static_cast<int>(SamplingMode::kFifo) == 0 && static_cast<int>(SamplingMode::kWholeGroup) == 1);
static_assert(static_cast<int>(WriteTarget::kExistingRows) == 0 && static_cast<int>(WriteTarget::kNewRows) == 1 &&
              static_cast<int>(WriteTarget::kKeys) == 2);
static_assert(static_cast<int>(StatusCode::kInvalidArgument) == 1 && static_cast<int>(StatusCode::kTimeout) == 7 &&
              static_cast<int>(StatusCode::kUnavailable) == 9 && static_cast<int>(StatusCode::kInternal) == 12);

// Codecs of structs that only travel inside others (declared before the
// list templates below, which find them by ordinary lookup).
static void Encode(WireWriter& w, const ColumnWriteMeta& v);
static void Decode(WireReader& r, ColumnWriteMeta* out);
static void Encode(WireWriter& w, const RowMeta& v);
static void Decode(WireReader& r, RowMeta* out);
static void Encode(WireWriter& w, const TaskDepth& v);
static void Decode(WireReader& r, TaskDepth* out);
static void Encode(WireWriter& w, const KvEntry& v);
static void Decode(WireReader& r, KvEntry* out);
static void Encode(WireWriter& w, const StorageItem& v);
static void Decode(WireReader& r, StorageItem* out);
static void Encode(WireWriter& w, const ShmWriteItem& v);
static void Decode(WireReader& r, ShmWriteItem* out);
static void Encode(WireWriter& w, const ShmCell& v);
static void Decode(WireReader& r, ShmCell* out);

namespace {

// Smallest encodings, in bytes.
constexpr size_t kMinString = 4;
constexpr size_t kMinRowId = 8;
constexpr size_t kMinColumnSchema = 4 + 1 + 4;
constexpr size_t kMinTensorMeta = 1 + 4 + 8;
constexpr size_t kMinTags = 8 + 8 + 8 + 4;
constexpr size_t kMinUserTag = 4 + 4;
constexpr size_t kMinPatch = 1 + 1 + 4;
constexpr size_t kMinColumnWrite = 4 + 4;
constexpr size_t kMinRowMeta = 8 + kMinTags;
constexpr size_t kMinTaskDepth = 4 + 8 * 3;
constexpr size_t kMinKvEntry = 4 + 8 + kMinTags + 4;
constexpr size_t kMinStorageItem = 8 + 4 + kMinTensorMeta;

// A lease deadline travels as "time remaining"; more than this either way is
// not a deadline the controller can have produced (leases are at most
// kMaxLeaseTimeout).
constexpr std::chrono::nanoseconds kMaxDeadlineOffset = std::chrono::hours(24 * 8);

void EncodeStrings(WireWriter& w, const std::vector<std::string>& v) {
  w.Count(v.size());
  for (const std::string& s : v) w.String(s);
}

std::vector<std::string> DecodeStrings(WireReader& r, const char* field, uint64_t max_count, size_t max_bytes) {
  std::vector<std::string> out;
  const size_t n = r.Count(field, max_count, kMinString);
  out.reserve(n);
  for (size_t i = 0; i < n && r.ok(); ++i) out.push_back(r.String(field, max_bytes));
  return out;
}

void EncodeRowIds(WireWriter& w, const std::vector<RowId>& v) {
  w.Count(v.size());
  for (RowId id : v) w.U64(id);
}

std::vector<RowId> DecodeRowIds(WireReader& r, const char* field, uint64_t max_count) {
  std::vector<RowId> out;
  const size_t n = r.Count(field, max_count, kMinRowId);
  out.reserve(n);
  for (size_t i = 0; i < n && r.ok(); ++i) out.push_back(r.U64(field));
  return out;
}

template <typename T>
void EncodeList(WireWriter& w, const std::vector<T>& v) {
  w.Count(v.size());
  for (const T& x : v) Encode(w, x);
}

template <typename T>
std::vector<T> DecodeList(WireReader& r, const char* field, uint64_t max_count, size_t min_bytes) {
  std::vector<T> out;
  const size_t n = r.Count(field, max_count, min_bytes);
  out.reserve(n);
  for (size_t i = 0; i < n && r.ok(); ++i) {
    T x;
    Decode(r, &x);
    out.push_back(std::move(x));
  }
  return out;
}

void EncodeShape(WireWriter& w, const std::vector<int64_t>& shape) {
  w.Count(shape.size());
  for (int64_t d : shape) w.I64(d);
}

std::vector<int64_t> DecodeShape(WireReader& r, const char* field) {
  std::vector<int64_t> out;
  const size_t n = r.Count(field, kMaxTensorDims, 8);
  out.reserve(n);
  for (size_t i = 0; i < n && r.ok(); ++i) out.push_back(r.I64(field));
  return out;
}

void EncodeUserTags(WireWriter& w, const std::map<std::string, std::string>& user) {
  w.Count(user.size());
  for (const auto& [k, v] : user) {
    w.String(k);
    w.String(v);
  }
}

std::map<std::string, std::string> DecodeUserTags(WireReader& r) {
  std::map<std::string, std::string> out;
  const size_t n = r.Count("tags.user", kMaxUserTags, kMinUserTag);
  for (size_t i = 0; i < n && r.ok(); ++i) {
    std::string key = r.String("tags.user.name", kMaxNameBytes);
    std::string value = r.String("tags.user.value", kMaxUserTagBytes);
    if (!r.ok()) break;
    if (!out.emplace(std::move(key), std::move(value)).second) {
      r.Invalid("tags.user", "names a user tag twice");
      break;
    }
  }
  return out;
}

void EncodeOptionalI64(WireWriter& w, const std::optional<int64_t>& v) {
  w.Bool(v.has_value());
  if (v) w.I64(*v);
}

std::optional<int64_t> DecodeOptionalI64(WireReader& r, const char* field) {
  if (!r.Bool(field)) return std::nullopt;
  const int64_t v = r.I64(field);
  if (!r.ok()) return std::nullopt;
  return v;
}

void EncodeMillis(WireWriter& w, std::chrono::milliseconds d) { w.I64(d.count()); }
std::chrono::milliseconds DecodeMillis(WireReader& r, const char* field) {
  return std::chrono::milliseconds(r.I64(field));
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08" PRIx32, v);
  return buf;
}

}  // namespace

// ------------------------------------------------------------ message types

bool IsKnownMessageType(uint16_t type) {
  switch (type) {
#define SLUICE_TQ_WIRE_CASE_(name, number, req, rep) case number:
    SLUICE_TQ_WIRE_MESSAGES(SLUICE_TQ_WIRE_CASE_)
#undef SLUICE_TQ_WIRE_CASE_
    return true;
    default:
      return false;
  }
}

std::string MessageTypeName(MessageType type) {
  switch (type) {
#define SLUICE_TQ_WIRE_NAME_(name, number, req, rep) \
  case MessageType::k##name:                         \
    return #name;
    SLUICE_TQ_WIRE_MESSAGES(SLUICE_TQ_WIRE_NAME_)
#undef SLUICE_TQ_WIRE_NAME_
  }
  return "message type " + std::to_string(static_cast<unsigned>(type));
}

bool IsStorageMessage(MessageType type) {
  return static_cast<uint16_t>(type) >= 64 && static_cast<uint16_t>(type) < 128;
}

std::string Describe(const Header& header) {
  return MessageTypeName(header.type) + (header.is_error()   ? " error reply"
                                         : header.is_reply() ? " reply"
                                                             : " request");
}

// ------------------------------------------------------------ header

void BeginMessage(WireWriter& w, MessageType type, uint16_t flags, uint16_t target, uint64_t request_id) {
  SLUICE_CHECK_EQ(w.size(), 0u);
  w.U32(kMagic);
  w.U16(kProtocolVersion);
  w.U16(static_cast<uint16_t>(type));
  w.U16(flags);
  w.U16(target);
  w.U32(0);  // reserved
  w.U64(request_id);
  w.U64(0);  // body_bytes, patched by FinishMessage
}

Message FinishMessage(WireWriter& w) {
  SLUICE_CHECK(w.size() >= kHeaderBytes);
  w.PatchU64(24, w.size() - kHeaderBytes);
  Message m;
  m.data = w.Release(&m.size, &m.capacity);
  return m;
}

Result<Header> DecodeHeader(std::span<const std::byte> message, const WireLimits& limits) {
  const size_t size = message.size();
  const std::string short_header = "message of " + std::to_string(size) + " bytes is shorter than the " +
                                   std::to_string(kHeaderBytes) + "-byte header";
  if (size < 4) return Status::DataLoss(short_header);
  const uint32_t magic = LoadU32(message.data());
  if (magic != kMagic) {
    return Status::InvalidArgument("not a Sluice TransferQueue message: magic " + Hex32(magic) + ", expected " +
                                   Hex32(kMagic) + " ('SLTQ')");
  }
  if (size < 6) return Status::DataLoss(short_header);
  Header h;
  h.version = LoadU16(message.data() + 4);
  if (h.version != kProtocolVersion) {
    return Status::Unimplemented("TransferQueue protocol version " + std::to_string(h.version) +
                                 " is not supported: this build speaks version " + std::to_string(kProtocolVersion));
  }
  if (size < kHeaderBytes) return Status::DataLoss(short_header);
  if (size > limits.max_message_bytes) {
    return Status::InvalidArgument("message of " + std::to_string(size) + " bytes exceeds max_message_bytes " +
                                   std::to_string(limits.max_message_bytes));
  }
  const uint16_t type = LoadU16(message.data() + 6);
  if (!IsKnownMessageType(type)) return Status::InvalidArgument("unknown message type " + std::to_string(type));
  h.type = static_cast<MessageType>(type);
  h.flags = LoadU16(message.data() + 8);
  h.target = LoadU16(message.data() + 10);
  const uint32_t reserved = LoadU32(message.data() + 12);
  h.request_id = LoadU64(message.data() + 16);
  h.body_bytes = LoadU64(message.data() + 24);
  const std::string what = Describe(h);
  if ((h.flags & ~(kFlagReply | kFlagError)) != 0) {
    return Status::InvalidArgument(what + ": unknown flags " + Hex32(h.flags));
  }
  if (h.is_error() && !h.is_reply()) return Status::InvalidArgument(what + ": error flag without reply flag");
  if (reserved != 0) return Status::InvalidArgument(what + ": reserved header field is " + Hex32(reserved) + ", not 0");
  if (!IsStorageMessage(h.type) && h.target != 0) {
    return Status::InvalidArgument(what + ": target " + std::to_string(h.target) +
                                   " must be 0 (only storage messages address a unit)");
  }
  if (h.body_bytes != size - kHeaderBytes) {
    return Status::DataLoss(what + ": header says " + std::to_string(h.body_bytes) + " body bytes, the frame has " +
                            std::to_string(size - kHeaderBytes));
  }
  return h;
}

Message EncodeErrorReply(MessageType type, uint64_t request_id, const Status& status) {
  SLUICE_CHECK(!status.ok()) << "an error reply needs an error";
  WireWriter w;
  BeginMessage(w, type, kFlagReply | kFlagError, 0, request_id);
  w.U8(static_cast<uint8_t>(status.code()));
  const std::string& msg = status.message();
  w.String(std::string_view(msg).substr(0, kMaxErrorMessageBytes));
  return FinishMessage(w);
}

Result<std::string> DecodeRequestToken(std::span<const std::byte> message, const Header& header,
                                       const WireLimits& limits) {
  WireReader r(message.subspan(kHeaderBytes), kHeaderBytes, Describe(header), limits, nullptr, {});
  std::string token = r.String("token", kMaxTokenBytes);
  if (!r.ok()) return r.status();
  return token;
}

Status DecodeErrorReply(std::span<const std::byte> message, const Header& header, const WireLimits& limits) {
  WireReader r(message.subspan(kHeaderBytes), kHeaderBytes, Describe(header), limits, nullptr, {});
  const uint8_t code = r.U8("code");
  std::string text = r.String("message", kMaxErrorMessageBytes);
  if (r.ok() && (code == 0 || code > static_cast<uint8_t>(StatusCode::kInternal))) {
    r.Invalid("code", "is " + std::to_string(code) + ", not an error code");
  }
  Status finished = r.Finish();
  if (!finished.ok()) return finished;
  return Status(static_cast<StatusCode>(code), std::move(text));
}

// ------------------------------------------------------------ body codecs

static void Encode(WireWriter& w, const ColumnWriteMeta& v) {
  w.String(v.column);
  EncodeList(w, v.rows);
}
static void Decode(WireReader& r, ColumnWriteMeta* out) {
  out->column = r.String("columns.column", kMaxNameBytes);
  out->rows = DecodeList<TensorMeta>(r, "columns.rows", r.limits().max_batch_rows, kMinTensorMeta);
}

static void Encode(WireWriter& w, const RowMeta& v) {
  w.U64(v.id);
  Encode(w, v.tags);
}
static void Decode(WireReader& r, RowMeta* out) {
  out->id = r.U64("rows.id");
  Decode(r, &out->tags);
}

static void Encode(WireWriter& w, const TaskDepth& v) {
  w.String(v.task);
  w.U64(v.ready);
  w.U64(v.leased);
  w.U64(v.acked);
  w.U64(v.acked_total);
  w.U64(v.waiting);
}
static void Decode(WireReader& r, TaskDepth* out) {
  out->task = r.String("tasks.task", kMaxNameBytes);
  out->ready = r.U64("tasks.ready");
  out->leased = r.U64("tasks.leased");
  out->acked = r.U64("tasks.acked");
  out->acked_total = r.U64("tasks.acked_total");
  out->waiting = r.U64("tasks.waiting");
}

static void Encode(WireWriter& w, const KvEntry& v) {
  w.String(v.key);
  w.U64(v.row);
  Encode(w, v.tags);
  EncodeStrings(w, v.columns);
}
static void Decode(WireReader& r, KvEntry* out) {
  out->key = r.String("entries.key", kMaxNameBytes);
  out->row = r.U64("entries.row");
  Decode(r, &out->tags);
  out->columns = DecodeStrings(r, "entries.columns", kMaxColumns, kMaxNameBytes);
}

static void Encode(WireWriter& w, const StorageItem& v) {
  w.U64(v.row);
  w.String(v.column);
  Encode(w, v.tensor);
}
static void Decode(WireReader& r, StorageItem* out) {
  out->row = r.U64("items.row");
  out->column = r.String("items.column", kMaxNameBytes);
  Decode(r, &out->tensor);
}

void Encode(WireWriter&, const Empty&) {}
void Decode(WireReader&, Empty*) {}

void Encode(WireWriter& w, const ServerInfo& v) {
  w.U16(v.protocol_version);
  w.U32(v.storage_units);
  w.U64(v.max_message_bytes);
  w.U32(v.max_batch_rows);
  w.U64(v.max_tensor_bytes);
  w.Bool(v.token_required);
  w.String(v.shm_segment);
  w.U64(v.shm_data_bytes);
  w.U32(v.shm_rings);
  w.U32(v.direct_port);
  w.U32(static_cast<uint32_t>(v.unit_hosts.size()));
  for (const UnitHost& h : v.unit_hosts) {
    w.U32(h.first_unit);
    w.U32(h.count);
    w.String(h.endpoint);
  }
}

void Encode(WireWriter& w, const RingInfo& v) {
  w.String(v.name);
  w.U64(v.capacity);
}
void Decode(WireReader& r, RingInfo* out) {
  out->name = r.String("name", kMaxNameBytes);
  out->capacity = r.U64("capacity");
}
void Decode(WireReader& r, ServerInfo* out) {
  out->protocol_version = r.U16("protocol_version");
  out->storage_units = r.U32("storage_units");
  out->max_message_bytes = r.U64("max_message_bytes");
  out->max_batch_rows = r.U32("max_batch_rows");
  out->max_tensor_bytes = r.U64("max_tensor_bytes");
  out->token_required = r.Bool("token_required");
  out->shm_segment = r.String("shm_segment", kMaxNameBytes);
  out->shm_data_bytes = r.U64("shm_data_bytes");
  out->shm_rings = r.U32("shm_rings");
  out->direct_port = r.U32("direct_port");
  const size_t hosts = r.Count("unit_hosts", kMaxStorageUnits, 4 + 4 + kMinString);
  out->unit_hosts.resize(hosts);
  for (UnitHost& h : out->unit_hosts) {
    h.first_unit = r.U32("unit_hosts.first_unit");
    h.count = r.U32("unit_hosts.count");
    h.endpoint = r.String("unit_hosts.endpoint", kMaxNameBytes);
  }
}

void Encode(WireWriter& w, const DeclareWriteRequest& v) {
  w.U64(v.write_id);
  EncodeRowIds(w, v.rows);
  EncodeList(w, v.columns);
}
void Decode(WireReader& r, DeclareWriteRequest* out) {
  out->write_id = r.U64("write_id");
  out->rows = DecodeRowIds(r, "rows", r.limits().max_batch_rows);
  out->columns = DecodeList<ColumnWriteMeta>(r, "columns", kMaxColumns, kMinColumnWrite);
}

void Encode(WireWriter& w, const ColumnSchema& v) {
  w.String(v.name);
  w.U8(static_cast<uint8_t>(v.dtype));
  EncodeShape(w, v.shape);
}
void Decode(WireReader& r, ColumnSchema* out) {
  out->name = r.String("columns.name", kMaxNameBytes);
  out->dtype = r.Enum("columns.dtype", DType::kBool);
  out->shape = DecodeShape(r, "columns.shape");
}

void Encode(WireWriter& w, const TensorMeta& v) {
  w.U8(static_cast<uint8_t>(v.dtype));
  EncodeShape(w, v.shape);
  w.U64(v.nbytes);
}
void Decode(WireReader& r, TensorMeta* out) {
  out->dtype = r.Enum("tensor.dtype", DType::kBool);
  out->shape = DecodeShape(r, "tensor.shape");
  out->nbytes = r.U64("tensor.nbytes");
}

void Encode(WireWriter& w, const RowTags& v) {
  w.I64(v.group_id);
  w.I64(v.policy_version);
  w.I64(v.token_length);
  EncodeUserTags(w, v.user);
}
void Decode(WireReader& r, RowTags* out) {
  out->group_id = r.I64("tags.group_id");
  out->policy_version = r.I64("tags.policy_version");
  out->token_length = r.I64("tags.token_length");
  out->user = DecodeUserTags(r);
}

void Encode(WireWriter& w, const RowTagPatch& v) {
  EncodeOptionalI64(w, v.policy_version);
  EncodeOptionalI64(w, v.token_length);
  EncodeUserTags(w, v.user);
}
void Decode(WireReader& r, RowTagPatch* out) {
  out->policy_version = DecodeOptionalI64(r, "patches.policy_version");
  out->token_length = DecodeOptionalI64(r, "patches.token_length");
  out->user = DecodeUserTags(r);
}

void Encode(WireWriter& w, const SamplingPolicy& v) {
  w.U8(static_cast<uint8_t>(v.mode));
  w.U32(v.group_size);
  w.I64(v.min_policy_version);
  w.I64(v.max_policy_version);
  w.U32(v.dp_ranks);
}
void Decode(WireReader& r, SamplingPolicy* out) {
  out->mode = r.Enum("policy.mode", SamplingMode::kWholeGroup);
  out->group_size = r.U32("policy.group_size");
  out->min_policy_version = r.I64("policy.min_policy_version");
  out->max_policy_version = r.I64("policy.max_policy_version");
  out->dp_ranks = r.U32("policy.dp_ranks");
}

void Encode(WireWriter& w, const CapacityWait& v) {
  w.Bool(v.block);
  EncodeMillis(w, v.timeout);
}
void Decode(WireReader& r, CapacityWait* out) {
  out->block = r.Bool("wait.block");
  out->timeout = DecodeMillis(r, "wait.timeout_ms");
}

void Encode(WireWriter& w, const HostTensor& v) {
  w.U8(static_cast<uint8_t>(v.dtype));
  EncodeShape(w, v.shape);
  w.U64(v.nbytes);
  w.Align(8);
  w.Bytes(v.data, v.nbytes);
}
void Decode(WireReader& r, HostTensor* out) {
  const DType dtype = r.Enum("tensor.dtype", DType::kBool);
  std::vector<int64_t> shape = DecodeShape(r, "tensor.shape");
  const uint64_t nbytes = r.U64("tensor.nbytes");
  if (!r.ok()) return;
  if (nbytes > r.limits().max_tensor_bytes) {
    r.Invalid("tensor.nbytes",
              "is " + std::to_string(nbytes) + ", max_tensor_bytes is " + std::to_string(r.limits().max_tensor_bytes));
    return;
  }
  Result<uint64_t> numel = CheckedNumel(shape);
  if (!numel.ok() || *numel * DTypeSize(dtype) != nbytes) {
    r.Invalid("tensor.nbytes", "is " + std::to_string(nbytes) + ", which does not match shape " + ShapeToString(shape) +
                                   " of " + std::string(DTypeName(dtype)));
    return;
  }
  r.Align("tensor.padding", 8);
  std::span<const std::byte> bytes = r.Bytes("tensor.bytes", nbytes);
  if (!r.ok()) return;
  const auto address = reinterpret_cast<uintptr_t>(bytes.data());
  if (r.owner() != nullptr && address % DTypeSize(dtype) == 0) {
    // A view: the owner keeps the whole received message alive.
    out->dtype = dtype;
    out->shape = std::move(shape);
    out->owner = r.owner();
    out->data = bytes.data();
    out->nbytes = bytes.size();
  } else {
    *out = HostTensor::Copy(dtype, std::move(shape), bytes.data(), bytes.size());
  }
}

void Encode(WireWriter& w, const RegisterColumnsRequest& v) { EncodeList(w, v.columns); }
void Decode(WireReader& r, RegisterColumnsRequest* out) {
  out->columns = DecodeList<ColumnSchema>(r, "columns", kMaxColumns, kMinColumnSchema);
}

void Encode(WireWriter& w, const RegisterTaskRequest& v) { w.String(v.task); }
void Decode(WireReader& r, RegisterTaskRequest* out) { out->task = r.String("task", kMaxNameBytes); }

void Encode(WireWriter& w, const DescribeResponse& v) {
  EncodeList(w, v.columns);
  EncodeStrings(w, v.tasks);
}
void Decode(WireReader& r, DescribeResponse* out) {
  out->columns = DecodeList<ColumnSchema>(r, "columns", kMaxColumns, kMinColumnSchema);
  out->tasks = DecodeStrings(r, "tasks", kMaxTasks, kMaxNameBytes);
}

void Encode(WireWriter& w, const CreatePartitionRequest& v) {
  w.String(v.partition);
  w.U32(v.group_size);
  EncodeStrings(w, v.consumers);
}
void Decode(WireReader& r, CreatePartitionRequest* out) {
  out->partition = r.String("partition", kMaxNameBytes);
  out->group_size = r.U32("group_size");
  out->consumers = DecodeStrings(r, "consumers", kMaxTasks, kMaxNameBytes);
}

void Encode(WireWriter& w, const CreatePartitionResponse& v) { w.Bool(v.created); }
void Decode(WireReader& r, CreatePartitionResponse* out) { out->created = r.Bool("created"); }

void Encode(WireWriter& w, const CreateRowsRequest& v) {
  w.String(v.partition);
  EncodeList(w, v.rows);
  EncodeStrings(w, v.keys);
  Encode(w, v.wait);
}
void Decode(WireReader& r, CreateRowsRequest* out) {
  const uint32_t max_rows = r.limits().max_batch_rows;
  out->partition = r.String("partition", kMaxNameBytes);
  out->rows = DecodeList<RowTags>(r, "rows", max_rows, kMinTags);
  out->keys = DecodeStrings(r, "keys", max_rows, kMaxNameBytes);
  Decode(r, &out->wait);
}

void Encode(WireWriter& w, const CreateRowsResponse& v) { EncodeRowIds(w, v.rows); }
void Decode(WireReader& r, CreateRowsResponse* out) { out->rows = DecodeRowIds(r, "rows", r.limits().max_batch_rows); }

void Encode(WireWriter& w, const BeginWriteRequest& v) {
  w.String(v.partition);
  w.U8(static_cast<uint8_t>(v.target));
  EncodeRowIds(w, v.rows);
  EncodeList(w, v.new_rows);
  EncodeStrings(w, v.keys);
  EncodeList(w, v.patches);
  EncodeList(w, v.columns);
  Encode(w, v.wait);
}
void Decode(WireReader& r, BeginWriteRequest* out) {
  const uint32_t max_rows = r.limits().max_batch_rows;
  out->partition = r.String("partition", kMaxNameBytes);
  out->target = r.Enum("target", WriteTarget::kKeys);
  out->rows = DecodeRowIds(r, "rows", max_rows);
  out->new_rows = DecodeList<RowTags>(r, "new_rows", max_rows, kMinTags);
  out->keys = DecodeStrings(r, "keys", max_rows, kMaxNameBytes);
  out->patches = DecodeList<RowTagPatch>(r, "patches", max_rows, kMinPatch);
  out->columns = DecodeList<ColumnWriteMeta>(r, "columns", kMaxColumns, kMinColumnWrite);
  Decode(r, &out->wait);
}

void Encode(WireWriter& w, const BeginWriteResponse& v) {
  w.U64(v.write_id);
  EncodeRowIds(w, v.rows);
  w.U64(v.reserved_bytes);
}
void Decode(WireReader& r, BeginWriteResponse* out) {
  out->write_id = r.U64("write_id");
  out->rows = DecodeRowIds(r, "rows", r.limits().max_batch_rows);
  out->reserved_bytes = r.U64("reserved_bytes");
}

void Encode(WireWriter& w, const CommitWriteRequest& v) { w.U64(v.write_id); }
void Decode(WireReader& r, CommitWriteRequest* out) { out->write_id = r.U64("write_id"); }
void Encode(WireWriter& w, const AbortWriteRequest& v) { w.U64(v.write_id); }
void Decode(WireReader& r, AbortWriteRequest* out) { out->write_id = r.U64("write_id"); }

void Encode(WireWriter& w, const GetMetaRequest& v) {
  w.String(v.task);
  EncodeStrings(w, v.columns);
  w.U32(v.n);
  w.String(v.partition);
  Encode(w, v.policy);
  EncodeMillis(w, v.timeout);
  EncodeMillis(w, v.lease_timeout);
  w.String(v.holder);
}
void Decode(WireReader& r, GetMetaRequest* out) {
  out->task = r.String("task", kMaxNameBytes);
  out->columns = DecodeStrings(r, "columns", kMaxColumns, kMaxNameBytes);
  out->n = r.U32("n");
  out->partition = r.String("partition", kMaxNameBytes);
  Decode(r, &out->policy);
  out->timeout = DecodeMillis(r, "timeout_ms");
  out->lease_timeout = DecodeMillis(r, "lease_timeout_ms");
  out->holder = r.String("holder", kMaxNameBytes);
}

// A deadline travels as the time left on the sender's clock, clamped.
void EncodeDeadline(WireWriter& w, std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - w.now());
  w.I64(std::clamp(left, -kMaxDeadlineOffset, kMaxDeadlineOffset).count());
}
std::chrono::steady_clock::time_point DecodeDeadline(WireReader& r) {
  const int64_t left = r.I64("deadline_ns");
  if (!r.ok()) return {};
  if (left < -kMaxDeadlineOffset.count() || left > kMaxDeadlineOffset.count()) {
    r.Invalid("deadline_ns", "is " + std::to_string(left) + ", more than 8 days from now");
    return {};
  }
  return r.now() + std::chrono::nanoseconds(left);
}

void Encode(WireWriter& w, const BatchMeta& v) {
  w.U64(v.lease_id);
  w.String(v.task);
  w.String(v.partition);
  EncodeStrings(w, v.columns);
  EncodeList(w, v.rows);
  w.Count(v.rank.size());
  for (uint32_t rank : v.rank) w.U32(rank);
  w.U32(v.dp_ranks);
  EncodeDeadline(w, v.deadline);
}
void Decode(WireReader& r, BatchMeta* out) {
  const uint32_t max_rows = r.limits().max_batch_rows;
  out->lease_id = r.U64("lease_id");
  out->task = r.String("task", kMaxNameBytes);
  out->partition = r.String("partition", kMaxNameBytes);
  out->columns = DecodeStrings(r, "columns", kMaxColumns, kMaxNameBytes);
  out->rows = DecodeList<RowMeta>(r, "rows", max_rows, kMinRowMeta);
  const size_t ranks = r.Count("rank", max_rows, 4);
  out->rank.clear();
  out->rank.reserve(ranks);
  for (size_t i = 0; i < ranks && r.ok(); ++i) out->rank.push_back(r.U32("rank"));
  out->dp_ranks = r.U32("dp_ranks");
  out->deadline = DecodeDeadline(r);
}

void Encode(WireWriter& w, const AckRequest& v) { w.U64(v.lease_id); }
void Decode(WireReader& r, AckRequest* out) { out->lease_id = r.U64("lease_id"); }
void Encode(WireWriter& w, const ReleaseRequest& v) { w.U64(v.lease_id); }
void Decode(WireReader& r, ReleaseRequest* out) { out->lease_id = r.U64("lease_id"); }
void Encode(WireWriter& w, const RenewRequest& v) {
  w.U64(v.lease_id);
  EncodeMillis(w, v.lease_timeout);
}
void Decode(WireReader& r, RenewRequest* out) {
  out->lease_id = r.U64("lease_id");
  out->lease_timeout = DecodeMillis(r, "lease_timeout_ms");
}
void Encode(WireWriter& w, const RenewResponse& v) { EncodeDeadline(w, v.deadline); }
void Decode(WireReader& r, RenewResponse* out) { out->deadline = DecodeDeadline(r); }
void Encode(WireWriter& w, const ReleaseHolderRequest& v) { w.String(v.holder); }
void Decode(WireReader& r, ReleaseHolderRequest* out) { out->holder = r.String("holder", kMaxNameBytes); }
void Encode(WireWriter& w, const ReleaseHolderResponse& v) {
  w.U64(v.leases_released);
  w.U64(v.rows_returned);
  w.U64(v.rows_cleared);
}
void Decode(WireReader& r, ReleaseHolderResponse* out) {
  out->leases_released = r.U64("leases_released");
  out->rows_returned = r.U64("rows_returned");
  out->rows_cleared = r.U64("rows_cleared");
}

void Encode(WireWriter& w, const ReclaimTicket& v) {
  w.U64(v.id);
  EncodeRowIds(w, v.rows);
  w.U64(v.bytes);
}
void Decode(WireReader& r, ReclaimTicket* out) {
  out->id = r.U64("reclaim.id");
  out->rows = DecodeRowIds(r, "reclaim.rows", r.limits().max_list_entries);
  out->bytes = r.U64("reclaim.bytes");
}

void Encode(WireWriter& w, const AckResponse& v) {
  w.U64(v.rows_acked);
  w.U64(v.rows_cleared);
  w.U64(v.rows_freed);
  Encode(w, v.reclaim);
}
void Decode(WireReader& r, AckResponse* out) {
  out->rows_acked = r.U64("rows_acked");
  out->rows_cleared = r.U64("rows_cleared");
  out->rows_freed = r.U64("rows_freed");
  Decode(r, &out->reclaim);
}

void Encode(WireWriter& w, const ReleaseResponse& v) {
  w.U64(v.rows_returned);
  w.U64(v.rows_cleared);
}
void Decode(WireReader& r, ReleaseResponse* out) {
  out->rows_returned = r.U64("rows_returned");
  out->rows_cleared = r.U64("rows_cleared");
}

void Encode(WireWriter& w, const ClearPartitionRequest& v) { w.String(v.partition); }
void Decode(WireReader& r, ClearPartitionRequest* out) { out->partition = r.String("partition", kMaxNameBytes); }

void Encode(WireWriter& w, const ClearResponse& v) {
  w.U64(v.rows_cleared);
  Encode(w, v.reclaim);
}
void Decode(WireReader& r, ClearResponse* out) {
  out->rows_cleared = r.U64("rows_cleared");
  Decode(r, &out->reclaim);
}

void Encode(WireWriter& w, const KvLookupRequest& v) {
  w.String(v.partition);
  EncodeStrings(w, v.keys);
}
void Decode(WireReader& r, KvLookupRequest* out) {
  out->partition = r.String("partition", kMaxNameBytes);
  out->keys = DecodeStrings(r, "keys", r.limits().max_batch_rows, kMaxNameBytes);
}

void Encode(WireWriter& w, const KvListRequest& v) { w.String(v.partition); }
void Decode(WireReader& r, KvListRequest* out) { out->partition = r.String("partition", kMaxNameBytes); }

void Encode(WireWriter& w, const KvClearRequest& v) {
  w.String(v.partition);
  EncodeStrings(w, v.keys);
}
void Decode(WireReader& r, KvClearRequest* out) {
  out->partition = r.String("partition", kMaxNameBytes);
  out->keys = DecodeStrings(r, "keys", r.limits().max_batch_rows, kMaxNameBytes);
}

void Encode(WireWriter& w, const KvEntries& v) { EncodeList(w, v); }
void Decode(WireReader& r, KvEntries* out) {
  *out = DecodeList<KvEntry>(r, "entries", r.limits().max_list_entries, kMinKvEntry);
}

void Encode(WireWriter& w, const FinishReclaimRequest& v) { w.U64(v.reclaim_id); }
void Decode(WireReader& r, FinishReclaimRequest* out) { out->reclaim_id = r.U64("reclaim_id"); }

void Encode(WireWriter& w, const ControllerStats& v) {
  for (uint64_t x :
       {v.rows, v.capacity_rows, v.bytes_held, v.bytes_committed, v.bytes_reserved, v.bytes_reclaiming,
        v.capacity_bytes, v.partitions, v.active_leases, v.open_writes, v.waiting_consumers, v.waiting_producers}) {
    w.U64(x);
  }
  EncodeList(w, v.tasks);
  for (uint64_t x : {v.rows_created, v.rows_freed, v.leases_granted, v.leases_acked, v.leases_released,
                     v.leases_expired, v.rows_redelivered, v.writes_committed, v.writes_aborted}) {
    w.U64(x);
  }
}
void Decode(WireReader& r, ControllerStats* out) {
  for (uint64_t* x : {&out->rows, &out->capacity_rows, &out->bytes_held, &out->bytes_committed, &out->bytes_reserved,
                      &out->bytes_reclaiming, &out->capacity_bytes, &out->partitions, &out->active_leases,
                      &out->open_writes, &out->waiting_consumers, &out->waiting_producers}) {
    *x = r.U64("stats");
  }
  out->tasks = DecodeList<TaskDepth>(r, "tasks", kMaxTasks, kMinTaskDepth);
  for (uint64_t* x :
       {&out->rows_created, &out->rows_freed, &out->leases_granted, &out->leases_acked, &out->leases_released,
        &out->leases_expired, &out->rows_redelivered, &out->writes_committed, &out->writes_aborted}) {
    *x = r.U64("stats");
  }
}

void Encode(WireWriter& w, const StorageWriteRequest& v) {
  w.U64(v.write_id);
  EncodeList(w, v.items);
}
void Decode(WireReader& r, StorageWriteRequest* out) {
  out->write_id = r.U64("write_id");
  out->items = DecodeList<StorageItem>(r, "items", uint64_t{r.limits().max_batch_rows} * kMaxColumns, kMinStorageItem);
}

void Encode(WireWriter& w, const StorageReadRequest& v) {
  EncodeRowIds(w, v.rows);
  EncodeStrings(w, v.columns);
}
void Decode(WireReader& r, StorageReadRequest* out) {
  out->rows = DecodeRowIds(r, "rows", r.limits().max_batch_rows);
  out->columns = DecodeStrings(r, "columns", kMaxColumns, kMaxNameBytes);
}

namespace {
// Tensors by column, then row: [column][row].
void EncodeColumns(WireWriter& w, const std::vector<std::vector<HostTensor>>& v) {
  w.Count(v.size());
  for (const auto& column : v) EncodeList(w, column);
}
std::vector<std::vector<HostTensor>> DecodeColumns(WireReader& r, const char* what, const char* rows_what) {
  const size_t columns = r.Count(what, kMaxColumns, 4);
  std::vector<std::vector<HostTensor>> out;
  out.reserve(columns);
  for (size_t c = 0; c < columns && r.ok(); ++c) {
    out.push_back(DecodeList<HostTensor>(r, rows_what, r.limits().max_batch_rows, kMinTensorMeta));
  }
  return out;
}
void EncodeCells(WireWriter& w, const std::vector<std::vector<ShmCell>>& v) {
  w.Count(v.size());
  for (const auto& column : v) EncodeList(w, column);
}
std::vector<std::vector<ShmCell>> DecodeCells(WireReader& r) {
  const size_t columns = r.Count("cells", kMaxColumns, 4);
  std::vector<std::vector<ShmCell>> out;
  out.reserve(columns);
  for (size_t c = 0; c < columns && r.ok(); ++c) {
    out.push_back(DecodeList<ShmCell>(r, "cells.rows", r.limits().max_batch_rows, 8 + kMinTensorMeta));
  }
  return out;
}
}  // namespace

void Encode(WireWriter& w, const StorageReadResponse& v) { EncodeColumns(w, v.tensors); }
void Decode(WireReader& r, StorageReadResponse* out) { out->tensors = DecodeColumns(r, "tensors", "tensors.rows"); }

void Encode(WireWriter& w, const StorageDiscardRequest& v) {
  EncodeRowIds(w, v.rows);
  EncodeStrings(w, v.columns);
}
void Decode(WireReader& r, StorageDiscardRequest* out) {
  out->rows = DecodeRowIds(r, "rows", r.limits().max_batch_rows);
  out->columns = DecodeStrings(r, "columns", kMaxColumns, kMaxNameBytes);
}

void Encode(WireWriter& w, const StorageFreeRequest& v) { EncodeRowIds(w, v.rows); }
void Decode(WireReader& r, StorageFreeRequest* out) {
  out->rows = DecodeRowIds(r, "rows", r.limits().max_list_entries);
}

void Encode(WireWriter& w, const StorageStats& v) {
  w.U32(v.unit);
  w.U64(v.rows);
  w.U64(v.tensors);
  w.U64(v.bytes);
}
void Decode(WireReader& r, StorageStats* out) {
  out->unit = r.U32("unit");
  out->rows = r.U64("rows");
  out->tensors = r.U64("tensors");
  out->bytes = r.U64("bytes");
}

// ------------------------------------------------------------ shared memory

static void Encode(WireWriter& w, const ShmWriteItem& v) {
  w.U64(v.row);
  w.String(v.column);
  Encode(w, v.meta);
}
static void Decode(WireReader& r, ShmWriteItem* out) {
  out->row = r.U64("items.row");
  out->column = r.String("items.column", kMaxNameBytes);
  Decode(r, &out->meta);
}
static void Encode(WireWriter& w, const ShmCell& v) {
  w.U64(v.offset);
  Encode(w, v.meta);
}
static void Decode(WireReader& r, ShmCell* out) {
  out->offset = r.U64("cells.offset");
  Decode(r, &out->meta);
}

void Encode(WireWriter& w, const ShmWriteRequest& v) {
  w.U64(v.write_id);
  EncodeList(w, v.items);
}
void Decode(WireReader& r, ShmWriteRequest* out) {
  out->write_id = r.U64("write_id");
  out->items =
      DecodeList<ShmWriteItem>(r, "items", uint64_t{r.limits().max_batch_rows} * kMaxColumns, 8 + 4 + kMinTensorMeta);
}

void Encode(WireWriter& w, const ShmWriteReply& v) {
  w.Count(v.offsets.size());
  for (uint64_t o : v.offsets) w.U64(o);
}
void Decode(WireReader& r, ShmWriteReply* out) {
  const size_t n = r.Count("offsets", uint64_t{r.limits().max_batch_rows} * kMaxColumns, 8);
  out->offsets.clear();
  out->offsets.reserve(n);
  for (size_t i = 0; i < n && r.ok(); ++i) out->offsets.push_back(r.U64("offsets"));
}

void Encode(WireWriter& w, const ShmReadReply& v) { EncodeCells(w, v.cells); }
void Decode(WireReader& r, ShmReadReply* out) { out->cells = DecodeCells(r); }

void Encode(WireWriter& w, const PutRequest& v) {
  Encode(w, v.begin);
  EncodeColumns(w, v.data);
}
void Decode(WireReader& r, PutRequest* out) {
  Decode(r, &out->begin);
  out->data = DecodeColumns(r, "data", "data.rows");
}

void Encode(WireWriter& w, const TakeRequest& v) {
  w.U64(v.ack);
  Encode(w, v.get);
  EncodeStrings(w, v.columns);
  w.Bool(v.in_place);
}
void Decode(WireReader& r, TakeRequest* out) {
  out->ack = r.U64("ack");
  Decode(r, &out->get);
  out->columns = DecodeStrings(r, "columns", kMaxColumns, kMaxNameBytes);
  out->in_place = r.Bool("in_place");
}

void Encode(WireWriter& w, const TakeReply& v) {
  Encode(w, v.meta);
  w.Bool(v.in_place);
  if (v.in_place) {
    EncodeCells(w, v.cells);
  } else {
    EncodeColumns(w, v.data);
  }
}
void Decode(WireReader& r, TakeReply* out) {
  Decode(r, &out->meta);
  out->in_place = r.Bool("in_place");
  if (out->in_place) {
    out->cells = DecodeCells(r);
  } else {
    out->data = DecodeColumns(r, "data", "data.rows");
  }
}

}  // namespace sluice::transfer_queue::wire
