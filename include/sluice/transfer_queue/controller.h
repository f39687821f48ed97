// The TransferQueue controller: the control plane. It holds every row's
// metadata (partition, tags, which columns are committed, each task's
// consumption state), the leases and the capacity accounting. It never sees
// payload bytes: those go producer -> storage unit -> consumer (storage.h).
//
// The interface is a set of request/response structs (plain data, no
// callbacks, no pointers into controller state) behind an abstract class, so
// that the shared-memory and TCP transports only serialize the same structs.
// The in-process implementation (NewInProcessController) is called directly
// by TransferQueueClient; most users want the client (client.h), not this.
//
// Contract
//  * Rows. CreateRows / BeginWrite(kNewRows, kKeys) allocate row ids, never
//    reused within a run. A row belongs to one partition for its life.
//  * Two-phase column writes. BeginWrite validates the write against the
//    schema, reserves its bytes against capacity and marks the (row, column)
//    cells as being written; the caller then stores the bytes in the storage
//    units; CommitWrite makes all cells of the write (and any rows it
//    created, and its tag patches) visible at once. AbortWrite undoes
//    BeginWrite. A failed CommitWrite leaves the write open: the caller
//    discards the stored bytes and then calls AbortWrite, so the reservation
//    always covers bytes that are still in storage.
//  * Consumption. For each registered task a row is ready -> leased -> acked.
//    GetMeta leases rows whose requested columns are all committed and that
//    the task has not consumed; Ack finishes a lease; Release or expiry of the
//    deadline returns its rows to ready.
//  * Freeing. A row is freed when every registered task has acked it, when
//    its partition is cleared (ClearPartition) or its key cleared (KvClear).
//    With no registered task, rows are only freed by clearing. A freed row's
//    bytes stay counted in bytes_held until the caller has dropped them from
//    storage and called FinishReclaim with the ReclaimTicket it was given:
//    the bytes in storage never exceed the accounting.
//  * Capacity. rows <= capacity_rows and bytes_held <= capacity_bytes at all
//    times. A CreateRows / BeginWrite that does not fit blocks until it does
//    (Timeout after `timeout`), or returns ResourceExhausted at once if
//    `block` is false or if it could never fit.
//  * Lease expiry is processed lazily at the start of every call, and by
//    blocked GetMeta calls, which wake at the earliest lease deadline. There
//    is no background thread.
//  * Clearing with leases outstanding. ClearPartition frees the rows at once,
//    whatever their state. A later Ack or Release of a lease that held
//    cleared rows succeeds; the response counts them in rows_cleared (they
//    are neither acked nor returned). GetMeta calls blocked on the partition
//    return NotFound. Open writes into cleared rows fail at CommitWrite.
//
// Complexity (R = rows in the partition, k = rows in the request or
// response, V = ready views of the partition, one per distinct
// (task, column set) ever requested there, G = group size): GetMeta
// O(V k log R + k log k) (plus, the first time a (task, column set) is asked
// of a partition, O(R log R) to build its view); CommitWrite, Ack, Release,
// expiry O(V k log R + groups touched * G); ClearPartition O(R + k);
// Stats O(tasks + partitions). Nothing scans the whole table.
//
// Thread safety: every method is thread-safe. The in-process controller has
// one mutex; no method holds it while calling out.
#ifndef SLUICE_TRANSFER_QUEUE_CONTROLLER_H_
#define SLUICE_TRANSFER_QUEUE_CONTROLLER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/transfer_queue/clock.h"
#include "sluice/transfer_queue/types.h"

namespace sluice::transfer_queue {

// The longest lease a request or the options may ask for.
inline constexpr std::chrono::milliseconds kMaxLeaseTimeout = std::chrono::hours(24 * 7);
// How long a holder given to ReleaseHolder stays fenced (its GetMeta
// refused); the controller keeps the latest kMaxFencedHolders of them.
inline constexpr std::chrono::milliseconds kHolderFence = std::chrono::minutes(10);
inline constexpr size_t kMaxFencedHolders = 4096;

struct ControllerOptions {
  // Columns known from the start; more may be added with RegisterColumns.
  std::vector<ColumnSchema> columns;
  // Consumer tasks known from the start; more may be added with RegisterTask.
  std::vector<std::string> tasks;
  // Rows alive at once (including rows of open writes). Default 1M.
  uint64_t capacity_rows = uint64_t{1} << 20;
  // Payload bytes held at once. Default 8 GiB.
  uint64_t capacity_bytes = uint64_t{8} << 30;
  // Lease duration when a GetMeta request does not set one. Default 60 s;
  // at most kMaxLeaseTimeout.
  std::chrono::milliseconds default_lease_timeout{60000};
  // Largest n of a GetMeta and largest row count of one write. Default 65536.
  uint32_t max_batch_rows = 65536;
  // Largest single tensor (one row of one column). Default 1 GiB.
  uint64_t max_tensor_bytes = uint64_t{1} << 30;
  // Ended leases remembered, so an Ack after expiry gets "expired" rather
  // than "unknown lease". Default 65536.
  size_t lease_history = 65536;
  // Distinct (task, column set) views per partition. Default 64.
  size_t max_views_per_partition = 64;
  // Clock for lease deadlines. Null: SteadyClock.
  std::shared_ptr<const Clock> clock;
  // A file to which every successful Ack appends a line of JSON: the lease,
  // its task and holder, the partition and each row acked with its group id
  // ({"ack":7,"task":"train","holder":"h","partition":"p","rows":[[12,3],...]}),
  // the hub's own record of what each task consumed. Empty: none. Opened
  // (created if missing) when the controller is made; a path that is not a
  // regular file is refused. An Ack whose line cannot be written still acks
  // and returns DataLoss naming the file.
  std::string ack_log;
};

// ---------------------------------------------------------------- requests

// How a producer call waits for capacity.
struct CapacityWait {
  bool block = true;  // false: ResourceExhausted at once instead of waiting
  std::chrono::milliseconds timeout{10000};
};

struct RegisterColumnsRequest {
  std::vector<ColumnSchema> columns;
};

struct RegisterTaskRequest {
  std::string task;
};

struct CreatePartitionRequest {
  std::string partition;
  // Rows per GRPO group in this partition; 0 = not declared. When declared,
  // creating a row that would give a group more than group_size rows fails.
  uint32_t group_size = 0;
  // The tasks that consume this partition (registered, no duplicates): only
  // they may GetMeta from it, and a row is freed once they have all acked it
  // (e.g. a partition of prompts consumed by the rollout alone). Empty:
  // every task, including tasks registered later.
  std::vector<std::string> consumers;
};
struct CreatePartitionResponse {
  bool created = false;  // false: it existed already with the same group_size
};

struct DescribeResponse {
  std::vector<ColumnSchema> columns;  // in registration order
  std::vector<std::string> tasks;     // in registration order
};

struct CreateRowsRequest {
  std::string partition;
  std::vector<RowTags> rows;
  // Empty, or one non-empty key per row, unique within the partition.
  std::vector<std::string> keys;
  CapacityWait wait;
};
struct CreateRowsResponse {
  std::vector<RowId> rows;
};

// One column of a write: the metadata of each target row's tensor, in the
// order of the write's target rows.
struct ColumnWriteMeta {
  std::string column;
  std::vector<TensorMeta> rows;
};

enum class WriteTarget : uint8_t {
  kExistingRows,  // `rows`
  kNewRows,       // rows created by the write, tagged `new_rows`
  kKeys,          // `keys`: an existing key's row, or a new row tagged new_rows[i]
};

struct BeginWriteRequest {
  // Required for kNewRows and kKeys. For kExistingRows, optional: if set,
  // every row must belong to it.
  std::string partition;
  WriteTarget target = WriteTarget::kExistingRows;
  std::vector<RowId> rows;
  std::vector<RowTags> new_rows;
  std::vector<std::string> keys;
  // Empty, or one per target row; applied at commit. (For kKeys, a key that
  // already exists keeps its group id.)
  std::vector<RowTagPatch> patches;
  // Each column at most once; none already committed or being written for
  // any target row. May be empty if rows are created or patches given.
  std::vector<ColumnWriteMeta> columns;
  CapacityWait wait;
};
struct BeginWriteResponse {
  WriteId write_id = 0;
  std::vector<RowId> rows;  // the target rows, in request order
  uint64_t reserved_bytes = 0;
};

struct CommitWriteRequest {
  WriteId write_id = 0;
};
struct AbortWriteRequest {
  WriteId write_id = 0;
};

struct GetMetaRequest {
  std::string task;
  std::vector<std::string> columns;  // at least one, no duplicates
  uint32_t n = 0;                    // rows; for kWholeGroup a multiple of G
  std::string partition;
  SamplingPolicy policy;
  // How long to wait for n eligible rows; 0 = do not wait.
  std::chrono::milliseconds timeout{0};
  // Lease duration; 0 = ControllerOptions::default_lease_timeout. At most
  // kMaxLeaseTimeout.
  std::chrono::milliseconds lease_timeout{0};
  // Who holds the lease (e.g. a process's name and pid), at most
  // kMaxNameBytes; empty: nobody in particular. ReleaseHolder ends every
  // lease of a holder at once, when whoever runs the hub learns it is gone.
  std::string holder;
};

struct AckRequest {
  LeaseId lease_id = 0;
};
struct ReleaseRequest {
  LeaseId lease_id = 0;
};
struct ReleaseHolderRequest {
  std::string holder;  // not empty
};
struct RenewRequest {
  LeaseId lease_id = 0;
  // The lease's new deadline is now + this; 0 =
  // ControllerOptions::default_lease_timeout. At most kMaxLeaseTimeout.
  std::chrono::milliseconds lease_timeout{0};
};
struct ClearPartitionRequest {
  std::string partition;
};
struct KvLookupRequest {
  std::string partition;
  std::vector<std::string> keys;
};
struct KvListRequest {
  std::string partition;
};
struct KvClearRequest {
  std::string partition;
  std::vector<std::string> keys;
};

// Rows whose storage bytes the caller must drop (StorageUnit::FreeRows)
// before calling FinishReclaim(id). id == 0: nothing to reclaim.
struct ReclaimTicket {
  ReclaimId id = 0;
  std::vector<RowId> rows;
  uint64_t bytes = 0;
};

struct AckResponse {
  uint64_t rows_acked = 0;
  uint64_t rows_cleared = 0;  // rows of the lease whose partition/key was cleared
  uint64_t rows_freed = 0;    // acked by every task now; in `reclaim`
  ReclaimTicket reclaim;
};

struct ReleaseResponse {
  uint64_t rows_returned = 0;
  uint64_t rows_cleared = 0;
};

struct ReleaseHolderResponse {
  uint64_t leases_released = 0;
  uint64_t rows_returned = 0;
  uint64_t rows_cleared = 0;
};

struct RenewResponse {
  // The lease's new deadline, on the controller's clock (as BatchMeta's).
  std::chrono::steady_clock::time_point deadline;
};

struct ClearResponse {
  uint64_t rows_cleared = 0;
  ReclaimTicket reclaim;
};

struct FinishReclaimRequest {
  ReclaimId reclaim_id = 0;
};

struct KvEntry {
  std::string key;
  RowId row = 0;
  RowTags tags;
  std::vector<std::string> columns;  // committed columns, in registration order
};

// ---------------------------------------------------------------- interface

class Controller {
 public:
  virtual ~Controller() = default;

  // Adds columns. Re-registering an identical schema is a no-op. Errors:
  // InvalidArgument (bad name, dtype/shape; a name registered with another
  // schema; duplicate in the request), ResourceExhausted (over kMaxColumns).
  // All-or-nothing.
  virtual Status RegisterColumns(const RegisterColumnsRequest& request) = 0;
  // Adds a consumer task; re-registering is a no-op. The task starts with
  // every alive row ready. InvalidArgument (bad name), ResourceExhausted
  // (over kMaxTasks).
  virtual Status RegisterTask(const RegisterTaskRequest& request) = 0;
  virtual Result<DescribeResponse> Describe() = 0;

  // InvalidArgument (bad name), AlreadyExists (exists with another group_size).
  virtual Result<CreatePartitionResponse> CreatePartition(const CreatePartitionRequest& request) = 0;

  // Creates rows with tags and no columns; visible at once. Errors:
  // NotFound (partition), InvalidArgument (no rows, bad tags or keys, key
  // count), AlreadyExists (key taken), FailedPrecondition (group over the
  // partition's group_size), OutOfRange (more than max_batch_rows),
  // ResourceExhausted / Timeout (capacity; see CapacityWait).
  virtual Result<CreateRowsResponse> CreateRows(const CreateRowsRequest& request) = 0;

  // Phase one of a write. Errors, all before anything is reserved:
  // NotFound (partition, row, column), InvalidArgument (dtype/shape/nbytes
  // vs schema naming row and column, counts, duplicate column, row outside
  // the partition, bad tags), AlreadyExists (cell committed or being
  // written, key taken), FailedPrecondition (group size), OutOfRange
  // (row count, tensor over max_tensor_bytes), ResourceExhausted / Timeout
  // (capacity).
  virtual Result<BeginWriteResponse> BeginWrite(const BeginWriteRequest& request) = 0;
  // Phase two. NotFound if the write is unknown or one of its rows was
  // cleared meanwhile (the write then stays open: discard, then AbortWrite).
  virtual Status CommitWrite(const CommitWriteRequest& request) = 0;
  // Releases the reservation and deletes rows the write created. NotFound if
  // the write is unknown (already committed or aborted).
  virtual Status AbortWrite(const AbortWriteRequest& request) = 0;

  // Leases n rows for the task, waiting up to request.timeout for them.
  // Errors: NotFound (task, partition, column; the partition cleared while
  // waiting), InvalidArgument (n == 0, no or duplicate columns, negative
  // timeouts, n not a multiple of the group size, no group size, group size
  // mismatch with the partition, min > max version, dp_ranks == 0 or more
  // ranks than rows/groups), OutOfRange (n > max_batch_rows or
  // capacity_rows: could never be served; lease_timeout > kMaxLeaseTimeout), ResourceExhausted (too many views),
  // Timeout (fewer than n eligible rows; the message gives how many).
  virtual Result<BatchMeta> GetMeta(const GetMetaRequest& request) = 0;

  // Finishes a lease. Errors: NotFound (never granted, or so long ago it is
  // forgotten), FailedPrecondition ("lease 17 expired at ...", already acked,
  // released).
  virtual Result<AckResponse> Ack(const AckRequest& request) = 0;
  // Returns a lease's rows to ready now. Errors as Ack.
  virtual Result<ReleaseResponse> Release(const ReleaseRequest& request) = 0;
  // Keeps a lease alive: its deadline becomes now + lease_timeout (earlier
  // or later than before). A consumer still working on its rows renews
  // before the deadline; one that dies stops renewing, and its rows return
  // to ready at the last deadline it set. Errors as Ack, plus
  // InvalidArgument (negative lease_timeout) and OutOfRange (above
  // kMaxLeaseTimeout).
  virtual Result<RenewResponse> Renew(const RenewRequest& request) = 0;
  // Releases every active lease granted with GetMetaRequest::holder ==
  // request.holder (their rows ready again now; a later Ack or Release of
  // one is FailedPrecondition "released"): for the process that runs the
  // hub, or a supervisor that reaches it over the wire, when it knows a
  // consumer died. None: zero counts. InvalidArgument (empty holder).
  // The holder is also fenced for kHolderFence: a GetMeta under its name
  // (one the dead process sent before it died, waiting here or still on its
  // way) is refused with FailedPrecondition instead of leasing rows to
  // nobody, so holder names are one process's (a name and pid).
  // Unimplemented by controllers that do not keep holders.
  virtual Result<ReleaseHolderResponse> ReleaseHolder(const ReleaseHolderRequest& request) {
    return Status::Unimplemented("ReleaseHolder of '" + request.holder + "': this controller keeps no holders");
  }

  // Frees every row of the partition and removes it. NotFound if unknown.
  virtual Result<ClearResponse> ClearPartition(const ClearPartitionRequest& request) = 0;

  // Key-value view. NotFound (partition; any key unknown: nothing returned).
  virtual Result<std::vector<KvEntry>> KvLookup(const KvLookupRequest& request) = 0;
  // Every key of the partition, sorted by key.
  virtual Result<std::vector<KvEntry>> KvList(const KvListRequest& request) = 0;
  // Frees the rows of `keys`. NotFound (partition, any key: nothing cleared).
  virtual Result<ClearResponse> KvClear(const KvClearRequest& request) = 0;

  // The storage bytes of a ticket are gone: stop counting them. NotFound if
  // the ticket is unknown (already finished).
  virtual Status FinishReclaim(const FinishReclaimRequest& request) = 0;

  virtual Result<ControllerStats> Stats() = 0;

  // Wakes every blocked call with Aborted; every later call returns Aborted.
  virtual void Close() = 0;
};

// InvalidArgument naming the offending option (a bad column, task, zero
// capacity, zero lease timeout, ...).
Result<std::shared_ptr<Controller>> NewInProcessController(ControllerOptions options);

}  // namespace sluice::transfer_queue

#endif  // SLUICE_TRANSFER_QUEUE_CONTROLLER_H_
