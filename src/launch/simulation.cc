#include "sluice/launch/simulation.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/checkpoint_engine/weights.h"
#include "sluice/model/transformer.h"
#include "sluice/model/weights.h"
#include "sluice/pipeline/options.h"
#include "sluice/reward/task.h"
#include "sluice/rollout/engine.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/schedule/packing.h"
#include "sluice/simulate/fit.h"
#include "sluice/simulate/lengths.h"
#include "sluice/trainer/losses.h"
#include "sluice/trainer/trainer.h"

namespace sluice::launch {

namespace {

namespace ce = checkpoint_engine;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Weighted by 1 / y^2: every measurement's relative error counts alike, so
// the small steps are fitted as well as the large ones.
std::vector<double> RelativeWeights(const std::vector<double>& y) {
  std::vector<double> w;
  for (double v : y) w.push_back(1.0 / std::max(v * v, 1e-18));
  return w;
}

struct Rollout {
  double step = 0, row = 0, context = 0, prompt = 0, token = 0;
};

// Rounds of every measurement, interleaved: a slow spell of a shared machine
// (its other load) falls on one round of a point, not all of them, and each
// point keeps its fastest round.
int Rounds(const CalibrationOptions& o) { return o.quick ? 1 : 3; }

// y[i] = min(y[i], round[i]): points measured in the same order every round.
void KeepFastest(std::vector<double>* y, const std::vector<double>& round) {
  if (y->empty()) {
    *y = round;
    return;
  }
  for (size_t i = 0; i < y->size() && i < round.size(); ++i) (*y)[i] = std::min((*y)[i], round[i]);
}

// One round of MeasureRollout's points: decode steps (dx, dy) and prefills
// (px, py), in the same order every round.
Status RolloutRound(const std::shared_ptr<model::Transformer>& m, const CalibrationOptions& o,
                    const std::vector<int64_t>& rows_set, const std::vector<int32_t>& prompts,
                    std::vector<std::vector<double>>* dx, std::vector<double>* dy, std::vector<std::vector<double>>* px,
                    std::vector<double>* py) {
  const int64_t context = std::min<int64_t>(o.max_context, m->config().max_position_embeddings);
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(m->config().vocab_size - 1));
  uint64_t id = 0;
  for (int64_t rows : rows_set) {
    for (int32_t prompt : prompts) {
      const int32_t length = static_cast<int32_t>(std::min<int64_t>(context - prompt, o.quick ? 24 : 160));
      if (length < 2) continue;
      rollout::EngineOptions eo;
      eo.num_slots = static_cast<int32_t>(rows);
      eo.max_seq_len = prompt + length;
      SLUICE_ASSIGN_OR_RETURN(auto engine, rollout::RolloutEngine::Create({m, 0}, eo));
      for (int64_t r = 0; r < rows; ++r) {
        rollout::GenerationRequest req;
        req.id = id++;
        for (int32_t i = 0; i < prompt; ++i) req.prompt.push_back(token(rng));
        req.sampling.seed = req.id;
        req.sampling.max_new_tokens = length;
        req.sampling.forced_length = length;
        SLUICE_RETURN_IF_ERROR(engine->Submit(std::move(req)));
      }
      auto t0 = Clock::now();
      SLUICE_RETURN_IF_ERROR(engine->Step().status());
      px->push_back({static_cast<double>(rows), static_cast<double>(rows * prompt)});
      py->push_back(Since(t0));
      // Decode steps in runs of 8 (a step's own timing is noisy), each
      // attending prompt + generated positions per row.
      int64_t generated = 1;
      while (!engine->idle()) {
        const int64_t n = std::min<int64_t>(8, length - generated);
        double attended = 0;
        t0 = Clock::now();
        for (int64_t k = 0; k < n; ++k, ++generated) {
          attended += static_cast<double>(rows * (prompt + generated));
          SLUICE_RETURN_IF_ERROR(engine->Step().status());
        }
        const double t = Since(t0);
        dx->push_back({1.0, static_cast<double>(rows), attended / static_cast<double>(n)});
        dy->push_back(t / static_cast<double>(n));
      }
    }
  }
  return Status::Ok();
}

// The engine's steps on batches of `rows` sequences with distinct prompts of
// `prompt` tokens: the first step prefills them (no decode rows), every later
// one decodes all rows with contexts growing by one token.
Result<Rollout> MeasureRollout(const std::shared_ptr<model::Transformer>& m, const CalibrationOptions& o) {
  const int64_t context = std::min<int64_t>(o.max_context, m->config().max_position_embeddings);
  std::vector<int64_t> rows_set = o.quick ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{1, 4, 16, 32, 64};
  for (auto& r : rows_set) r = std::min(r, o.max_rows);
  rows_set.erase(std::unique(rows_set.begin(), rows_set.end()), rows_set.end());
  const std::vector<int32_t> prompts = {8, static_cast<int32_t>(std::max<int64_t>(8, context / 4))};
  std::vector<std::vector<double>> dx, px;
  std::vector<double> dy, py;
  for (int round = 0; round < Rounds(o); ++round) {
    dx.clear(), px.clear();
    std::vector<double> round_dy, round_py;
    SLUICE_RETURN_IF_ERROR(RolloutRound(m, o, rows_set, prompts, &dx, &round_dy, &px, &round_py));
    KeepFastest(&dy, round_dy);
    KeepFastest(&py, round_py);
  }
  Rollout out;
  SLUICE_ASSIGN_OR_RETURN(auto d, simulate::FitNonNegative(dx, dy, RelativeWeights(dy)));
  SLUICE_ASSIGN_OR_RETURN(auto p, simulate::FitNonNegative(px, py, RelativeWeights(py)));
  out.step = d[0], out.row = d[1], out.context = d[2];
  out.prompt = p[0], out.token = p[1];
  return out;
}

struct Training {
  double step = 0, micro_batch = 0, token = 0, token_context = 0;
  double proximal_share = 0;  // of the micro-batches' time, the pass before the update
};

// A synthetic RL batch: one sample per response length, `prompt` tokens of
// prompt, random tokens from `rng`, groups of four with alternating rewards
// and their group-normalised advantages (what the trainer's cost depends
// on: the shapes; the values only need to be valid).
Result<std::vector<trainer::RolloutSample>> SyntheticBatch(const std::vector<int32_t>& lengths, int32_t prompt,
                                                           int64_t vocab, std::mt19937* rng) {
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<trainer::RolloutSample> samples;
  std::vector<double> rewards;
  std::vector<GroupId> groups;
  for (size_t i = 0; i < lengths.size(); ++i) {
    trainer::RolloutSample s;
    s.id = static_cast<uint64_t>(i);
    s.group_id = static_cast<GroupId>(i / 4);
    for (int32_t k = 0; k < prompt; ++k) s.prompt.push_back(token(*rng));
    for (int32_t k = 0; k < lengths[i]; ++k) s.response.push_back(token(*rng));
    s.behavior_logprobs.assign(static_cast<size_t>(lengths[i]), -5.0f);
    s.versions.assign(static_cast<size_t>(lengths[i]), 0);
    s.reward = static_cast<double>(i % 2);
    rewards.push_back(s.reward);
    groups.push_back(s.group_id);
    samples.push_back(std::move(s));
  }
  SLUICE_ASSIGN_OR_RETURN(auto adv, trainer::GroupAdvantages(rewards, groups, true));
  for (size_t i = 0; i < samples.size(); ++i) samples[i].advantage = adv[i];
  return samples;
}

// RL steps of the trainer on synthetic batches of several sizes and length
// mixes, one worker, fitted per micro-batch as the trainer packs them. Each
// batch is trained under two micro-batch budgets (the run's, and one a few
// times the longest sample), so the per-step and per-micro-batch parts are
// told apart.
Result<Training> MeasureTraining(const std::shared_ptr<model::Transformer>& m, const CalibrationOptions& o) {
  const int64_t context =
      std::min<int64_t>({o.max_context, m->config().max_position_embeddings, o.trainer.micro_batch_tokens});
  struct Batch {
    int n;
    int median;
    double tail;
    int32_t prompt = 16;
  };
  std::vector<Batch> batches = {{8, 16, 1}, {32, 16, 1}, {16, 64, 1}, {32, 24, 8}};
  // A step of a run packs up to its whole batch into one micro-batch: up to
  // 64 rows here.
  if (!o.quick) batches.push_back({8, 160, 1}), batches.push_back({16, 48, 4}), batches.push_back({64, 16, 1});
  // The run's own step, so its micro-batches are inside the fit, not
  // extrapolated from the batches above. The fit is per micro-batch, so a
  // step of more than 256 samples is measured on 256 of the same lengths.
  if (o.step.samples > 0) {
    constexpr int64_t kMostStepSamples = 256;
    const int32_t step_prompt =
        std::clamp<int32_t>(o.step.prompt_tokens, 1, static_cast<int32_t>(std::max<int64_t>(1, context - 1)));
    const int64_t n = std::min(o.step.samples, kMostStepSamples);
    batches.push_back({static_cast<int>(n), o.step.median, o.step.tail, step_prompt});
    std::fprintf(stderr,
                 "calibrate: the run's step is measured too: %lld samples%s, answers of median %d and longest %ld "
                 "tokens, prompts of %d\n",
                 static_cast<long long>(n), n < o.step.samples ? " (of the step's more)" : "", o.step.median,
                 std::lround(o.step.median * o.step.tail), step_prompt);
  }
  // The points: each batch under each budget.
  struct Point {
    std::shared_ptr<const std::vector<trainer::RolloutSample>> samples;
    int64_t budget = 0;
  };
  std::vector<Point> points;
  std::vector<std::vector<double>> x;
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  for (size_t b = 0; b < batches.size(); ++b) {
    const int32_t batch_prompt = batches[b].prompt;
    const auto fits = static_cast<int32_t>(std::max<int64_t>(2, context - batch_prompt));
    std::vector<int32_t> lengths =
        simulate::LongTailLengths(batches[b].n, std::min(batches[b].median, fits), batches[b].tail, o.seed + b);
    std::vector<int64_t> total;
    for (int32_t& len : lengths) len = std::min(len, fits), total.push_back(batch_prompt + len);
    SLUICE_ASSIGN_OR_RETURN(std::vector<trainer::RolloutSample> batch,
                            SyntheticBatch(lengths, batch_prompt, m->config().vocab_size, &rng));
    auto samples = std::make_shared<const std::vector<trainer::RolloutSample>>(std::move(batch));
    std::vector<size_t> order(samples->size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    const int64_t batch_longest = *std::max_element(total.begin(), total.end());
    for (int64_t budget : {o.trainer.micro_batch_tokens, std::min(o.trainer.micro_batch_tokens, 3 * batch_longest)}) {
      double padded = 0, padded_context = 0;
      const auto mbs = schedule::PackMicroBatches(total, order, budget, 1);
      for (const auto& mb : mbs) {
        const auto p = static_cast<double>(schedule::PaddedTokens(total, mb));
        padded += p;
        padded_context += p * p / static_cast<double>(mb.size());
      }
      x.push_back({1.0, static_cast<double>(mbs.size()), padded, padded_context});
      points.push_back({samples, budget});
    }
  }
  std::vector<double> y;
  double proximal = 0, trained = 0;  // seconds over every measurement
  for (int round = 0; round < Rounds(o); ++round) {
    std::vector<double> times;
    for (const Point& point : points) {
      trainer::TrainerOptions to = o.trainer;
      to.micro_batch_tokens = point.budget;
      to.micro_batch_threads = 1;
      to.may_run = nullptr;
      to.done_running = nullptr;
      auto policy = std::make_shared<model::Transformer>(m->config(), o.seed);
      std::shared_ptr<model::Transformer> reference;
      if (to.loss.kl_coef > 0) reference = std::make_shared<model::Transformer>(m->config(), o.seed);
      SLUICE_ASSIGN_OR_RETURN(auto trainer, trainer::Trainer::Create(policy, reference, to));
      // The faster of two: the first step of a trainer also allocates.
      double best = 1e300;
      for (int rep = 0; rep < 2; ++rep) {
        const auto t0 = Clock::now();
        SLUICE_ASSIGN_OR_RETURN(trainer::StepMetrics sm, trainer->RlStep(*point.samples));
        const double took = Since(t0);
        best = std::min(best, took);
        proximal += sm.proximal_s, trained += took;
      }
      times.push_back(best);
    }
    KeepFastest(&y, times);
  }
  SLUICE_ASSIGN_OR_RETURN(auto c, simulate::FitNonNegative(x, y, RelativeWeights(y)));
  // The pass's share of the micro-batches' time (the step's fixed part is
  // small beside them here).
  const double share = trained > 0 ? std::min(0.95, proximal / trained) : 0.0;
  std::fprintf(stderr, "calibrate: the pass before the update (proximal log-probabilities) takes %.0f%% of training\n",
               100 * share);
  return Training{c[0], c[1], c[2], c[3], share};
}

// How much slower decoding and training run while every core is busy,
// shared as the pipeline shares them: engines decoding on one model (data
// parallel rollout), the trainer's workers splitting a step's micro-batches
// (data parallel training), and, half and half, training next to decoding
// (the split modes). Each ratio is the median over interleaved rounds of
// the round's own ratio (a slow spell of the machine falls on both sides
// of a round's ratio, and an odd round does not move a median); each kind's
// slowdown is the mean of its two ratios.
Status MeasureSlowdown(const std::shared_ptr<model::Transformer>& m, const CalibrationOptions& o,
                       simulate::CostProfile* p) {
  const int32_t k = o.cores;
  if (k < 2) return Status::Ok();
  const int32_t prompt = 16, length = o.quick ? 16 : 48;
  const int32_t rows = static_cast<int32_t>(std::min<int64_t>(32, o.max_rows));
  auto decode_model = model::CloneModel(*m);
  auto decode = [&](int32_t seed) -> Result<double> {
    const auto t0 = Clock::now();
    rollout::EngineOptions eo;
    eo.num_slots = rows;
    eo.max_seq_len = prompt + length;
    SLUICE_ASSIGN_OR_RETURN(auto engine, rollout::RolloutEngine::Create({decode_model, 0}, eo));
    for (int32_t r = 0; r < rows; ++r) {
      rollout::GenerationRequest req;
      req.id = static_cast<uint64_t>(r);
      req.prompt.assign(static_cast<size_t>(prompt), static_cast<model::TokenId>(1 + (r + seed) % 200));
      req.sampling.seed = static_cast<uint64_t>(seed);
      req.sampling.forced_length = length;
      req.sampling.max_new_tokens = length;
      SLUICE_RETURN_IF_ERROR(engine->Submit(std::move(req)));
    }
    SLUICE_RETURN_IF_ERROR(engine->RunUntilIdle().status());
    return Since(t0);
  };
  // The trainer with k workers on 8k equal samples: 2k equal micro-batches.
  // `serial` keeps the helpers from taking any (all on the caller's thread,
  // same packing).
  std::atomic<bool> serial{true};
  trainer::TrainerOptions to = o.trainer;
  to.micro_batch_threads = k;
  to.may_run = [&serial](int32_t) { return !serial.load(); };
  to.done_running = nullptr;
  std::shared_ptr<model::Transformer> reference;
  if (to.loss.kl_coef > 0) reference = std::make_shared<model::Transformer>(m->config(), o.seed);
  SLUICE_ASSIGN_OR_RETURN(
      auto trainer, trainer::Trainer::Create(std::make_shared<model::Transformer>(m->config(), o.seed), reference, to));
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  SLUICE_ASSIGN_OR_RETURN(
      std::vector<trainer::RolloutSample> batch,
      SyntheticBatch(std::vector<int32_t>(static_cast<size_t>(8 * k), length), prompt, m->config().vocab_size, &rng));
  auto train = [&]() -> Result<double> {
    const auto t0 = Clock::now();
    SLUICE_RETURN_IF_ERROR(trainer->RlStep(batch).status());
    return Since(t0);
  };
  SLUICE_RETURN_IF_ERROR(decode(0).status());  // warm
  SLUICE_RETURN_IF_ERROR(train().status());
  // Runs fn(thread) on k threads started together; each thread's time.
  auto together = [&](const std::function<Result<double>(int32_t)>& fn) -> Result<std::vector<double>> {
    std::vector<Result<double>> times(static_cast<size_t>(k), Status::Internal("not run"));
    std::atomic<int32_t> ready{0};
    std::vector<std::thread> threads;
    for (int32_t j = 0; j < k; ++j) {
      threads.emplace_back([&, j] {
        ready.fetch_add(1);
        while (ready.load() < k) std::this_thread::yield();
        times[static_cast<size_t>(j)] = fn(j);
      });
    }
    for (auto& t : threads) t.join();
    std::vector<double> out;
    for (auto& t : times) {
      SLUICE_RETURN_IF_ERROR(t.status());
      out.push_back(*t);
    }
    return out;
  };
  // Rounds of every measurement, interleaved; each round's four ratios.
  std::vector<double> decode_all, decode_mixed, train_all, train_mixed;
  for (int round = 0; round < (o.quick ? 2 : 6); ++round) {
    SLUICE_ASSIGN_OR_RETURN(const double decode_alone, decode(0));
    SLUICE_ASSIGN_OR_RETURN(const double train_alone, train());
    // Data parallel decoding: the slowest engine.
    SLUICE_ASSIGN_OR_RETURN(auto times, together([&](int32_t j) { return decode(j); }));
    decode_all.push_back(*std::max_element(times.begin(), times.end()) / decode_alone);
    // Data parallel training: k workers on the step (a perfect split would
    // take 1/k of it).
    serial.store(false);
    SLUICE_ASSIGN_OR_RETURN(const double train_parallel, train());
    serial.store(true);
    train_all.push_back(train_parallel * k / train_alone);
    // Half and half: the trainer on one thread, engines on the others.
    SLUICE_ASSIGN_OR_RETURN(times, together([&](int32_t j) { return j == 0 ? train() : decode(j); }));
    train_mixed.push_back(times[0] / train_alone);
    decode_mixed.push_back(*std::max_element(times.begin() + 1, times.end()) / decode_alone);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  auto spread = [](const std::vector<double>& v) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    char text[48];
    std::snprintf(text, sizeof(text), "%.2f-%.2f", *lo, *hi);
    return std::string(text);
  };
  const double da = median(decode_all), dm = median(decode_mixed), ta = median(train_all), tm = median(train_mixed);
  p->rollout_slowdown = std::max(1.0, (da + dm) / 2);
  p->trainer_slowdown = std::max(1.0, (ta + tm) / 2);
  std::fprintf(stderr,
               "calibrate: with %d cores busy (medians of %zu rounds, their ranges in brackets): decoding %.2fx "
               "slower (all decoding) [%s] / %.2fx (next to training) [%s], training %.2fx (data parallel) [%s] / "
               "%.2fx (next to decoding) [%s]\n",
               k, decode_all.size(), da, spread(decode_all).c_str(), dm, spread(decode_mixed).c_str(), ta,
               spread(train_all).c_str(), tm, spread(train_mixed).c_str());
  return Status::Ok();
}

// Publish: export the trainer's weights and commit them to a version store;
// switch: the rollout engine's hook handing over a filled standby buffer.
Status MeasureWeights(const std::shared_ptr<model::Transformer>& m, const CalibrationOptions& o,
                      simulate::CostProfile* p) {
  SLUICE_ASSIGN_OR_RETURN(TensorMap initial, model::ExportWeights(*m));
  ce::VersionStoreOptions so;
  so.layout = ce::LayoutOf(initial);
  SLUICE_ASSIGN_OR_RETURN(auto store, ce::VersionStore::Create(so));
  SLUICE_RETURN_IF_ERROR(store->Publish(0, initial));
  initial.clear();
  auto serving = model::CloneModel(*m);
  SLUICE_ASSIGN_OR_RETURN(auto standby, rollout::StandbyWeights::Create(serving, 0, *store));
  const rollout::WeightSwapHook hook = standby->Hook();
  std::vector<double> publish, fill, swap;
  PolicyVersion current = 0;
  for (int64_t v = 1; v <= (o.quick ? 2 : 5); ++v) {
    auto t0 = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(TensorMap weights, model::ExportWeights(*m));
    SLUICE_RETURN_IF_ERROR(store->Publish(v, weights));
    publish.push_back(Since(t0));
    t0 = Clock::now();
    SLUICE_RETURN_IF_ERROR(standby->WaitUntilReady(v, std::chrono::seconds(60)));
    fill.push_back(Since(t0));
    t0 = Clock::now();
    std::optional<rollout::PolicySnapshot> next = hook(current);
    swap.push_back(Since(t0));
    if (!next) return Status::Internal("calibrate: the standby buffer handed over no version " + std::to_string(v));
    current = next->version;
    // The engine's next step calls the hook with the new version as
    // `current`, which frees the buffer it stopped serving for the next fill.
    if (hook(current)) return Status::Internal("calibrate: the standby buffer handed over a version twice");
  }
  standby->Stop();
  std::sort(publish.begin(), publish.end());
  std::sort(swap.begin(), swap.end());
  std::sort(fill.begin(), fill.end());
  p->weight_fill_s = fill[fill.size() / 2];
  p->publish_s = publish[publish.size() / 2];
  p->weight_switch_s = swap[swap.size() / 2];
  return Status::Ok();
}

Result<double> MeasureReward(const reward::Task& task) {
  const uint64_t n = std::min<uint64_t>(256, task.size(reward::Split::kTrain));
  if (n == 0) return 0.0;
  std::vector<reward::Example> examples;
  for (uint64_t i = 0; i < n; ++i) {
    SLUICE_ASSIGN_OR_RETURN(reward::Example ex, task.Get(reward::Split::kTrain, i));
    examples.push_back(std::move(ex));
  }
  volatile double sink = 0;  // the scores themselves are not needed
  const auto t0 = Clock::now();
  for (const auto& ex : examples) sink = sink + task.Score(ex, ex.answer);
  return Since(t0) / static_cast<double>(n);
}

}  // namespace

void ShareCores(pipeline::RunOptions* o, int32_t threads, int32_t rollout_threads, bool data_parallel_sync) {
  const bool split =
      o->pipeline.mode == pipeline::PipelineMode::kOneStepOff || o->pipeline.mode == pipeline::PipelineMode::kAsync;
  if (!split && data_parallel_sync) {
    o->rl.trainer.micro_batch_threads = threads;
    o->pipeline.rollout_engines = threads;
  }
  o->pipeline.rollout_threads = split ? rollout_threads : threads;
  o->pipeline.trainer_threads = split ? threads - rollout_threads : threads;
}

Result<simulate::Layout> SimulatedLayout(const pipeline::RunOptions& o, int32_t process_threads) {
  simulate::Layout l;
  switch (o.pipeline.mode) {
    case pipeline::PipelineMode::kSync:
      l.mode = simulate::Mode::kSync;
      break;
    case pipeline::PipelineMode::kOneStepOff:
      l.mode = simulate::Mode::kOneStepOff;
      break;
    case pipeline::PipelineMode::kAsync:
      l.mode = simulate::Mode::kAsync;
      break;
    case pipeline::PipelineMode::kDirect:
      return Status::InvalidArgument("pipeline.mode direct is not simulated (sync is its streaming equivalent)");
  }
  const pipeline::ThreadBudget b = o.Threads(process_threads);
  l.max_staleness = o.pipeline.max_staleness;
  l.sync_interval = o.pipeline.sync_interval;
  l.rollout_engines = b.rollout_engines;
  l.rollout_slots = o.rl.rollout_slots;
  l.trainer_workers = b.trainer_workers;
  l.lent_workers = b.lent_workers;
  l.micro_batch_tokens = o.rl.trainer.micro_batch_tokens;
  l.mini_batches = o.rl.trainer.mini_batches;
  if (b.threads_per_engine != 1 || b.threads_per_worker != 1) {
    return Status::InvalidArgument(
        "the simulator models single-threaded engines and trainer workers (the profile's threads); this layout runs " +
        b.ToString() + " (set pipeline.rollout_threads / trainer_threads to give each one thread)");
  }
  return l;
}

std::string ModelShape(const model::ModelConfig& c) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s hidden=%lld layers=%lld heads=%lld/%lld head_dim=%lld ffn=%lld vocab=%lld",
                c.model_type.c_str(), static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.num_attention_heads),
                static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.resolved_head_dim()),
                static_cast<long long>(c.intermediate_size), static_cast<long long>(c.vocab_size));
  return buf;
}

Result<simulate::CostProfile> Calibrate(std::shared_ptr<model::Transformer> model, const reward::Task& task,
                                        const CalibrationOptions& o) {
  if (!model) return Status::InvalidArgument("calibrate: no model");
  if (o.threads < 1 || o.cores < 1 || o.max_rows < 1 || o.max_context < 16) {
    return Status::InvalidArgument("calibrate: threads, cores and max_rows must be >= 1, max_context >= 16");
  }
  const int caller_threads = torch::get_num_threads();
  torch::set_num_threads(o.threads);
  struct Restore {
    int n;
    ~Restore() { torch::set_num_threads(n); }
  } restore{caller_threads};
  simulate::CostProfile p;
  p.model = ModelShape(model->config());
  p.device = "cpu";
  p.threads = o.threads;
  p.measured_by = o.measured_by;
  try {
    auto t0 = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(Rollout r, MeasureRollout(model, o));
    std::fprintf(stderr, "calibrate: rollout measured in %.1f s\n", Since(t0));
    t0 = Clock::now();
    p.decode_step_s = r.step, p.decode_row_s = r.row, p.decode_context_s = r.context;
    p.prefill_prompt_s = r.prompt, p.prefill_token_s = r.token;
    SLUICE_ASSIGN_OR_RETURN(Training t, MeasureTraining(model, o));
    std::fprintf(stderr, "calibrate: trainer measured in %.1f s\n", Since(t0));
    p.train_step_s = t.step, p.train_micro_batch_s = t.micro_batch;
    p.train_token_s = t.token, p.train_token_context_s = t.token_context;
    p.train_proximal_share = t.proximal_share;
    SLUICE_RETURN_IF_ERROR(MeasureWeights(model, o, &p));
    t0 = Clock::now();
    p.cores = o.cores;
    SLUICE_RETURN_IF_ERROR(MeasureSlowdown(model, o, &p));
    std::fprintf(stderr, "calibrate: %lld cores busy at once measured in %.1f s\n", static_cast<long long>(o.cores),
                 Since(t0));
  } catch (const c10::Error& e) {
    return Status::Internal(std::string("calibrate: libtorch failed: ") + e.what_without_backtrace());
  }
  SLUICE_ASSIGN_OR_RETURN(p.reward_answer_s, MeasureReward(task));
  SLUICE_RETURN_IF_ERROR(p.Validate());
  return p;
}

}  // namespace sluice::launch
