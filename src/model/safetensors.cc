#include "sluice/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "bounded_json.h"
#include "sluice/common/check.h"
#include "sluice/common/file_util.h"

namespace sluice::model {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts unsupported");

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Entry {
  std::string name;
  uint64_t begin;
  uint64_t end;
};

Status ParseEntry(const std::string& origin, const std::string& name, const json& spec, uint64_t data_size,
                  HostTensor* out, Entry* entry) {
  auto fail = [&](const std::string& what) { return Status::DataLoss(origin + ": tensor '" + name + "': " + what); };
  if (!spec.is_object()) return fail("entry is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!spec.contains(key)) return fail(std::string("missing \"") + key + "\"");
  }
  const json& jdtype = spec["dtype"];
  if (!jdtype.is_string()) return fail("\"dtype\" is not a string");
  auto dtype = ParseDTypeName(jdtype.get<std::string>());
  if (!dtype) return fail("unknown dtype \"" + jdtype.get<std::string>() + "\"");
  const json& jshape = spec["shape"];
  if (!jshape.is_array()) return fail("\"shape\" is not an array");
  std::vector<int64_t> shape;
  for (const json& d : jshape) {
    if (!d.is_number_unsigned()) return fail("\"shape\" holds a value that is not a non-negative integer");
    if (d.get<uint64_t>() > (uint64_t{1} << 48)) return fail("dimension too large");
    shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  const json& joff = spec["data_offsets"];
  if (!joff.is_array() || joff.size() != 2 || !joff[0].is_number_unsigned() || !joff[1].is_number_unsigned()) {
    return fail("\"data_offsets\" must be two non-negative integers");
  }
  uint64_t begin = joff[0].get<uint64_t>(), end = joff[1].get<uint64_t>();
  if (begin > end) return fail("data_offsets begin " + std::to_string(begin) + " > end " + std::to_string(end));
  if (end > data_size) {
    return fail("data_offsets end " + std::to_string(end) + " is past the data buffer (" + std::to_string(data_size) +
                " bytes): file truncated or offsets out of range");
  }
  auto numel = CheckedNumel(shape);
  if (!numel.ok()) return fail(numel.status().message());
  uint64_t expected = *numel * DTypeSize(*dtype);
  if (end - begin != expected) {
    return fail("holds " + std::to_string(end - begin) + " bytes but shape x dtype needs " + std::to_string(expected));
  }
  out->dtype = *dtype;
  out->shape = std::move(shape);
  out->nbytes = static_cast<size_t>(end - begin);
  *entry = Entry{name, begin, end};
  return Status::Ok();
}

class MappedFile {
 public:
  MappedFile(void* addr, size_t size) : addr_(addr), size_(size) {}
  ~MappedFile() {
    if (addr_ != nullptr && size_ > 0) munmap(addr_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

 private:
  void* addr_;
  size_t size_;
};

}  // namespace

Result<SafetensorsContents> ParseSafetensors(std::span<const std::byte> bytes, std::shared_ptr<const void> owner,
                                             const std::string& origin) {
  if (bytes.size() < 8) {
    return Status::DataLoss(origin + ": " + std::to_string(bytes.size()) +
                            " bytes is too short for a safetensors file (needs an 8-byte header length)");
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return Status::DataLoss(origin + ": header length " + std::to_string(header_len) + " exceeds the limit of " +
                            std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (header_len > bytes.size() - 8) {
    return Status::DataLoss(origin + ": header length " + std::to_string(header_len) + " is past the end of the " +
                            std::to_string(bytes.size()) + "-byte file (truncated?)");
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  if (header_len < 2 || header_begin[0] != '{') {
    return Status::DataLoss(origin + ": header does not start with a JSON object");
  }
  SLUICE_ASSIGN_OR_RETURN(json header,
                          ParseBoundedJson<json>(std::string_view(header_begin, header_len), origin + ": header"));
  if (header.is_discarded()) return Status::DataLoss(origin + ": header is not valid JSON");
  if (!header.is_object()) return Status::DataLoss(origin + ": header is not a JSON object");

  const std::byte* data = bytes.data() + 8 + header_len;
  const uint64_t data_size = bytes.size() - 8 - header_len;
  SafetensorsContents contents;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Status::DataLoss(origin + ": \"__metadata__\" is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return Status::DataLoss(origin + ": \"__metadata__\" value for '" + m.key() + "' is not a string");
        }
        contents.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    HostTensor tensor;
    Entry entry;
    SLUICE_RETURN_IF_ERROR(ParseEntry(origin, it.key(), it.value(), data_size, &tensor, &entry));
    tensor.data = data + entry.begin;
    tensor.owner = owner;
    contents.tensors.emplace(it.key(), std::move(tensor));
    entries.push_back(std::move(entry));
  }
  // The buffer must be covered exactly: no overlaps (two names aliasing the
  // same bytes) and no holes (bytes that no tensor accounts for).
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t cursor = 0;
  for (const Entry& e : entries) {
    if (e.begin < cursor) {
      return Status::DataLoss(origin + ": tensor '" + e.name + "' overlaps the previous tensor (bytes " +
                              std::to_string(e.begin) + ".." + std::to_string(cursor) + ")");
    }
    if (e.begin > cursor) {
      return Status::DataLoss(origin + ": bytes " + std::to_string(cursor) + ".." + std::to_string(e.begin) +
                              " before tensor '" + e.name + "' belong to no tensor");
    }
    cursor = e.end;
  }
  if (cursor != data_size) {
    return Status::DataLoss(origin + ": " + std::to_string(data_size - cursor) +
                            " trailing bytes after the last tensor belong to no tensor");
  }
  return contents;
}

Result<SafetensorsContents> ReadSafetensorsFile(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::Unavailable(path + ": cannot stat: " + std::strerror(err));
  }
  size_t size = static_cast<size_t>(st.st_size);
  std::shared_ptr<const void> owner;
  const std::byte* base = nullptr;
  if (size > 0) {
    void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Status::Unavailable(path + ": cannot map: " + std::strerror(err));
    }
    owner = std::make_shared<MappedFile>(addr, size);
    base = static_cast<const std::byte*>(addr);
  }
  ::close(fd);
  return ParseSafetensors(std::span<const std::byte>(base, size), std::move(owner), path);
}

std::string SerializeSafetensors(const TensorMap& tensors, const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    // Either would make a file that ReadSafetensorsFile rejects.
    SLUICE_CHECK(name != "__metadata__") << "a tensor may not be named __metadata__";
    auto numel = CheckedNumel(t.shape);
    SLUICE_CHECK(numel.ok() && *numel * DTypeSize(t.dtype) == t.nbytes)
        << "tensor '" << name << "' has " << t.nbytes << " bytes, which does not match its shape and dtype";
    header[name] = {
        {"dtype", std::string(DTypeName(t.dtype))}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + offset);
  uint64_t len = text.size();
  out.append(reinterpret_cast<const char*>(&len), 8);
  out += text;
  for (const auto& [name, t] : tensors) out.append(reinterpret_cast<const char*>(t.data), t.nbytes);
  return out;
}

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string ShardName(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i, n);
  return buf;
}

}  // namespace

Status WriteSafetensorsFile(const std::string& path, const TensorMap& tensors,
                            const std::map<std::string, std::string>& metadata) {
  return WriteFileAtomically(path, SerializeSafetensors(tensors, metadata));
}

Result<TensorMap> LoadCheckpointTensors(const std::string& dir) {
  fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return Status::NotFound(dir + ": checkpoint directory does not exist");
  if (fs::exists(root / kSingleFile, ec)) {
    SLUICE_ASSIGN_OR_RETURN(auto contents, ReadSafetensorsFile((root / kSingleFile).string()));
    return std::move(contents.tensors);
  }
  fs::path index_path = root / kIndexFile;
  if (!fs::exists(index_path, ec)) {
    return Status::NotFound(dir + ": neither " + kSingleFile + " nor " + kIndexFile + " is present");
  }
  SLUICE_ASSIGN_OR_RETURN(const std::string index_text, ReadFileToString(index_path.string()));
  SLUICE_ASSIGN_OR_RETURN(json index, ParseBoundedJson<json>(index_text, index_path.string()));
  if (index.is_discarded() || !index.is_object()) return Status::DataLoss(index_path.string() + ": not a JSON object");
  if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
    return Status::DataLoss(index_path.string() + ": missing object \"weight_map\"");
  }
  std::map<std::string, std::set<std::string>> names_by_shard;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      return Status::DataLoss(index_path.string() + ": weight_map entry '" + it.key() + "' is not a file name");
    }
    std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      return Status::InvalidArgument(index_path.string() + ": shard name '" + shard + "' for '" + it.key() +
                                     "' must be a plain file name in the checkpoint directory");
    }
    names_by_shard[shard].insert(it.key());
  }
  TensorMap out;
  for (const auto& [shard, names] : names_by_shard) {
    SLUICE_ASSIGN_OR_RETURN(auto contents, ReadSafetensorsFile((root / shard).string()));
    for (const std::string& name : names) {
      auto found = contents.tensors.find(name);
      if (found == contents.tensors.end()) {
        return Status::DataLoss(dir + ": index maps '" + name + "' to " + shard + ", which does not contain it");
      }
      out.emplace(name, found->second);
    }
    for (const auto& [name, unused] : contents.tensors) {
      if (!names.count(name)) {
        return Status::DataLoss(dir + ": shard " + shard + " holds '" + name + "', which the index does not map to it");
      }
    }
  }
  return out;
}

Status SaveCheckpointTensors(const std::string& dir, const TensorMap& tensors, const CheckpointWriteOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::Unavailable(dir + ": cannot create directory: " + ec.message());
  fs::path root(dir);
  std::vector<TensorMap> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    if (options.max_shard_bytes > 0 && shard_bytes > 0 && shard_bytes + t.nbytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace(name, t);
    shard_bytes += t.nbytes;
    total += t.nbytes;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    SLUICE_RETURN_IF_ERROR(WriteSafetensorsFile((root / kSingleFile).string(), tensors, metadata));
    // The loader prefers model.safetensors, so a stale index left beside it is harmless.
    fs::remove(root / kIndexFile, ec);
    return Status::Ok();
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", json::object()}};
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string name = ShardName(i + 1, shards.size());
    SLUICE_RETURN_IF_ERROR(WriteSafetensorsFile((root / name).string(), shards[i], metadata));
    for (const auto& [tensor_name, unused] : shards[i]) index["weight_map"][tensor_name] = name;
  }
  SLUICE_RETURN_IF_ERROR(WriteFileAtomically((root / kIndexFile).string(), index.dump(2) + "\n"));
  // A stale model.safetensors would shadow the shards the loader should read.
  fs::remove(root / kSingleFile, ec);
  if (ec) return Status::Unavailable(dir + ": cannot remove the stale model.safetensors: " + ec.message());
  return Status::Ok();
}

}  // namespace sluice::model
