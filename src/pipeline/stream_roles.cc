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

#include "agent_driver.h"
#include "hub_records.h"
#include "sluice/common/file_util.h"
#include "sluice/common/logging.h"
#include "sluice/common/mutex.h"
#include "sluice/common/trace.h"
#include "sluice/schedule/intake.h"

namespace sluice::pipeline {

using std::chrono::milliseconds;

namespace {

// How often the prompt feeder looks again for room.
constexpr auto kIdlePoll = milliseconds(2);

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
      PromptRecord record;
      SLUICE_ASSIGN_OR_RETURN(record.prompt, s.EncodePrompt(ex.prompt));
      record.example = static_cast<int64_t>(ex.index);
      if (s.options.agent.enabled()) record.row = AgentRow(ex);
      record.reference_answer = std::move(ex.answer);
      AppendRecord(record, &cols);
    }
    TraceSpan span(RoleActivityName(RoleActivity::kPutPrompts), "launcher");
    SLUICE_RETURN_IF_ERROR(client.PutRows(kPromptPartition, std::move(tags), cols).status());
  }
  return Status::Ok();
}

RolloutRole::Options StreamRoles::RolloutOptions(const TrainingRun::State& s) {
  RolloutRole::Options o = RolloutRole::Options::From(s.options, s.step, s.version);
  o.eos_id = s.tokenizer->eos_id();
  o.lease_holder = s.lease_holder;
  o.model = s.policy->config();
  return o;
}

RewardRole::Options StreamRoles::RewardOptions(const TrainingRun::State& s) {
  RewardRole::Options o = RewardRole::Options::From(s.options, s.step);
  o.lease_holder = s.lease_holder;
  return o;
}

Status RunLoops(int n, const std::function<Status(int)>& loop, std::atomic<bool>* failed) {
  if (n <= 1) return loop(0);
  std::vector<Status> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) {
    threads.emplace_back([&, i] {
      results[static_cast<size_t>(i)] = loop(i);
      if (!results[static_cast<size_t>(i)].ok()) failed->store(true);
    });
  }
  results[0] = loop(0);
  if (!results[0].ok()) failed->store(true);
  for (auto& t : threads) t.join();
  for (const Status& st : results) SLUICE_RETURN_IF_ERROR(st);
  return Status::Ok();
}

Result<std::unique_ptr<StreamRoles::RunLearner>> StreamRoles::RunLearner::Open(
    TrainingRun::State& s, RunHealth& health, std::function<Result<EvalResult>()> evaluate, ProgressFn progress) {
  SLUICE_ASSIGN_OR_RETURN(MetricsLog metrics, MetricsLog::Open(s.options.run_dir));
  return std::unique_ptr<RunLearner>(
      new RunLearner(s, health, std::move(evaluate), std::move(progress), std::move(metrics)));
}

std::unique_ptr<StreamRoles::RunLearner> StreamRoles::RunLearner::ForFollower(TrainingRun::State& s,
                                                                              RunHealth& health) {
  return std::unique_ptr<RunLearner>(new RunLearner(s, health, nullptr, nullptr, std::nullopt));
}

StreamRoles::RunLearner::RunLearner(TrainingRun::State& s, RunHealth& health,
                                    std::function<Result<EvalResult>()> evaluate, ProgressFn progress,
                                    std::optional<MetricsLog> metrics)
    : s_(s),
      health_(health),
      evaluate_(std::move(evaluate)),
      progress_(std::move(progress)),
      start_(Clock::now()),
      metrics_(std::move(metrics)) {}

StreamRoles::RunLearner::~RunLearner() = default;

int64_t StreamRoles::RunLearner::step() const { return s_.step; }
PolicyVersion StreamRoles::RunLearner::version() const { return s_.version; }

Status StreamRoles::RunLearner::Train(std::vector<trainer::RolloutSample>& samples, StepRecord* rec) {
  return s_.TrainOnGroups(samples, rec);
}

void StreamRoles::RunLearner::Advance(int64_t step, PolicyVersion version) {
  s_.step = step;
  s_.version = version;
}

Result<TensorMap> StreamRoles::RunLearner::Weights() { return model::ExportWeights(*s_.policy); }

Status StreamRoles::RunLearner::FinishStep(StepRecord& rec) {
  if (!metrics_) return Status::Internal("a trainer rank above 0 finished a step");
  s_.elapsed_total = s_.elapsed_offset + std::chrono::duration<double>(Clock::now() - start_).count();
  rec.elapsed_seconds = s_.elapsed_total;
  // Roles as threads share one task, whose count has the reward role's
  // failures; as processes, the reward role's count comes through the run health.
  rec.reward_errors = static_cast<int64_t>(s_.task->score_errors()) +
                      (s_.options.pipeline.processes ? health_.reward_errors() : int64_t{0});
  auto evaluate_traced = [&]() -> Result<EvalResult> {
    RoleDoing doing(health_, PipelineRole::kTrainer, RoleActivity::kEvaluate);
    return evaluate_();
  };
  return s_.FinishStep(rec, *metrics_, evaluate_traced, progress_);
}

trainer::Trainer& StreamRoles::RunLearner::trainer() { return *s_.trainer; }
trainer::DataParallelGroup* StreamRoles::RunLearner::ranks() { return s_.data_parallel.get(); }

TrainerRole::Options StreamRoles::TrainerOptions(const TrainingRun::State& s) {
  TrainerRole::Options o = TrainerRole::Options::From(s.options);
  o.lease_holder = s.lease_holder;
  return o;
}

}  // namespace sluice::pipeline
