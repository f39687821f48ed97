// The bytes of the CheckpointEngine's shared-memory store: the control
// segment, the per-version data segments, and the serialized layout. See
// docs/checkpoint_engine.md for the protocol built on them.
//
// Every segment starts with a SegmentPreamble whose layout never changes
// between protocol versions, so any peer can tell "not ours" (magic), "ours
// but another protocol" (protocol_version) and "truncated" (segment_bytes)
// apart and say which. The rest of a segment is only read after the preamble
// matched.
//
// Fields of the control block that change after creation are std::atomic
// (lock-free, address-free 64- and 32-bit atomics, asserted below): most are
// written under the control mutex, but a few are read without it
// (latest_version(), the futex word), and a holder killed mid-update leaves
// exactly a prefix of its release-ordered stores, which the repair relies on.
//
// Thread safety: plain structs; see shm_control.h for who may touch what.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_SHM_FORMAT_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_SHM_FORMAT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/shm.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine::shm {

static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free (and so address-free)");

// "SLCECTL1" / "SLCEVER1" as little-endian words.
inline constexpr uint64_t kControlMagic = 0x314c544345434c53ULL;
inline constexpr uint64_t kVersionMagic = 0x3152455645434c53ULL;
// Bumped on any incompatible change to the structs below or the protocol.
// 2: segment recycling (the spare segment, flocks on version segments).
inline constexpr uint32_t kProtocolVersion = 2;

// Tensor bytes in a version segment start on this boundary (cache line;
// enough for vectorized copies and for wrapping as framework tensors).
inline constexpr size_t kTensorAlignment = 64;
// The first tensor starts on a page of its own.
inline constexpr size_t kDataAlignment = 4096;

struct SegmentPreamble {
  // Written last by the creator (release): 0 means "still being initialized".
  std::atomic<uint64_t> magic;
  uint32_t protocol_version;
  uint32_t reserved;
  uint64_t segment_bytes;  // the size the creator gave the segment
};
static_assert(sizeof(SegmentPreamble) == 24);

struct ProcessRecord {
  std::atomic<uint64_t> start_time;  // written before pid
  std::atomic<int32_t> pid;          // 0: nobody
  uint32_t reserved;
};

// A committed version still in shared memory. Free when version == kNoVersion.
struct VersionEntry {
  std::atomic<int64_t> version;
};

// One attached reader process (or one ShmSubscriber in it). Followed in
// memory by pins_per_reader std::atomic<int64_t> pins (kNoVersion: unused).
struct alignas(64) ReaderSlot {
  ProcessRecord owner;
};

struct ControlBlock {
  SegmentPreamble preamble;
  // Geometry, fixed by the creator.
  uint32_t header_bytes;  // sizeof(ControlBlock) of the creator
  uint32_t max_readers;
  uint32_t pins_per_reader;
  uint32_t version_entries;
  uint32_t num_tensors;
  uint32_t layout_blob_bytes;
  uint64_t layout_hash;
  uint64_t max_tensor_bytes;
  uint64_t version_segment_bytes;
  uint64_t entries_offset;
  uint64_t slots_offset;
  uint64_t slot_stride;
  uint64_t layout_offset;

  ShmMutex mu;

  // Mutable state. Written only under `mu`; `latest` and `commit_seq` are
  // also read without it.
  std::atomic<uint32_t> destroyed;   // 1: being torn down; re-open the store
  std::atomic<uint32_t> commit_seq;  // futex word, bumped after every commit
  std::atomic<int64_t> latest;       // kNoVersion before the first commit
  std::atomic<int64_t> staging;      // version being staged, kNoVersion if none
  ProcessRecord publisher;           // pid 0: no publisher attached
  std::atomic<uint64_t> commits;
  std::atomic<uint64_t> aborts;
  std::atomic<uint64_t> recoveries;
  // 1 while the attached publisher recycles segments: a freed version's
  // segment may then become the spare (see Control::RetireSegment).
  std::atomic<uint32_t> recycle_segments;
  uint32_t reserved;
  std::atomic<uint64_t> segments_recycled;  // stagings into the spare
};

// Header of one version's data segment, followed by num_tensors TensorRecords;
// tensor bytes start at data_offset.
struct VersionHeader {
  SegmentPreamble preamble;
  uint64_t layout_hash;
  int64_t version;
  uint32_t num_tensors;
  uint32_t reserved;
  uint64_t data_offset;
  // 1 once every tensor is put and re-verified, before the version is
  // committed; readers refuse an unsealed segment.
  std::atomic<uint32_t> sealed;
  uint32_t reserved2;
};

struct TensorRecord {
  uint64_t offset;  // from the start of the segment
  uint64_t nbytes;
  uint64_t checksum;  // XXH64 of the bytes, written at Put
  uint64_t reserved;
};

// Where everything lives, computed from the layout and limits (publisher) or
// read back from a ControlBlock (everyone else).
struct Geometry {
  uint32_t max_readers = 0;
  uint32_t pins_per_reader = 0;
  uint32_t version_entries = 0;
  size_t entries_offset = 0;
  size_t slots_offset = 0;
  size_t slot_stride = 0;
  size_t layout_offset = 0;
  size_t control_bytes = 0;
  // Version segments.
  std::vector<size_t> tensor_offsets;  // layout order
  std::vector<size_t> tensor_bytes;
  size_t version_header_bytes = 0;  // VersionHeader + records
  size_t version_segment_bytes = 0;
};

// The layout as stored in the control segment: per tensor, u32 name length,
// name, u8 dtype, u8[3] zero, u32 rank, i64 dims[rank].
std::string SerializeLayout(const Layout& layout);
// DataLoss naming the problem if `blob` is malformed.
Result<Layout> ParseLayout(const std::byte* blob, size_t nbytes, uint32_t num_tensors);
uint64_t LayoutHash(const std::string& blob);

// The whole geometry for `layout` (validated) and the reader limits.
Geometry ComputeGeometry(const std::vector<size_t>& tensor_bytes, uint32_t max_readers, uint32_t pins_per_reader,
                         size_t layout_blob_bytes);

// Validates a mapped segment's preamble: `what` names the segment in errors.
//   Unavailable        - magic still 0 (the creator is initializing it, or
//                        died doing so)
//   FailedPrecondition - another magic (not a Sluice segment of this kind)
//                        or another protocol version
//   DataLoss           - shorter than its preamble or than it says it is
Status CheckPreamble(const SharedMemorySegment& segment, uint64_t magic, const std::string& what);
// The same for `size` mapped bytes at `data` (null when size is 0).
Status CheckPreamble(const std::byte* data, size_t size, uint64_t magic, const std::string& what);

// The pins of `slot` (pins_per_reader of them).
inline std::atomic<int64_t>* SlotPins(ReaderSlot* slot) { return reinterpret_cast<std::atomic<int64_t>*>(slot + 1); }

}  // namespace sluice::checkpoint_engine::shm

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_SHM_FORMAT_H_
