// sluice._C.transfer_queue: the TransferQueueClient (client.h) for Python,
// over an in-process hub or a sluice_queue_server (remote.h). This layer
// converts and calls; the API users see (argument checks, schema inference,
// BatchMeta, string columns) is python/sluice/transfer_queue.py.
//
// Tensors. A CPU contiguous torch tensor goes in as HostTensor views of its
// own bytes (no copy here; the transport copies once: into the in-process
// storage unit, the shared-memory arena or the request message); a
// [B, ...] tensor gives one view per row. Tensors read back are views of the
// hub's bytes (the arena over shared memory, the reply message over TCP, the
// storage cell in process) holding the HostTensor's owner, so the bytes stay
// valid (and an arena block pinned) while Python holds the tensor; a fixed
// column asked stacked is copied once into a new [B, ...] tensor.
//
// The GIL is released around every call into the client. Python objects are
// touched only with it held; the tensors a write borrows are released with
// it held too (the ColumnBatch outlives the released section).
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "sluice/transfer_queue/client.h"
#include "sluice/transfer_queue/remote.h"
#include "tensors.h"

namespace sluice::python {
namespace {

namespace py = pybind11;
namespace tq = sluice::transfer_queue;
using std::chrono::milliseconds;

// ---------------------------------------------------------------- tensors in

// Checks what would make a view of `t` wrong; the Python layer has already
// turned every caller mistake into a clear ValueError / TypeError.
DType CheckWritable(const at::Tensor& t, const std::string& column) {
  if (!t.defined()) throw py::type_error("column '" + column + "': undefined tensor");
  if (t.layout() != at::kStrided) throw py::type_error("column '" + column + "': only strided (dense) tensors");
  if (!t.device().is_cpu()) throw py::value_error("column '" + column + "': tensor is not on the CPU");
  if (!t.is_contiguous()) throw py::value_error("column '" + column + "': tensor is not contiguous");
  std::optional<DType> d = ToDType(t.scalar_type());
  if (!d)
    throw py::type_error("column '" + column + "': unsupported dtype " + std::string(c10::toString(t.scalar_type())));
  return *d;
}

// A HostTensor viewing `bytes` of `t` (kept alive by `owner`).
HostTensor View(DType dtype, std::vector<int64_t> shape, const std::shared_ptr<const void>& owner,
                const std::byte* data, size_t nbytes) {
  HostTensor h;
  h.dtype = dtype;
  h.shape = std::move(shape);
  h.owner = owner;
  h.data = data;
  h.nbytes = nbytes;
  return h;
}

// One column from Python: ("tensor", t) a [B, ...] tensor, one row per
// first index; ("tensors", [t, ...]) one tensor per row; ("utf8", bytes,
// [len, ...]) UTF-8 strings, concatenated.
std::vector<HostTensor> ToRows(const std::string& column, const py::tuple& spec) {
  if (spec.size() < 2) throw py::value_error("column '" + column + "': malformed column spec");
  const std::string kind = spec[0].cast<std::string>();
  std::vector<HostTensor> rows;
  if (kind == "tensor") {
    at::Tensor t = spec[1].cast<at::Tensor>();
    const DType dtype = CheckWritable(t, column);
    if (t.dim() < 1) throw py::value_error("column '" + column + "': a batch tensor needs a first (batch) dimension");
    const int64_t n = t.size(0);
    std::vector<int64_t> row_shape(t.sizes().begin() + 1, t.sizes().end());
    const size_t row_bytes = n == 0 ? 0 : t.nbytes() / static_cast<size_t>(n);
    auto owner = std::make_shared<at::Tensor>(t);
    const auto* base = static_cast<const std::byte*>(t.data_ptr());
    rows.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      rows.push_back(View(dtype, row_shape, owner, base + static_cast<size_t>(i) * row_bytes, row_bytes));
    }
  } else if (kind == "tensors") {
    py::sequence seq = spec[1].cast<py::sequence>();
    rows.reserve(seq.size());
    for (py::handle item : seq) {
      at::Tensor t = item.cast<at::Tensor>();
      const DType dtype = CheckWritable(t, column);
      auto owner = std::make_shared<at::Tensor>(t);
      rows.push_back(View(dtype, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), owner,
                          static_cast<const std::byte*>(t.data_ptr()), t.nbytes()));
    }
  } else if (kind == "utf8") {
    if (spec.size() != 3) throw py::value_error("column '" + column + "': malformed string column spec");
    auto joined = std::make_shared<std::string>(spec[1].cast<std::string>());
    std::vector<int64_t> lengths = spec[2].cast<std::vector<int64_t>>();
    size_t offset = 0;
    rows.reserve(lengths.size());
    for (int64_t len : lengths) {
      if (len < 0 || offset + static_cast<size_t>(len) > joined->size()) {
        throw py::value_error("column '" + column + "': string lengths do not match the bytes");
      }
      rows.push_back(View(DType::kU8, {len}, joined, reinterpret_cast<const std::byte*>(joined->data()) + offset, len));
      offset += static_cast<size_t>(len);
    }
    if (offset != joined->size())
      throw py::value_error("column '" + column + "': string lengths do not match the bytes");
  } else {
    throw py::value_error("column '" + column + "': unknown column kind '" + kind + "'");
  }
  return rows;
}

tq::ColumnBatch ToColumnBatch(const py::dict& columns) {
  tq::ColumnBatch batch;
  for (auto [name, spec] : columns) {
    const std::string column = name.cast<std::string>();
    batch.emplace(column, ToRows(column, spec.cast<py::tuple>()));
  }
  return batch;
}

tq::RowTags ToTags(const py::handle& h) {
  // (group_id, policy_version, token_length, {user: value})
  py::tuple t = h.cast<py::tuple>();
  if (t.size() != 4) throw py::value_error("malformed row tags");
  tq::RowTags tags;
  tags.group_id = t[0].cast<int64_t>();
  tags.policy_version = t[1].cast<int64_t>();
  tags.token_length = t[2].cast<int64_t>();
  tags.user = t[3].cast<std::map<std::string, std::string>>();
  return tags;
}

std::vector<tq::RowTags> ToTagList(const py::list& list) {
  std::vector<tq::RowTags> out;
  out.reserve(list.size());
  for (py::handle h : list) out.push_back(ToTags(h));
  return out;
}

std::vector<tq::RowTagPatch> ToPatches(const py::list& list) {
  // (policy_version or None, token_length or None, {user: value})
  std::vector<tq::RowTagPatch> out;
  out.reserve(list.size());
  for (py::handle h : list) {
    py::tuple t = h.cast<py::tuple>();
    if (t.size() != 3) throw py::value_error("malformed tag patch");
    tq::RowTagPatch p;
    if (!t[0].is_none()) p.policy_version = t[0].cast<int64_t>();
    if (!t[1].is_none()) p.token_length = t[1].cast<int64_t>();
    p.user = t[2].cast<std::map<std::string, std::string>>();
    out.push_back(std::move(p));
  }
  return out;
}

// ---------------------------------------------------------------- tensors out

py::tuple FromTags(const tq::RowTags& tags) {
  return py::make_tuple(tags.group_id, tags.policy_version, tags.token_length, tags.user);
}

// The rows of one column as Python wants them:
//   "views": a list of per-row tensors viewing the hub's bytes;
//   "stack": one new [B, ...] tensor (rows must share dtype and shape);
//   "str":   a list of str (rows must be 1-D uint8, valid UTF-8).
py::object ConvertColumn(const std::string& column, const std::vector<HostTensor>& rows, const std::string& kind) {
  if (kind == "views") {
    py::list out;
    for (const HostTensor& h : rows) out.append(py::cast(ViewOf(h)));
    return out;
  }
  if (kind == "str") {
    py::list out;
    for (size_t i = 0; i < rows.size(); ++i) {
      const HostTensor& h = rows[i];
      if (h.dtype != DType::kU8 || h.shape.size() != 1) {
        throw StatusError(Status::DataLoss("string column '" + column + "' row " + std::to_string(i) + " is " +
                                           std::string(DTypeName(h.dtype)) + " " + ShapeToString(h.shape) +
                                           ", not 1-D U8 bytes"));
      }
      PyObject* s =
          PyUnicode_DecodeUTF8(reinterpret_cast<const char*>(h.data), static_cast<Py_ssize_t>(h.nbytes), "strict");
      if (s == nullptr) {
        PyErr_Clear();
        throw py::value_error("string column '" + column + "' row " + std::to_string(i) +
                              " holds bytes that are not valid UTF-8");
      }
      out.append(py::reinterpret_steal<py::object>(s));
    }
    return out;
  }
  if (kind == "stack") {
    std::vector<int64_t> shape = {static_cast<int64_t>(rows.size())};
    DType dtype = rows.empty() ? DType::kU8 : rows[0].dtype;
    if (!rows.empty()) shape.insert(shape.end(), rows[0].shape.begin(), rows[0].shape.end());
    for (size_t i = 1; i < rows.size(); ++i) {
      if (rows[i].dtype != dtype || rows[i].shape != rows[0].shape) {
        throw py::value_error("column '" + column + "' cannot be stacked: row 0 is " + std::string(DTypeName(dtype)) +
                              " " + ShapeToString(rows[0].shape) + ", row " + std::to_string(i) + " is " +
                              std::string(DTypeName(rows[i].dtype)) + " " + ShapeToString(rows[i].shape) +
                              " (read it with stack=False)");
      }
    }
    at::Tensor out = at::empty(shape, at::TensorOptions().dtype(ToScalarType(dtype)));
    {
      py::gil_scoped_release release;
      auto* dst = static_cast<std::byte*>(out.data_ptr());
      for (const HostTensor& h : rows) {
        if (h.nbytes > 0) std::memcpy(dst, h.data, h.nbytes);
        dst += h.nbytes;
      }
    }
    return py::cast(out);
  }
  throw py::value_error("unknown conversion '" + kind + "' for column '" + column + "'");
}

py::dict ConvertColumns(const tq::ColumnBatch& columns, const py::dict& kinds) {
  py::dict out;
  for (const auto& [name, rows] : columns) {
    std::string kind = "views";
    if (kinds.contains(name)) kind = kinds[py::str(name)].cast<std::string>();
    out[py::str(name)] = ConvertColumn(name, rows, kind);
  }
  return out;
}

py::tuple FromEntry(const tq::KvEntry& e) { return py::make_tuple(e.key, e.row, FromTags(e.tags), e.columns); }

double MonotonicSeconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// ---------------------------------------------------------------- the client

// One connection (or in-process hub) and the client over it. Close() stops
// the controller side from serving this object; the parts stay alive, so
// views already handed out stay valid and concurrent calls finish with
// Aborted rather than touching freed memory.
class Client {
 public:
  static std::unique_ptr<Client> Connect(const std::string& endpoint, const std::string& token, const std::string& shm,
                                         int64_t rpc_timeout_ms) {
    tq::RemoteOptions options;
    options.token = token;
    if (rpc_timeout_ms <= 0) throw py::value_error("rpc_timeout must be > 0");
    options.rpc_timeout = milliseconds(rpc_timeout_ms);
    if (shm == "auto") {
      options.shm = tq::ShmMode::kAuto;
    } else if (shm == "off") {
      options.shm = tq::ShmMode::kOff;
    } else if (shm == "required") {
      options.shm = tq::ShmMode::kRequired;
    } else {
      throw py::value_error("shm must be 'auto', 'off' or 'required', not '" + shm + "'");
    }
    Result<tq::RemoteQueue> queue = Status::Internal("not connected");
    {
      py::gil_scoped_release release;
      queue = tq::ConnectTransferQueue(endpoint, options);
    }
    auto c = std::unique_ptr<Client>(new Client(ValueOrThrow(std::move(queue))));
    return c;
  }

  static std::unique_ptr<Client> InProcess(uint64_t capacity_bytes, uint64_t capacity_rows, uint32_t storage_units,
                                           int64_t lease_timeout_ms, uint32_t max_batch_rows,
                                           uint64_t max_tensor_bytes) {
    tq::HubOptions options;
    options.controller.capacity_bytes = capacity_bytes;
    options.controller.capacity_rows = capacity_rows;
    options.controller.default_lease_timeout = milliseconds(lease_timeout_ms);
    options.controller.max_batch_rows = max_batch_rows;
    options.controller.max_tensor_bytes = max_tensor_bytes;
    options.storage_units = storage_units;
    std::shared_ptr<tq::TransferQueueHub> hub(ValueOrThrow(tq::TransferQueueHub::Create(std::move(options))));
    return std::unique_ptr<Client>(new Client(std::move(hub)));
  }

  std::string transport() const { return transport_; }
  std::string endpoint() const { return endpoint_; }
  std::string shm_segment() const { return shm_segment_; }

  void Close() {
    py::gil_scoped_release release;
    client_.controller()->Close();
  }

  py::tuple Describe() {
    Result<tq::DescribeResponse> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.controller()->Describe();
    }
    tq::DescribeResponse d = ValueOrThrow(std::move(r));
    py::list columns;
    for (const tq::ColumnSchema& c : d.columns) {
      columns.append(py::make_tuple(c.name, std::string(DTypeName(c.dtype)), c.shape));
    }
    return py::make_tuple(columns, d.tasks);
  }

  void RegisterColumns(const py::list& schemas) {
    std::vector<tq::ColumnSchema> columns;
    for (py::handle h : schemas) {
      py::tuple t = h.cast<py::tuple>();
      if (t.size() != 3) throw py::value_error("malformed column schema");
      columns.push_back(tq::ColumnSchema{t[0].cast<std::string>(), ParseDType(t[1].cast<std::string>()),
                                         t[2].cast<std::vector<int64_t>>()});
    }
    py::gil_scoped_release release;
    ThrowIfError(client_.RegisterColumns(std::move(columns)));
  }

  void RegisterTask(const std::string& task) {
    py::gil_scoped_release release;
    ThrowIfError(client_.RegisterTask(task));
  }

  bool CreatePartition(const std::string& partition, uint32_t group_size, std::vector<std::string> consumers) {
    Result<tq::CreatePartitionResponse> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.controller()->CreatePartition(
          tq::CreatePartitionRequest{partition, group_size, std::move(consumers)});
    }
    return ValueOrThrow(std::move(r)).created;
  }

  std::vector<tq::RowId> PutRows(const std::string& partition, const py::list& tags, const py::dict& columns) {
    std::vector<tq::RowTags> row_tags = ToTagList(tags);
    tq::ColumnBatch batch = ToColumnBatch(columns);  // outlives the released section
    Result<std::vector<tq::RowId>> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.PutRows(partition, std::move(row_tags), batch);
    }
    return ValueOrThrow(std::move(r));
  }

  void PutColumns(const std::vector<tq::RowId>& rows, const py::dict& columns, const py::list& patches) {
    std::vector<tq::RowTagPatch> row_patches = ToPatches(patches);
    tq::ColumnBatch batch = ToColumnBatch(columns);
    Status s;
    {
      py::gil_scoped_release release;
      s = client_.PutColumns(rows, batch, std::move(row_patches));
    }
    ThrowIfError(s);
  }

  // (task, columns, n, partition, (mode, group_size, min_version,
  // max_version, dp_ranks), timeout_ms, lease_timeout_ms) -> the BatchMeta
  // as a tuple. The wait is cut into slices so Ctrl-C (and other signals)
  // are handled while it waits.
  py::tuple GetMeta(const std::string& task, std::vector<std::string> columns, uint32_t n, const std::string& partition,
                    const py::tuple& policy, int64_t timeout_ms, int64_t lease_timeout_ms, const std::string& holder) {
    if (timeout_ms < 0) throw py::value_error("timeout must be >= 0");
    if (lease_timeout_ms < 0) throw py::value_error("lease_timeout must be >= 0");
    tq::GetMetaRequest request;
    request.task = task;
    request.columns = std::move(columns);
    request.n = n;
    request.partition = partition;
    request.lease_timeout = milliseconds(lease_timeout_ms);
    request.holder = holder;
    if (policy.size() != 5) throw py::value_error("malformed sampling policy");
    const std::string mode = policy[0].cast<std::string>();
    if (mode == "fifo") {
      request.policy.mode = tq::SamplingMode::kFifo;
    } else if (mode == "whole_group") {
      request.policy.mode = tq::SamplingMode::kWholeGroup;
    } else {
      throw py::value_error("sampling mode must be 'fifo' or 'whole_group', not '" + mode + "'");
    }
    request.policy.group_size = policy[1].cast<uint32_t>();
    request.policy.min_policy_version = policy[2].cast<int64_t>();
    request.policy.max_policy_version = policy[3].cast<int64_t>();
    request.policy.dp_ranks = policy[4].cast<uint32_t>();

    constexpr milliseconds kSlice(500);
    const milliseconds total(timeout_ms);
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const auto waited = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
      request.timeout = std::min(kSlice, std::max(total - waited, milliseconds(0)));
      Result<tq::BatchMeta> r = Status::Internal("no reply");
      {
        py::gil_scoped_release release;
        r = client_.GetMeta(request);
      }
      if (r.ok()) return FromBatchMeta(*r);
      const bool more = std::chrono::steady_clock::now() - start < total;
      if (r.status().code() != StatusCode::kTimeout || !more) {
        if (r.status().code() == StatusCode::kTimeout && total > kSlice) {
          throw StatusError(
              Status::Timeout(r.status().message() + " (of a " + std::to_string(total.count()) + " ms wait in all)"));
        }
        throw StatusError(r.status());
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  // Reads `columns` (empty: meta_columns) of `rows`, converted per `kinds`.
  py::dict GetData(uint64_t lease_id, const std::vector<tq::RowId>& rows, const std::vector<std::string>& meta_columns,
                   const std::vector<std::string>& columns, const py::dict& kinds) {
    tq::BatchMeta meta;
    meta.lease_id = lease_id;
    meta.columns = meta_columns;
    meta.rows.reserve(rows.size());
    for (tq::RowId id : rows) meta.rows.push_back(tq::RowMeta{id, {}});
    Result<tq::BatchData> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.GetData(meta, columns);
    }
    tq::BatchData data = ValueOrThrow(std::move(r));
    return ConvertColumns(data.columns, kinds);
  }

  py::tuple Ack(uint64_t lease) {
    Result<tq::AckResponse> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.Ack(lease);
    }
    tq::AckResponse a = ValueOrThrow(std::move(r));
    return py::make_tuple(a.rows_acked, a.rows_cleared, a.rows_freed);
  }

  py::tuple Release(uint64_t lease) {
    Result<tq::ReleaseResponse> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.Release(lease);
    }
    tq::ReleaseResponse a = ValueOrThrow(std::move(r));
    return py::make_tuple(a.rows_returned, a.rows_cleared);
  }

  double Renew(uint64_t lease, int64_t lease_timeout_ms) {
    if (lease_timeout_ms < 0) throw py::value_error("lease_timeout must be >= 0");
    Result<tq::RenewResponse> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.Renew(lease, milliseconds(lease_timeout_ms));
    }
    return MonotonicSeconds(ValueOrThrow(std::move(r)).deadline);
  }

  py::tuple ReleaseHolder(const std::string& holder) {
    Result<tq::ReleaseHolderResponse> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.ReleaseHolder(holder);
    }
    tq::ReleaseHolderResponse a = ValueOrThrow(std::move(r));
    return py::make_tuple(a.leases_released, a.rows_returned, a.rows_cleared);
  }

  uint64_t ClearPartition(const std::string& partition) {
    Result<tq::ClearResponse> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.ClearPartition(partition);
    }
    return ValueOrThrow(std::move(r)).rows_cleared;
  }

  void KvPut(const std::string& partition, std::vector<std::string> keys, const py::list& tags, const py::list& patches,
             const py::dict& columns) {
    std::vector<tq::RowTags> row_tags = ToTagList(tags);
    std::vector<tq::RowTagPatch> row_patches = ToPatches(patches);
    tq::ColumnBatch batch = ToColumnBatch(columns);
    Status s;
    {
      py::gil_scoped_release release;
      s = client_.KvPutBatch(partition, std::move(keys), std::move(row_tags), batch, std::move(row_patches));
    }
    ThrowIfError(s);
  }

  // -> ([entry, ...], {column: converted})
  py::tuple KvGet(const std::string& partition, std::vector<std::string> keys, const std::vector<std::string>& columns,
                  const py::dict& kinds) {
    Result<tq::KvBatch> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.KvGetBatch(partition, std::move(keys), columns);
    }
    tq::KvBatch batch = ValueOrThrow(std::move(r));
    py::list entries;
    for (const tq::KvEntry& e : batch.entries) entries.append(FromEntry(e));
    return py::make_tuple(entries, ConvertColumns(batch.columns, kinds));
  }

  py::list KvList(const std::string& partition) {
    Result<std::vector<tq::KvEntry>> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.KvList(partition);
    }
    py::list out;
    for (const tq::KvEntry& e : ValueOrThrow(std::move(r))) out.append(FromEntry(e));
    return out;
  }

  uint64_t KvClear(const std::string& partition, std::vector<std::string> keys) {
    Result<tq::ClearResponse> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.KvClear(partition, std::move(keys));
    }
    return ValueOrThrow(std::move(r)).rows_cleared;
  }

  py::dict Stats() {
    Result<tq::QueueStats> r = Status::Internal("no reply");
    {
      py::gil_scoped_release release;
      r = client_.Stats();
    }
    const tq::QueueStats s = ValueOrThrow(std::move(r));
    const tq::ControllerStats& c = s.controller;
    py::dict out;
    out["rows"] = c.rows;
    out["capacity_rows"] = c.capacity_rows;
    out["bytes_held"] = c.bytes_held;
    out["bytes_committed"] = c.bytes_committed;
    out["bytes_reserved"] = c.bytes_reserved;
    out["bytes_reclaiming"] = c.bytes_reclaiming;
    out["capacity_bytes"] = c.capacity_bytes;
    out["partitions"] = c.partitions;
    out["active_leases"] = c.active_leases;
    out["open_writes"] = c.open_writes;
    out["waiting_consumers"] = c.waiting_consumers;
    out["waiting_producers"] = c.waiting_producers;
    out["rows_created"] = c.rows_created;
    out["rows_freed"] = c.rows_freed;
    out["leases_granted"] = c.leases_granted;
    out["leases_acked"] = c.leases_acked;
    out["leases_released"] = c.leases_released;
    out["leases_expired"] = c.leases_expired;
    out["rows_redelivered"] = c.rows_redelivered;
    out["writes_committed"] = c.writes_committed;
    out["writes_aborted"] = c.writes_aborted;
    out["storage_bytes"] = s.storage_bytes;
    py::dict tasks;
    for (const tq::TaskDepth& t : c.tasks) {
      py::dict d;
      d["ready"] = t.ready;
      d["leased"] = t.leased;
      d["acked"] = t.acked;
      d["acked_total"] = t.acked_total;
      d["waiting"] = t.waiting;
      tasks[py::str(t.task)] = d;
    }
    out["tasks"] = tasks;
    return out;
  }

 private:
  explicit Client(tq::RemoteQueue queue)
      : client_(queue.client()),
        remote_(std::move(queue)),
        transport_(remote_.shm_segment.empty() ? "tcp" : "shm"),
        endpoint_(remote_.endpoint),
        shm_segment_(remote_.shm_segment) {}
  explicit Client(std::shared_ptr<tq::TransferQueueHub> hub)
      : client_(hub->client()), hub_(std::move(hub)), transport_("in_process") {}

  static py::tuple FromBatchMeta(const tq::BatchMeta& m) {
    py::list rows;
    for (const tq::RowMeta& r : m.rows) rows.append(py::make_tuple(r.id, FromTags(r.tags)));
    return py::make_tuple(m.lease_id, m.task, m.partition, m.columns, rows, m.rank, m.dp_ranks,
                          MonotonicSeconds(m.deadline));
  }

  tq::TransferQueueClient client_;
  tq::RemoteQueue remote_;                     // when connected to a server
  std::shared_ptr<tq::TransferQueueHub> hub_;  // when in process
  std::string transport_;
  std::string endpoint_;
  std::string shm_segment_;
};

}  // namespace

void BindTransferQueue(py::module_& m) {
  py::class_<Client>(m, "Client")
      .def_static("connect", &Client::Connect, py::arg("endpoint"), py::arg("token"), py::arg("shm"),
                  py::arg("rpc_timeout_ms"))
      .def_static("in_process", &Client::InProcess, py::arg("capacity_bytes"), py::arg("capacity_rows"),
                  py::arg("storage_units"), py::arg("lease_timeout_ms"), py::arg("max_batch_rows"),
                  py::arg("max_tensor_bytes"))
      .def_property_readonly("transport", &Client::transport)
      .def_property_readonly("endpoint", &Client::endpoint)
      .def_property_readonly("shm_segment", &Client::shm_segment)
      .def("close", &Client::Close)
      .def("describe", &Client::Describe)
      .def("register_columns", &Client::RegisterColumns)
      .def("register_task", &Client::RegisterTask)
      .def("create_partition", &Client::CreatePartition)
      .def("put_rows", &Client::PutRows)
      .def("put_columns", &Client::PutColumns)
      .def("get_meta", &Client::GetMeta)
      .def("get_data", &Client::GetData)
      .def("ack", &Client::Ack)
      .def("release", &Client::Release)
      .def("renew", &Client::Renew)
      .def("release_holder", &Client::ReleaseHolder)
      .def("clear_partition", &Client::ClearPartition)
      .def("kv_put", &Client::KvPut)
      .def("kv_get", &Client::KvGet)
      .def("kv_list", &Client::KvList)
      .def("kv_clear", &Client::KvClear)
      .def("stats", &Client::Stats);
}

}  // namespace sluice::python
