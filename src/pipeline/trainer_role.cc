// The trainer role (trainer_role.h): rank 0 leads each step (takes its
// groups, trains, publishes, records, acks); the other ranks follow its plan.
#include "sluice/pipeline/trainer_role.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "agent_driver.h"
#include "hub_records.h"
#include "sluice/checkpoint_engine/weights.h"
#include "sluice/common/logging.h"
#include "sluice/common/trace.h"
#include "sluice/trainer/data_parallel.h"
#include "sluice/trainer/trainer.h"
#include "sluice/transfer_queue/client.h"
#include "stream_roles.h"

namespace sluice::pipeline {

namespace {

// The roles over each step's interval, from the run health's counters: the
// rollout's tokens and busy share (its rate is what it generated meanwhile,
// gen_seconds = the interval, not the trained tokens), per replica with
// several (a replica elsewhere's counters come through the launcher,
// RemoteBeats), and the trainer's busy share.
class RolloutMeter {
 public:
  RolloutMeter(const RunHealth& health, int64_t replicas, Clock::time_point start)
      : health_(health),
        replicas_(replicas > 1 ? std::min<int64_t>(replicas, RunHealth::kMaxReplicas) : 0),
        start_(start),
        busy_us_(health.rollout().busy_us),
        tokens_(health.rollout().tokens),
        replica_busy_us_(replicas_),
        replica_tokens_(replicas_) {
    for (int64_t k = 0; k < replicas_; ++k) {
      replica_busy_us_[k] = health.replica(k).busy_us;
      replica_tokens_[k] = health.replica(k).tokens;
    }
  }

  // The interval since the last call (or the start) ends at `now`; its
  // figures go into `rec` (whose train_seconds is set).
  void Record(Clock::time_point now, StepRecord* rec) {
    const double interval = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const int64_t busy_us = health_.rollout().busy_us, tokens = health_.rollout().tokens;
    rec->rollout_tokens = tokens - tokens_;
    rec->rollout_busy = std::min(1.0, static_cast<double>(busy_us - busy_us_) / 1e6 / interval);
    for (int64_t k = 0; k < replicas_; ++k) {
      const int64_t replica_busy = health_.replica(k).busy_us, replica_tokens = health_.replica(k).tokens;
      rec->replica_tokens.push_back(replica_tokens - replica_tokens_[k]);
      rec->replica_busy.push_back(
          std::min(1.0, static_cast<double>(replica_busy - replica_busy_us_[k]) / 1e6 / interval));
      replica_busy_us_[k] = replica_busy;
      replica_tokens_[k] = replica_tokens;
    }
    rec->trainer_busy = std::min(1.0, rec->train_seconds / interval);
    rec->gen_seconds = interval;
    busy_us_ = busy_us;
    tokens_ = tokens;
    start_ = now;
  }

 private:
  const RunHealth& health_;
  const int64_t replicas_;
  Clock::time_point start_;
  int64_t busy_us_, tokens_;
  std::vector<int64_t> replica_busy_us_, replica_tokens_;
};

// The trainer's groups from the hub: taken (whole groups of the train
// task, by prompt cursor) and held, with the leases that hold them, until
// their step's update is published; then trained, each once. A group
// delivered twice (a lease that ran out, or its prompt generated again) is
// kept under the new lease if it is the same rows, else dropped (acked, as
// any copy of a group already trained), and counted.
class StepGroups {
 public:
  struct Taken {
    std::vector<trainer::RolloutSample> group;
    std::vector<tq::RowId> rows;  // the hub row of each answer (for the other trainer ranks)
    tq::LeaseId lease = 0;
  };

  StepGroups(tq::TransferQueueClient& client, int64_t G, std::chrono::seconds lease, const std::string& holder,
             std::function<bool(uint64_t)> lose)
      : client_(client), G_(G), lose_(std::move(lose)) {
    request_.task = kTrainTask;
    request_.columns = RecordColumns<AnswerToTrain>();
    request_.n = static_cast<uint32_t>(G);
    request_.partition = kRolloutPartition;
    request_.policy.mode = tq::SamplingMode::kWholeGroup;
    request_.timeout = kHubPoll;
    request_.lease_timeout = lease;
    request_.holder = holder;  // names this rank in the hub's ack log
  }

  // Takes groups until the step has its own: prompt order, the cursors in
  // *step_cursors (held already or taken now; groups of later prompts that
  // come first are held for their step); completion order, any P groups,
  // the earliest admitted first, appended to *step_cursors. `before_each`
  // runs before every take (its error ends the wait).
  Status TakeStep(TrainOrder order, int64_t P, std::vector<uint64_t>* step_cursors,
                  const std::function<Status()>& before_each) {
    auto have_all = [&] {
      if (order == TrainOrder::kCompletion) return static_cast<int64_t>(step_cursors->size()) == P;
      return std::all_of(step_cursors->begin(), step_cursors->end(), [&](uint64_t c) { return taken_.count(c) > 0; });
    };
    while (!have_all()) {
      SLUICE_RETURN_IF_ERROR(before_each());
      auto meta = client_.GetMeta(request_);
      if (!meta.ok()) {
        if (meta.status().code() == StatusCode::kTimeout) continue;
        return meta.status();
      }
      SLUICE_ASSIGN_OR_RETURN(tq::BatchData data, client_.GetData(*meta));
      const uint64_t cursor = static_cast<uint64_t>(meta->rows[0].tags.group_id);
      if (meta->rows.size() != static_cast<size_t>(G_)) {
        return Status::DataLoss("the hub delivered " + std::to_string(meta->rows.size()) + " rows of group " +
                                std::to_string(cursor) + ", expected the whole group of " + std::to_string(G_));
      }
      std::set<tq::RowId> delivered;
      for (const tq::RowMeta& row : meta->rows) delivered.insert(row.id);
      if (auto held = taken_.find(cursor);
          held != taken_.end() &&
          delivered == std::set<tq::RowId>(held->second.rows.begin(), held->second.rows.end())) {
        // Its lease ran out while the step waited for other groups: the same
        // rows under a new lease. Keep the group under the new lease (acked
        // after training, like any other); acking now would tell the
        // rollout's admission it was trained, and lose it if we died.
        ++duplicates_;
        SLUICE_LOG(WARNING) << "group " << cursor << " delivered again while held (its lease ran out); kept";
        held->second.lease = meta->lease_id;
        continue;
      }
      if (trained_.count(cursor) > 0 || taken_.count(cursor) > 0) {
        // Trained already (its lease ran out before the ack), or another
        // copy of a group held or trained (its prompt generated again: a
        // rollout replica died after writing the answers, before its ack):
        // the group is trained once, from the copy taken first.
        ++duplicates_;
        SLUICE_LOG(WARNING) << "group " << cursor << " delivered again after it was "
                            << (taken_.count(cursor) > 0 ? "taken (another copy)" : "trained")
                            << "; dropped (trained once)";
        SLUICE_RETURN_IF_ERROR(client_.Ack(meta->lease_id).status());  // this copy is done with
        continue;
      }
      std::vector<trainer::RolloutSample> group(static_cast<size_t>(G_));
      std::vector<tq::RowId> rows(static_cast<size_t>(G_), 0);
      std::vector<bool> filled(static_cast<size_t>(G_), false);
      for (size_t i = 0; i < meta->rows.size(); ++i) {
        const tq::RowTags& tags = meta->rows[i].tags;
        SLUICE_ASSIGN_OR_RETURN(AnswerToTrain answer, DecodeRecord<AnswerToTrain>(data, i));
        const int32_t g = answer.answer_index;
        if (static_cast<uint64_t>(tags.group_id) != cursor || g < 0 || g >= G_ || filled[static_cast<size_t>(g)]) {
          return Status::DataLoss("group " + std::to_string(cursor) +
                                  " from the hub is not G distinct answers of one " + "prompt (row of group " +
                                  std::to_string(tags.group_id) + ", answer " + std::to_string(g) + ")");
        }
        filled[static_cast<size_t>(g)] = true;
        rows[static_cast<size_t>(g)] = meta->rows[i].id;
        trainer::RolloutSample& smp = group[static_cast<size_t>(g)];
        smp.id = cursor * static_cast<uint64_t>(G_) + static_cast<uint64_t>(g);
        smp.group_id = tags.group_id;
        smp.reward = answer.reward;
        smp.trajectory = std::move(answer.trajectory);
        MoveAnswerTokens(std::move(answer), &smp);
      }
      if (lose_ && lose_(cursor)) continue;  // leased, never acked
      taken_.emplace(cursor, Taken{std::move(group), std::move(rows), meta->lease_id});
      if (order == TrainOrder::kCompletion) step_cursors->push_back(cursor);
    }
    return Status::Ok();
  }

  // The group of `cursor` (taken), as trained now: never taken again.
  Taken Train(uint64_t cursor) {
    auto node = taken_.extract(cursor);
    trained_.insert(cursor);
    return std::move(node.mapped());
  }

  // Groups delivered twice since the last call.
  int64_t TakeDuplicates() { return std::exchange(duplicates_, 0); }

 private:
  tq::TransferQueueClient& client_;
  const int64_t G_;
  const std::function<bool(uint64_t)> lose_;  // RunHooks::lose_taken_group
  tq::GetMetaRequest request_;
  std::map<uint64_t, Taken> taken_;
  std::set<uint64_t> trained_;
  int64_t duplicates_ = 0;
};

}  // namespace

TrainerRole::Options TrainerRole::Options::From(const RunOptions& run) {
  const RlOptions& rl = run.rl;
  const PipelineOptions& po = run.pipeline;
  Options o;
  o.prompts_per_step = rl.prompts_per_step;
  o.group_size = rl.group_size;
  o.steps = rl.steps;
  o.dynamic_sampling = rl.dynamic_sampling;
  o.mini_batches = rl.trainer.mini_batches;
  o.sync_interval = po.sync_interval;
  o.train_order = po.train_order;
  o.lease_seconds = po.lease_seconds;
  o.replicas = po.AllRolloutReplicas();
  o.lending = po.Lending();
  o.trainer_threads = po.trainer_threads;
  o.rollout_threads = po.rollout_threads;
  o.run_dir = run.run_dir;
  return o;
}

TrainerRole::TrainerRole(Options options, Wiring wiring) : o_(std::move(options)), w_(std::move(wiring)) {}

Status TrainerRole::Run() {
  if (w_.learner == nullptr || w_.hub == nullptr || w_.health == nullptr) {
    return Status::InvalidArgument("the trainer role needs its learner, hub and health");
  }
  trainer::DataParallelGroup* ranks = w_.learner->ranks();
  if (ranks != nullptr && ranks->rank() > 0) return Follow();
  if (w_.weights == nullptr) return Status::InvalidArgument("trainer rank 0 needs a weight publisher");
  return Lead();
}

namespace {

// A step's groups as taken, in prompt order, and what the step's record
// says of them (rewards, lengths, staleness); the groups with signal are
// trained.
struct StepGroupsTaken {
  std::map<uint64_t, std::vector<trainer::RolloutSample>> kept;  // by prompt cursor
  std::map<uint64_t, std::vector<tq::RowId>> rows;
  std::vector<tq::LeaseId> leases;
  std::vector<std::string> trajectories;  // agent runs: every sample's summary, kept or dropped
};

StepGroupsTaken Summarize(StepGroups& groups_in, const std::vector<uint64_t>& step_cursors, PolicyVersion version,
                          bool dynamic_sampling, int64_t group_size, StepRecord* rec) {
  StepGroupsTaken out;
  double reward_sum = 0, correct = 0, len_sum = 0, stale_sum = 0, token_stale_sum = 0, tokens = 0;
  for (uint64_t cursor : step_cursors) {
    StepGroups::Taken taken = groups_in.Train(cursor);
    std::vector<trainer::RolloutSample> group = std::move(taken.group);
    out.rows[cursor] = std::move(taken.rows);
    out.leases.push_back(taken.lease);
    rec->prompts.push_back(static_cast<uint64_t>(group.front().group_id));  // as the rows say, not as the loop expects
    for (const trainer::RolloutSample& smp : group) {
      if (!smp.trajectory.empty()) out.trajectories.push_back(smp.trajectory);
      reward_sum += smp.reward;
      correct += smp.reward >= 1.0 ? 1.0 : 0.0;
      len_sum += static_cast<double>(smp.response.size());
      rec->response_len_max = std::max<int64_t>(rec->response_len_max, static_cast<int64_t>(smp.response.size()));
      rec->generated_tokens +=
          smp.versions.empty() ? static_cast<int64_t>(smp.response.size())
                               : std::count_if(smp.versions.begin(), smp.versions.end(), [](auto v) { return v >= 0; });
      const int64_t stale = version - trainer::OldestSampledVersion(smp, version);
      stale_sum += static_cast<double>(stale);
      if (stale >= 0) {
        if (rec->staleness_hist.size() <= static_cast<size_t>(stale)) rec->staleness_hist.resize(stale + 1, 0);
        ++rec->staleness_hist[static_cast<size_t>(stale)];
      }
      rec->staleness_max = std::max(rec->staleness_max, stale);
      for (int64_t v : smp.versions) {
        if (v < 0) continue;  // an environment's token
        token_stale_sum += static_cast<double>(version - v);
        tokens += 1;
      }
    }
    const bool all_equal =
        std::all_of(group.begin(), group.end(), [&](const auto& x) { return x.reward == group.front().reward; });
    if (dynamic_sampling && all_equal) continue;
    out.kept.emplace(cursor, std::move(group));
  }
  const double total = static_cast<double>(step_cursors.size()) * static_cast<double>(group_size);
  rec->reward_mean = reward_sum / total;
  rec->accuracy = correct / total;
  rec->response_len_mean = len_sum / total;
  rec->staleness_mean = stale_sum / total;
  rec->token_staleness_mean = tokens > 0 ? token_stale_sum / tokens : 0;
  rec->groups_kept = static_cast<int64_t>(out.kept.size());
  return out;
}

// Trains the kept groups in prompt order (so sync mode trains exactly the
// batch the direct loop trains), telling the other ranks the plan.
Status TrainLed(const TrainerRole::Options& o_, const TrainerRole::Wiring& w_, StepGroupsTaken& step, StepRecord* rec) {
  TrainerRole::Learner& learner = *w_.learner;
  std::vector<trainer::RolloutSample> samples;
  StepPlan plan;  // for the other trainer ranks
  plan.step = rec->step;
  for (auto& [cursor, group] : step.kept) {
    const std::vector<tq::RowId>& rows = step.rows.at(cursor);
    for (size_t g = 0; g < group.size(); ++g) {
      plan.entries.push_back({rows[g], group[g].id, group[g].group_id, group[g].reward});
      samples.push_back(std::move(group[g]));
    }
  }
  if (w_.hooks.inspect_batch) w_.hooks.inspect_batch(rec->step, samples);
  RoleDoing doing(*w_.health, PipelineRole::kTrainer, RoleActivity::kTrainStep);
  trainer::DataParallelGroup* ranks = learner.ranks();
  const bool several = ranks != nullptr && ranks->size() > 1;
  // Rank 0's shard, as the trainer takes it (Trainer::Step: DataParallelShard).
  std::vector<tq::RowId> own;
  for (const auto& mini :
       trainer::DataParallelShard(plan.entries.size(), o_.mini_batches, 0, several ? ranks->size() : 1)) {
    for (size_t i : mini) own.push_back(plan.entries[i].row);
  }
  SLUICE_RETURN_IF_ERROR(RecordShard(o_.run_dir, rec->step, 0, own));
  if (several) SLUICE_RETURN_IF_ERROR(ranks->SetShared(StepPlanKey(rec->step), plan.Encode()));
  SLUICE_RETURN_IF_ERROR(learner.Train(samples, rec));
  // Every rank has read the plan once the update is done (it is a
  // collective); a step with nothing to train leaves its header-only plan
  // in the store (nothing tells when the others have read it).
  if (several && !samples.empty()) SLUICE_RETURN_IF_ERROR(ranks->DeleteShared(StepPlanKey(rec->step)));
  return Status::Ok();
}

}  // namespace

Status TrainerRole::Lead() {
  Learner& learner = *w_.learner;
  tq::TransferQueueClient& hub = *w_.hub;
  RunHealth& health = *w_.health;
  const int64_t P = o_.prompts_per_step;
  // Core lending: the trainer's extra micro-batch workers run on the
  // rollout's cores, only while the rollout has nothing to decode.
  trainer::Trainer& model_trainer = learner.trainer();
  struct RestoreWorkers {
    trainer::Trainer& t;
    int32_t n;
    ~RestoreWorkers() { (void)t.SetMicroBatchWorkers(n, nullptr); }
  } restore{model_trainer, model_trainer.options().micro_batch_threads};
  if (o_.lending) {
    const int32_t own = o_.trainer_threads;
    auto may_run = [&health, own](int32_t w) { return w < own || health.EnterLentCore(); };
    auto done_running = [&health, own](int32_t w) {
      if (w >= own) health.LeaveLentCore();
    };
    SLUICE_RETURN_IF_ERROR(model_trainer.SetMicroBatchWorkers(own + o_.rollout_threads, may_run, done_running));
  }
  TraceThisThread(PipelineRole::kTrainer, "trainer");
  RolloutMeter meter(health, o_.replicas, Clock::now());
  StepGroups groups_in(hub, o_.group_size, std::chrono::seconds(o_.lease_seconds), o_.lease_holder,
                       w_.hooks.lose_taken_group);
  while (learner.step() < o_.steps) {
    health.Beat(PipelineRole::kTrainer);
    StepRecord rec;
    rec.step = learner.step() + 1;
    rec.total_steps = o_.steps;
    rec.version = learner.version();
    if (auto stats = hub.Stats(); stats.ok()) {
      for (const auto& task : stats->controller.tasks) {
        if (task.task == kTrainTask) rec.queue_ready = static_cast<int64_t>(task.ready);
      }
    }
    // Take P whole groups: in the order they complete, or (prompt order) the
    // step's own prompts step*P .. +P-1, keeping groups of later prompts
    // that complete first for their step.
    const auto t0 = Clock::now();
    std::vector<uint64_t> step_cursors;
    if (o_.train_order == TrainOrder::kPrompt) {
      for (int64_t k = 0; k < P; ++k) step_cursors.push_back(static_cast<uint64_t>(learner.step() * P + k));
    }
    {
      RoleDoing waiting(health, PipelineRole::kTrainer, RoleActivity::kWaitForGroups);
      SLUICE_RETURN_IF_ERROR(groups_in.TakeStep(o_.train_order, P, &step_cursors, [&]() -> Status {
        // While the hub's GetMeta is blocked the hub shows the trainer's
        // demand and the rollout admits nothing past this step.
        if (health.StopRequested()) return Status::Aborted("the run was stopped");
        health.Beat(PipelineRole::kTrainer);
        return w_.check ? w_.check() : Status::Ok();
      }));
    }
    StepGroupsTaken step =
        Summarize(groups_in, step_cursors, learner.version(), o_.dynamic_sampling, o_.group_size, &rec);
    const auto t1 = Clock::now();
    rec.wait_seconds = std::chrono::duration<double>(t1 - t0).count();
    rec.duplicate_groups = groups_in.TakeDuplicates();
    if (!step.trajectories.empty()) SLUICE_RETURN_IF_ERROR(CountAgentStep(step.trajectories, &rec));
    SLUICE_RETURN_IF_ERROR(TrainLed(o_, w_, step, &rec));
    const int64_t trained = learner.step() + 1;
    const bool publish = trained % o_.sync_interval == 0 || trained == o_.steps;
    learner.Advance(trained, learner.version() + (publish ? 1 : 0));
    if (publish) {
      RoleDoing doing(health, PipelineRole::kTrainer, RoleActivity::kPublish);
      SLUICE_ASSIGN_OR_RETURN(TensorMap weights, learner.Weights());
      if (w_.hooks.rewrite_published) w_.hooks.rewrite_published(learner.version(), &weights);
      SLUICE_RETURN_IF_ERROR(w_.weights->Publish(learner.version(), weights));
    }
    TraceRecorder::Global().Counter("weight version", TraceNowUs(), static_cast<double>(learner.version()));
    health.RecordTrainer(learner.step(), learner.version());
    // Published, recorded, then acked: the rollout's admission reads the
    // record (TrainerRecord) as the trainer's progress.
    SLUICE_RETURN_IF_ERROR(WriteTrainerRecord(hub, {learner.step(), learner.version()}));
    {
      RoleDoing acking(health, PipelineRole::kTrainer, RoleActivity::kAck);
      for (tq::LeaseId lease : step.leases) {
        auto acked = hub.Ack(lease);
        if (!acked.ok() && acked.status().code() != StatusCode::kFailedPrecondition) return acked.status();
        if (!acked.ok()) {
          // The lease ran out (pipeline.lease_seconds) and the hub may deliver
          // the group again; it is trained once (StepGroups).
          SLUICE_LOG(WARNING) << "trained a group whose lease had ended: " << acked.status().ToString();
        }
      }
    }
    const auto t2 = Clock::now();
    rec.train_seconds = std::chrono::duration<double>(t2 - t1).count();
    meter.Record(t2, &rec);
    SLUICE_RETURN_IF_ERROR(learner.FinishStep(rec));
  }
  return Status::Ok();
}

Status TrainerRole::Follow() {
  Learner& learner = *w_.learner;
  trainer::DataParallelGroup& ranks = *learner.ranks();
  RunHealth& health = *w_.health;
  const HealthSlot slot = o_.slot;
  // For the launcher's watchdog: beats, and what the rank is doing (RoleDoing,
  // also the rank's spans in the run's trace, a row of the trainer's track).
  auto beat = [&] { health.Beat(slot); };
  TraceThisThread(PipelineRole::kTrainer, "trainer rank " + std::to_string(ranks.rank()));
  struct Finished {
    RunHealth& health;
    HealthSlot slot;
    ~Finished() { health.Finished(slot); }
  } finished{health, slot};
  while (learner.step() < o_.steps) {
    const int64_t step = learner.step() + 1;
    // Rank 0 may wait minutes for the step's groups: poll, watching for a stop.
    Result<std::string> bytes = Status::Timeout("");
    {
      RoleDoing waiting(health, slot, RoleActivity::kWaitForPlan);
      while (bytes.status().code() == StatusCode::kTimeout) {
        beat();
        if (health.StopRequested()) return Status::Aborted("the run was stopped");
        if (ranks.GetShared(kRanksEndedKey, std::chrono::milliseconds(0)).ok()) {
          return Status::Aborted("the run ended before step " + std::to_string(step) + " (rank 0's launcher says)");
        }
        bytes = ranks.GetShared(StepPlanKey(step), std::chrono::seconds(1));
      }
    }
    SLUICE_RETURN_IF_ERROR(bytes.status());
    SLUICE_ASSIGN_OR_RETURN(StepPlan plan, StepPlan::Decode(*bytes, step));
    std::vector<trainer::RolloutSample> samples(plan.entries.size());
    for (size_t i = 0; i < samples.size(); ++i) {
      samples[i].id = plan.entries[i].id;
      samples[i].group_id = plan.entries[i].group;
      samples[i].reward = plan.entries[i].reward;
    }
    // This rank's shard, straight from the hub's storage (the rows stay
    // leased by rank 0 until the update is published).
    tq::BatchMeta mine;
    mine.columns = RecordColumns<AnswerTokens>();
    std::vector<size_t> shard;
    for (const auto& mini : trainer::DataParallelShard(samples.size(), o_.mini_batches, ranks.rank(), ranks.size())) {
      shard.insert(shard.end(), mini.begin(), mini.end());
    }
    for (size_t i : shard) mine.rows.push_back({plan.entries[i].row, {}});
    std::vector<tq::RowId> own;  // the rows this rank reads and trains
    for (const tq::RowMeta& row : mine.rows) own.push_back(row.id);
    SLUICE_RETURN_IF_ERROR(RecordShard(o_.run_dir, step, ranks.rank(), own));
    beat();
    if (!shard.empty()) {
      RoleDoing reading(health, slot, RoleActivity::kReadShard);
      SLUICE_ASSIGN_OR_RETURN(tq::BatchData data, w_.hub->GetData(mine));
      for (size_t j = 0; j < shard.size(); ++j) {
        SLUICE_ASSIGN_OR_RETURN(AnswerTokens tokens, DecodeRecord<AnswerTokens>(data, j));
        MoveAnswerTokens(std::move(tokens), &samples[shard[j]]);
      }
    }
    StepRecord rec;  // the metrics are rank 0's to write
    rec.step = step;
    beat();
    {
      RoleDoing training(health, slot, RoleActivity::kTrainStep);
      SLUICE_RETURN_IF_ERROR(learner.Train(samples, &rec));
    }
    beat();
    learner.Advance(step, learner.version());
  }
  return Status::Ok();
}

}  // namespace sluice::pipeline
