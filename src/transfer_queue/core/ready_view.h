// ReadyView: the ready-list of one (partition, task, column set). It holds
// exactly the rows of the partition that are visible, have every column of
// the set committed and are not consumed by the task, so GetMeta never scans
// the row table. It also indexes complete GRPO groups for whole-group
// sampling. The controller keeps every view of a partition up to date on
// each commit, lease, ack, release, expiry and free (see controller_state.h).
//
// Order: rows by (policy_version, row id); complete groups by
// (min policy_version of the group, first row id). Costs: AddRow/RemoveRow
// O(log R); RefreshGroup O(log groups); PickRows O(log R + n); PickGroups
// O(log groups + groups picked + groups skipped by max_version).
//
// Thread safety: none; guarded by the controller's mutex.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_READY_VIEW_H_
#define SLUICE_SRC_TRANSFER_QUEUE_READY_VIEW_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sluice/transfer_queue/types.h"

namespace sluice::transfer_queue::internal {

// A group as the partition sees it.
struct GroupSummary {
  uint32_t created = 0;  // rows ever created in the group (never decremented, except by an aborted write)
  uint32_t alive = 0;    // rows not freed
  PolicyVersion min_version = 0;
  PolicyVersion max_version = 0;
  RowId first_row = 0;
};

class ReadyView {
 public:
  ReadyView(uint32_t task, uint64_t mask) : task_(task), mask_(mask) {}

  uint32_t task() const { return task_; }
  uint64_t mask() const { return mask_; }
  size_t size() const { return rows_.size(); }

  // Adds an eligible row. Precondition: not in the view.
  void AddRow(RowId row, PolicyVersion version, GroupId group);
  // Removes the row if present (keyed by the version it was added with);
  // returns whether it was. A group losing a row is no longer complete.
  bool RemoveRow(RowId row, PolicyVersion version, GroupId group);
  // Re-evaluates whether `group` is complete: every row ever created is alive
  // and in this view. Call after rows of the group were added or its summary
  // changed.
  void RefreshGroup(GroupId group, const GroupSummary& summary);

  // Up to n rows with min <= version <= max, in view order.
  std::vector<RowId> PickRows(size_t n, PolicyVersion min_version, PolicyVersion max_version) const;
  // Up to `count` complete groups of exactly `size` rows whose versions all
  // lie in [min, max], in view order.
  std::vector<GroupId> PickGroups(size_t count, uint32_t size, PolicyVersion min_version,
                                  PolicyVersion max_version) const;

 private:
  struct GroupKey {
    PolicyVersion min_version;
    RowId first_row;
    GroupId group;
    PolicyVersion max_version;
    auto operator<=>(const GroupKey&) const = default;
  };
  struct GroupState {
    uint32_t in_view = 0;
    std::optional<std::pair<uint32_t, GroupKey>> complete;  // (size bucket, key) when complete
  };
  void Uncomplete(GroupState& state);

  const uint32_t task_;
  const uint64_t mask_;
  std::set<std::pair<PolicyVersion, RowId>> rows_;
  std::unordered_map<GroupId, GroupState> groups_;
  std::map<uint32_t, std::set<GroupKey>> complete_;  // by group size
};

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_READY_VIEW_H_
