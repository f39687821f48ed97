#include "core/ready_view.h"

#include <limits>

#include "sluice/common/check.h"

namespace sluice::transfer_queue::internal {

void ReadyView::AddRow(RowId row, PolicyVersion version, GroupId group) {
  bool inserted = rows_.emplace(version, row).second;
  SLUICE_CHECK(inserted) << "row " << row << " added twice to a ready view";
  if (group != kNoGroup) ++groups_[group].in_view;
}

bool ReadyView::RemoveRow(RowId row, PolicyVersion version, GroupId group) {
  if (rows_.erase({version, row}) == 0) return false;
  if (group != kNoGroup) {
    auto it = groups_.find(group);
    SLUICE_CHECK(it != groups_.end() && it->second.in_view > 0) << "group " << group << " count out of sync";
    Uncomplete(it->second);
    if (--it->second.in_view == 0) groups_.erase(it);
  }
  return true;
}

void ReadyView::Uncomplete(GroupState& state) {
  if (!state.complete) return;
  auto bucket = complete_.find(state.complete->first);
  SLUICE_CHECK(bucket != complete_.end());
  bucket->second.erase(state.complete->second);
  if (bucket->second.empty()) complete_.erase(bucket);
  state.complete.reset();
}

void ReadyView::RefreshGroup(GroupId group, const GroupSummary& summary) {
  auto it = groups_.find(group);
  if (it == groups_.end()) return;  // no row of the group in the view: not complete, nothing indexed
  GroupState& state = it->second;
  std::optional<std::pair<uint32_t, GroupKey>> want;
  if (summary.created > 0 && summary.alive == summary.created && state.in_view == summary.created) {
    want =
        std::make_pair(summary.created, GroupKey{summary.min_version, summary.first_row, group, summary.max_version});
  }
  if (want == state.complete) return;
  Uncomplete(state);
  if (want) {
    complete_[want->first].insert(want->second);
    state.complete = want;
  }
}

std::vector<RowId> ReadyView::PickRows(size_t n, PolicyVersion min_version, PolicyVersion max_version) const {
  std::vector<RowId> out;
  for (auto it = rows_.lower_bound({min_version, 0}); it != rows_.end() && out.size() < n; ++it) {
    if (it->first > max_version) break;
    out.push_back(it->second);
  }
  return out;
}

std::vector<GroupId> ReadyView::PickGroups(size_t count, uint32_t size, PolicyVersion min_version,
                                           PolicyVersion max_version) const {
  std::vector<GroupId> out;
  auto bucket = complete_.find(size);
  if (bucket == complete_.end()) return out;
  const GroupKey from{min_version, 0, std::numeric_limits<GroupId>::min(), std::numeric_limits<PolicyVersion>::min()};
  for (auto it = bucket->second.lower_bound(from); it != bucket->second.end() && out.size() < count; ++it) {
    if (it->min_version > max_version) break;
    if (it->max_version > max_version) continue;
    out.push_back(it->group);
  }
  return out;
}

}  // namespace sluice::transfer_queue::internal
