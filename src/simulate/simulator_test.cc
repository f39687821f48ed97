#include "sluice/simulate/simulator.h"

#include <gtest/gtest.h>

#include <cmath>

namespace sluice::simulate {
namespace {

Workload Uniform(int64_t steps, int64_t P, int64_t G, int32_t length) {
  Workload w;
  w.steps = steps;
  w.prompts_per_step = P;
  w.group_size = G;
  w.prompt_tokens = {8};
  w.response_tokens.assign(static_cast<size_t>(steps * P * G), length);
  return w;
}

// Decode steps cost 10 ms whatever their rows, a trainer step 0.5 s; nothing
// else costs anything.
CostProfile Simple() {
  CostProfile c;
  c.model = "test";
  c.decode_step_s = 0.010;
  c.train_step_s = 0.5;
  return c;
}

TEST(SimulatorTest, SyncAlternatesGenerationAndTraining) {
  // 4 steps; every answer 21 tokens: the first from the prefill (free here),
  // 20 decode steps of 10 ms = 0.2 s, then 0.5 s of training; an idle engine
  // looks for work every 2 ms, so each step may start up to 2 ms late.
  Layout l;
  l.mode = Mode::kSync;
  auto r = Simulate(Uniform(4, 2, 4, 21), l, Simple());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GE(r->wall_s, 4 * 0.7 - 1e-9);
  EXPECT_LE(r->wall_s, 4 * 0.7 + 4 * 0.0021);
  EXPECT_EQ(r->decode_steps, 4 * 20);
  EXPECT_EQ(r->generated_tokens, 4 * 2 * 4 * 21);
  EXPECT_DOUBLE_EQ(r->staleness_mean, 0.0);
  ASSERT_EQ(r->steps.size(), 4u);
  for (const StepTiming& s : r->steps) EXPECT_EQ(s.staleness_max, 0);
  EXPECT_NEAR(r->trainer_wait_s, 4 * 0.2, 4 * 0.0021);
}

TEST(SimulatorTest, SyncWaitsForEachVersionsStandbyCopy) {
  // The rollout can switch to a version only once its standby copy is
  // filled: in sync, every step after the first starts that much later.
  Layout l;
  l.mode = Mode::kSync;
  CostProfile c = Simple();
  auto quick = Simulate(Uniform(4, 2, 4, 21), l, c);
  c.weight_fill_s = 0.1;
  auto filled = Simulate(Uniform(4, 2, 4, 21), l, c);
  ASSERT_TRUE(quick.ok() && filled.ok());
  EXPECT_NEAR(filled->wall_s - quick->wall_s, 3 * 0.1, 3 * 0.0021);
}

TEST(SimulatorTest, AsyncOverlapsGenerationWithTraining) {
  // Generation 0.2 s per step's prompts, training 0.5 s: once the pipeline
  // fills, the trainer never waits, so the wall is about the first step's
  // generation plus every step's training.
  Layout l;
  l.mode = Mode::kAsync;
  l.max_staleness = 2;
  auto r = Simulate(Uniform(8, 2, 4, 21), l, Simple());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->wall_s, 0.2 + 8 * 0.5, 0.01);
  Layout s = l;
  s.mode = Mode::kSync;
  auto sync = Simulate(Uniform(8, 2, 4, 21), s, Simple());
  ASSERT_TRUE(sync.ok());
  EXPECT_GT(sync->wall_s / r->wall_s, 1.3);
  // The staleness bound holds for every answer, and it is used.
  int64_t most = 0;
  for (const StepTiming& st : r->steps) most = std::max(most, st.staleness_max);
  EXPECT_LE(most, 2);
  EXPECT_GE(most, 1);
}

TEST(SimulatorTest, OneStepOffKeepsStalenessAtOne) {
  Layout l;
  l.mode = Mode::kOneStepOff;
  auto r = Simulate(Uniform(6, 2, 4, 21), l, Simple());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const StepTiming& st : r->steps) EXPECT_LE(st.staleness_max, 1);
  EXPECT_GT(r->staleness_mean, 0.5);
}

TEST(SimulatorTest, ContinuousBatchingOnlyPaysForRowsDecoding) {
  // Per-row cost only: one long answer among short ones costs its own
  // decode steps, not the whole batch's.
  CostProfile c;
  c.model = "test";
  c.decode_row_s = 0.001;
  Workload w = Uniform(1, 1, 8, 11);
  w.response_tokens[0] = 101;
  Layout l;
  l.mode = Mode::kSync;
  auto r = Simulate(w, l, c);
  ASSERT_TRUE(r.ok());
  // 7 answers x 10 decoded tokens + 100 for the long one, 1 ms per row-step.
  EXPECT_NEAR(r->wall_s, 0.001 * (7 * 10 + 100), 1e-9);
  EXPECT_EQ(r->decode_steps, 100);
  EXPECT_LT(r->occupancy, 0.2);
}

// Of the trainer's work only micro-batches, `seconds` each; a layout of
// `mode` with a worker lent by the rollout and micro-batches of 64 tokens.
CostProfile MicroBatchesOnly(double seconds) {
  CostProfile c = Simple();
  c.train_step_s = 0;
  c.train_micro_batch_s = seconds;
  return c;
}
Layout OneLentWorker(Mode mode) {
  Layout l;
  l.mode = mode;
  l.micro_batch_tokens = 64;
  l.lent_workers = 1;
  return l;
}

TEST(SimulatorTest, LentWorkersTrainOnlyWhileTheRolloutIdles) {
  // Micro-batch cost only; with every prompt generated the rollout idles
  // and the lent worker takes micro-batches.
  const CostProfile c = MicroBatchesOnly(0.1);
  Layout l = OneLentWorker(Mode::kAsync);
  l.max_staleness = 4;
  auto lent = Simulate(Uniform(4, 2, 4, 21), l, c);
  ASSERT_TRUE(lent.ok()) << lent.status().ToString();
  l.lent_workers = 0;
  auto alone = Simulate(Uniform(4, 2, 4, 21), l, c);
  ASSERT_TRUE(alone.ok());
  EXPECT_GT(lent->lent_micro_batches, 0);
  EXPECT_EQ(alone->lent_micro_batches, 0);
  EXPECT_LT(lent->wall_s, alone->wall_s);
}

TEST(SimulatorTest, ThePassBeforeTheUpdateIsAPhaseOfItsOwn) {
  // One-step-off: the rollout generates the next step (0.2 s) while the
  // trainer trains, so the lent worker joins 0.2 s into each step. With the
  // micro-batches' cost in one phase it can take only what is left then;
  // with half of it in a pass before the update (as RlStep recomputes the
  // proximal log-probabilities), it joins the second phase from its start
  // and the step ends sooner. The work is the same; with no lent worker
  // the split changes nothing.
  CostProfile c = MicroBatchesOnly(0.3);
  Layout l = OneLentWorker(Mode::kOneStepOff);
  const Workload w = Uniform(4, 2, 4, 21);
  auto lumped = Simulate(w, l, c);
  c.train_proximal_share = 0.5;
  auto phased = Simulate(w, l, c);
  ASSERT_TRUE(lumped.ok() && phased.ok());
  EXPECT_NEAR(phased->trainer_compute_s, lumped->trainer_compute_s, 1e-9);
  EXPECT_LT(phased->wall_s, lumped->wall_s - 0.1);
  EXPECT_GT(phased->lent_micro_batches, lumped->lent_micro_batches);

  l.lent_workers = 0;
  auto alone_phased = Simulate(w, l, c);
  c.train_proximal_share = 0;
  auto alone_lumped = Simulate(w, l, c);
  ASSERT_TRUE(alone_phased.ok() && alone_lumped.ok());
  EXPECT_NEAR(alone_phased->wall_s, alone_lumped->wall_s, 1e-9);
}

TEST(SimulatorTest, SharedCoresSlowWorkThatOverlaps) {
  // Async overlaps 0.2 s of generation per step with 0.5 s of training.
  // Two threads on two cores that each run half as fast while both work:
  // the overlapped parts take twice as long.
  Layout l;
  l.mode = Mode::kAsync;
  l.max_staleness = 2;
  CostProfile own = Simple();
  auto alone = Simulate(Uniform(8, 2, 4, 21), l, own);
  CostProfile shared = Simple();
  shared.cores = 2;
  shared.rollout_slowdown = 2.0;
  shared.trainer_slowdown = 2.0;
  auto slowed = Simulate(Uniform(8, 2, 4, 21), l, shared);
  ASSERT_TRUE(alone.ok() && slowed.ok());
  // All generation but the first step's overlaps training; each second of
  // it now takes two (and so does as much training): the wall grows by the
  // overlapped generation time.
  const double overlapped = alone->rollout_busy_s - 0.2;
  EXPECT_GT(overlapped, 0.5);
  EXPECT_NEAR(slowed->wall_s - alone->wall_s, overlapped, 0.02);
  // The work itself is unchanged.
  EXPECT_NEAR(slowed->trainer_compute_s, alone->trainer_compute_s, 1e-9);
  // No sharing declared (cores 0): no slowdown whatever the factor.
  CostProfile own_hardware = shared;
  own_hardware.cores = 0;
  auto separate = Simulate(Uniform(8, 2, 4, 21), l, own_hardware);
  ASSERT_TRUE(separate.ok());
  EXPECT_DOUBLE_EQ(separate->wall_s, alone->wall_s);
  using W = CostProfile::Work;
  EXPECT_DOUBLE_EQ(shared.Slowdown(W::kRollout, 1), 1.0);
  EXPECT_DOUBLE_EQ(shared.Slowdown(W::kTrainer, 2), 2.0);
  EXPECT_DOUBLE_EQ(shared.Slowdown(W::kRollout, 4), 4.0);  // time-shared beyond the cores
  // Only the trainer slowed: the wall grows by less.
  CostProfile trainer_only = shared;
  trainer_only.rollout_slowdown = 1.0;
  auto partly = Simulate(Uniform(8, 2, 4, 21), l, trainer_only);
  ASSERT_TRUE(partly.ok());
  EXPECT_GT(partly->wall_s, alone->wall_s + 0.1);
  EXPECT_LT(partly->wall_s, slowed->wall_s - 0.1);
}

TEST(SimulatorTest, KvCapacityPreemptsAndComputesAgain) {
  // One engine, 4 answers of 21 tokens sharing a prompt of 8. Unlimited,
  // every answer decodes 20 steps as a row (its first token comes with the
  // prefill). With 50 tokens of cache, the rows' growth preempts the newest
  // at 10 tokens (8 + 4 x 10 + 4 > 50) and the next at 14 (8 + 3 x 14 + 3 >
  // 50); the first to come back heads the queue and does not fit until the
  // other two finish, which also drops the prompt from the cache: then both
  // return, with the prompt and their 10 + 14 tokens prefilled again, and
  // each decodes one step fewer as a row (its next token comes with the
  // prefill).
  CostProfile c;
  c.model = "test";
  c.decode_row_s = 0.001;
  c.prefill_token_s = 0.0001;
  Workload w = Uniform(1, 1, 4, 21);
  Layout l;
  l.mode = Mode::kSync;
  auto unlimited = Simulate(w, l, c);
  l.kv_capacity_tokens = 50;
  auto tight = Simulate(w, l, c);
  ASSERT_TRUE(unlimited.ok() && tight.ok()) << tight.status().ToString();
  EXPECT_EQ(unlimited->preemptions, 0);
  EXPECT_NEAR(unlimited->rollout_compute_s, 4 * 20 * 0.001 + 8 * 0.0001, 1e-12);
  EXPECT_EQ(tight->preemptions, 2);
  EXPECT_EQ(tight->generated_tokens, 4 * 21);
  EXPECT_NEAR(tight->rollout_compute_s, (4 * 20 - 2) * 0.001 + (8 + 8 + 10 + 14) * 0.0001, 1e-12);
  // An answer that cannot fit the cache at all is refused, not looped on.
  l.kv_capacity_tokens = 20;
  auto r = Simulate(w, l, c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("kv_capacity_tokens"), std::string::npos);
}

TEST(SimulatorTest, InterruptingSwitchesComputeTheCacheAgain) {
  // Async with long answers: versions arrive while answers decode. Decoding
  // on over the old cache costs nothing more; interrupting computes every
  // running row's cache again at each switch.
  CostProfile c = Simple();
  c.prefill_token_s = 0.0005;
  Layout l;
  l.mode = Mode::kAsync;
  l.max_staleness = 2;
  Workload w = Uniform(6, 2, 4, 81);
  auto keep = Simulate(w, l, c);
  l.recompute_on_switch = true;
  auto again = Simulate(w, l, c);
  ASSERT_TRUE(keep.ok() && again.ok());
  EXPECT_EQ(keep->recomputed_tokens, 0);
  EXPECT_GT(again->recomputed_tokens, 0);
  EXPECT_GT(again->rollout_compute_s, keep->rollout_compute_s);
  EXPECT_GT(again->wall_s, keep->wall_s);
}

TEST(SimulatorTest, CompletionOrderTrainsWhatFinishedFirst) {
  // The first prompt's answer is long: the trainer that takes prompts in
  // order waits for it; one that takes whatever completed does not.
  Workload w = Uniform(2, 2, 1, 3);
  w.response_tokens[0] = 200;
  Layout l;
  l.mode = Mode::kAsync;
  l.max_staleness = 2;
  auto ordered = Simulate(w, l, Simple());
  l.completion_order = true;
  auto first_done = Simulate(w, l, Simple());
  ASSERT_TRUE(ordered.ok() && first_done.ok());
  EXPECT_GT(ordered->steps[0].start_s, 199 * 0.010);
  EXPECT_LT(first_done->steps[0].start_s, 10 * 0.010);
}

TEST(SimulatorTest, MiniBatchesWaitForTheirSlowestWorker) {
  // Training only: samples of 101, 2, 2, 101 tokens on two workers at 1 ms a
  // token, packed end to end. One update: the two long ones run side by
  // side (~0.103 s). Two updates over consecutive halves (101 + 2, 2 + 101):
  // each half waits for its long sample (~0.202 s), and pays its update.
  CostProfile c;
  c.model = "test";
  c.train_token_s = 0.001;
  c.train_update_s = 0.05;
  Workload w = Uniform(1, 4, 1, 1);
  w.prompt_tokens = {1};
  w.response_tokens = {100, 1, 1, 100};
  Layout l;
  l.mode = Mode::kSync;
  l.trainer_workers = 2;
  l.micro_batch_tokens = 128;
  l.unpadded_micro_batches = true;
  auto one = Simulate(w, l, c);
  l.mini_batches = 2;
  auto two = Simulate(w, l, c);
  ASSERT_TRUE(one.ok() && two.ok());
  auto train = [](const SimResult& r) { return r.steps[0].end_s - r.steps[0].start_s; };
  EXPECT_NEAR(train(*one), 0.101 + 0.002 + 0.05, 0.0021);
  EXPECT_NEAR(train(*two), 2 * (0.101 + 0.05), 0.0021);
  EXPECT_NEAR(one->trainer_compute_s, 0.206 + 0.05, 1e-9);
  EXPECT_NEAR(two->trainer_compute_s, 0.206 + 0.1, 1e-9);
}

TEST(SimulatorTest, SeveralDecodeStepsPerEventChangeLittle) {
  // A GPU-like roofline profile (cores of their own), long-tail lengths, two
  // engines: taking up to 32 decode steps per event moves the wall time by
  // well under a percent, in every mode.
  CostProfile c;
  c.model = "test";
  c.decode_step_s = 0.002;
  c.memory_step_s = 0.005;
  c.memory_context_s = 2e-8;
  c.compute_row_s = 3e-5;
  c.compute_context_s = 1e-9;
  c.prefill_token_s = 2e-5;
  c.train_token_s = 2e-5;
  c.publish_s = 0.5;
  Workload w = Uniform(6, 8, 4, 1);
  for (size_t i = 0; i < w.response_tokens.size(); ++i) {
    w.response_tokens[i] = 50 + static_cast<int32_t>((i * 7919) % 997) * static_cast<int32_t>(i % 5 == 0 ? 4 : 1);
  }
  for (Mode mode : {Mode::kSync, Mode::kOneStepOff, Mode::kAsync}) {
    Layout l;
    l.mode = mode;
    l.rollout_engines = 2;
    l.rollout_slots = 32;
    l.kv_capacity_tokens = 20000;
    l.unpadded_micro_batches = true;
    auto exact = Simulate(w, l, c);
    l.max_steps_per_event = 32;
    auto fast = Simulate(w, l, c);
    ASSERT_TRUE(exact.ok() && fast.ok()) << exact.status().ToString();
    EXPECT_NEAR(fast->wall_s / exact->wall_s, 1.0, 0.005) << static_cast<int>(mode);
    EXPECT_EQ(fast->generated_tokens, exact->generated_tokens);
  }
}

TEST(SimulatorTest, DeterministicForTheSameInputs) {
  Workload w = Uniform(5, 3, 4, 9);
  for (size_t i = 0; i < w.response_tokens.size(); ++i) w.response_tokens[i] = 1 + static_cast<int32_t>(i * 7 % 40);
  Layout l;
  l.rollout_engines = 2;
  l.rollout_slots = 5;
  CostProfile c = Simple();
  c.decode_context_s = 1e-5;
  c.prefill_token_s = 1e-4;
  c.weight_switch_s = 0.003;
  c.publish_s = 0.01;
  c.reward_answer_s = 0.001;
  auto a = Simulate(w, l, c);
  auto b = Simulate(w, l, c);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->wall_s, b->wall_s);
  EXPECT_EQ(a->decode_steps, b->decode_steps);
  EXPECT_EQ(
      a->generated_tokens, 5 * 3 * 4 * 0 + [&] {
        int64_t n = 0;
        for (int32_t t : w.response_tokens) n += t;
        return n;
      }());
}

TEST(SimulatorTest, RefusesBadInputNamingIt) {
  Layout l;
  Workload w = Uniform(2, 2, 2, 4);
  w.response_tokens.pop_back();
  auto r = Simulate(w, l, Simple());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("response_tokens"), std::string::npos);

  w = Uniform(2, 2, 2, 4);
  w.response_tokens[3] = 0;
  EXPECT_NE(Simulate(w, l, Simple()).status().message().find("answer of 0 tokens"), std::string::npos);

  w = Uniform(2, 2, 2, 100);
  l.micro_batch_tokens = 64;
  EXPECT_NE(Simulate(w, l, Simple()).status().message().find("micro_batch_tokens"), std::string::npos);

  Layout sync;
  sync.mode = Mode::kSync;
  sync.lent_workers = 1;
  EXPECT_NE(Simulate(Uniform(1, 1, 1, 4), sync, Simple()).status().message().find("lends no workers"),
            std::string::npos);

  Layout few;
  few.rollout_engines = 4;
  few.rollout_slots = 2;
  EXPECT_NE(Simulate(Uniform(1, 1, 1, 4), few, Simple()).status().message().find("rollout_slots"), std::string::npos);

  CostProfile c = Simple();
  c.decode_row_s = -1;
  EXPECT_NE(Simulate(Uniform(1, 1, 1, 4), Layout{}, c).status().message().find("rollout.decode_row_s"),
            std::string::npos);
  c = Simple();
  c.train_step_s = std::nan("");
  EXPECT_FALSE(Simulate(Uniform(1, 1, 1, 4), Layout{}, c).ok());

  for (auto mutate : {+[](Layout& x) { x.kv_capacity_tokens = -1; }, +[](Layout& x) { x.mini_batches = 0; },
                      +[](Layout& x) { x.max_steps_per_event = 0; }}) {
    Layout bad;
    mutate(bad);
    EXPECT_EQ(Simulate(Uniform(1, 1, 1, 4), bad, Simple()).status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace sluice::simulate
