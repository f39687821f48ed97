#include "core/ready_view.h"

#include <gtest/gtest.h>

#include <limits>

namespace sluice::transfer_queue::internal {
namespace {

constexpr PolicyVersion kMin = std::numeric_limits<PolicyVersion>::min();
constexpr PolicyVersion kMax = std::numeric_limits<PolicyVersion>::max();

GroupSummary Summary(uint32_t created, uint32_t alive, PolicyVersion lo, PolicyVersion hi, RowId first) {
  return GroupSummary{created, alive, lo, hi, first};
}

TEST(ReadyViewTest, RowsComeInVersionThenIdOrder) {
  ReadyView view(0, 1);
  view.AddRow(5, 2, kNoGroup);
  view.AddRow(3, 2, kNoGroup);
  view.AddRow(9, 1, kNoGroup);
  view.AddRow(1, kNoPolicyVersion, kNoGroup);
  EXPECT_EQ(view.PickRows(10, kMin, kMax), (std::vector<RowId>{1, 9, 3, 5}));
  EXPECT_EQ(view.PickRows(2, kMin, kMax), (std::vector<RowId>{1, 9}));
  EXPECT_EQ(view.PickRows(10, 2, 2), (std::vector<RowId>{3, 5}));
  EXPECT_EQ(view.PickRows(10, 0, 1), (std::vector<RowId>{9}));
  EXPECT_TRUE(view.RemoveRow(9, 1, kNoGroup));
  EXPECT_FALSE(view.RemoveRow(9, 1, kNoGroup));
  EXPECT_FALSE(view.RemoveRow(3, 7, kNoGroup)) << "removal is keyed by the version it was added with";
  EXPECT_EQ(view.size(), 3u);
}

TEST(ReadyViewTest, GroupIsCompleteOnlyWhenEveryCreatedRowIsInTheView) {
  ReadyView view(0, 1);
  view.AddRow(1, 0, 7);
  view.AddRow(2, 0, 7);
  view.RefreshGroup(7, Summary(3, 3, 0, 0, 1));
  EXPECT_TRUE(view.PickGroups(1, 3, kMin, kMax).empty()) << "2 of 3 rows ready";
  view.AddRow(3, 0, 7);
  view.RefreshGroup(7, Summary(3, 3, 0, 0, 1));
  EXPECT_EQ(view.PickGroups(1, 3, kMin, kMax), (std::vector<GroupId>{7}));
  EXPECT_TRUE(view.PickGroups(1, 2, kMin, kMax).empty()) << "a group of 3 never serves a request for 2";
  // A row leaving (leased) makes the group incomplete at once.
  view.RemoveRow(2, 0, 7);
  EXPECT_TRUE(view.PickGroups(1, 3, kMin, kMax).empty());
  view.AddRow(2, 0, 7);
  view.RefreshGroup(7, Summary(3, 3, 0, 0, 1));
  EXPECT_EQ(view.PickGroups(1, 3, kMin, kMax).size(), 1u);
  // A freed row (alive < created) makes it incomplete forever.
  view.RemoveRow(3, 0, 7);
  view.RefreshGroup(7, Summary(3, 2, 0, 0, 1));
  EXPECT_TRUE(view.PickGroups(1, 2, kMin, kMax).empty());
  EXPECT_TRUE(view.PickGroups(1, 3, kMin, kMax).empty());
}

TEST(ReadyViewTest, GroupsFilteredByVersionRangeAndOrderedByAge) {
  ReadyView view(0, 1);
  // group 1: versions 3..4; group 2: versions 1..1; group 3: versions 2..5
  RowId id = 1;
  for (auto [group, lo, hi] : {std::tuple<GroupId, PolicyVersion, PolicyVersion>{1, 3, 4}, {2, 1, 1}, {3, 2, 5}}) {
    RowId first = id;
    view.AddRow(id++, lo, group);
    view.AddRow(id++, hi, group);
    view.RefreshGroup(group, Summary(2, 2, lo, hi, first));
  }
  EXPECT_EQ(view.PickGroups(5, 2, kMin, kMax), (std::vector<GroupId>{2, 3, 1}));
  EXPECT_EQ(view.PickGroups(5, 2, 2, kMax), (std::vector<GroupId>{3, 1}));
  EXPECT_EQ(view.PickGroups(5, 2, 2, 4), (std::vector<GroupId>{1})) << "group 3 reaches version 5";
  EXPECT_EQ(view.PickGroups(1, 2, kMin, kMax), (std::vector<GroupId>{2}));
}

}  // namespace
}  // namespace sluice::transfer_queue::internal
