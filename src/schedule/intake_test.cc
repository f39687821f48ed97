#include "sluice/schedule/intake.h"

#include <gtest/gtest.h>

namespace sluice::schedule {
namespace {

IntakeOptions Options(int64_t staleness) {
  IntakeOptions o;
  o.prompts_per_step = 4;
  o.group_size = 2;
  o.max_staleness = staleness;
  o.steps = 10;
  return o;
}

std::function<Result<TrainerProgress>()> Progress(const TrainerProgress& p) {
  return [p]() -> Result<TrainerProgress> { return p; };
}

TEST(PromptIntakeTest, TakesAboutABatchBeyondTheSlotsWithinTheStaleness) {
  auto intake = PromptIntake::Create(Options(1));
  ASSERT_TRUE(intake.ok());
  // 8 slots, nothing queued: room for 2 x 8 / G = 8 prompts; staleness 1
  // admits 2 steps' worth (8) at version 0.
  TrainerProgress p;
  auto n = (*intake)->Take(8, 0, 0, Progress(p));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 8);
  // Full admission: nothing more until the trainer advances.
  EXPECT_EQ(*(*intake)->Take(8, 0, 0, Progress(p)), 0);
  // The trainer trained a step (4 prompts) and published version 1;
  // an engine still at version 0 gets nothing, one at version 1 gets 4.
  p.trained_steps = 1;
  p.latest_version = 1;
  EXPECT_EQ(*(*intake)->Take(8, 0, 0, Progress(p)), 0);
  EXPECT_EQ(*(*intake)->Take(8, 0, 1, Progress(p)), 4);
  EXPECT_EQ((*intake)->cursor(), 12);
}

TEST(PromptIntakeTest, AWaitingTrainersPromptsComeFirst) {
  auto intake = PromptIntake::Create(Options(4));
  ASSERT_TRUE(intake.ok());
  TrainerProgress p;
  p.waiting = true;
  // Room for 8, but the trainer waits for step 1's 4 prompts: only those.
  EXPECT_EQ(*(*intake)->Take(8, 0, 0, Progress(p)), 4);
  EXPECT_EQ(*(*intake)->Take(8, 0, 0, Progress(p)), 0);
  p.waiting = false;
  EXPECT_EQ(*(*intake)->Take(8, 8, 0, Progress(p)), 4);
}

TEST(PromptIntakeTest, DataParallelEnginesShareAStepsPrompts) {
  // Sync hands a step's 4 prompts x 2 answers out at once. One engine of
  // two with 4 slots takes what fills its slots (2 prompts), leaving the
  // rest to the other; a lone engine would take all 4 (twice its slots).
  IntakeOptions o = Options(0);
  o.engines = 2;
  auto shared = PromptIntake::Create(o);
  ASSERT_TRUE(shared.ok());
  TrainerProgress p;
  p.waiting = true;
  EXPECT_EQ(*(*shared)->Take(4, 0, 0, Progress(p)), 2);
  EXPECT_EQ(*(*shared)->Take(4, 0, 0, Progress(p)), 2);
  EXPECT_EQ(*(*shared)->Take(4, 0, 0, Progress(p)), 0);
  auto alone = PromptIntake::Create(Options(0));
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(*(*alone)->Take(4, 0, 0, Progress(p)), 4);
}

TEST(PromptIntakeTest, ManyEnginesOfManySlotsEachTakeTheirShare) {
  // A step's 4 prompts x 2 answers among 4 engines of 64 slots: an engine's
  // own slots would hold the whole step, but each takes its share (one
  // prompt), so all four decode at once; with its share queued it may take
  // another share later (here, none is left).
  IntakeOptions o = Options(0);
  o.engines = 4;
  auto intake = PromptIntake::Create(o);
  ASSERT_TRUE(intake.ok());
  TrainerProgress p;
  p.waiting = true;
  for (int e = 0; e < 4; ++e) EXPECT_EQ(*(*intake)->Take(64, 0, 0, Progress(p)), 1) << "engine " << e;
  EXPECT_EQ(*(*intake)->Take(64, 2, 0, Progress(p)), 0);
}

// Two replicas, each with its own intake, share one stream: the cursor is
// the stream's (taken_prompts), so together they admit what one intake
// would, and a replica handed prompts past its admission (the other took
// the ones it counted on) may start only those below StartLimit.
TEST(PromptIntakeTest, ReplicasShareTheStreamsCursor) {
  IntakeOptions o = Options(1);  // P = 4, G = 2: staleness 1 admits 8 prompts at version 0
  o.replicas = 2;
  auto a = PromptIntake::Create(o);
  auto b = PromptIntake::Create(o);
  ASSERT_TRUE(a.ok() && b.ok());
  TrainerProgress p;
  // Each takes its share of a step (P / 2 replicas = 2) per call.
  EXPECT_EQ(*(*a)->Take(64, 0, 0, Progress(p)), 2);
  p.taken_prompts = 2;
  EXPECT_EQ(*(*b)->Take(64, 0, 0, Progress(p)), 2);
  p.taken_prompts = 6;  // a took 2 more meanwhile
  EXPECT_EQ(*(*b)->Take(64, 0, 0, Progress(p)), 2) << "prompts 6 and 7, the last admissible";
  p.taken_prompts = 8;
  EXPECT_EQ(*(*a)->Take(64, 0, 0, Progress(p)), 0) << "together they hold the staleness window";
  EXPECT_EQ(*(*b)->Take(64, 0, 0, Progress(p)), 0);
  EXPECT_EQ(*(*a)->StartLimit(0, Progress(p)), 8);
  // The trainer trained step 1 and published version 1: an engine at version
  // 1 may start up to prompt 11, one still at 0 only up to 7.
  p.trained_steps = 1;
  p.latest_version = 1;
  EXPECT_EQ(*(*a)->StartLimit(1, Progress(p)), 12);
  EXPECT_EQ(*(*a)->StartLimit(0, Progress(p)), 8);
  EXPECT_EQ(*(*a)->Take(64, 0, 1, Progress(p)), 2);
  // A dead replica's prompt comes back to the stream (taken drops): the
  // survivors take it although the cursor they last saw was higher.
  p.taken_prompts = 9;
  EXPECT_EQ(*(*b)->Take(64, 0, 1, Progress(p)), 2);
  EXPECT_EQ((*b)->cursor(), 11);
  // At the end of the run nothing is left to take.
  p.taken_prompts = 40;
  p.trained_steps = 8;
  p.latest_version = 9;
  EXPECT_EQ(*(*a)->Take(64, 0, 9, Progress(p)), 0);
}

TEST(PromptIntakeTest, EndsAtTheLastStepAndRefusesBadOptions) {
  IntakeOptions o = Options(100);
  o.steps = 1;
  auto intake = PromptIntake::Create(o);
  ASSERT_TRUE(intake.ok());
  EXPECT_EQ(*(*intake)->Take(64, 0, 0, Progress({})), 4);
  EXPECT_EQ(*(*intake)->Take(64, 0, 0, Progress({})), 0);
  // The progress callback's error comes back.
  IntakeOptions two = Options(1);
  auto failing = PromptIntake::Create(two);
  ASSERT_TRUE(failing.ok());
  auto r = (*failing)->Take(8, 0, 0, []() -> Result<TrainerProgress> { return Status::Unavailable("hub down"); });
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);

  for (auto mutate : std::vector<std::function<void(IntakeOptions&)>>{
           [](IntakeOptions& x) { x.prompts_per_step = 0; }, [](IntakeOptions& x) { x.group_size = 0; },
           [](IntakeOptions& x) { x.sync_interval = 0; }, [](IntakeOptions& x) { x.max_staleness = -1; },
           [](IntakeOptions& x) { x.start_step = 11; }, [](IntakeOptions& x) { x.engines = 0; },
           [](IntakeOptions& x) { x.replicas = 0; }}) {
    IntakeOptions bad = Options(1);
    mutate(bad);
    EXPECT_EQ(PromptIntake::Create(bad).status().code(), StatusCode::kInvalidArgument);
  }
}

// The trained prompts from the newest version: a version follows the update
// of every sync_interval-th step and of the last (prompt order). Mutations:
// start / si dropped (a resumed run's first version counts from step 0), or
// no clamp to the run's steps (the last, partial interval's version claims
// prompts past the end): both fail.
TEST(PromptIntakeTest, TrainedEndFollowsThePublishedVersions) {
  IntakeOptions o = Options(1);
  o.prompts_per_step = 3;
  o.steps = 9;
  o.sync_interval = 2;
  auto fresh = PromptIntake::Create(o);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->TrainedEnd(0), 0);
  EXPECT_EQ((*fresh)->TrainedEnd(1), 2 * 3);  // after step 2
  EXPECT_EQ((*fresh)->TrainedEnd(4), 8 * 3);
  EXPECT_EQ((*fresh)->TrainedEnd(5), 9 * 3);  // the last step's (9 % 2 != 0)
  EXPECT_EQ((*fresh)->TrainedEnd(99), 9 * 3);
  EXPECT_EQ((*fresh)->TrainedEnd(-1), 0);
  // Resumed after step 3 at version 7: the next version follows step 4.
  o.start_step = 3;
  o.version = 7;
  auto resumed = PromptIntake::Create(o);
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ((*resumed)->TrainedEnd(7), 3 * 3);
  EXPECT_EQ((*resumed)->TrainedEnd(8), 4 * 3);
  EXPECT_EQ((*resumed)->TrainedEnd(9), 6 * 3);
  EXPECT_EQ((*resumed)->TrainedEnd(10), 8 * 3);
  EXPECT_EQ((*resumed)->TrainedEnd(11), 9 * 3);
}

}  // namespace
}  // namespace sluice::schedule
