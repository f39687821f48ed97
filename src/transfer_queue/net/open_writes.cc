#include "net/open_writes.h"

#include <algorithm>

#include "core/validation.h"
#include "sluice/common/check.h"

namespace sluice::transfer_queue::internal {

OpenWrites::OpenWrites(std::chrono::milliseconds timeout, uint32_t num_units)
    : timeout_(timeout), num_units_(num_units) {
  SLUICE_CHECK(num_units_ > 0);
}

void OpenWrites::Touch(Write& w, TimePoint now) {
  MutexLock lock(&mu_);
  w.deadline = timeout_.count() > 0 ? now + timeout_ : TimePoint::max();
}

void OpenWrites::Add(WriteId id, const BeginWriteRequest& request, const std::vector<RowId>& rows, TimePoint now) {
  auto w = std::make_shared<Write>();
  w->cells.rows = rows;
  for (const ColumnWriteMeta& c : request.columns) w->cells.columns.push_back(c.column);
  for (size_t i = 0; i < rows.size(); ++i) w->row_index.emplace(rows[i], i);
  w->declared = request.columns;
  MutexLock lock(&mu_);
  w->deadline = timeout_.count() > 0 ? now + timeout_ : TimePoint::max();
  writes_[id] = std::move(w);
}

std::shared_ptr<OpenWrites::Write> OpenWrites::Find(WriteId id) const {
  MutexLock lock(&mu_);
  auto it = writes_.find(id);
  return it == writes_.end() ? nullptr : it->second;
}

void OpenWrites::Forget(WriteId id) {
  MutexLock lock(&mu_);
  writes_.erase(id);
}

std::string OpenWrites::NotOpen(WriteId id) const {
  return "write " + std::to_string(id) +
         " is not open on this server (never begun here, already committed or aborted, or aborted by the server "
         "after being left open longer than open_write_timeout = " +
         std::to_string(timeout_.count()) + " ms)";
}

Status OpenWrites::Store(const StorageWriteRequest& request, uint32_t unit, const std::function<Status()>& store,
                         TimePoint now) {
  std::shared_ptr<Write> w = Find(request.write_id);
  if (w == nullptr) return Status::NotFound(NotOpen(request.write_id));
  std::unique_lock<std::mutex> op(w->op_mu);
  if (!w->open) return Status::NotFound(NotOpen(request.write_id));
  for (const StorageItem& item : request.items) {
    const std::string where = "write " + std::to_string(request.write_id) + ", row " + std::to_string(item.row) +
                              ", column " + Quoted(item.column);
    auto row = w->row_index.find(item.row);
    if (row == w->row_index.end()) return Status::InvalidArgument(where + ": the row is not a target of the write");
    auto column = std::find_if(w->declared.begin(), w->declared.end(),
                               [&](const ColumnWriteMeta& c) { return c.column == item.column; });
    if (column == w->declared.end()) {
      return Status::InvalidArgument(where + ": the column was not declared by the write's BeginWrite");
    }
    const TensorMeta& meta = column->rows[row->second];
    const HostTensor& t = item.tensor;
    if (t.dtype != meta.dtype || t.shape != meta.shape || t.nbytes != meta.nbytes) {
      return Status::InvalidArgument(
          where + ": tensor " + ShapeToString(t.shape) + " " + std::string(DTypeName(t.dtype)) + " (" +
          std::to_string(t.nbytes) + " bytes) differs from the declared " + ShapeToString(meta.shape) + " " +
          std::string(DTypeName(meta.dtype)) + " (" + std::to_string(meta.nbytes) + " bytes)");
    }
    const uint32_t owner = StorageUnitFor(item.row, num_units_);
    if (owner != unit) {
      return Status::InvalidArgument(where + ": the row belongs to storage unit " + std::to_string(owner) + ", not " +
                                     std::to_string(unit));
    }
  }
  Status stored = store();
  Touch(*w, now);
  return stored;
}

Status OpenWrites::Commit(WriteId id, const std::function<Status()>& commit, TimePoint now) {
  std::shared_ptr<Write> w = Find(id);
  if (w == nullptr) return Status::NotFound(NotOpen(id));
  std::unique_lock<std::mutex> op(w->op_mu);
  if (!w->open) return Status::NotFound(NotOpen(id));
  Status committed = commit();
  if (committed.ok()) {
    w->open = false;
    Forget(id);
  } else {
    Touch(*w, now);  // the client undoes it now (or expiry will)
  }
  return committed;
}

Status OpenWrites::Abort(WriteId id, const std::function<Status(const WriteCells*)>& abort) {
  std::shared_ptr<Write> w = Find(id);
  if (w == nullptr) return abort(nullptr);
  std::unique_lock<std::mutex> op(w->op_mu);
  if (!w->open) return abort(nullptr);
  w->open = false;
  Forget(id);
  return abort(&w->cells);
}

std::vector<std::pair<RowId, std::vector<std::string>>> OpenWrites::Discardable(
    const StorageDiscardRequest& request) const {
  std::vector<std::pair<RowId, std::vector<std::string>>> out;
  MutexLock lock(&mu_);
  if (writes_.empty()) return out;
  for (RowId row : request.rows) {
    std::vector<std::string> columns;
    for (const auto& [id, w] : writes_) {
      if (w->row_index.count(row) == 0) continue;
      for (const std::string& c : request.columns) {
        if (std::find(w->cells.columns.begin(), w->cells.columns.end(), c) != w->cells.columns.end() &&
            std::find(columns.begin(), columns.end(), c) == columns.end()) {
          columns.push_back(c);
        }
      }
    }
    if (!columns.empty()) out.emplace_back(row, std::move(columns));
  }
  return out;
}

size_t OpenWrites::Expire(TimePoint now, const std::function<void(WriteId, const WriteCells&)>& abort) {
  std::vector<std::pair<WriteId, std::shared_ptr<Write>>> expired;
  std::vector<std::unique_lock<std::mutex>> locks;
  {
    MutexLock lock(&mu_);
    for (auto it = writes_.begin(); it != writes_.end();) {
      std::unique_lock<std::mutex> op(it->second->op_mu, std::try_to_lock);
      if (it->second->deadline > now || !op.owns_lock() || !it->second->open) {
        ++it;
        continue;
      }
      it->second->open = false;
      expired.emplace_back(it->first, it->second);
      locks.push_back(std::move(op));
      it = writes_.erase(it);
    }
  }
  for (auto& [id, w] : expired) abort(id, w->cells);
  return expired.size();
}

size_t OpenWrites::size() const {
  MutexLock lock(&mu_);
  return writes_.size();
}

}  // namespace sluice::transfer_queue::internal
