// TransferQueue storage units: the data plane. A unit holds the bytes of
// (row, column) cells; rows are sharded over N units by StorageUnitFor.
//
// A unit does not decide visibility: the controller does. Bytes stored by a
// write that is not committed yet are never named by controller metadata, so
// no client read reaches them (a read is always addressed by a BatchMeta or a
// key lookup from the controller). Because row ids are never reused, a read
// of a freed row is NotFound, never another row's data.
//
// Like the controller, a unit is an abstract interface over plain
// request/response structs so later transports can serialize them; the
// in-process unit copies the bytes once at Write and hands out zero-copy
// views at Read.
//
// Thread safety: every method is thread-safe; the in-process unit has one
// mutex per unit and copies bytes outside it.
#ifndef SLUICE_TRANSFER_QUEUE_STORAGE_H_
#define SLUICE_TRANSFER_QUEUE_STORAGE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"
#include "sluice/transfer_queue/types.h"

namespace sluice::transfer_queue {

// The unit that holds `row`'s bytes. Precondition: num_units > 0.
inline uint32_t StorageUnitFor(RowId row, uint32_t num_units) { return static_cast<uint32_t>(row % num_units); }

struct StorageItem {
  RowId row = 0;
  std::string column;
  HostTensor tensor;
};

struct StorageWriteRequest {
  WriteId write_id = 0;  // for messages only
  std::vector<StorageItem> items;
};

struct StorageReadRequest {
  std::vector<RowId> rows;
  std::vector<std::string> columns;
};
struct StorageReadResponse {
  // tensors[c][i] is column columns[c] of rows[i]: zero-copy views whose owner
  // keeps the bytes alive after the row is freed.
  std::vector<std::vector<HostTensor>> tensors;
};

// Drops the (row, column) cells named, where present.
struct StorageDiscardRequest {
  std::vector<RowId> rows;
  std::vector<std::string> columns;
};

struct StorageFreeRequest {
  std::vector<RowId> rows;
};

// Bytes held by a set of units together, with the high-water mark; lets
// tests check the capacity bound exactly across units.
struct StorageMeter {
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> peak_bytes{0};
};

class StorageUnit {
 public:
  virtual ~StorageUnit() = default;

  // Stores every item or none. Errors: InvalidArgument (nbytes inconsistent
  // with dtype and shape, null data, empty column name; item named),
  // OutOfRange (tensor over max_tensor_bytes), AlreadyExists (a cell is
  // already stored, or twice in the request).
  virtual Status Write(const StorageWriteRequest& request) = 0;
  // All or nothing. NotFound naming the first missing (row, column): never
  // written, or freed.
  virtual Result<StorageReadResponse> Read(const StorageReadRequest& request) = 0;
  // Idempotent.
  virtual Status Discard(const StorageDiscardRequest& request) = 0;
  // Drops every cell of `rows`. Idempotent.
  virtual Status FreeRows(const StorageFreeRequest& request) = 0;
  virtual Result<StorageStats> Stats() = 0;
};

// Where a storage unit keeps the bytes of its cells. Without one, each cell
// is a heap buffer; the server's shared-memory arena is another.
class CellMemory {
 public:
  virtual ~CellMemory() = default;
  // The tensor as the unit will hold it: a copy of its bytes in this memory,
  // or `tensor` itself when its bytes already live here (written in place by
  // a same-host client). The result's owner releases the memory.
  virtual Result<HostTensor> Place(const HostTensor& tensor) = 0;
};

struct StorageUnitOptions {
  uint32_t index = 0;                             // appears in stats and messages
  uint64_t max_tensor_bytes = uint64_t{1} << 30;  // default 1 GiB
  std::shared_ptr<StorageMeter> meter;            // optional, shared by units
  std::shared_ptr<CellMemory> memory;             // optional: default heap buffers
};

std::shared_ptr<StorageUnit> NewInProcessStorageUnit(StorageUnitOptions options);

}  // namespace sluice::transfer_queue

#endif  // SLUICE_TRANSFER_QUEUE_STORAGE_H_
