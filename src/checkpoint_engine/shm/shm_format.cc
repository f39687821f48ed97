#include "shm/shm_format.h"

#include <cstring>
#include <sstream>

#include "core/checksum.h"

namespace sluice::checkpoint_engine::shm {
namespace {

size_t AlignUp(size_t n, size_t alignment) { return (n + alignment - 1) / alignment * alignment; }

template <typename T>
void Append(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace

std::string SerializeLayout(const Layout& layout) {
  std::string blob;
  for (const TensorSpec& spec : layout) {
    Append<uint32_t>(&blob, static_cast<uint32_t>(spec.name.size()));
    blob.append(spec.name);
    Append<uint8_t>(&blob, static_cast<uint8_t>(spec.dtype));
    blob.append(3, '\0');
    Append<uint32_t>(&blob, static_cast<uint32_t>(spec.shape.size()));
    for (int64_t d : spec.shape) Append<int64_t>(&blob, d);
  }
  return blob;
}

Result<Layout> ParseLayout(const std::byte* blob, size_t nbytes, uint32_t num_tensors) {
  Layout layout;
  size_t pos = 0;
  auto take = [&](void* out, size_t n) {
    if (nbytes - pos < n) return false;
    std::memcpy(out, blob + pos, n);
    pos += n;
    return true;
  };
  const auto malformed = [&](const std::string& why) {
    return Status::DataLoss("stored layout is malformed at byte " + std::to_string(pos) + " of " +
                            std::to_string(nbytes) + ": " + why);
  };
  for (uint32_t t = 0; t < num_tensors; ++t) {
    TensorSpec spec;
    uint32_t name_len = 0;
    if (!take(&name_len, sizeof(name_len)) || name_len == 0 || name_len > nbytes - pos) {
      return malformed("bad name length for tensor " + std::to_string(t));
    }
    spec.name.assign(reinterpret_cast<const char*>(blob + pos), name_len);
    pos += name_len;
    uint8_t dtype[4];
    if (!take(dtype, sizeof(dtype)) || dtype[0] > static_cast<uint8_t>(DType::kBool)) {
      return malformed("bad dtype for tensor " + std::to_string(t));
    }
    spec.dtype = static_cast<DType>(dtype[0]);
    uint32_t rank = 0;
    if (!take(&rank, sizeof(rank)) || rank > 64) return malformed("bad rank for tensor " + std::to_string(t));
    spec.shape.resize(rank);
    for (uint32_t d = 0; d < rank; ++d) {
      if (!take(&spec.shape[d], sizeof(int64_t))) return malformed("truncated shape of tensor " + std::to_string(t));
    }
    layout.push_back(std::move(spec));
  }
  if (pos != nbytes) return malformed(std::to_string(nbytes - pos) + " trailing bytes");
  return layout;
}

uint64_t LayoutHash(const std::string& blob) { return Checksum64(blob.data(), blob.size(), /*seed=*/kProtocolVersion); }

Geometry ComputeGeometry(const std::vector<size_t>& tensor_bytes, uint32_t max_readers, uint32_t pins_per_reader,
                         size_t layout_blob_bytes) {
  Geometry g;
  g.max_readers = max_readers;
  g.pins_per_reader = pins_per_reader;
  // Outside a critical section every committed version in memory is the
  // latest or pinned by a slot, and a slot pins at most pins_per_reader
  // versions. Inside a commit the new version's entry is written before the
  // superseded latest is freed: one more. So entries never run out.
  g.version_entries = max_readers * pins_per_reader + 2;
  g.entries_offset = AlignUp(sizeof(ControlBlock), 64);
  g.slots_offset = AlignUp(g.entries_offset + g.version_entries * sizeof(VersionEntry), 64);
  g.slot_stride = AlignUp(sizeof(ReaderSlot) + pins_per_reader * sizeof(std::atomic<int64_t>), 64);
  g.layout_offset = g.slots_offset + max_readers * g.slot_stride;
  g.control_bytes = g.layout_offset + layout_blob_bytes;

  g.version_header_bytes = sizeof(VersionHeader) + tensor_bytes.size() * sizeof(TensorRecord);
  size_t offset = AlignUp(g.version_header_bytes, kDataAlignment);
  for (size_t n : tensor_bytes) {
    g.tensor_offsets.push_back(offset);
    g.tensor_bytes.push_back(n);
    offset = AlignUp(offset + n, kTensorAlignment);
  }
  g.version_segment_bytes = offset;
  return g;
}

Status CheckPreamble(const SharedMemorySegment& segment, uint64_t magic, const std::string& what) {
  return CheckPreamble(segment.data(), segment.size(), magic, what);
}

Status CheckPreamble(const std::byte* data, size_t size, uint64_t magic, const std::string& what) {
  if (size < sizeof(SegmentPreamble)) {
    if (size == 0)
      return Status::Unavailable(what + " is empty: its creator is still initializing it (or died doing so)");
    return Status::DataLoss(what + " is truncated: " + std::to_string(size) + " bytes, shorter than its " +
                            std::to_string(sizeof(SegmentPreamble)) + "-byte preamble");
  }
  const auto* pre = reinterpret_cast<const SegmentPreamble*>(data);
  const uint64_t found = pre->magic.load(std::memory_order_acquire);
  if (found == 0)
    return Status::Unavailable(what + " is not initialized yet (its creator is still writing it, or died doing so)");
  if (found != magic) {
    std::ostringstream msg;
    msg << what << " is not a Sluice CheckpointEngine segment of this kind (magic 0x" << std::hex << found
        << ", expected 0x" << magic << ")";
    return Status::FailedPrecondition(msg.str());
  }
  if (pre->protocol_version != kProtocolVersion) {
    return Status::FailedPrecondition(what + " was written with shm protocol version " +
                                      std::to_string(pre->protocol_version) + "; this build speaks version " +
                                      std::to_string(kProtocolVersion) + " (peers must run the same protocol)");
  }
  if (pre->segment_bytes != size) {
    return Status::DataLoss(what + " is " + std::to_string(size) + " bytes but its header says " +
                            std::to_string(pre->segment_bytes) + " (truncated or overwritten)");
  }
  return Status::Ok();
}

}  // namespace sluice::checkpoint_engine::shm
