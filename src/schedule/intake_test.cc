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
  // The trainer acked a step (4 prompts x 2 answers) and published version 1;
  // an engine still at version 0 gets nothing, one at version 1 gets 4.
  p.acked_answers = 8;
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
           [](IntakeOptions& x) { x.start_step = 11; }, [](IntakeOptions& x) { x.engines = 0; }}) {
    IntakeOptions bad = Options(1);
    mutate(bad);
    EXPECT_EQ(PromptIntake::Create(bad).status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace sluice::schedule
