// The server's record of two-phase writes between BeginWrite and
// CommitWrite/AbortWrite. It is what lets a network server keep the
// controller's capacity accounting true when clients misbehave or die:
//  * a storage write is accepted only for cells its BeginWrite declared, with
//    the declared dtype, shape and nbytes, on the unit that owns the row, so
//    a client cannot store bytes that were never reserved;
//  * a remote Discard drops only cells of open writes, never committed data;
//  * a write left open longer than the timeout (its client died between the
//    two phases) is discarded and aborted by the server, so its reservation
//    is not leaked.
//
// Each write has an operation lock held while its store, commit or abort
// runs (a client sends a write's shards one after another, so this costs no
// parallelism); expiry only try-locks it, so a write is never expired while
// one of its operations is in flight.
//
// Thread safety: thread-safe. Lock order: a write's op_mu, then mu_; expiry
// holds mu_ and only try-locks op_mu.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_OPEN_WRITES_H_
#define SLUICE_SRC_TRANSFER_QUEUE_OPEN_WRITES_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sluice/common/mutex.h"
#include "sluice/common/status.h"
#include "sluice/transfer_queue/controller.h"
#include "sluice/transfer_queue/storage.h"

namespace sluice::transfer_queue::internal {

// The cells a write may store: rows x columns.
struct WriteCells {
  std::vector<RowId> rows;
  std::vector<std::string> columns;
};

class OpenWrites {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // timeout 0: writes never expire. Precondition: num_units > 0.
  OpenWrites(std::chrono::milliseconds timeout, uint32_t num_units);

  // Records a write the controller began: `rows` are its target rows (from
  // BeginWriteResponse), request.columns their declared tensors.
  void Add(WriteId id, const BeginWriteRequest& request, const std::vector<RowId>& rows, TimePoint now);

  // Runs `store` if every item of `request` is a declared cell of open write
  // request.write_id, owned by `unit`, with the declared metadata. Errors:
  // NotFound (the write is not open here), InvalidArgument (an undeclared
  // cell, other metadata, the wrong unit), or store's own.
  Status Store(const StorageWriteRequest& request, uint32_t unit, const std::function<Status()>& store, TimePoint now);
  // Runs `commit` while the write is open; forgets the write if it succeeds.
  // NotFound if the write is not open here (never begun, finished, expired).
  Status Commit(WriteId id, const std::function<Status()>& commit, TimePoint now);
  // Forgets the write and runs `abort` with its cells (null if it was not
  // open here: the controller then gives the answer).
  Status Abort(WriteId id, const std::function<Status(const WriteCells*)>& abort);
  // The cells of `request` that belong to open writes, by row.
  std::vector<std::pair<RowId, std::vector<std::string>>> Discardable(const StorageDiscardRequest& request) const;
  // Forgets writes idle past the timeout (no operation in flight) and runs
  // `abort` on each, outside mu_ and under the write's op lock. Returns how many.
  size_t Expire(TimePoint now, const std::function<void(WriteId, const WriteCells&)>& abort);

  size_t size() const;

 private:
  struct Write {
    std::mutex op_mu;    // held while a store/commit/abort of this write runs
    bool open = true;    // false once committed, aborted or expired (under op_mu)
    TimePoint deadline;  // guarded by OpenWrites::mu_
    WriteCells cells;    // immutable after Add
    std::unordered_map<RowId, size_t> row_index;
    std::vector<ColumnWriteMeta> declared;  // declared[c].rows[i] for cells.rows[i]
  };
  std::shared_ptr<Write> Find(WriteId id) const;
  void Forget(WriteId id);
  void Touch(Write& w, TimePoint now);
  std::string NotOpen(WriteId id) const;

  const std::chrono::milliseconds timeout_;
  const uint32_t num_units_;
  mutable Mutex mu_;
  std::unordered_map<WriteId, std::shared_ptr<Write>> writes_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_OPEN_WRITES_H_
