// Plain data shared by every part of the TransferQueue: identifiers, column
// schemas, row tags, sampling policies, leased batch metadata and statistics.
//
// Everything here is a value type with no pointers into queue state, so the
// same structs travel unchanged between the in-process client and the
// controller, and (in later transports) through the wire format.
//
// Thread safety: values; a const object may be read from any thread.
#ifndef SLUICE_TRANSFER_QUEUE_TYPES_H_
#define SLUICE_TRANSFER_QUEUE_TYPES_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sluice/common/host_tensor.h"
#include "sluice/common/ids.h"

namespace sluice::transfer_queue {

// A row id is allocated by the controller, increases monotonically and is
// never reused within a run (a cleared row's id stays dead), so a row id can
// never name another row's data.
using RowId = uint64_t;
using LeaseId = uint64_t;
using WriteId = uint64_t;
using ReclaimId = uint64_t;
// GRPO group id (the G samples generated from one prompt share it; scoped to
// a partition) and the policy version that produced a row: sluice/common/ids.h.
using sluice::GroupId;
using sluice::PolicyVersion;

inline constexpr GroupId kNoGroup = -1;
inline constexpr PolicyVersion kNoPolicyVersion = -1;
// In a ColumnSchema's per-row shape, a first dimension of kRaggedDim means
// "any length per row" (e.g. response tokens).
inline constexpr int64_t kRaggedDim = -1;

// Limits on names and tags: they bound what a row costs in the controller and
// what a wire message may carry.
inline constexpr size_t kMaxNameBytes = 256;      // task, column, partition names and keys
inline constexpr size_t kMaxUserTags = 64;        // user tags per row
inline constexpr size_t kMaxUserTagBytes = 4096;  // one user tag value
// Columns are tracked as a 64-bit readiness mask per row.
inline constexpr size_t kMaxColumns = 64;
inline constexpr size_t kMaxTasks = 64;

// The schema of one column: the dtype and the per-row shape. shape[0] may be
// kRaggedDim (any non-negative length per row); every other dimension is
// fixed and non-negative. A scalar per row has shape {}.
struct ColumnSchema {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  friend bool operator==(const ColumnSchema&, const ColumnSchema&) = default;
};

// What the controller knows about one tensor without seeing its bytes.
struct TensorMeta {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;

  friend bool operator==(const TensorMeta&, const TensorMeta&) = default;
};

// Tags carried by a row. group_id is fixed at creation; the others may be
// patched when a column is written (RowTagPatch), e.g. the token length once
// the response is generated.
struct RowTags {
  GroupId group_id = kNoGroup;
  PolicyVersion policy_version = kNoPolicyVersion;
  int64_t token_length = 0;  // >= 0; the weight for token-balanced splits
  std::map<std::string, std::string> user;

  friend bool operator==(const RowTags&, const RowTags&) = default;
};

// A change to a row's tags, applied atomically with the column write that
// carries it. Unset fields are left as they are; user tags are merged (a key
// present in `user` overwrites the row's value).
struct RowTagPatch {
  std::optional<PolicyVersion> policy_version;
  std::optional<int64_t> token_length;
  std::map<std::string, std::string> user;
};

enum class SamplingMode : uint8_t {
  // Rows in order of (policy_version, row id): the oldest policy first, then
  // creation order. Ignores groups.
  kFifo,
  // Whole GRPO groups: all G rows of a group id together, never split. A
  // group is eligible only when all its rows exist (exactly G were created)
  // and all are ready for the task. Rows without a group id are never served.
  kWholeGroup,
};

struct SamplingPolicy {
  SamplingMode mode = SamplingMode::kFifo;
  // kWholeGroup: rows per group. 0 takes the partition's declared group size;
  // if both are set they must be equal.
  uint32_t group_size = 0;
  // Only rows whose policy_version tag lies in [min, max] (inclusive) are
  // eligible; for kWholeGroup, every row of the group must lie in the range.
  PolicyVersion min_policy_version = std::numeric_limits<PolicyVersion>::min();
  PolicyVersion max_policy_version = std::numeric_limits<PolicyVersion>::max();
  // > 1: split the batch across this many data-parallel ranks with balanced
  // sums of token_length (greedy largest-first). Whole groups stay on one rank.
  uint32_t dp_ranks = 1;
};

struct RowMeta {
  RowId id = 0;
  RowTags tags;
};

// A leased batch, from GetMeta. Ack or Release it before `deadline`, or its
// rows return to ready for the task and the lease is dead.
struct BatchMeta {
  LeaseId lease_id = 0;
  std::string task;
  std::string partition;
  // The columns the rows were ready for; GetData may read any subset of them.
  std::vector<std::string> columns;
  std::vector<RowMeta> rows;
  // dp_ranks > 1: rank[i] is the data-parallel rank of rows[i]. Empty otherwise.
  std::vector<uint32_t> rank;
  uint32_t dp_ranks = 1;
  // On the controller's clock (see ControllerOptions::clock).
  std::chrono::steady_clock::time_point deadline;

  std::vector<RowId> row_ids() const;
  // Indices into `rows` assigned to `rank` (all rows when dp_ranks == 1).
  std::vector<size_t> RowsOfRank(uint32_t rank) const;
};

// A task's view of the rows that are alive (created and visible, not freed).
struct TaskDepth {
  std::string task;
  uint64_t ready = 0;   // not consumed yet (its columns may still be missing)
  uint64_t leased = 0;  // under an active lease
  uint64_t acked = 0;   // consumed, kept until every task has acked them
  // Rows this task has acked since the queue started (never decreases; a
  // consumer's progress, e.g. the samples a trainer has applied).
  uint64_t acked_total = 0;
  // GetMeta calls of this task blocked now, waiting for eligible rows: a
  // consumer's demand, which producers may serve first (the pipeline's
  // rollout does: while the trainer waits, it admits nothing past the
  // trainer's step).
  uint64_t waiting = 0;
};

struct ControllerStats {
  uint64_t rows = 0;  // alive, including rows of writes not committed yet
  uint64_t capacity_rows = 0;
  // Bytes the queue answers for: committed + reserved by open writes + freed
  // rows whose storage bytes are being reclaimed. Never above capacity_bytes.
  uint64_t bytes_held = 0;
  uint64_t bytes_committed = 0;
  uint64_t bytes_reserved = 0;
  uint64_t bytes_reclaiming = 0;
  uint64_t capacity_bytes = 0;
  uint64_t partitions = 0;
  uint64_t active_leases = 0;
  uint64_t open_writes = 0;
  uint64_t waiting_consumers = 0;  // GetMeta calls blocked now
  uint64_t waiting_producers = 0;  // CreateRows/BeginWrite calls blocked on capacity now
  std::vector<TaskDepth> tasks;    // in registration order
  // Counters since start.
  uint64_t rows_created = 0;
  uint64_t rows_freed = 0;  // every task acked, cleared, or aborted before commit
  uint64_t leases_granted = 0;
  uint64_t leases_acked = 0;
  uint64_t leases_released = 0;
  uint64_t leases_expired = 0;
  uint64_t rows_redelivered = 0;  // returned to ready by expiry or release
  uint64_t writes_committed = 0;
  uint64_t writes_aborted = 0;
};

struct StorageStats {
  uint32_t unit = 0;
  uint64_t rows = 0;
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

}  // namespace sluice::transfer_queue

#endif  // SLUICE_TRANSFER_QUEUE_TYPES_H_
