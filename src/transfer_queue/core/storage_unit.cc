// The in-process storage unit: one buffer per (row, column) cell (a heap
// buffer, or a block of the CellMemory it was given), copied in at Write
// (outside the lock) and shared with readers as zero-copy views. A view's
// owner is the cell's buffer, so dropping the cell (FreeRows, Discard) never
// invalidates a view; it only stops the unit counting it.
#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>

#include "core/validation.h"
#include "sluice/common/large_buffers.h"
#include "sluice/common/mutex.h"
#include "sluice/transfer_queue/storage.h"

namespace sluice::transfer_queue {
namespace {

using sluice::Quoted;

struct Cell {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::shared_ptr<const void> owner;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
};

class InProcessStorageUnit final : public StorageUnit {
 public:
  explicit InProcessStorageUnit(StorageUnitOptions options) : options_(std::move(options)) {}
  ~InProcessStorageUnit() override {
    MutexLock lock(&mu_);
    if (options_.meter) options_.meter->bytes.fetch_sub(bytes_);
  }

  Status Write(const StorageWriteRequest& request) override {
    // Validate and copy without the lock: the copy is the slow part.
    std::vector<std::pair<std::pair<RowId, std::string>, Cell>> cells;
    cells.reserve(request.items.size());
    uint64_t total = 0;
    for (const StorageItem& item : request.items) {
      // Built only for an error: a write of many small cells must not pay
      // for a message per cell.
      auto where = [&] {
        return Where() + ": write " + std::to_string(request.write_id) + ", row " + std::to_string(item.row) +
               ", column " + Quoted(item.column);
      };
      if (Status name = internal::ValidateName("column", item.column); !name.ok()) return name.WithContext(where());
      const HostTensor& t = item.tensor;
      SLUICE_RETURN_IF_ERROR(internal::PrefixWhere(
          internal::ValidateTensorBytes(TensorMeta{t.dtype, t.shape, t.nbytes}, options_.max_tensor_bytes, ""), where));
      if (t.data == nullptr && t.nbytes > 0) return Status::InvalidArgument(where() + ": data is null");
      Cell cell{t.dtype, t.shape, nullptr, nullptr, t.nbytes};
      if (options_.memory) {
        SLUICE_ASSIGN_OR_RETURN(HostTensor placed, options_.memory->Place(t));
        cell.owner = std::move(placed.owner);
        cell.data = placed.data;
      } else {
        // Cells of a MiB and more reuse freed cells' memory (large_buffers.h).
        std::shared_ptr<std::byte[]> buffer = large_buffers::TakeShared(t.nbytes);
        if (t.nbytes > 0) std::memcpy(buffer.get(), t.data, t.nbytes);
        cell.data = buffer.get();
        cell.owner = std::move(buffer);
      }
      cells.push_back({{item.row, item.column}, std::move(cell)});
      total += t.nbytes;
    }
    // A cell listed twice: one sort of the keys instead of a set node per cell.
    std::vector<std::pair<RowId, std::string_view>> keys;
    keys.reserve(cells.size());
    for (const auto& [key, cell] : cells) keys.emplace_back(key.first, key.second);
    std::sort(keys.begin(), keys.end());
    if (auto twice = std::adjacent_find(keys.begin(), keys.end()); twice != keys.end()) {
      return Status::AlreadyExists(Where() + ": write " + std::to_string(request.write_id) + ", row " +
                                   std::to_string(twice->first) + ", column " + Quoted(twice->second) +
                                   ": appears twice in the write");
    }
    MutexLock lock(&mu_);
    for (const auto& [key, cell] : cells) {
      auto row = rows_.find(key.first);
      if (row != rows_.end() && row->second.count(key.second) > 0) {
        return Status::AlreadyExists(Where() + ": row " + std::to_string(key.first) + " column " + Quoted(key.second) +
                                     " is already stored");
      }
    }
    for (auto& [key, cell] : cells) rows_[key.first].emplace(key.second, std::move(cell));
    tensors_ += cells.size();
    AddBytesLocked(total);
    return Status::Ok();
  }

  Result<StorageReadResponse> Read(const StorageReadRequest& request) override {
    StorageReadResponse out;
    out.tensors.resize(request.columns.size());
    MutexLock lock(&mu_);
    for (size_t c = 0; c < request.columns.size(); ++c) {
      const std::string& column = request.columns[c];
      out.tensors[c].reserve(request.rows.size());
      for (RowId row_id : request.rows) {
        const Cell* cell = nullptr;
        if (auto row = rows_.find(row_id); row != rows_.end()) {
          auto it = row->second.find(column);
          if (it != row->second.end()) cell = &it->second;
        }
        if (cell == nullptr) {
          return Status::NotFound(Where() + ": row " + std::to_string(row_id) + " has no column " + Quoted(column) +
                                  " (never written, or the row was freed or cleared)");
        }
        HostTensor view;
        view.dtype = cell->dtype;
        view.shape = cell->shape;
        view.data = cell->data;
        view.nbytes = cell->nbytes;
        view.owner = cell->owner;
        out.tensors[c].push_back(std::move(view));
      }
    }
    return out;
  }

  Status Discard(const StorageDiscardRequest& request) override {
    MutexLock lock(&mu_);
    uint64_t freed = 0;
    for (RowId row_id : request.rows) freed += FreeCellsLocked(row_id, &request.columns);
    SubBytesLocked(freed);
    return Status::Ok();
  }

  Status FreeRows(const StorageFreeRequest& request) override {
    MutexLock lock(&mu_);
    uint64_t freed = 0;
    for (RowId row_id : request.rows) freed += FreeCellsLocked(row_id, nullptr);
    SubBytesLocked(freed);
    return Status::Ok();
  }

  Result<StorageStats> Stats() override {
    MutexLock lock(&mu_);
    return StorageStats{options_.index, rows_.size(), tensors_, bytes_};
  }

 private:
  std::string Where() const { return "storage unit " + std::to_string(options_.index); }

  void AddBytesLocked(uint64_t n) SLUICE_REQUIRES(mu_) {
    bytes_ += n;
    if (!options_.meter) return;
    // The post-add total is an exact instantaneous total over every unit
    // sharing the meter, so the peak is exact too.
    const uint64_t now = options_.meter->bytes.fetch_add(n) + n;
    uint64_t peak = options_.meter->peak_bytes.load();
    while (now > peak && !options_.meter->peak_bytes.compare_exchange_weak(peak, now)) {
    }
  }
  // Frees the row's cells of `columns` (every cell when null); the row goes
  // with its last cell. Returns the bytes freed (the caller subtracts them).
  uint64_t FreeCellsLocked(RowId row_id, const std::vector<std::string>* columns) SLUICE_REQUIRES(mu_) {
    auto row = rows_.find(row_id);
    if (row == rows_.end()) return 0;
    uint64_t freed = 0;
    if (columns == nullptr) {
      for (const auto& [column, cell] : row->second) freed += cell.nbytes;
      tensors_ -= row->second.size();
      row->second.clear();
    } else {
      for (const std::string& column : *columns) {
        auto cell = row->second.find(column);
        if (cell == row->second.end()) continue;
        freed += cell->second.nbytes;
        --tensors_;
        row->second.erase(cell);
      }
    }
    if (row->second.empty()) rows_.erase(row);
    return freed;
  }

  void SubBytesLocked(uint64_t n) SLUICE_REQUIRES(mu_) {
    bytes_ -= n;
    if (options_.meter) options_.meter->bytes.fetch_sub(n);
  }

  const StorageUnitOptions options_;
  Mutex mu_;
  std::unordered_map<RowId, std::map<std::string, Cell, std::less<>>> rows_ SLUICE_GUARDED_BY(mu_);
  uint64_t tensors_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ SLUICE_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::shared_ptr<StorageUnit> NewInProcessStorageUnit(StorageUnitOptions options) {
  return std::make_shared<InProcessStorageUnit>(std::move(options));
}

}  // namespace sluice::transfer_queue
