// The rollout, reward and trainer roles of the streaming modes; see
// stream_roles.h. The wiring (threads or processes) is in stream_train.cc
// and stream_launch.cc.
#include "stream_roles.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "hub_records.h"
#include "sluice/common/file_util.h"
#include "sluice/common/logging.h"
#include "sluice/common/mutex.h"
#include "sluice/common/trace.h"
#include "sluice/schedule/intake.h"

namespace sluice::pipeline {

using std::chrono::milliseconds;

namespace {

constexpr auto kPoll = milliseconds(50);
// How often an idle engine looks again for prompts to admit.
constexpr auto kIdlePoll = milliseconds(2);

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

  StepGroups(tq::TransferQueueClient& client, std::vector<std::string> columns, int64_t G, std::chrono::seconds lease,
             const std::string& holder, std::function<bool(uint64_t)> lose)
      : client_(client), G_(G), lose_(std::move(lose)) {
    request_.task = kTrainTask;
    request_.columns = std::move(columns);
    request_.n = static_cast<uint32_t>(G);
    request_.partition = kRolloutPartition;
    request_.policy.mode = tq::SamplingMode::kWholeGroup;
    request_.timeout = kPoll;
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
        SLUICE_ASSIGN_OR_RETURN(const HostTensor* answer, Cell(data, column::kAnswerIndex, i));
        SLUICE_ASSIGN_OR_RETURN(const int32_t g, TensorScalar<int32_t>(*answer, DType::kI32, column::kAnswerIndex));
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
        SLUICE_RETURN_IF_ERROR(ReadAnswerTokens(data, i, &smp));
        SLUICE_ASSIGN_OR_RETURN(const HostTensor* reward, Cell(data, column::kReward, i));
        SLUICE_ASSIGN_OR_RETURN(smp.reward, TensorScalar<float>(*reward, DType::kF32, column::kReward));
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
Result<std::optional<tq::BatchData>> ReadLeasedRows(tq::TransferQueueClient& client, const tq::BatchMeta& meta,
                                                    std::chrono::seconds lease, const char* who) {
  Result<tq::BatchData> data = client.GetData(meta);
  if (data.ok()) return std::optional<tq::BatchData>(std::move(*data));
  if (data.status().code() != StatusCode::kNotFound) return data.status();
  Result<tq::RenewResponse> held = client.Renew(meta.lease_id, lease);
  if (held.ok()) return data.status();  // still held: a real loss
  if (held.status().code() != StatusCode::kFailedPrecondition) return held.status();
  SLUICE_LOG(WARNING) << who << ": dropped " << meta.rows.size()
                      << " row(s) whose lease ran out before they were read (a pause longer than " << lease.count()
                      << " s?): " << held.status().message();
  return std::optional<tq::BatchData>();
}

int32_t TraceTrack(PipelineRole role) { return static_cast<int32_t>(role) + 1; }

void TraceThisThread(PipelineRole role, const std::string& thread_name) {
  TraceRecorder& trace = TraceRecorder::Global();
  trace.SetThreadTrack(TraceTrack(role), PipelineRoleName(role));
  trace.NameThread(thread_name);
}

std::string StreamRoles::TracePart(const TrainingRun::State& s, const std::string& part) {
  return (fs::path(s.options.run_dir) / "roles" / ("trace-" + part + ".jsonl")).string();
}

Status StreamRoles::StartTrace(const TrainingRun::State& s, const std::string& part) {
  if (!s.options.trace) return Status::Ok();
  std::error_code ec;
  fs::create_directories(fs::path(s.options.run_dir) / "roles", ec);
  return TraceRecorder::Global().Start(TracePart(s, part)).WithContext("run.trace");
}

void StreamRoles::FinishTrace(const TrainingRun::State& s, const std::vector<std::string>& parts) {
  if (!s.options.trace) return;
  if (Status done = TraceRecorder::Global().Finish(); !done.ok())
    SLUICE_LOG(WARNING) << "run.trace: " << done.ToString();
  std::vector<std::string> paths;
  for (const std::string& part : parts) paths.push_back(TracePart(s, part));
  const std::string out = (fs::path(s.options.run_dir) / "trace.json").string();
  Result<int64_t> events = FinishTraceFile(paths, out);
  if (!events.ok()) {
    SLUICE_LOG(WARNING) << "run.trace: " << events.status().ToString();
    return;
  }
  for (const std::string& path : paths) std::remove(path.c_str());
  SLUICE_LOG(INFO) << "trace: " << out << " (" << *events << " events; open it in ui.perfetto.dev)";
}

Result<std::unique_ptr<MetricsServer>> StreamRoles::ServeMetrics(const TrainingRun::State& s, RunHealth& health,
                                                                 tq::TransferQueueClient& hub,
                                                                 const std::vector<RoleProcess>& processes,
                                                                 const tq::TransferQueueServer* hub_server) {
  if (s.options.metrics_listen.empty()) return std::unique_ptr<MetricsServer>();
  for (const RoleProcess& p : processes) health.Label(p.slot, p.role, p.index);
  auto render = [&health, &hub, hub_server]() {
    std::string out;
    auto metric = [&out](const char* name, const char* type, const char* help) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    };
    auto value = [&out](const std::string& series, double v) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), " %.17g\n", v);
      out += series + buf;
    };
    metric("sluice_trainer_step", "gauge", "RL steps trained");
    value("sluice_trainer_step", static_cast<double>(health.trainer_step()));
    metric("sluice_weight_version", "gauge", "the newest weight version the trainer published");
    value("sluice_weight_version", static_cast<double>(health.trainer_version()));
    metric("sluice_rollout_tokens_total", "counter", "tokens generated (trained or not)");
    value("sluice_rollout_tokens_total", static_cast<double>(health.rollout().tokens));
    metric("sluice_rollout_busy_seconds_total", "counter", "time the rollout spent decoding");
    value("sluice_rollout_busy_seconds_total", static_cast<double>(health.rollout().busy_us) / 1e6);
    metric("sluice_rollout_idle", "gauge", "1 while the rollout has nothing to decode");
    value("sluice_rollout_idle", health.rollout_idle() ? 1.0 : 0.0);
    metric("sluice_reward_errors_total", "counter", "answers a reward.python function failed on");
    value("sluice_reward_errors_total", static_cast<double>(health.reward_errors()));
    // Per role process (trainer rank, rollout replica, reward worker; hub
    // storage ranks too), as labelled in the run health (those elsewhere once the
    // launcher knows them).
    std::vector<std::pair<int, std::string>> labelled;  // (slot, labels)
    for (int slot = 0; slot < RunHealth::kSlots; ++slot) {
      const std::optional<RunHealth::SlotLabel> p = health.LabelOf(slot);
      if (!p) continue;
      const std::string role = p->hub_storage ? "hub_storage" : PipelineRoleName(p->role);
      labelled.emplace_back(slot, "role=\"" + role + "\",index=\"" + std::to_string(p->index) + "\"");
    }
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    metric("sluice_role_seconds_since_progress", "gauge", "since the role's process last went round its loop");
    for (const auto& [slot, labels] : labelled) {
      const int64_t beat = health.Slot(slot).beat_ns;
      if (beat > 0) value("sluice_role_seconds_since_progress{" + labels + "}", static_cast<double>(now - beat) / 1e9);
    }
    metric("sluice_role_activity", "gauge", "1 for what the role's process is doing now");
    for (const auto& [slot, labels] : labelled) {
      value("sluice_role_activity{" + labels + ",activity=\"" + health.DescribeActivity(slot) + "\"}", 1);
    }
    if (hub_server != nullptr) {
      const tq::ServerCounters c = hub_server->counters();
      metric("sluice_hub_requests_total", "counter", "the role processes' requests to the hub, by the path they took");
      value("sluice_hub_requests_total{path=\"ring\"}", static_cast<double>(c.ring_requests));
      value("sluice_hub_requests_total{path=\"direct\"}", static_cast<double>(c.direct_requests));
      value("sluice_hub_requests_total{path=\"socket\"}",
            static_cast<double>(c.requests - c.ring_requests - c.direct_requests));
    }
    Result<tq::QueueStats> stats = hub.Stats();
    if (stats.ok()) {
      metric("sluice_hub_rows", "gauge", "rows alive in the hub, by consuming task and state");
      for (const tq::TaskDepth& t : stats->controller.tasks) {
        const std::string task = "task=\"" + t.task + "\"";
        value("sluice_hub_rows{" + task + ",state=\"ready\"}", static_cast<double>(t.ready));
        value("sluice_hub_rows{" + task + ",state=\"leased\"}", static_cast<double>(t.leased));
        value("sluice_hub_rows{" + task + ",state=\"acked\"}", static_cast<double>(t.acked));
      }
      metric("sluice_hub_acked_rows_total", "counter", "rows each task has acked");
      for (const tq::TaskDepth& t : stats->controller.tasks) {
        value("sluice_hub_acked_rows_total{task=\"" + t.task + "\"}", static_cast<double>(t.acked_total));
      }
    }
    return out;
  };
  MetricsServerOptions serving;
  serving.allow_non_loopback = s.options.metrics_allow_non_loopback;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<MetricsServer> server,
                          MetricsServer::Start(s.options.metrics_listen, render, serving));
  SLUICE_LOG(INFO) << "live counters: " << server->url();
  return server;
}

Result<bool> StreamRoles::RoleDone(const TrainingRun::State& s, tq::TransferQueueClient& client, PipelineRole role) {
  const RlOptions& rl = s.options.rl;
  const uint64_t prompts = static_cast<uint64_t>((rl.steps - s.step) * rl.prompts_per_step);
  SLUICE_ASSIGN_OR_RETURN(const HubDepths depths, ReadHubDepths(client));
  switch (role) {
    case PipelineRole::kRollout:
      return depths.rollout.acked_total >= prompts;
    case PipelineRole::kReward:
      return AllScored(depths, prompts);
    case PipelineRole::kTrainer:
      break;
  }
  return false;
}

Status StreamRoles::FeedPrompts(const TrainingRun::State& s, tq::TransferQueueClient& client, RunHealth& health,
                                const std::function<bool()>& stopping) {
  const RlOptions& rl = s.options.rl;
  const PipelineOptions& po = s.options.pipeline;
  const int64_t P = rl.prompts_per_step;
  const uint64_t n = s.task->size(reward::Split::kTrain);
  const uint64_t start = static_cast<uint64_t>(s.step * P), end = static_cast<uint64_t>(rl.steps * P);
  // Admission lets the rollout hold fewer than (max_staleness + 1) versions'
  // prompts beyond what the trainer retired. The trainer retires only
  // prompts whose answers are all in the hub, but the rollout acks its
  // prompts a batch at a time (up to 2 x slots / G prompts), so what it has
  // acked may trail that by a batch (a batch per replica): one more version
  // and those batches more are written ahead, and admitted prompts are
  // always in the hub. (Replicas that join the run count from when they do.)
  auto window = [&] {
    const int64_t replicas = po.AllRolloutReplicas() + health.joined_rollout_replicas();
    return static_cast<uint64_t>((po.EffectiveMaxStaleness() + 2) * P * po.sync_interval +
                                 std::max<int64_t>(1, replicas) * (2 * rl.rollout_slots / rl.group_size + 1));
  };
  TraceRecorder::Global().SetThreadTrack(0, "launcher");
  TraceRecorder::Global().NameThread("prompt feeder");
  for (uint64_t next = start; next < end;) {
    if (stopping() || health.StopRequested()) return Status::Ok();
    SLUICE_ASSIGN_OR_RETURN(tq::ControllerStats stats, client.controller()->Stats());
    uint64_t finished = 0;  // prompts whose answers are all in the hub
    for (const tq::TaskDepth& t : stats.tasks) {
      if (t.task == kRolloutTask) finished = t.acked_total;
    }
    const uint64_t until = std::min(end, start + finished + window());
    if (next >= until) {
      std::this_thread::sleep_for(kIdlePoll);
      continue;
    }
    std::vector<tq::RowTags> tags;
    tq::ColumnBatch cols;
    for (; next < until; ++next) {
      SLUICE_ASSIGN_OR_RETURN(reward::Example ex,
                              s.task->Get(reward::Split::kTrain, PermutedIndex(s.options.seed, next, n)));
      tq::RowTags t;
      t.group_id = static_cast<GroupId>(next);
      tags.push_back(t);
      const int64_t example = static_cast<int64_t>(ex.index);
      SLUICE_ASSIGN_OR_RETURN(const std::vector<model::TokenId> prompt, s.EncodePrompt(ex.prompt));
      cols[column::kPrompt].push_back(VectorTensor(DType::kI32, prompt));
      cols[column::kExample].push_back(HostTensor::Copy(DType::kI64, {}, &example, sizeof(example)));
      cols[column::kReferenceAnswer].push_back(
          HostTensor::Copy(DType::kU8, {static_cast<int64_t>(ex.answer.size())}, ex.answer.data(), ex.answer.size()));
    }
    TraceSpan span(RoleActivityName(RoleActivity::kPutPrompts), "launcher");
    SLUICE_RETURN_IF_ERROR(client.PutRows(kPromptPartition, std::move(tags), cols).status());
  }
  return Status::Ok();
}

Status StreamRoles::RunRollout(TrainingRun::State& s, tq::TransferQueueClient& client, const Rollout& r,
                               RunHealth& health, const std::function<bool()>& stopping) {
  const RlOptions& rl = s.options.rl;
  const PipelineOptions& po = s.options.pipeline;
  const int64_t P = rl.prompts_per_step, G = rl.group_size;
  const int32_t engines = std::max(1, po.rollout_engines);
  // Data-parallel engines share the admission and the prompts' intake (both
  // under `mu`) and the weights (one shared hook, so the standby buffer an
  // engine still reads is never refilled).
  const std::vector<rollout::WeightSwapHook> hooks =
      rollout::ShareWeightSwapHook(r.standby->Hook(), engines, s.version);
  schedule::IntakeOptions io;
  io.prompts_per_step = P;
  io.group_size = G;
  io.sync_interval = po.sync_interval;
  io.max_staleness = po.EffectiveMaxStaleness();
  io.version = s.version;
  io.start_step = s.step;  // (the trainer advances s.step in threads mode)
  io.steps = rl.steps;
  io.engines = engines;
  // Replicas share the hub's one prompt stream; so does a replica that may
  // be started again mid-run (by this launcher, or on another host by
  // whatever supervises it there). Then the stream's cursor is the hub's.
  io.replicas = std::max(1, po.AllRolloutReplicas());
  io.shared = po.processes && (po.max_restarts > 0 || po.remote_rollout_replicas > 0);
  const bool shared = io.Shared();
  SLUICE_ASSIGN_OR_RETURN(auto intake, schedule::PromptIntake::Create(io));
  Mutex mu;
  // Guarded by mu: the intake, and the prompts admitted but not yet taken
  // from the hub.
  int64_t owed = 0;
  // The trainer's progress, from the hub (under mu): its record (the steps
  // it trained and the newest version it published by then; the weights
  // here may be newer), and whether it waits for data now (it has taken
  // nothing yet, or its GetMeta is blocked); and the prompts every replica
  // has taken from the stream, and finished (all their answers in the hub,
  // whoever generated them).
  uint64_t prompts_done = 0;
  const uint64_t run_prompts = static_cast<uint64_t>(intake->end_cursor() - intake->cursor());
  // (From the attempt's start: no version known yet. A replica started
  // again mid-run serves a newer version than the records it reads first.)
  TrainerRecord trainer_record{io.start_step, 0};
  auto trainer_progress = [&]() -> Result<schedule::TrainerProgress> {
    SLUICE_ASSIGN_OR_RETURN(trainer_record, ReadTrainerRecord(client, trainer_record));
    SLUICE_ASSIGN_OR_RETURN(const HubDepths depths, ReadHubDepths(client));
    const tq::TaskDepth& train = depths.train;
    schedule::TrainerProgress p;
    p.trained_steps = trainer_record.step - io.start_step;
    p.latest_version = std::max(trainer_record.version, r.weights->latest_version());
    p.waiting = train.waiting > 0 || (train.leased == 0 && train.acked_total == 0);
    p.taken_prompts = static_cast<int64_t>(depths.rollout.acked_total + depths.rollout.leased);
    prompts_done = depths.rollout.acked_total;
    return p;
  };
  int64_t untaken = intake->end_cursor() - intake->cursor();  // prompts not yet taken from the hub; guarded by mu
  std::set<uint64_t> taken_before;                            // not shared: the prompts taken so far; guarded by mu
  tq::GetMetaRequest take;
  take.task = kRolloutTask;
  take.columns = {column::kPrompt, column::kExample, column::kReferenceAnswer};
  take.partition = kPromptPartition;
  // Held while generating, renewed every third of it: a replica that dies
  // leaves its prompts to the others after at most this.
  const auto lease = std::chrono::seconds(po.worker_lease_seconds);
  take.lease_timeout = lease;
  take.holder = s.lease_holder;
  std::atomic<int32_t> active{0};  // engines with something to decode
  std::atomic<bool> failed{false};
  struct IdleOnExit {
    RunHealth* health;
    ~IdleOnExit() { health->SetRolloutIdle(true); }
  } idle_on_exit{&health};

  auto run_engine = [&](int32_t e) -> Status {
    TraceThisThread(PipelineRole::kRollout, r.process + "engine " + std::to_string(e));
    if (po.rollout_threads > 0) SetIntraOpThreadsHere(std::max(1, po.rollout_threads / engines));
    rollout::EngineOptions eo;
    eo.num_slots = rl.rollout_slots / engines + (e < rl.rollout_slots % engines ? 1 : 0);
    eo.eos_token_id = s.tokenizer->eos_id();
    eo.switch_policy = po.switch_policy;
    SLUICE_ASSIGN_OR_RETURN(auto engine, rollout::RolloutEngine::Create({r.model, s.version}, eo));
    engine->SetWeightSwapHook(hooks[static_cast<size_t>(e)]);
    // This engine's share of the rollout's idle flag: idle when no engine has work.
    struct Busy {
      std::atomic<int32_t>& active;
      RunHealth& health;
      bool busy = false;
      void Set(bool b) {
        if (b != busy) active += b ? 1 : -1;
        busy = b;
        health.SetRolloutIdle(active.load() == 0);
      }
      ~Busy() { Set(false); }
    } busy{active, health};
    rollout::EngineStats seen;
    PolicyVersion traced_version = -1;
    // This engine's prompts in flight, as the hub gave them (what the reward
    // needs travels on with each answer), and the leases that hold them
    // (renewed while the engine lives): a lease is acked when every answer
    // of its prompts is in the hub, so the prompts of a rollout that dies
    // are delivered again. A prompt delivered again while in flight here
    // (its lease ran out) is not generated twice: its new lease is finished
    // with the first delivery's answers.
    struct InFlight {
      int64_t example = 0;
      HostTensor reference_answer;
      std::vector<tq::LeaseId> leases;
      int64_t answers_left = 0;
      bool decoding = false;  // a step has run since its answers were submitted
    };
    std::map<uint64_t, InFlight> in_flight;
    std::map<tq::LeaseId, int64_t> prompts_left;  // by lease
    // Prompts taken past what this engine may start yet (shared stream: the
    // other replicas took the ones admission counted on), by cursor: the
    // lowest start first, so a prompt the trainer waits for (one a dead
    // replica held, handed out again) never waits behind a later one.
    struct Parked {
      uint64_t cursor;
      std::vector<model::TokenId> prompt;
      int64_t example;
      HostTensor reference_answer;
      tq::LeaseId lease;
    };
    std::multimap<uint64_t, Parked> parked;
    auto renew_at = Clock::now() + lease / 3;
    // Keep what this engine holds, every third of the lease: a lease that
    // ran out regardless (a pause longer than the lease) is done with; its
    // prompts went back to the stream and whoever takes them finds the
    // answers written (its ack is refused and logged).
    auto renew_due = [&]() -> Status {
      if (Clock::now() < renew_at) return Status::Ok();
      renew_at = Clock::now() + lease / 3;
      for (const auto& [held, prompts] : prompts_left) {
        Result<tq::RenewResponse> renewed = client.Renew(held, lease);
        if (renewed.ok()) continue;
        if (renewed.status().code() != StatusCode::kFailedPrecondition) return renewed.status();
        SLUICE_LOG(WARNING) << "rollout: " << renewed.status().message();
      }
      return Status::Ok();
    };
    auto start_prompt = [&](Parked p) -> Status {
      if (auto it = in_flight.find(p.cursor); it != in_flight.end()) {
        it->second.leases.push_back(p.lease);
        return Status::Ok();
      }
      in_flight[p.cursor] = {p.example, std::move(p.reference_answer), {p.lease}, G, false};
      for (int64_t g = 0; g < G; ++g) {
        rollout::GenerationRequest req;
        req.id = p.cursor * static_cast<uint64_t>(G) + static_cast<uint64_t>(g);
        req.prompt = p.prompt;
        req.sampling = rl.sampling;
        req.sampling.seed = AnswerSeed(s.options.seed, P, G, p.cursor, g);
        if (s.hooks.forced_length) req.sampling.forced_length = s.hooks.forced_length(p.cursor, g);
        SLUICE_RETURN_IF_ERROR(engine->Submit(std::move(req)));
      }
      return Status::Ok();
    };
    auto peek_at = Clock::now();
    bool peeking = false;  // this turn takes one prompt past admission, to look
    // The trainer's progress, asked of the hub at most once a turn (parked
    // prompts, the intake and the prompts taken all use it; the engine's
    // version moves only in its step, after them).
    std::optional<schedule::TrainerProgress> progress_this_turn;
    auto progress_now = [&]() -> Result<schedule::TrainerProgress> {
      if (!progress_this_turn) {
        SLUICE_ASSIGN_OR_RETURN(schedule::TrainerProgress p, trainer_progress());
        progress_this_turn = p;
      }
      return *progress_this_turn;
    };
    // A prompt handed out again (its lease ran out, or its replica died)
    // whose answers are all in the hub, or were trained: done with, not
    // generated again (the answers would be written anew once the trainer
    // consumed the first ones, and reach it twice). Asked in this order: the
    // trainer publishes the version that trained a prompt before its ack
    // frees the answers, so answers gone are a prompt trained.
    auto answered_before = [&](uint64_t c) -> Result<bool> {
      SLUICE_ASSIGN_OR_RETURN(const schedule::TrainerProgress before, progress_now());
      if (static_cast<int64_t>(c) < intake->TrainedEnd(before.latest_version)) {
        SLUICE_LOG(INFO) << "rollout: prompt " << c << " was handed out again after it was trained";
        return true;
      }
      std::vector<std::string> keys;
      for (int64_t g = 0; g < G; ++g) keys.push_back(AnswerKey(c, g));
      Result<tq::KvBatch> there = client.KvGetBatch(kRolloutPartition, keys, {column::kAnswerIndex});
      if (!there.ok() && there.status().code() != StatusCode::kNotFound) return there.status();
      if (there.ok()) {
        SLUICE_LOG(INFO) << "rollout: prompt " << c << " was handed out again with all its answers in the hub";
        return true;
      }
      SLUICE_ASSIGN_OR_RETURN(const schedule::TrainerProgress now, trainer_progress());
      if (static_cast<int64_t>(c) < intake->TrainedEnd(now.latest_version)) {
        SLUICE_LOG(INFO) << "rollout: prompt " << c << " was handed out again after it was trained";
        return true;
      }
      return false;
    };
    // RunHooks::hold_for_switch: the prompts this engine has stopped for a
    // weight switch (each once).
    std::set<uint64_t> held;
    auto hold_for_switch = [&]() -> Status {
      if (!s.hooks.hold_for_switch || engine->num_waiting() > 0 || engine->num_running() == 0) return Status::Ok();
      std::optional<uint64_t> flagged;
      for (const auto& [c, prompt] : in_flight) {
        if (prompt.decoding && held.count(c) == 0 && s.hooks.hold_for_switch(c)) {
          flagged = c;
          break;
        }
      }
      if (!flagged) return Status::Ok();
      // Only while the steps the trainer's next version needs are all out of
      // this engine (else it would wait for answers held here).
      uint64_t lowest = in_flight.begin()->first;
      if (!parked.empty()) lowest = std::min(lowest, parked.begin()->first);
      int64_t trained_steps = 0;
      {
        MutexLock lock(&mu);
        SLUICE_ASSIGN_OR_RETURN(const schedule::TrainerProgress progress, progress_now());
        trained_steps = progress.trained_steps;
      }
      const int64_t needed_end = (io.start_step + trained_steps + std::max<int64_t>(1, po.sync_interval)) * P;
      if (static_cast<int64_t>(lowest) < needed_end) return Status::Ok();  // not yet: asked again next turn
      held.insert(*flagged);
      const PolicyVersion from = engine->policy_version();
      const auto give_up = Clock::now() + std::chrono::seconds(30);
      RoleDoing doing(health, r.slot, RoleActivity::kWaitAdmission, /*traced=*/false);
      while (engine->policy_version() == from && !engine->pending_version() && Clock::now() < give_up && !stopping() &&
             !health.StopRequested() && !failed.load()) {
        health.Beat(r.slot);
        SLUICE_RETURN_IF_ERROR(renew_due());
        SLUICE_RETURN_IF_ERROR(engine->PollWeights());
        std::this_thread::sleep_for(kIdlePoll);
      }
      if (engine->policy_version() == from && !engine->pending_version()) {
        SLUICE_LOG(WARNING) << "rollout: held the answers of prompt " << *flagged << " for a weight switch, and none "
                            << "came (hold_for_switch)";
      }
      return Status::Ok();
    };
    while (!stopping() && !health.StopRequested() && !failed.load()) {
      progress_this_turn.reset();
      health.Beat(r.slot);
      busy.Set(!engine->idle());
      SLUICE_RETURN_IF_ERROR(renew_due());
      // Keep about one batch of prompts waiting so freed slots refill at once.
      const int64_t queued = static_cast<int64_t>(engine->num_waiting()) + engine->num_running();
      struct Taken {
        tq::BatchMeta meta;
        tq::BatchData data;
      };
      std::vector<Taken> taken_now;  // this turn's prompts, a lease each
      {
        MutexLock lock(&mu);
        if (!shared && untaken == 0 && engine->idle()) return Status::Ok();  // every answer is in the hub
        // Parked prompts first, as far as the engine's version allows.
        if (!parked.empty()) {
          SLUICE_ASSIGN_OR_RETURN(const int64_t limit, intake->StartLimit(engine->policy_version(), progress_now));
          while (!parked.empty() && static_cast<int64_t>(parked.begin()->first) < limit) {
            SLUICE_RETURN_IF_ERROR(start_prompt(std::move(parked.begin()->second)));
            parked.erase(parked.begin());
          }
        }
        SLUICE_ASSIGN_OR_RETURN(const int64_t admitted,
                                intake->Take(eo.num_slots, queued, engine->policy_version(), progress_now));
        // Shared: what is admitted now (the count is the stream's, not ours to
        // owe). An engine with nothing to do looks at the stream's next prompt
        // regardless (every kPoll): the stream's cursor counts the prompts
        // taken, but prompts a dead replica held come back below it (the
        // lowest are handed out first), and admission alone would wait for
        // them forever. One it may not start goes straight back.
        owed = shared ? admitted : owed + admitted;
        peeking = false;
        if (shared && owed == 0 && engine->idle() && in_flight.empty() && Clock::now() >= peek_at) {
          peek_at = Clock::now() + kPoll;
          owed = 1;
          peeking = true;
        }
        // The admitted prompts, in order, from the hub's prompt partition,
        // one lease each: a prompt is acked the moment its last answer is in
        // the hub. (A lease of several would keep a finished prompt unacked
        // while the others generate; were this replica to die then, its
        // prompt would be generated again after the trainer consumed its
        // answers, and the group would reach the trainer twice.)
        if (owed > 0) {
          RoleDoing doing(health, r.slot, RoleActivity::kTakePrompts);
          take.n = 1;
          for (int64_t asked = owed; asked > 0; --asked) {
            auto got = client.GetMeta(take);
            if (!got.ok() && got.status().code() != StatusCode::kTimeout) return got.status();
            if (!got.ok()) break;  // none ready
            SLUICE_ASSIGN_OR_RETURN(std::optional<tq::BatchData> d, ReadLeasedRows(client, *got, lease, "rollout"));
            if (!d) continue;
            // A prompt handed out again (a lease that ran out) was admitted
            // and counted when first taken. (Shared: the stream counts.)
            const bool again = !shared && got->rows.size() == 1 &&
                               !taken_before.insert(static_cast<uint64_t>(got->rows[0].tags.group_id)).second;
            if (!again) {
              owed -= static_cast<int64_t>(got->rows.size());
              untaken -= static_cast<int64_t>(got->rows.size());
            }
            taken_now.push_back({std::move(*got), std::move(*d)});
          }
        }
        // (Take asked the hub just now: an idle engine always wants prompts.)
        if (shared && taken_now.empty() && engine->idle() && parked.empty() && in_flight.empty() &&
            prompts_done >= run_prompts) {
          return Status::Ok();  // every answer of the run is in the hub
        }
      }
      if (taken_now.empty() && engine->idle()) {
        RoleDoing doing(health, r.slot, RoleActivity::kWaitAdmission, /*traced=*/false);
        std::this_thread::sleep_for(kIdlePoll);
      }
      int64_t limit = std::numeric_limits<int64_t>::max();  // shared: the cursors this engine may start now
      if (shared && !taken_now.empty()) {
        MutexLock lock(&mu);
        SLUICE_ASSIGN_OR_RETURN(limit, intake->StartLimit(engine->policy_version(), progress_now));
      }
      for (const Taken& t : taken_now) {
        if (t.meta.rows.size() != 1) {
          return Status::DataLoss("the hub leased " + std::to_string(t.meta.rows.size()) + " prompts, asked for one");
        }
        const uint64_t c = static_cast<uint64_t>(t.meta.rows[0].tags.group_id);
        SLUICE_ASSIGN_OR_RETURN(const HostTensor* prompt_cell, Cell(t.data, column::kPrompt, 0));
        SLUICE_ASSIGN_OR_RETURN(std::vector<model::TokenId> prompt,
                                TensorVector<model::TokenId>(*prompt_cell, DType::kI32, column::kPrompt));
        SLUICE_ASSIGN_OR_RETURN(const HostTensor* example, Cell(t.data, column::kExample, 0));
        SLUICE_ASSIGN_OR_RETURN(const int64_t index, TensorScalar<int64_t>(*example, DType::kI64, column::kExample));
        SLUICE_ASSIGN_OR_RETURN(const HostTensor* reference, Cell(t.data, column::kReferenceAnswer, 0));
        if (prompt.empty()) return Status::DataLoss("prompt row of cursor " + std::to_string(c) + " has no tokens");
        if (peeking && static_cast<int64_t>(c) >= limit) {  // not one this engine may start: back it goes
          if (Result<tq::ReleaseResponse> back = client.Release(t.meta.lease_id);
              !back.ok() && back.status().code() != StatusCode::kFailedPrecondition) {
            return back.status();
          }
          continue;
        }
        if (in_flight.count(c) == 0) {
          bool done = false;
          {
            MutexLock lock(&mu);
            SLUICE_ASSIGN_OR_RETURN(done, answered_before(c));
          }
          if (done) {
            Result<tq::AckResponse> acked = client.Ack(t.meta.lease_id);
            if (!acked.ok() && acked.status().code() != StatusCode::kFailedPrecondition) return acked.status();
            continue;
          }
        }
        ++prompts_left[t.meta.lease_id];
        Parked p{c, std::move(prompt), index, *reference, t.meta.lease_id};
        if (static_cast<int64_t>(c) >= limit) {
          parked.emplace(c, std::move(p));
        } else {
          SLUICE_RETURN_IF_ERROR(start_prompt(std::move(p)));
        }
      }
      busy.Set(!engine->idle());
      // Lent cores come back before decoding: wait for the trainer's lent
      // workers to finish their micro-batches (bounded by one micro-batch).
      while (!engine->idle() && health.lent_workers_running() > 0 && !health.StopRequested() && !stopping()) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      SLUICE_RETURN_IF_ERROR(hold_for_switch());
      // A step on an idle engine still runs the weight-swap hook.
      const auto t0 = Clock::now();
      std::vector<rollout::GenerationResult> done;
      {
        // A step on an idle engine only runs the hook: not traced.
        RoleDoing doing(health, r.slot, RoleActivity::kDecodeStep, !engine->idle());
        SLUICE_ASSIGN_OR_RETURN(done, engine->Step());
      }
      if (s.hooks.hold_for_switch) {
        for (auto& [c, prompt] : in_flight) prompt.decoding = true;
      }
      if (engine->policy_version() != traced_version) {  // switched weights in that step
        traced_version = engine->policy_version();
        TraceRecorder::Global().Counter("serving version", TraceNowUs(), static_cast<double>(traced_version));
      }
      if (!engine->idle() || !done.empty()) {  // (summed over replicas)
        const int64_t busy_us =
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count() / engines;
        health.AddDecoding(r.replica, busy_us, 0);
      }
      const rollout::EngineStats& now = engine->stats();
      health.AddSlotSteps((now.decode_steps - seen.decode_steps) * eo.num_slots,
                          now.active_slot_steps - seen.active_slot_steps);
      seen = now;
      for (auto& res : done) {
        health.AddDecoding(r.replica, 0, static_cast<int64_t>(res.tokens.size()));
        const uint64_t c = res.id / static_cast<uint64_t>(G);
        auto prompt_it = in_flight.find(c);
        if (prompt_it == in_flight.end()) return Status::Internal("answer " + std::to_string(res.id) + " of no prompt");
        InFlight& prompt = prompt_it->second;
        tq::RowTags tags;
        tags.group_id = static_cast<GroupId>(c);
        tags.policy_version = res.versions.empty() ? engine->policy_version() : res.versions.front();
        tags.token_length = static_cast<int64_t>(res.tokens.size());
        const int32_t answer_index = static_cast<int32_t>(res.id % static_cast<uint64_t>(G));
        tq::ColumnBatch cols;
        cols[column::kPrompt] = {VectorTensor(DType::kI32, res.prompt)};
        cols[column::kResponse] = {VectorTensor(DType::kI32, res.tokens)};
        cols[column::kLogprobs] = {VectorTensor(DType::kF32, res.logprobs)};
        cols[column::kVersions] = {VectorTensor(DType::kI64, res.versions)};
        cols[column::kAnswerIndex] = {HostTensor::Copy(DType::kI32, {}, &answer_index, sizeof(answer_index))};
        cols[column::kExample] = {HostTensor::Copy(DType::kI64, {}, &prompt.example, sizeof(prompt.example))};
        cols[column::kReferenceAnswer] = {prompt.reference_answer};
        RoleDoing doing(health, r.slot, RoleActivity::kWriteAnswer);
        // Keyed by prompt and answer, so an answer is in the hub once: a
        // replica that died before acking its prompt may have written some
        // of them, and the one the prompt went to next finds them there.
        SLUICE_RETURN_IF_ERROR(WriteAnswerOnce(
            client, AnswerKey(c, answer_index), column::kResponse,
            [&] { return client.KvPutBatch(kRolloutPartition, {AnswerKey(c, answer_index)}, {tags}, cols); },
            [&] { return stopping() || health.StopRequested(); }, renew_due));
        // The prompt's last answer: done with it; a lease's last prompt: ack it.
        if (--prompt.answers_left > 0) continue;
        const std::vector<tq::LeaseId> leases = std::move(prompt.leases);
        in_flight.erase(prompt_it);
        for (tq::LeaseId lease : leases) {
          if (--prompts_left[lease] > 0) continue;
          prompts_left.erase(lease);
          if (s.hooks.lose_prompt_ack && s.hooks.lose_prompt_ack(c)) continue;
          Result<tq::AckResponse> acked = client.Ack(lease);
          if (!acked.ok() && acked.status().code() != StatusCode::kFailedPrecondition) return acked.status();
          // A lease that ran out: its prompts were handed out again, and
          // whoever took them finds these answers in the hub.
          if (!acked.ok()) SLUICE_LOG(WARNING) << "rollout: " << acked.status().message();
        }
      }
    }
    return Status::Ok();
  };

  if (engines == 1) return run_engine(0);
  std::vector<Status> results(static_cast<size_t>(engines));
  std::vector<std::thread> threads;
  for (int32_t e = 1; e < engines; ++e) {
    threads.emplace_back([&, e] {
      results[static_cast<size_t>(e)] = run_engine(e);
      if (!results[static_cast<size_t>(e)].ok()) failed.store(true);
    });
  }
  results[0] = run_engine(0);
  if (!results[0].ok()) failed.store(true);
  for (auto& t : threads) t.join();
  for (const Status& st : results) SLUICE_RETURN_IF_ERROR(st);
  return Status::Ok();
}

Status StreamRoles::RunReward(TrainingRun::State& s, tq::TransferQueueClient& client, RunHealth& health,
                              const std::function<bool()>& stopping, HealthSlot slot, const std::string& process) {
  // Every answer of the run is scored: by this process's loops, or (reward
  // workers, a restarted worker) by others, as the hub says. (The prompts
  // are counted now: in threads mode the trainer moves s.step on.)
  const uint64_t prompts = static_cast<uint64_t>((s.options.rl.steps - s.step) * s.options.rl.prompts_per_step);
  std::atomic<bool> all_scored{false};
  auto check_all_scored = [&]() -> Status {
    SLUICE_ASSIGN_OR_RETURN(const HubDepths depths, ReadHubDepths(client));
    if (AllScored(depths, prompts)) all_scored.store(true);
    return Status::Ok();
  };
  std::atomic<bool> failed{false};
  std::atomic<int64_t> errors_shown{0};  // of s.task's score errors, added to the run health
  const auto lease = std::chrono::seconds(s.options.pipeline.worker_lease_seconds);
  // One loop per answer the task scores at once (reward.python: its
  // workers); each leases one answer at a time.
  std::atomic<int> loop_ids{0};
  auto run_loop = [&]() -> Status {
    TraceThisThread(PipelineRole::kReward, process + "scorer " + std::to_string(loop_ids.fetch_add(1)));
    while (!all_scored.load() && !stopping() && !health.StopRequested() && !failed.load()) {
      health.Beat(slot);
      // What it scores comes from the hub: the answer, and the reference answer
      // the rollout wrote next to it (no lookup in the dataset).
      Result<tq::BatchMeta> meta = Status::Internal("not taken");
      {
        // Mostly waiting for answers: a span only when one came.
        const int64_t t0 = TraceNowUs();
        RoleDoing doing(health, slot, RoleActivity::kTakeAnswer, /*traced=*/false);
        tq::GetMetaRequest take;
        take.task = kRewardTask;
        take.columns = {column::kResponse, column::kExample, column::kReferenceAnswer, column::kAnswerIndex};
        take.n = 1;
        take.partition = kRolloutPartition;
        take.timeout = kPoll;
        take.lease_timeout = lease;
        take.holder = s.lease_holder;
        meta = client.GetMeta(take);
        if (meta.ok()) {
          TraceRecorder::Global().Complete(RoleActivityName(RoleActivity::kTakeAnswer), "reward", t0, TraceNowUs());
        }
      }
      if (!meta.ok()) {
        if (meta.status().code() != StatusCode::kTimeout) return meta.status();
        SLUICE_RETURN_IF_ERROR(check_all_scored());
        continue;
      }
      SLUICE_ASSIGN_OR_RETURN(std::optional<tq::BatchData> read, ReadLeasedRows(client, *meta, lease, "reward"));
      if (!read) continue;
      const tq::BatchData& data = *read;
      // Score sees the whole example, as in the direct loop and the
      // evaluator (its prompt, and whatever else the task's Score reads),
      // from this process's task by the index the hub carries; the reference
      // answer the hub carries must be that example's (else the prompt
      // feeder's task is not this worker's).
      SLUICE_ASSIGN_OR_RETURN(const HostTensor* example, Cell(data, column::kExample, 0));
      SLUICE_ASSIGN_OR_RETURN(int64_t index, TensorScalar<int64_t>(*example, DType::kI64, column::kExample));
      SLUICE_ASSIGN_OR_RETURN(const HostTensor* reference, Cell(data, column::kReferenceAnswer, 0));
      SLUICE_ASSIGN_OR_RETURN(std::vector<uint8_t> answer,
                              TensorVector<uint8_t>(*reference, DType::kU8, column::kReferenceAnswer));
      if (index < 0)
        return Status::DataLoss("reward: the hub's example index " + std::to_string(index) + " is negative");
      SLUICE_ASSIGN_OR_RETURN(reward::Example ex, s.task->Get(reward::Split::kTrain, static_cast<uint64_t>(index)));
      if (ex.answer != std::string_view(reinterpret_cast<const char*>(answer.data()), answer.size())) {
        return Status::DataLoss("reward: training example " + std::to_string(index) +
                                " has another reference answer in this worker's task than the prompt feeder wrote "
                                "to the hub: both must load the same task");
      }
      SLUICE_ASSIGN_OR_RETURN(const HostTensor* response, Cell(data, column::kResponse, 0));
      SLUICE_ASSIGN_OR_RETURN(std::vector<model::TokenId> tokens,
                              TensorVector<model::TokenId>(*response, DType::kI32, column::kResponse));
      const std::string text = model::DecodeKnown(*s.tokenizer, tokens);
      float reward = 0;
      {
        RoleDoing doing(health, slot, RoleActivity::kScore);
        reward = static_cast<float>(s.task->Score(ex, text));
      }
      // This process's new score errors onto the run health (which reward workers
      // share), each once: the count only grows, loops finish out of order.
      const int64_t errors = static_cast<int64_t>(s.task->score_errors());
      for (int64_t shown = errors_shown.load(); shown < errors;) {
        if (errors_shown.compare_exchange_weak(shown, errors)) {
          health.AddRewardErrors(errors - shown);
          break;
        }
      }
      tq::ColumnBatch cols;
      cols[column::kReward] = {HostTensor::Copy(DType::kF32, {}, &reward, sizeof(reward))};
      RoleDoing doing(health, slot, RoleActivity::kWriteReward);
      // An answer whose reward is written already: a worker that died before
      // its ack scored it (its lease ran out); the reward stands.
      SLUICE_ASSIGN_OR_RETURN(const HostTensor* answer_index, Cell(data, column::kAnswerIndex, 0));
      SLUICE_ASSIGN_OR_RETURN(const int32_t g, TensorScalar<int32_t>(*answer_index, DType::kI32, column::kAnswerIndex));
      auto renew_at = Clock::now() + lease / 3;
      SLUICE_RETURN_IF_ERROR(WriteAnswerOnce(
          client, AnswerKey(static_cast<uint64_t>(meta->rows[0].tags.group_id), g), column::kReward,
          [&] { return client.PutColumns(meta->row_ids(), cols); },
          [&] { return stopping() || health.StopRequested(); },
          [&]() -> Status {
            if (Clock::now() < renew_at) return Status::Ok();
            renew_at = Clock::now() + lease / 3;
            Result<tq::RenewResponse> renewed = client.Renew(meta->lease_id, lease);
            return renewed.ok() || renewed.status().code() == StatusCode::kFailedPrecondition ? Status::Ok()
                                                                                              : renewed.status();
          }));
      // A lease that ran out meanwhile (a pause longer than it): the answer
      // went back to the stream, and whoever scores it finds the reward.
      if (Result<tq::AckResponse> acked = client.Ack(meta->lease_id); !acked.ok()) {
        if (acked.status().code() != StatusCode::kFailedPrecondition) return acked.status();
        SLUICE_LOG(WARNING) << "reward: " << acked.status().message();
      }
    }
    return Status::Ok();
  };

  const int loops = std::max(1, s.task->max_parallel_scores());
  if (loops == 1) return run_loop();
  std::vector<Status> results(static_cast<size_t>(loops));
  std::vector<std::thread> threads;
  for (int i = 1; i < loops; ++i) {
    threads.emplace_back([&, i] {
      results[static_cast<size_t>(i)] = run_loop();
      if (!results[static_cast<size_t>(i)].ok()) failed.store(true);
    });
  }
  results[0] = run_loop();
  if (!results[0].ok()) failed.store(true);
  for (auto& t : threads) t.join();
  for (const Status& st : results) SLUICE_RETURN_IF_ERROR(st);
  return Status::Ok();
}

Status StreamRoles::RunTrainer(TrainingRun::State& s, tq::TransferQueueClient& client, const Trainer& t,
                               RunHealth& health, const std::function<Result<EvalResult>()>& evaluate,
                               const ProgressFn& progress) {
  const RlOptions& rl = s.options.rl;
  const PipelineOptions& po = s.options.pipeline;
  const int64_t P = rl.prompts_per_step, G = rl.group_size;

  // Core lending: the trainer's extra micro-batch workers run on the
  // rollout's cores, only while the rollout has nothing to decode.
  const int32_t own_workers = s.trainer->options().micro_batch_threads;
  struct RestoreWorkers {
    trainer::Trainer* t;
    int32_t n;
    ~RestoreWorkers() { (void)t->SetMicroBatchWorkers(n, nullptr); }
  } restore{s.trainer.get(), own_workers};
  if (po.Lending()) {
    const int32_t own = po.trainer_threads;
    auto may_run = [&health, own](int32_t w) {
      if (w < own) return true;
      return health.EnterLentCore();
      return false;
    };
    auto done_running = [&health, own](int32_t w) {
      if (w >= own) health.LeaveLentCore();
    };
    SLUICE_RETURN_IF_ERROR(s.trainer->SetMicroBatchWorkers(own + po.rollout_threads, may_run, done_running));
  }

  TraceThisThread(PipelineRole::kTrainer, "trainer");
  const auto run_start = Clock::now();
  RolloutMeter meter(health, po.AllRolloutReplicas(), run_start);
  SLUICE_ASSIGN_OR_RETURN(MetricsLog metrics, MetricsLog::Open(s.options.run_dir));
  const std::vector<std::string> columns = {column::kPrompt,   column::kResponse,    column::kLogprobs,
                                            column::kVersions, column::kAnswerIndex, column::kReward};
  StepGroups groups_in(client, columns, G, std::chrono::seconds(po.lease_seconds), s.lease_holder,
                       s.hooks.lose_taken_group);
  while (s.step < rl.steps) {
    health.Beat(PipelineRole::kTrainer);
    StepRecord rec;
    rec.step = s.step + 1;
    rec.total_steps = rl.steps;
    rec.version = s.version;
    if (auto stats = client.Stats(); stats.ok()) {
      for (const auto& task : stats->controller.tasks) {
        if (task.task == kTrainTask) rec.queue_ready = static_cast<int64_t>(task.ready);
      }
    }
    // Take P whole groups: in the order they complete, or (prompt order) the
    // step's own prompts s.step*P .. +P-1, keeping groups of later prompts
    // that complete first for their step.
    const auto t0 = Clock::now();
    std::vector<uint64_t> step_cursors;
    if (po.train_order == TrainOrder::kPrompt) {
      for (int64_t k = 0; k < P; ++k) step_cursors.push_back(static_cast<uint64_t>(s.step * P + k));
    }
    {
      RoleDoing waiting(health, PipelineRole::kTrainer, RoleActivity::kWaitForGroups);
      SLUICE_RETURN_IF_ERROR(groups_in.TakeStep(po.train_order, P, &step_cursors, [&]() -> Status {
        // While the hub's GetMeta is blocked the hub shows the trainer's
        // demand and the rollout admits nothing past this step.
        if (health.StopRequested()) return Status::Aborted("the run was stopped");
        health.Beat(PipelineRole::kTrainer);
        return t.check ? t.check() : Status::Ok();
      }));
    }
    // The step's groups: metrics over all of them, training on those with signal.
    std::map<uint64_t, std::vector<trainer::RolloutSample>> groups;  // by prompt cursor
    std::map<uint64_t, std::vector<tq::RowId>> group_rows;
    std::vector<tq::LeaseId> step_leases;
    double reward_sum = 0, correct = 0, len_sum = 0, stale_sum = 0, token_stale_sum = 0, tokens = 0;
    for (uint64_t cursor : step_cursors) {
      StepGroups::Taken taken = groups_in.Train(cursor);
      std::vector<trainer::RolloutSample> group = std::move(taken.group);
      group_rows[cursor] = std::move(taken.rows);
      step_leases.push_back(taken.lease);
      rec.prompts.push_back(static_cast<uint64_t>(group.front().group_id));  // as the rows say, not as the loop expects
      for (const trainer::RolloutSample& smp : group) {
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
      const bool all_equal =
          std::all_of(group.begin(), group.end(), [&](const auto& x) { return x.reward == group.front().reward; });
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
    rec.duplicate_groups = groups_in.TakeDuplicates();
    // Train on the kept groups in prompt order (so sync mode trains exactly
    // the batch the direct loop trains).
    std::vector<trainer::RolloutSample> samples;
    StepPlan plan;  // for the other trainer ranks
    plan.step = rec.step;
    for (auto& [cursor, group] : groups) {
      const std::vector<tq::RowId>& rows = group_rows.at(cursor);
      for (size_t g = 0; g < group.size(); ++g) {
        plan.entries.push_back({rows[g], group[g].id, group[g].group_id, group[g].reward});
        samples.push_back(std::move(group[g]));
      }
    }
    if (s.hooks.inspect_batch) s.hooks.inspect_batch(rec.step, samples);
    {
      RoleDoing doing(health, PipelineRole::kTrainer, RoleActivity::kTrainStep);
      const bool ranks = s.data_parallel && s.data_parallel->size() > 1;
      // Rank 0's shard, as the trainer takes it (Trainer::Step: DataParallelShard).
      std::vector<tq::RowId> own;
      for (const auto& mini : trainer::DataParallelShard(plan.entries.size(), rl.trainer.mini_batches, 0,
                                                         ranks ? s.data_parallel->size() : 1)) {
        for (size_t i : mini) own.push_back(plan.entries[i].row);
      }
      SLUICE_RETURN_IF_ERROR(RecordShard(s.options.run_dir, rec.step, 0, own));
      if (ranks) SLUICE_RETURN_IF_ERROR(s.data_parallel->SetShared(StepPlanKey(rec.step), plan.Encode()));
      SLUICE_RETURN_IF_ERROR(s.TrainOnGroups(samples, &rec));
      // Every rank has read the plan once the update is done (it is a
      // collective); a step with nothing to train leaves its header-only
      // plan in the store (nothing tells when the others have read it).
      if (ranks && !samples.empty()) SLUICE_RETURN_IF_ERROR(s.data_parallel->DeleteShared(StepPlanKey(rec.step)));
    }
    ++s.step;
    if (s.step % po.sync_interval == 0 || s.step == rl.steps) {
      RoleDoing doing(health, PipelineRole::kTrainer, RoleActivity::kPublish);
      ++s.version;
      SLUICE_ASSIGN_OR_RETURN(TensorMap weights, model::ExportWeights(*s.policy));
      if (s.hooks.rewrite_published) s.hooks.rewrite_published(s.version, &weights);
      SLUICE_RETURN_IF_ERROR(t.weights->Publish(s.version, weights));
    }
    TraceRecorder::Global().Counter("weight version", TraceNowUs(), static_cast<double>(s.version));
    health.RecordTrainer(s.step, s.version);
    // Published, recorded, then acked: the rollout's admission reads the
    // record (TrainerRecord) as the trainer's progress.
    SLUICE_RETURN_IF_ERROR(WriteTrainerRecord(client, {s.step, s.version}));
    {
      RoleDoing acking(health, PipelineRole::kTrainer, RoleActivity::kAck);
      for (tq::LeaseId lease : step_leases) {
        auto acked = client.Ack(lease);
        if (!acked.ok() && acked.status().code() != StatusCode::kFailedPrecondition) return acked.status();
        if (!acked.ok()) {
          // The lease ran out (pipeline.lease_seconds) and the hub may deliver
          // the group again; it is trained once (see `trained`).
          SLUICE_LOG(WARNING) << "trained a group whose lease had ended: " << acked.status().ToString();
        }
      }
    }
    const auto t2 = Clock::now();
    rec.train_seconds = std::chrono::duration<double>(t2 - t1).count();
    meter.Record(t2, &rec);
    s.elapsed_total = s.elapsed_offset + std::chrono::duration<double>(Clock::now() - run_start).count();
    rec.elapsed_seconds = s.elapsed_total;
    // Roles as threads share one task, whose count has the reward role's
    // failures; as processes, the reward role's count comes through the run health.
    rec.reward_errors =
        static_cast<int64_t>(s.task->score_errors()) + (po.processes ? health.reward_errors() : int64_t{0});
    auto evaluate_traced = [&]() -> Result<EvalResult> {
      RoleDoing doing(health, PipelineRole::kTrainer, RoleActivity::kEvaluate);
      return evaluate();
    };
    SLUICE_RETURN_IF_ERROR(s.FinishStep(rec, metrics, evaluate_traced, progress));
  }
  return Status::Ok();
}

Status StreamRoles::FollowTrainer(TrainingRun::State& s, tq::TransferQueueClient& client, RunHealth& health,
                                  HealthSlot slot) {
  const RlOptions& rl = s.options.rl;
  trainer::DataParallelGroup& ranks = *s.data_parallel;
  const std::vector<std::string> columns = {column::kPrompt, column::kResponse, column::kLogprobs, column::kVersions};
  // For the launcher's watchdog: beats, and what the rank is doing (RoleDoing,
  // also the rank's spans in the run's trace, a row of the trainer's track).
  auto beat = [&] { health.Beat(slot); };
  TraceThisThread(PipelineRole::kTrainer, "trainer rank " + std::to_string(ranks.rank()));
  struct Finished {
    RunHealth& health;
    HealthSlot slot;
    ~Finished() { health.Finished(slot); }
  } finished{health, slot};
  while (s.step < rl.steps) {
    const int64_t step = s.step + 1;
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
    mine.columns = columns;
    std::vector<size_t> shard;
    for (const auto& mini :
         trainer::DataParallelShard(samples.size(), rl.trainer.mini_batches, ranks.rank(), ranks.size())) {
      shard.insert(shard.end(), mini.begin(), mini.end());
    }
    for (size_t i : shard) mine.rows.push_back({plan.entries[i].row, {}});
    std::vector<tq::RowId> own;  // the rows this rank reads and trains
    for (const tq::RowMeta& row : mine.rows) own.push_back(row.id);
    SLUICE_RETURN_IF_ERROR(RecordShard(s.options.run_dir, step, ranks.rank(), own));
    beat();
    if (!shard.empty()) {
      RoleDoing reading(health, slot, RoleActivity::kReadShard);
      SLUICE_ASSIGN_OR_RETURN(tq::BatchData data, client.GetData(mine));
      for (size_t j = 0; j < shard.size(); ++j) SLUICE_RETURN_IF_ERROR(ReadAnswerTokens(data, j, &samples[shard[j]]));
    }
    StepRecord rec;  // the metrics are rank 0's to write
    rec.step = step;
    beat();
    {
      RoleDoing training(health, slot, RoleActivity::kTrainStep);
      SLUICE_RETURN_IF_ERROR(s.TrainOnGroups(samples, &rec));
    }
    beat();
    ++s.step;
  }
  return Status::Ok();
}

}  // namespace sluice::pipeline
