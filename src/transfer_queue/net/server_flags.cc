#include "sluice/transfer_queue/server_flags.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/validation.h"
#include "net/rpc_channel.h"
#include "net/storage_hosts.h"
#include "sluice/runtime/flags.h"
#include "wire/wire.h"

namespace sluice::transfer_queue {
namespace {

std::vector<std::string> Split(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t end = text.find(sep, start);
    out.emplace_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

Result<int64_t> ParseInt(std::string_view text) {
  if (text.empty() || text.size() > 18) return Status::InvalidArgument("not a number");
  size_t i = text[0] == '-' ? 1 : 0;
  if (i == text.size()) return Status::InvalidArgument("not a number");
  int64_t v = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return Status::InvalidArgument("not a number");
    v = v * 10 + (text[i] - '0');
  }
  return text[0] == '-' ? -v : v;
}

Result<ColumnSchema> ParseColumn(const std::string& entry) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--columns: entry '" + entry + "': " + why +
                                   " (expected name:DTYPE:SHAPE, e.g. prompt:I64:* or mask:U8:4x2)");
  };
  std::vector<std::string> parts = Split(entry, ':');
  if (parts.size() != 3) return bad("needs exactly two ':'");
  ColumnSchema schema;
  schema.name = parts[0];
  std::string dtype = parts[1];
  for (char& ch : dtype) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  std::optional<DType> parsed = ParseDTypeName(dtype);
  if (!parsed) return bad("unknown dtype '" + parts[1] + "' (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
  schema.dtype = *parsed;
  if (!parts[2].empty()) {
    std::vector<std::string> dims = Split(parts[2], 'x');
    if (dims.size() > wire::kMaxTensorDims) return bad("more than 16 dimensions");
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] == "*") {
        schema.shape.push_back(kRaggedDim);
        continue;
      }
      Result<int64_t> dim = ParseInt(dims[d]);
      if (!dim.ok()) return bad("dimension '" + dims[d] + "' is not a number or '*'");
      schema.shape.push_back(*dim);
    }
  }
  Status valid = internal::ValidateSchema(schema);
  if (!valid.ok()) return bad(valid.message());
  return schema;
}

// "N" or "N-M" (inclusive): units [first, first + count) of a hub of `units`.
Result<std::pair<uint32_t, uint32_t>> ParseUnitRange(const std::string& flag, const std::string& text, uint32_t units) {
  auto bad = [&](const std::string& why) { return Status::InvalidArgument(flag + ": '" + text + "' " + why); };
  const size_t dash = text.find('-');
  Result<int64_t> first = ParseInt(text.substr(0, dash));
  Result<int64_t> last = dash == std::string::npos ? first : ParseInt(text.substr(dash + 1));
  if (!first.ok() || !last.ok() || *first < 0 || *last < *first) {
    return bad("is not a unit or a range of units (N or N-M, M >= N)");
  }
  if (*last >= static_cast<int64_t>(units)) {
    return bad("names unit " + std::to_string(*last) + ", but --storage-units is " + std::to_string(units) +
               " (units 0.." + std::to_string(units - 1) + ")");
  }
  return std::make_pair(static_cast<uint32_t>(*first), static_cast<uint32_t>(*last - *first + 1));
}

// --storage-hosts "UNITS@ENDPOINT,...".
Result<std::vector<StorageHost>> ParseStorageHosts(const std::string& text, uint32_t units) {
  std::vector<StorageHost> out;
  std::vector<wire::UnitHost> check;
  for (const std::string& entry : Split(text, ',')) {
    const size_t at = entry.find('@');
    if (at == std::string::npos) {
      return Status::InvalidArgument("--storage-hosts: entry '" + entry +
                                     "' is not UNITS@ENDPOINT (e.g. 1-2@tcp://10.0.0.2:5601)");
    }
    SLUICE_ASSIGN_OR_RETURN(auto range, ParseUnitRange("--storage-hosts", entry.substr(0, at), units));
    StorageHost host{range.first, range.second, entry.substr(at + 1)};
    SLUICE_RETURN_IF_ERROR(internal::ValidateEndpoint(host.endpoint).WithContext("--storage-hosts"));
    check.push_back({host.first_unit, host.count, host.endpoint});
    out.push_back(std::move(host));
  }
  SLUICE_RETURN_IF_ERROR(internal::CheckUnitHosts(check, units, "--storage-hosts"));
  return out;
}

}  // namespace

Result<std::vector<ColumnSchema>> ParseColumnList(std::string_view text) {
  std::vector<ColumnSchema> out;
  if (text.empty()) return out;
  for (const std::string& entry : Split(text, ',')) {
    SLUICE_ASSIGN_OR_RETURN(ColumnSchema schema, ParseColumn(entry));
    for (const ColumnSchema& seen : out) {
      if (seen.name == schema.name) {
        return Status::InvalidArgument("--columns: column '" + schema.name + "' is listed twice");
      }
    }
    out.push_back(std::move(schema));
  }
  if (out.size() > kMaxColumns) {
    return Status::InvalidArgument("--columns: " + std::to_string(out.size()) + " columns, at most " +
                                   std::to_string(kMaxColumns));
  }
  return out;
}

Result<uint64_t> ParseByteSize(std::string_view flag, std::string_view text) {
  auto bad = [&] {
    return Status::InvalidArgument(std::string(flag) + ": '" + std::string(text) +
                                   "' is not a byte count (a number with an optional K, M, G or T suffix)");
  };
  if (text.empty()) return bad();
  uint64_t scale = 1;
  switch (text.back()) {
    case 'K':
    case 'k':
      scale = uint64_t{1} << 10;
      break;
    case 'M':
    case 'm':
      scale = uint64_t{1} << 20;
      break;
    case 'G':
    case 'g':
      scale = uint64_t{1} << 30;
      break;
    case 'T':
    case 't':
      scale = uint64_t{1} << 40;
      break;
    default:
      break;
  }
  if (scale != 1) text.remove_suffix(1);
  Result<int64_t> n = ParseInt(text);
  if (!n.ok() || *n < 0) return bad();
  if (static_cast<uint64_t>(*n) > std::numeric_limits<uint64_t>::max() / scale / 2) {
    return Status::InvalidArgument(std::string(flag) + ": '" + std::string(text) + "' is too large");
  }
  return static_cast<uint64_t>(*n) * scale;
}

Result<std::string> ReadTokenFile(const std::string& path, const std::string& flag) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument(flag + ": '" + path + "' is a directory, not a file holding the token");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument(flag + ": cannot read '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  while (!token.empty() &&
         (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) {
    token.pop_back();
  }
  if (token.empty()) return Status::InvalidArgument(flag + ": '" + path + "' is empty");
  if (token.size() > wire::kMaxTokenBytes) {
    return Status::InvalidArgument(flag + ": the token in '" + path + "' has " + std::to_string(token.size()) +
                                   " bytes, at most " + std::to_string(wire::kMaxTokenBytes) + " allowed");
  }
  return token;
}

namespace {

// --storage-hosts, --serve-units, --peer-token-file,
// --storage-connect-timeout-ms (the other flags already parsed into *out).
Status ParseStorageFlags(const runtime::FlagSet& fs, const std::string& columns, const std::string& tasks,
                         ServerFlags* out) {
  ServerOptions& o = out->options;
  SLUICE_ASSIGN_OR_RETURN(std::string hosts, fs.GetString("storage-hosts"));
  SLUICE_ASSIGN_OR_RETURN(std::string serve, fs.GetString("serve-units"));
  SLUICE_ASSIGN_OR_RETURN(std::string peer_file, fs.GetString("peer-token-file"));
  SLUICE_ASSIGN_OR_RETURN(int64_t connect_ms, fs.GetInt("storage-connect-timeout-ms", 1, 3600000));
  o.storage_connect_timeout = std::chrono::milliseconds(connect_ms);
  if (!peer_file.empty()) {
    SLUICE_ASSIGN_OR_RETURN(o.peer_token, ReadTokenFile(peer_file, "--peer-token-file"));
    if (o.peer_token == o.token) {
      return Status::InvalidArgument(
          "--peer-token-file holds the same secret as --token-file: clients have that "
          "one, and the peer secret is what lets a server free and discard rows");
    }
  }
  if (!hosts.empty() && !serve.empty()) {
    return Status::InvalidArgument(
        "--storage-hosts and --serve-units: a server is either the controller's server "
        "(--storage-hosts) or a storage server (--serve-units), not both");
  }
  if ((!hosts.empty() || !serve.empty()) && o.peer_token.empty()) {
    return Status::InvalidArgument(std::string(hosts.empty() ? "--serve-units" : "--storage-hosts") +
                                   " needs --peer-token-file (the secret the controller's server and its storage "
                                   "servers share)");
  }
  if (!hosts.empty()) {
    SLUICE_ASSIGN_OR_RETURN(o.storage_hosts, ParseStorageHosts(hosts, o.storage_units));
  }
  if (serve.empty()) return Status::Ok();
  if (!columns.empty() || !tasks.empty() || !o.controller.ack_log.empty()) {
    return Status::InvalidArgument(
        "--serve-units: a storage server has no controller; --columns, --tasks and --ack-log "
        "belong on the controller's server");
  }
  if (o.shm_bytes > 0) {
    return Status::InvalidArgument("--serve-units: a storage server has no shared-memory arena (drop --shm-bytes)");
  }
  if (o.open_write_timeout.count() == 0) {
    return Status::InvalidArgument(
        "--serve-units: --open-write-timeout-ms must be > 0 (how long a storage server "
        "keeps a declared write its controller's server never finished)");
  }
  SLUICE_ASSIGN_OR_RETURN(auto range, ParseUnitRange("--serve-units", serve, o.storage_units));
  o.storage_only = true;
  o.first_unit = range.first;
  o.unit_count = range.second;
  return Status::Ok();
}

}  // namespace

Result<ServerFlags> ParseServerFlags(const std::vector<std::string>& args) {
  runtime::FlagSet fs;
  fs.Add("bind", "tcp://127.0.0.1:0", "endpoint to serve: tcp://HOST:PORT (port 0 = any free) or ipc://PATH");
  fs.Add("token-file", "", "file holding the shared-secret token clients must send; required for non-loopback binds");
  fs.Add("capacity-bytes", "", "payload bytes held at once (K/M/G/T suffixes); default 8G, or 3/4 of --shm-bytes");
  fs.Add("shm-bytes", "0",
         "shared-memory arena for same-host clients, which then write and read payloads in place (0 = none); "
         "must exceed --capacity-bytes");
  fs.Add("shm-rings", "64",
         "same-host clients served through a shared-memory ring each instead of the socket (with --shm-bytes; "
         "0 = none)");
  fs.Add("shm-ring-bytes", "256K", "bytes per direction of one ring (4K..1G, a multiple of 64)");
  fs.Add("direct-connections", "64",
         "clients served over a plain TCP connection each (tcp:// IPv4 binds; a second port on the same address) "
         "instead of ZeroMQ; 0 = none");
  fs.Add("capacity-rows", "1048576", "rows alive at once");
  fs.Add("storage-units", "2", "storage units (rows are sharded row % N)");
  fs.Add("columns", "", "columns to register: name:DTYPE:SHAPE,... e.g. prompt:I64:*,reward:F32:,mask:U8:4x2");
  fs.Add("tasks", "", "consumer tasks to register: name,name,...");
  fs.Add("lease-timeout-ms", "60000", "lease duration when a GetMeta does not set one");
  fs.Add("ack-log", "",
         "file every ack appends a JSON line to (the lease, its task and holder, each row with its group id): "
         "the hub's own record of what each task consumed; empty = none");
  fs.Add("max-batch-rows", "65536", "largest GetMeta n and write row count");
  fs.Add("max-tensor-bytes", "1G", "largest single tensor (one row of one column)");
  fs.Add("max-message-bytes", "", "largest message accepted; default max-tensor-bytes + 1M");
  fs.Add("workers", "4", "threads serving requests that do not block");
  fs.Add("max-blocking-calls", "256", "GetMeta/producer calls waiting at once");
  fs.Add("open-write-timeout-ms", "60000", "abort a write left open this long (its producer died); 0 = never");
  fs.Add("storage-hosts", "",
         "units of this hub served by storage servers on other hosts: UNITS@ENDPOINT,... (UNITS is N or N-M; "
         "e.g. 1@tcp://10.0.0.2:5601,2-3@tcp://10.0.0.3:5601); needs --peer-token-file");
  fs.Add("serve-units", "",
         "run as a storage server holding units N or N-M of a hub of --storage-units units, whose controller's "
         "server (--storage-hosts) is elsewhere; needs --peer-token-file");
  fs.Add("peer-token-file", "",
         "file holding the secret a controller's server and its storage servers share (clients never get it; "
         "different from --token-file's)");
  fs.Add("storage-connect-timeout-ms", "30000",
         "how long a controller's server waits at start for its storage servers");
  SLUICE_RETURN_IF_ERROR(fs.Parse(args));
  ServerFlags out;
  out.usage = "usage: sluice_queue_server [flags]\n" + fs.Usage();
  if (fs.help_requested()) {
    out.help = true;
    return out;
  }
  SLUICE_RETURN_IF_ERROR(fs.RejectPositional());
  ServerOptions& o = out.options;
  SLUICE_ASSIGN_OR_RETURN(o.bind, fs.GetString("bind"));
  SLUICE_RETURN_IF_ERROR(internal::ValidateEndpoint(o.bind).WithContext("--bind"));
  SLUICE_ASSIGN_OR_RETURN(out.token_file, fs.GetString("token-file"));
  if (!out.token_file.empty()) {
    SLUICE_ASSIGN_OR_RETURN(o.token, ReadTokenFile(out.token_file));
  }
  if (o.token.empty() && !IsLoopbackEndpoint(o.bind)) {
    return Status::InvalidArgument("--bind " + o.bind +
                                   " is not a loopback endpoint: other hosts could connect, so --token-file is "
                                   "required (or bind tcp://127.0.0.1:PORT)");
  }
  SLUICE_ASSIGN_OR_RETURN(std::string shm_bytes, fs.GetString("shm-bytes"));
  SLUICE_ASSIGN_OR_RETURN(o.shm_bytes, ParseByteSize("--shm-bytes", shm_bytes));
  SLUICE_ASSIGN_OR_RETURN(std::string capacity_bytes, fs.GetString("capacity-bytes"));
  if (capacity_bytes.empty()) {
    o.controller.capacity_bytes = o.shm_bytes > 0 ? o.shm_bytes / 4 * 3 : uint64_t{8} << 30;
  } else {
    SLUICE_ASSIGN_OR_RETURN(o.controller.capacity_bytes, ParseByteSize("--capacity-bytes", capacity_bytes));
  }
  if (o.controller.capacity_bytes == 0) return Status::InvalidArgument("--capacity-bytes must be > 0");
  if (o.shm_bytes > 0 && o.controller.capacity_bytes > o.shm_bytes) {
    return Status::InvalidArgument("--capacity-bytes " + capacity_bytes + " exceeds --shm-bytes " + shm_bytes +
                                   ": every stored payload lives in the arena, which needs room beyond the capacity "
                                   "for views readers still hold");
  }
  SLUICE_ASSIGN_OR_RETURN(int64_t direct, fs.GetInt("direct-connections", 0, 4096));
  o.direct_connections = static_cast<uint32_t>(direct);
  SLUICE_ASSIGN_OR_RETURN(int64_t rings, fs.GetInt("shm-rings", 0, 4096));
  o.shm_rings = static_cast<uint32_t>(rings);
  SLUICE_ASSIGN_OR_RETURN(std::string ring_bytes, fs.GetString("shm-ring-bytes"));
  SLUICE_ASSIGN_OR_RETURN(o.shm_ring_bytes, ParseByteSize("--shm-ring-bytes", ring_bytes));
  if (o.shm_ring_bytes < internal::kRingMinCapacity || o.shm_ring_bytes > internal::kRingMaxCapacity ||
      o.shm_ring_bytes % 64 != 0) {
    return Status::InvalidArgument("--shm-ring-bytes " + ring_bytes + " must be a multiple of 64 in 4K..1G");
  }
  SLUICE_ASSIGN_OR_RETURN(int64_t rows, fs.GetInt("capacity-rows", 1, int64_t{1} << 40));
  o.controller.capacity_rows = static_cast<uint64_t>(rows);
  SLUICE_ASSIGN_OR_RETURN(int64_t units, fs.GetInt("storage-units", 1, wire::kMaxStorageUnits));
  o.storage_units = static_cast<uint32_t>(units);
  SLUICE_ASSIGN_OR_RETURN(std::string columns, fs.GetString("columns"));
  SLUICE_ASSIGN_OR_RETURN(o.controller.columns, ParseColumnList(columns));
  SLUICE_ASSIGN_OR_RETURN(std::string tasks, fs.GetString("tasks"));
  if (!tasks.empty()) {
    for (const std::string& task : Split(tasks, ',')) {
      Status valid = internal::ValidateName("task", task);
      if (!valid.ok()) return valid.WithContext("--tasks");
      for (const std::string& seen : o.controller.tasks) {
        if (seen == task) return Status::InvalidArgument("--tasks: task '" + task + "' is listed twice");
      }
      o.controller.tasks.push_back(task);
    }
  }
  if (o.controller.tasks.size() > kMaxTasks) {
    return Status::InvalidArgument("--tasks: at most " + std::to_string(kMaxTasks) + " tasks");
  }
  SLUICE_ASSIGN_OR_RETURN(int64_t lease_ms, fs.GetInt("lease-timeout-ms", 1, kMaxLeaseTimeout.count()));
  o.controller.default_lease_timeout = std::chrono::milliseconds(lease_ms);
  SLUICE_ASSIGN_OR_RETURN(o.controller.ack_log, fs.GetString("ack-log"));
  SLUICE_ASSIGN_OR_RETURN(int64_t batch_rows, fs.GetInt("max-batch-rows", 1, int64_t{1} << 24));
  o.controller.max_batch_rows = static_cast<uint32_t>(batch_rows);
  SLUICE_ASSIGN_OR_RETURN(std::string tensor_bytes, fs.GetString("max-tensor-bytes"));
  SLUICE_ASSIGN_OR_RETURN(o.controller.max_tensor_bytes, ParseByteSize("--max-tensor-bytes", tensor_bytes));
  if (o.controller.max_tensor_bytes == 0) return Status::InvalidArgument("--max-tensor-bytes must be > 0");
  SLUICE_ASSIGN_OR_RETURN(std::string message_bytes, fs.GetString("max-message-bytes"));
  if (message_bytes.empty()) {
    o.max_message_bytes = o.controller.max_tensor_bytes + (uint64_t{1} << 20);
  } else {
    SLUICE_ASSIGN_OR_RETURN(o.max_message_bytes, ParseByteSize("--max-message-bytes", message_bytes));
    if (o.max_message_bytes < o.controller.max_tensor_bytes + (uint64_t{64} << 10)) {
      return Status::InvalidArgument("--max-message-bytes " + message_bytes +
                                     " must exceed --max-tensor-bytes by at least 64K so a tensor fits in a message");
    }
  }
  SLUICE_ASSIGN_OR_RETURN(int64_t workers, fs.GetInt("workers", 1, 256));
  o.workers = static_cast<uint32_t>(workers);
  SLUICE_ASSIGN_OR_RETURN(int64_t blocking, fs.GetInt("max-blocking-calls", 1, 65536));
  o.max_blocking_calls = static_cast<uint32_t>(blocking);
  SLUICE_ASSIGN_OR_RETURN(int64_t open_ms, fs.GetInt("open-write-timeout-ms", 0, kMaxLeaseTimeout.count()));
  o.open_write_timeout = std::chrono::milliseconds(open_ms);
  SLUICE_RETURN_IF_ERROR(ParseStorageFlags(fs, columns, tasks, &out));
  return out;
}

}  // namespace sluice::transfer_queue
