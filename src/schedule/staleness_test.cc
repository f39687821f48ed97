#include "sluice/schedule/staleness.h"

#include <gtest/gtest.h>

#include <deque>
#include <limits>
#include <thread>

#include "common/testing/status_macros.h"
#include "sluice/common/random.h"

namespace sluice::schedule {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<StalenessAdmission> Make(int64_t max_staleness, int64_t ppv, PolicyVersion start = 0) {
  auto a = StalenessAdmission::Create({max_staleness, ppv, start});
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return std::move(a).value();
}

// The rule both the admission and the shared stream use.
TEST(StalenessWindowTest, PromptsPastTheRetiredOnesARolloutMayStart) {
  EXPECT_EQ(StalenessWindow(2, 5, 4, 10), 40) << "versions 4, 5, 6, 7 of the trainer: 4 steps of 10";
  EXPECT_EQ(StalenessWindow(0, 3, 3, 16), 16) << "on policy: the trainer's next step";
  EXPECT_EQ(StalenessWindow(1, 0, 2, 16), 0) << "a rollout more than the bound behind";
  EXPECT_EQ(StalenessWindow(int64_t{1} << 62, int64_t{1} << 62, 0, 1000), std::numeric_limits<int64_t>::max());
  auto gate = Make(2, 10, 4);
  EXPECT_EQ(gate->Admissible(5), StalenessWindow(2, 5, 4, 10));
}

TEST(StalenessAdmissionTest, AdmitsWhileTheRuleHolds) {
  auto gate = Make(/*max_staleness=*/1, /*ppv=*/4);
  // trainer 0, rollout 0: prompts at pending 0..7 satisfy 0 + floor(p/4) - 0 <= 1.
  EXPECT_EQ(gate->Admissible(0), 8);
  auto admitted = gate->Admit(10, 0, milliseconds(0));
  ASSERT_TRUE(admitted.ok());
  EXPECT_EQ(*admitted, 8);
  SLUICE_EXPECT_ERROR(gate->Admit(1, 0, milliseconds(0)), kTimeout, "trainer at version 0, 8 prompts pending");
  EXPECT_EQ(gate->Admissible(1), 4) << "a fresher rollout may run further ahead";
  // The trainer finishes a step on 4 prompts: version 1, 4 pending.
  SLUICE_ASSERT_OK(gate->CompleteStep(1, 4));
  EXPECT_EQ(gate->Admissible(0), 0) << "1 + floor(4/4) - 0 = 2 > 1";
  EXPECT_EQ(gate->Admissible(1), 4);
  SLUICE_ASSERT_OK(gate->Retire(1));  // one prompt dropped
  EXPECT_EQ(gate->Admissible(0), 1);
  auto stats = gate->stats();
  EXPECT_EQ(stats.trainer_version, 1);
  EXPECT_EQ(stats.pending, 3);
  EXPECT_EQ(stats.admitted, 8);
  EXPECT_EQ(stats.retired, 5);
}

TEST(StalenessAdmissionTest, ZeroStalenessIsOnPolicy) {
  auto gate = Make(0, 2, 5);
  EXPECT_EQ(gate->Admissible(4), 0) << "a rollout behind the trainer is never admitted";
  EXPECT_EQ(gate->Admissible(5), 2) << "exactly one step's worth";
}

TEST(StalenessAdmissionTest, BlocksUntilTheTrainerAdvances) {
  auto gate = Make(0, 2);
  ASSERT_EQ(*gate->Admit(2, 0, milliseconds(0)), 2);
  Result<int64_t> blocked = Status::Internal("not run");
  std::thread rollout([&] { blocked = gate->Admit(5, 0, milliseconds(5000)); });
  while (gate->stats().waiters == 0) std::this_thread::yield();
  SLUICE_ASSERT_OK(gate->CompleteStep(1, 2));  // the rollout at version 0 is now too stale...
  std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(gate->stats().waiters, 1);
  SLUICE_ASSERT_OK(gate->ReportTrainerVersion(1));  // ...and stays blocked (nothing for v0 any more)
  gate->Close();
  rollout.join();
  EXPECT_EQ(blocked.status().code(), StatusCode::kAborted);
  SLUICE_EXPECT_ERROR(gate->Admit(1, 1, milliseconds(0)), kAborted, "closed");

  auto gate2 = Make(1, 2);
  ASSERT_EQ(*gate2->Admit(4, 0, milliseconds(0)), 4);
  std::thread rollout2([&] { blocked = gate2->Admit(5, 0, milliseconds(5000)); });
  while (gate2->stats().waiters == 0) std::this_thread::yield();
  SLUICE_ASSERT_OK(gate2->Retire(1));
  rollout2.join();
  ASSERT_TRUE(blocked.ok()) << blocked.status().ToString();
  EXPECT_EQ(*blocked, 1);
}

TEST(StalenessAdmissionTest, RejectsBadInput) {
  SLUICE_EXPECT_ERROR(StalenessAdmission::Create({-1, 1, 0}), kInvalidArgument, "max_staleness");
  SLUICE_EXPECT_ERROR(StalenessAdmission::Create({1, 0, 0}), kInvalidArgument, "prompts_per_version");
  SLUICE_EXPECT_ERROR(StalenessAdmission::Create({1, 1, -1}), kInvalidArgument, "initial_trainer_version");
  auto gate = Make(1, 1, 3);
  SLUICE_EXPECT_ERROR(gate->Admit(0, 3, milliseconds(0)), kInvalidArgument, "n must be > 0");
  SLUICE_EXPECT_ERROR(gate->Admit(1, -1, milliseconds(0)), kInvalidArgument, "rollout_version");
  SLUICE_EXPECT_ERROR(gate->Admit(1, 3, milliseconds(-5)), kInvalidArgument, "timeout is negative");
  SLUICE_EXPECT_ERROR(gate->ReportTrainerVersion(2), kFailedPrecondition, "cannot go backwards: 2 reported after 3");
  SLUICE_EXPECT_ERROR(gate->Retire(1), kFailedPrecondition, "only 0 are pending");
  SLUICE_EXPECT_ERROR(gate->Retire(0), kInvalidArgument, "n must be > 0");
  SLUICE_EXPECT_ERROR(gate->CompleteStep(4, 1), kFailedPrecondition, "only 0 are pending");
  EXPECT_EQ(gate->stats().trainer_version, 3) << "a refused step changes nothing";
  SLUICE_EXPECT_OK(gate->ReportTrainerVersion(3));
  // Huge versions do not overflow.
  EXPECT_EQ(gate->Admissible(std::numeric_limits<int64_t>::max()), std::numeric_limits<int64_t>::max() - 1);
}

// The documented guarantee, checked on random schedules: the trainer consumes
// prompts in admission order, ppv per version, some prompts are dropped
// anywhere in the queue; every trained prompt is at most max_staleness
// versions older than the trainer that trains it.
TEST(StalenessAdmissionTest, TrainedStalenessNeverExceedsTheBound) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const int64_t max_staleness = seed % 3;
    const int64_t ppv = 1 + seed % 4;
    auto gate = Make(max_staleness, ppv);
    std::deque<PolicyVersion> queue;  // rollout version of each pending prompt, admission order
    int64_t trained = 0;
    for (uint64_t step = 0; step < 2000; ++step) {
      const uint64_t r = SplitMix64(HashCombine(seed, step));
      const PolicyVersion tv = gate->stats().trainer_version;
      if (r % 3 == 0 && queue.size() >= size_t(ppv)) {
        for (int64_t i = 0; i < ppv; ++i) {
          ASSERT_LE(tv - queue.front(), max_staleness) << "seed " << seed << " step " << step;
          queue.pop_front();
          ++trained;
        }
        SLUICE_ASSERT_OK(gate->CompleteStep(tv + 1, ppv));
      } else if (r % 7 == 1 && !queue.empty()) {
        queue.erase(queue.begin() + (r >> 8) % queue.size());  // dropped
        SLUICE_ASSERT_OK(gate->Retire(1));
      } else {
        // A rollout whose weights lag the trainer by 0..max_staleness+1.
        const PolicyVersion vr = std::max<PolicyVersion>(0, tv - int64_t((r >> 16) % (max_staleness + 2)));
        const int64_t want = 1 + (r >> 24) % 5;
        const int64_t expect = std::min(want, gate->Admissible(vr));
        if (expect == 0) continue;  // Admit would time out (tested above)
        auto admitted = gate->Admit(want, vr, milliseconds(0));
        ASSERT_TRUE(admitted.ok()) << admitted.status().ToString();
        ASSERT_EQ(*admitted, expect);
        for (int64_t i = 0; i < *admitted; ++i) queue.push_back(vr);
      }
    }
    EXPECT_GT(trained, 100) << "seed " << seed;
  }
}

}  // namespace
}  // namespace sluice::schedule
