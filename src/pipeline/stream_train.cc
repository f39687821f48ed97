// The streaming modes (sync, one_step_off, async): rollout, reward and trainer
// as separate roles joined by the TransferQueue (samples) and the
// CheckpointEngine (weights). Threads in one process here; see
// docs/pipeline.md for the data flow and the guarantees.
//
//   rollout thread ── PutRows(prompt, response, logprobs, versions) ──► hub
//   reward thread  ◄── GetMeta("reward") ── hub ── PutColumns(reward) ──► hub
//   trainer        ◄── GetMeta("train", whole groups) ── hub
//   trainer ── Publish(version) ──► VersionStore ──► StandbyWeights ──► engine hook
//
// Staleness is bounded by admission: the rollout asks StalenessAdmission for
// prompts with the version it serves; the trainer retires a step's prompts
// and reports its new version together (CompleteStep).

#include <torch/torch.h>

#include <atomic>
#include <cstring>
#include <map>
#include <optional>

#include "loop_state.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/background_thread.h"
#include "sluice/common/mutex.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/transfer_queue/client.h"
#include "sluice/transfer_queue/staleness.h"

namespace sluice::pipeline {

namespace tq = transfer_queue;
namespace ce = checkpoint_engine;
using std::chrono::milliseconds;

namespace {

constexpr char kPartition[] = "rollouts";
constexpr char kRewardTask[] = "reward";
constexpr char kTrainTask[] = "train";
constexpr auto kPoll = milliseconds(50);

template <typename T>
HostTensor VectorTensor(DType dtype, const std::vector<T>& v) {
  return HostTensor::Copy(dtype, {static_cast<int64_t>(v.size())}, v.data(), v.size() * sizeof(T));
}

template <typename T>
std::vector<T> TensorVector(const HostTensor& t) {
  std::vector<T> v(t.nbytes / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.data, v.size() * sizeof(T));
  return v;
}

// The first error of any role; stops the others.
class ErrorSlot {
 public:
  void Set(const Status& s) {
    if (s.ok()) return;
    MutexLock lock(&mu_);
    if (first_.ok()) first_ = s;
    failed_.store(true);
  }
  bool failed() const { return failed_.load(); }
  Status Get() const {
    MutexLock lock(&mu_);
    return first_;
  }

 private:
  mutable Mutex mu_;
  Status first_ SLUICE_GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
};

}  // namespace

Result<PipelineMode> ParsePipelineMode(const std::string& name) {
  if (name == "direct") return PipelineMode::kDirect;
  if (name == "sync") return PipelineMode::kSync;
  if (name == "one_step_off") return PipelineMode::kOneStepOff;
  if (name == "async") return PipelineMode::kAsync;
  return Status::InvalidArgument("pipeline mode '" + name + "' is not one of {direct, sync, one_step_off, async}");
}

std::string PipelineModeName(PipelineMode mode) {
  switch (mode) {
    case PipelineMode::kDirect: return "direct";
    case PipelineMode::kSync: return "sync";
    case PipelineMode::kOneStepOff: return "one_step_off";
    case PipelineMode::kAsync: return "async";
  }
  return "?";
}

int64_t PipelineOptions::EffectiveMaxStaleness() const {
  switch (mode) {
    case PipelineMode::kDirect:
    case PipelineMode::kSync: return 0;
    case PipelineMode::kOneStepOff: return 1;
    case PipelineMode::kAsync: return max_staleness;
  }
  return 0;
}

Status SyncLoop::TrainStreaming(const ProgressFn& progress) {
  State& s = *state_;
  const RlOptions& rl = s.options.rl;
  const PipelineOptions& po = s.options.pipeline;
  const int64_t P = rl.prompts_per_step, G = rl.group_size;
  const uint64_t n_train = s.task->size(reward::Split::kTrain);

  if (s.step >= rl.steps) return Status::Ok();

  // ---- the hub: one partition of rollouts, consumed by "reward" and "train".
  tq::HubOptions hub_options;
  hub_options.controller.columns = {{"prompt", DType::kI32, {tq::kRaggedDim}},
                                    {"response", DType::kI32, {tq::kRaggedDim}},
                                    {"logprobs", DType::kF32, {tq::kRaggedDim}},
                                    {"versions", DType::kI64, {tq::kRaggedDim}},
                                    {"reward", DType::kF32, {}}};
  hub_options.controller.tasks = {kRewardTask, kTrainTask};
  SLUICE_ASSIGN_OR_RETURN(auto hub, tq::TransferQueueHub::Create(hub_options));
  tq::TransferQueueClient client = hub->client();
  SLUICE_RETURN_IF_ERROR(client.CreatePartition(kPartition, static_cast<uint32_t>(G)));

  // ---- the weights: the trainer publishes into a version store; the rollout
  // serves its own copy, refreshed through a standby buffer.
  SLUICE_ASSIGN_OR_RETURN(TensorMap initial, model::ExportWeights(*s.policy));
  ce::VersionStoreOptions store_options;
  store_options.layout = ce::LayoutOf(initial);
  SLUICE_ASSIGN_OR_RETURN(auto store, ce::VersionStore::Create(store_options));
  SLUICE_RETURN_IF_ERROR(store->Publish(s.version, initial));
  initial.clear();
  std::shared_ptr<model::Transformer> rollout_model = model::CloneModel(*s.policy);
  SLUICE_ASSIGN_OR_RETURN(auto standby,
                          rollout::StandbyWeights::Create(rollout_model, s.version, rollout::MakeWeightSource(*store)));

  tq::StalenessOptions staleness_options;
  staleness_options.max_staleness = po.EffectiveMaxStaleness();
  staleness_options.prompts_per_version = P * po.sync_interval;
  staleness_options.initial_trainer_version = s.version;
  SLUICE_ASSIGN_OR_RETURN(auto admission, tq::StalenessAdmission::Create(staleness_options));

  ErrorSlot errors;
  const uint64_t first_cursor = static_cast<uint64_t>(s.step * P);
  const uint64_t end_cursor = static_cast<uint64_t>(rl.steps * P);
  auto example_of = [&](uint64_t cursor) {
    return s.task->Get(reward::Split::kTrain, PermutedIndex(s.options.seed, cursor, n_train));
  };

  // ---- core lending: the trainer's extra micro-batch workers run on the
  // rollout's cores, only while the rollout has nothing to decode.
  std::atomic<bool> rollout_idle{false};
  const int32_t trainer_workers = s.trainer->options().micro_batch_threads;
  struct RestoreWorkers {
    trainer::Trainer* t;
    int32_t n;
    ~RestoreWorkers() { (void)t->SetMicroBatchWorkers(n, nullptr); }
  } restore{s.trainer.get(), trainer_workers};
  if (po.lend_idle_cores && po.rollout_threads > 0 && po.trainer_threads > 0) {
    const int32_t own = std::max(po.trainer_threads, trainer_workers);
    SLUICE_RETURN_IF_ERROR(s.trainer->SetMicroBatchWorkers(
        own + po.rollout_threads, [&rollout_idle, own](int32_t w) { return w < own || rollout_idle.load(); }));
  }

  // ---- rollout role
  std::atomic<int64_t> rollout_busy_us{0}, rollout_tokens{0};
  BackgroundThread rollout_thread("rollout");
  SLUICE_RETURN_IF_ERROR(rollout_thread.Start([&](std::stop_token stop) {
    if (po.rollout_threads > 0) SetIntraOpThreadsHere(po.rollout_threads);
    rollout::EngineOptions eo;
    eo.num_slots = rl.rollout_slots;
    eo.eos_token_id = s.tokenizer.eos_id();
    eo.switch_policy = po.switch_policy;
    auto engine_or = rollout::RolloutEngine::Create({rollout_model, s.version}, eo);
    if (!engine_or.ok()) return errors.Set(engine_or.status());
    auto engine = std::move(engine_or).value();
    engine->SetWeightSwapHook(standby->Hook());
    uint64_t cursor = first_cursor;
    struct IdleOnExit {
      std::atomic<bool>* idle;
      ~IdleOnExit() { idle->store(true); }
    } idle_on_exit{&rollout_idle};
    while (!stop.stop_requested() && !errors.failed()) {
      rollout_idle.store(engine->idle());
      // Keep about one batch of prompts waiting so freed slots refill at once.
      const int64_t queued = static_cast<int64_t>(engine->num_waiting()) + engine->num_running();
      const int64_t want = std::min<int64_t>((2 * rl.rollout_slots - queued) / G, static_cast<int64_t>(end_cursor - cursor));
      if (want > 0) {
        auto admitted = admission->Admit(want, engine->policy_version(), engine->idle() ? kPoll : milliseconds(0));
        if (!admitted.ok() && admitted.status().code() != StatusCode::kTimeout) {
          if (admitted.status().code() != StatusCode::kAborted) errors.Set(admitted.status());
          return;
        }
        for (int64_t i = 0; admitted.ok() && i < *admitted; ++i, ++cursor) {
          auto ex = example_of(cursor);
          if (!ex.ok()) return errors.Set(ex.status());
          const auto prompt = s.EncodePrompt(ex->prompt);
          for (int64_t g = 0; g < G; ++g) {
            rollout::GenerationRequest r;
            r.id = cursor * static_cast<uint64_t>(G) + static_cast<uint64_t>(g);
            r.prompt = prompt;
            r.sampling = rl.sampling;
            r.sampling.seed = AnswerSeed(s.options.seed, P, G, cursor, g);
            if (rl.forced_length) r.sampling.forced_length = rl.forced_length(cursor, g);
            if (Status st = engine->Submit(std::move(r)); !st.ok()) return errors.Set(st);
          }
        }
      } else if (engine->idle()) {
        std::this_thread::sleep_for(kPoll);  // every prompt of the run is out
      }
      rollout_idle.store(engine->idle());
      // A step on an idle engine still runs the weight-swap hook.
      const auto t0 = Clock::now();
      auto done = engine->Step();
      if (!done.ok()) return errors.Set(done.status());
      if (!engine->idle() || !done->empty()) {
        rollout_busy_us += std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
      }
      for (auto& r : *done) {
        rollout_tokens += static_cast<int64_t>(r.tokens.size());
        const uint64_t c = r.id / static_cast<uint64_t>(G);
        tq::RowTags tags;
        tags.group_id = static_cast<tq::GroupId>(c);
        tags.policy_version = r.versions.empty() ? engine->policy_version() : r.versions.front();
        tags.token_length = static_cast<int64_t>(r.tokens.size());
        tags.user["answer"] = std::to_string(r.id % static_cast<uint64_t>(G));
        tq::ColumnBatch cols;
        cols["prompt"] = {VectorTensor(DType::kI32, r.prompt)};
        cols["response"] = {VectorTensor(DType::kI32, r.tokens)};
        cols["logprobs"] = {VectorTensor(DType::kF32, r.logprobs)};
        cols["versions"] = {VectorTensor(DType::kI64, r.versions)};
        auto put = client.PutRows(kPartition, {tags}, cols);
        if (!put.ok()) return errors.Set(put.status());
      }
    }
  }));

  // ---- reward role
  BackgroundThread reward_thread("reward");
  SLUICE_RETURN_IF_ERROR(reward_thread.Start([&](std::stop_token stop) {
    while (!stop.stop_requested() && !errors.failed()) {
      auto meta = client.GetMeta(kRewardTask, {"response"}, 1, kPartition, {}, kPoll);
      if (!meta.ok()) {
        if (meta.status().code() != StatusCode::kTimeout) return errors.Set(meta.status());
        continue;
      }
      auto data = client.GetData(*meta);
      if (!data.ok()) return errors.Set(data.status());
      const uint64_t cursor = static_cast<uint64_t>(meta->rows[0].tags.group_id);
      auto ex = example_of(cursor);
      if (!ex.ok()) return errors.Set(ex.status());
      auto text = s.tokenizer.Decode(TensorVector<model::TokenId>(data->columns["response"][0]));
      if (!text.ok()) return errors.Set(text.status());
      const float reward = static_cast<float>(s.task->Score(*ex, *text));
      tq::ColumnBatch cols;
      cols["reward"] = {HostTensor::Copy(DType::kF32, {}, &reward, sizeof(reward))};
      if (Status st = client.PutColumns(meta->row_ids(), cols); !st.ok()) return errors.Set(st);
      if (auto acked = client.Ack(meta->lease_id); !acked.ok()) return errors.Set(acked.status());
    }
  }));

  // ---- trainer role (this thread)
  auto stop_roles = [&]() {
    admission->Close();
    rollout_thread.Stop();
    reward_thread.Stop();
    standby->Stop();
  };
  auto fail = [&](const Status& st) {
    errors.Set(st);
    stop_roles();
    return errors.Get();
  };
  const auto run_start = Clock::now();
  auto interval_start = run_start;
  int64_t busy_us_before = 0, tokens_before = 0;
  std::ofstream metrics(fs::path(s.options.run_dir) / "metrics.jsonl", std::ios::app);
  const std::vector<std::string> columns = {"prompt", "response", "logprobs", "versions", "reward"};
  tq::SamplingPolicy whole_groups;
  whole_groups.mode = tq::SamplingMode::kWholeGroup;
  while (s.step < rl.steps) {
    StepRecord rec;
    rec.step = s.step + 1;
    rec.total_steps = rl.steps;
    rec.version = s.version;
    if (auto stats = client.Stats(); stats.ok()) {
      for (const auto& t : stats->controller.tasks) {
        if (t.task == kTrainTask) rec.queue_ready = static_cast<int64_t>(t.ready);
      }
    }
    // Take P whole groups, in the order they complete.
    const auto t0 = Clock::now();
    std::map<uint64_t, std::vector<trainer::RolloutSample>> groups;  // by prompt cursor
    double reward_sum = 0, correct = 0, len_sum = 0, stale_sum = 0, token_stale_sum = 0, tokens = 0;
    for (int64_t taken = 0; taken < P;) {
      if (errors.failed()) return fail(errors.Get());
      auto meta = client.GetMeta(kTrainTask, columns, static_cast<uint32_t>(G), kPartition, whole_groups, kPoll);
      if (!meta.ok()) {
        if (meta.status().code() == StatusCode::kTimeout) continue;
        return fail(meta.status());
      }
      auto data = client.GetData(*meta);
      if (!data.ok()) return fail(data.status());
      if (auto acked = client.Ack(meta->lease_id); !acked.ok()) return fail(acked.status());
      ++taken;
      const uint64_t cursor = static_cast<uint64_t>(meta->rows[0].tags.group_id);
      rec.prompts.push_back(cursor);
      std::vector<trainer::RolloutSample> group(static_cast<size_t>(G));
      for (size_t i = 0; i < meta->rows.size(); ++i) {
        const int64_t g = std::stoll(meta->rows[i].tags.user.at("answer"));
        trainer::RolloutSample& smp = group.at(static_cast<size_t>(g));
        smp.id = cursor * static_cast<uint64_t>(G) + static_cast<uint64_t>(g);
        smp.group_id = cursor;
        smp.prompt = TensorVector<model::TokenId>(data->columns["prompt"][i]);
        smp.response = TensorVector<model::TokenId>(data->columns["response"][i]);
        smp.behavior_logprobs = TensorVector<float>(data->columns["logprobs"][i]);
        smp.versions = TensorVector<int64_t>(data->columns["versions"][i]);
        smp.reward = *reinterpret_cast<const float*>(data->columns["reward"][i].data);
        reward_sum += smp.reward;
        correct += smp.reward >= 1.0 ? 1.0 : 0.0;
        len_sum += static_cast<double>(smp.response.size());
        rec.response_len_max = std::max<int64_t>(rec.response_len_max, static_cast<int64_t>(smp.response.size()));
        rec.generated_tokens += static_cast<int64_t>(smp.response.size());
        const int64_t stale = s.version - (smp.versions.empty() ? s.version : smp.versions.front());
        stale_sum += static_cast<double>(stale);
        if (stale >= 0) {
          if (rec.staleness_hist.size() <= static_cast<size_t>(stale)) rec.staleness_hist.resize(stale + 1, 0);
          ++rec.staleness_hist[static_cast<size_t>(stale)];
        }
        rec.staleness_max = std::max(rec.staleness_max, stale);
        for (int64_t v : smp.versions) token_stale_sum += static_cast<double>(s.version - v);
        tokens += static_cast<double>(smp.versions.size());
      }
      const bool all_equal = std::all_of(group.begin(), group.end(),
                                         [&](const auto& x) { return x.reward == group.front().reward; });
      if (rl.dynamic_sampling && all_equal) continue;
      groups.emplace(cursor, std::move(group));
    }
    const auto t1 = Clock::now();
    const double total = static_cast<double>(P * G);
    rec.reward_mean = reward_sum / total;
    rec.accuracy = correct / total;
    rec.response_len_mean = len_sum / total;
    rec.staleness_mean = stale_sum / total;
    rec.token_staleness_mean = tokens > 0 ? token_stale_sum / tokens : 0;
    rec.wait_seconds = std::chrono::duration<double>(t1 - t0).count();
    rec.groups_kept = static_cast<int64_t>(groups.size());
    // Train on the kept groups in prompt order (so sync mode trains exactly
    // the batch the direct loop trains).
    std::vector<trainer::RolloutSample> samples;
    for (auto& [cursor, group] : groups) {
      for (auto& smp : group) samples.push_back(std::move(smp));
    }
    if (Status st = s.TrainOnGroups(samples, &rec); !st.ok()) return fail(st);
    ++s.step;
    if (s.step % po.sync_interval == 0 || s.step == rl.steps) {
      ++s.version;
      auto weights = model::ExportWeights(*s.policy);
      if (!weights.ok()) return fail(weights.status());
      if (Status st = store->Publish(s.version, *weights); !st.ok()) return fail(st);
    }
    // Publish first, then let rollout admit prompts for the new version.
    if (Status st = admission->CompleteStep(s.version, P); !st.ok()) return fail(st);
    const auto t2 = Clock::now();
    rec.train_seconds = std::chrono::duration<double>(t2 - t1).count();
    // The roles over this step's interval: the rollout's rate is what it
    // generated meanwhile (gen_seconds = the interval), not the trained tokens.
    const double interval = std::max(1e-9, std::chrono::duration<double>(t2 - interval_start).count());
    const int64_t busy_us = rollout_busy_us.load(), produced = rollout_tokens.load();
    rec.rollout_tokens = produced - tokens_before;
    rec.rollout_busy = std::min(1.0, static_cast<double>(busy_us - busy_us_before) / 1e6 / interval);
    rec.trainer_busy = std::min(1.0, rec.train_seconds / interval);
    rec.gen_seconds = interval;
    busy_us_before = busy_us;
    tokens_before = produced;
    interval_start = t2;
    s.elapsed_total = s.elapsed_offset + std::chrono::duration<double>(Clock::now() - run_start).count();
    rec.elapsed_seconds = s.elapsed_total;
    if (Status st = s.FinishStep(rec, metrics, [this] { return Evaluate(); }, progress); !st.ok()) return fail(st);
  }
  stop_roles();
  SLUICE_RETURN_IF_ERROR(errors.Get());
  s.stream_stats.rollout_busy_seconds = static_cast<double>(rollout_busy_us.load()) / 1e6;
  s.stream_stats.rollout_tokens = rollout_tokens.load();
  s.stream_stats.wall_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  return Status::Ok();
}

}  // namespace sluice::pipeline
