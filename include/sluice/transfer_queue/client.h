// TransferQueueClient: what producers and consumers call. Its concepts match
// the open-source TransferQueue (Python) client, so a later binding can keep
// the same shape: put rows/columns into a partition, get_meta (a leased batch
// of row ids and tags for a task), get_data (the requested columns of that
// batch), ack/release, clear, a key-value view, and stats.
//
// The client orchestrates the two planes: metadata and leases go to the
// controller (controller.h), bytes to the storage units (storage.h), rows
// sharded by StorageUnitFor(row, N). In process it calls the objects
// directly and GetData returns zero-copy views.
//
// Contract
//  * Writes are all-or-nothing and two-phase: BeginWrite at the controller
//    (validation, capacity reservation), bytes to the storage units, then
//    CommitWrite. A reader never sees part of a write. If storing or
//    committing fails, the stored bytes are discarded, the reservation is
//    released and the error is returned: a write is never silently invisible.
//  * Row lifetime. Rows are freed (their bytes dropped from storage) when
//    every registered task has acked them, or when their partition or key is
//    cleared. Views returned by GetData/KvGet keep their bytes alive after
//    that (the owner is shared), outside the queue's capacity accounting.
//  * Reading a freed or cleared row is NotFound, never another row's data.
//  * Memory. The bytes in storage never exceed capacity_bytes: they are
//    reserved before they are stored and unreserved only after they are
//    dropped (see Controller, "Freeing").
//
// Thread safety: a client is a cheap copyable value holding shared pointers;
// every method is thread-safe and clients may be shared or copied freely.
#ifndef SLUICE_TRANSFER_QUEUE_CLIENT_H_
#define SLUICE_TRANSFER_QUEUE_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"
#include "sluice/transfer_queue/controller.h"
#include "sluice/transfer_queue/storage.h"
#include "sluice/transfer_queue/types.h"

namespace sluice::transfer_queue {

// Per-row tensors of several columns: batch[column][i] is row i's tensor.
using ColumnBatch = std::map<std::string, std::vector<HostTensor>>;

struct BatchData {
  std::vector<RowId> rows;  // as in the BatchMeta
  ColumnBatch columns;      // columns[name][i] belongs to rows[i]
};

struct KvValue {
  KvEntry entry;                              // key, row, tags, committed columns
  std::map<std::string, HostTensor> columns;  // the columns asked for
};

// Several keys at once (KvGetBatch): columns[name][i] belongs to entries[i].
struct KvBatch {
  std::vector<KvEntry> entries;  // in the order of the keys asked for
  ColumnBatch columns;
};

// What a consumer takes in one step (TransferQueueClient::Take).
struct TakenBatch {
  BatchMeta meta;
  BatchData data;
};

// A transport that runs a whole put or take in one round trip implements
// this (the remote client does, see remote.h); the in-process hub needs none.
class FusedCalls {
 public:
  virtual ~FusedCalls() = default;
  // The whole write `begin` (its columns declared) with the bytes of
  // `columns` (payload_bytes in all): BeginWrite, storing and CommitWrite,
  // all or nothing. nullopt: this transport sends such a put in steps.
  virtual std::optional<Result<BeginWriteResponse>> Put(const BeginWriteRequest& begin, const ColumnBatch& columns,
                                                        uint64_t payload_bytes) = 0;
  // TransferQueueClient::Take.
  virtual Result<TakenBatch> Take(const GetMetaRequest& request, const std::vector<std::string>& columns,
                                  LeaseId ack_first) = 0;
};

struct QueueStats {
  ControllerStats controller;
  std::vector<StorageStats> storage;  // one per unit
  uint64_t storage_bytes = 0;         // sum over units (sampled one by one)
};

class TransferQueueClient {
 public:
  // Precondition: controller non-null, at least one storage unit, none null.
  // `fused` (optional): puts and takes in one round trip each.
  TransferQueueClient(std::shared_ptr<Controller> controller, std::vector<std::shared_ptr<StorageUnit>> storage,
                      std::shared_ptr<FusedCalls> fused = nullptr);

  // ---- setup (see Controller for errors)
  Status RegisterColumns(std::vector<ColumnSchema> columns);
  Status RegisterTask(std::string task);
  Status CreatePartition(std::string partition, uint32_t group_size = 0, std::vector<std::string> consumers = {});

  // ---- producers
  // Creates rows with tags and no columns yet.
  Result<std::vector<RowId>> CreateRows(std::string partition, std::vector<RowTags> tags, CapacityWait wait = {});
  // Writes columns of existing rows: columns[name][i] is rows[i]'s tensor.
  // patches: empty or one per row, applied atomically with the write.
  // Errors: InvalidArgument (a column's tensor count differs from rows.size(),
  // nothing to write), the controller's BeginWrite/CommitWrite errors, the
  // storage units' Write errors.
  Status PutColumns(const std::vector<RowId>& rows, const ColumnBatch& columns, std::vector<RowTagPatch> patches = {},
                    CapacityWait wait = {});
  // Creates rows and writes their first columns in one all-or-nothing step:
  // the rows become visible with their columns, or not at all.
  Result<std::vector<RowId>> PutRows(std::string partition, std::vector<RowTags> tags, const ColumnBatch& columns,
                                     CapacityWait wait = {});

  // ---- consumers
  // See Controller::GetMeta.
  Result<BatchMeta> GetMeta(const GetMetaRequest& request);
  Result<BatchMeta> GetMeta(std::string task, std::vector<std::string> columns, uint32_t n, std::string partition,
                            SamplingPolicy policy = {},
                            std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // Reads `columns` (a subset of meta.columns; empty = all of them) of the
  // batch's rows. Does not consult the lease: reading after an ack works
  // while the rows are alive. Errors: InvalidArgument (a column not in the
  // batch, duplicate column), NotFound (a row was freed or cleared; the
  // message names it).
  Result<BatchData> GetData(const BatchMeta& meta, const std::vector<std::string>& columns = {});
  // GetMeta, then GetData of `columns` (empty: the batch's), in one step,
  // after acking `ack_first` (0: none), typically the consumer's previous
  // batch. Over a remote connection this is one round trip instead of three.
  // If that ack fails nothing is taken and the error says so; if reading
  // fails the lease is released. Errors otherwise as GetMeta and GetData.
  Result<TakenBatch> Take(const GetMetaRequest& request, const std::vector<std::string>& columns = {},
                          LeaseId ack_first = 0);
  // Finishes the lease, then drops the bytes of rows every task has acked.
  Result<AckResponse> Ack(LeaseId lease);
  Result<ReleaseResponse> Release(LeaseId lease);
  // Controller::Renew: the lease's deadline becomes now + lease_timeout (0:
  // the controller's default).
  Result<RenewResponse> Renew(LeaseId lease, std::chrono::milliseconds lease_timeout = std::chrono::milliseconds(0));
  // Controller::ReleaseHolder: every lease taken with GetMetaRequest::holder
  // == holder is released now (a supervisor that saw that consumer die).
  Result<ReleaseHolderResponse> ReleaseHolder(const std::string& holder);

  // Frees every row of the partition (whatever their state) and removes it.
  Result<ClearResponse> ClearPartition(std::string partition);

  // ---- key-value view: a key names one row of a partition.
  // Creates the key's row (tagged `tags`) or, if the key exists, writes the
  // new columns to its row and patches its tags (policy version, token
  // length, user tags merged; the group id is kept). Writing a column the
  // key already has is AlreadyExists: KvClear the key to replace it.
  Status KvPut(std::string partition, std::string key, RowTags tags, const std::map<std::string, HostTensor>& columns,
               CapacityWait wait = {});
  // The key's tags and the asked columns (empty = every committed column).
  // NotFound if the key, or one of the columns for it, does not exist.
  Result<KvValue> KvGet(std::string partition, std::string key, const std::vector<std::string>& columns = {});
  // KvPut of several keys in one all-or-nothing write: columns[name][i]
  // belongs to keys[i]. A new key's row is created tagged tags[i] (tags:
  // empty for default tags, or one per key); patches[i] (patches: empty, or
  // one per key) is applied to keys[i]'s row at commit, whether the row is
  // new or existing (an existing key keeps its group id). Unlike KvPut, an
  // existing key's tags change only through its patch. Errors as KvPut, plus
  // InvalidArgument for counts that disagree and a key listed twice.
  Status KvPutBatch(std::string partition, std::vector<std::string> keys, std::vector<RowTags> tags,
                    const ColumnBatch& columns, std::vector<RowTagPatch> patches = {}, CapacityWait wait = {});
  // KvGet of several keys (each at most once): the entries in the order of
  // `keys` and the asked columns of their rows (empty = the columns every
  // one of the keys has committed). NotFound if a key, or an asked column of
  // one of them, does not exist: nothing is returned.
  Result<KvBatch> KvGetBatch(std::string partition, std::vector<std::string> keys,
                             const std::vector<std::string>& columns = {});
  Result<std::vector<KvEntry>> KvList(std::string partition);
  Result<ClearResponse> KvClear(std::string partition, std::vector<std::string> keys);

  // Controller stats plus each storage unit's.
  Result<QueueStats> Stats();

  const std::shared_ptr<Controller>& controller() const { return controller_; }
  const std::vector<std::shared_ptr<StorageUnit>>& storage() const { return storage_; }
  const std::shared_ptr<FusedCalls>& fused() const { return fused_; }

 private:
  // Two-phase write of `columns` for the target rows of `begin` (whose
  // `columns` field is filled here). Returns the target row ids.
  Result<std::vector<RowId>> Write(BeginWriteRequest begin, const ColumnBatch& columns, size_t num_rows);
  // Drops the cells `begin` wrote and aborts the write; returns `cause`.
  Status Undo(WriteId write, const std::vector<RowId>& rows, const ColumnBatch& columns, const Status& cause);
  // Drops a ticket's rows from storage, then tells the controller.
  Status Reclaim(const ReclaimTicket& ticket);
  Result<ColumnBatch> ReadColumns(const std::vector<RowId>& rows, const std::vector<std::string>& columns);

  std::shared_ptr<Controller> controller_;
  std::vector<std::shared_ptr<StorageUnit>> storage_;
  std::shared_ptr<FusedCalls> fused_;
};

struct HubOptions {
  ControllerOptions controller;
  uint32_t storage_units = 2;  // > 0
};

// An in-process TransferQueue: one controller and N storage units, shared by
// every client made from it. Clients keep the parts alive, so they may
// outlive the hub.
class TransferQueueHub {
 public:
  // InvalidArgument for bad options (see ControllerOptions).
  static Result<std::unique_ptr<TransferQueueHub>> Create(HubOptions options);

  TransferQueueClient client() const { return TransferQueueClient(controller_, storage_); }
  const std::shared_ptr<Controller>& controller() const { return controller_; }
  const std::vector<std::shared_ptr<StorageUnit>>& storage() const { return storage_; }
  // Bytes held by all units together, with the high-water mark.
  const StorageMeter& meter() const { return *meter_; }

 private:
  TransferQueueHub() = default;
  std::shared_ptr<Controller> controller_;
  std::vector<std::shared_ptr<StorageUnit>> storage_;
  std::shared_ptr<StorageMeter> meter_;
};

}  // namespace sluice::transfer_queue

#endif  // SLUICE_TRANSFER_QUEUE_CLIENT_H_
