// Process mode of the streaming pipeline (pipeline.processes): the launcher's
// restarts (TrainingRun::TrainInProcesses; each attempt is a LaunchAttempt,
// launch_attempt.h) and what each role process runs (TrainingRun::RunRole).
// The processes launched on other hosts meet it through the ranks' store
// (ranks_store.h; their side: rank_agent.cc).
//
//   launcher: TransferQueueServer (shm arena) + RunHealth segment
//     ├─ trainer process  ── ShmPublisher ──┐  CheckpointEngine shm store
//     ├─ rollout process  ── ShmSubscriber ─┘  (+ StandbyWeights)
//     └─ reward process
//   every role: ConnectTransferQueue(hub) over the arena
//
// Staleness: the rollout process keeps its own admission, fed by the
// trainer's progress records in the hub (hub_records.h, TrainerRecord), so the
// bound holds as in threads mode. Stopping: a role that fails exits non-zero;
// the supervisor then stops the others, as it does on the launcher's stop flag
// (SIGINT). Whatever way the run ends, the launcher removes the weight store,
// the run health and the hub's arena, and reaps every child.
//
// pipeline.trainer_command replaces the trainer process with a user's
// command (/bin/sh -c): the launcher creates the weight store and publishes
// the starting version itself, writes roles/trainer.json (hub endpoint,
// store, settings; the child gets its path in $SLUICE_RUN_INFO), and keeps a
// reader on the store. The command follows the trainer's hub protocol (whole
// groups leased from the train task, published, then acked); when it exits
// 0 the launcher checks that every answer was acked and adopts the latest
// version as the trained policy.
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ranks_store.h"
#include "remote_link.h"
#include "run_state.h"
#if SLUICE_HAVE_WEIGHT_BROADCAST
#include "sluice/checkpoint_engine/broadcast.h"
#endif
#include "launch_attempt.h"
#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/background_thread.h"
#include "sluice/common/file_util.h"
#include "sluice/common/logging.h"
#include "sluice/common/socket_util.h"
#include "sluice/common/trace.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/transfer_queue/remote.h"
#include "stream_roles.h"

namespace sluice::pipeline {

using std::chrono::milliseconds;

namespace {

// A rollout replica on another host: a store of its own, which the
// broadcast the launcher relays (WeightRelay) fills; the replica reads it as
// it would read the shared-memory store.
struct BroadcastWeights {
  std::shared_ptr<ce::VersionStore> store;
#if SLUICE_HAVE_WEIGHT_BROADCAST
  std::unique_ptr<ce::BroadcastSubscriber> subscriber;  // destroyed first
#endif
};

Result<BroadcastWeights> ReceiveWeights(const std::string& rendezvous, const ce::Layout& layout,
                                        const std::string& name, std::chrono::seconds timeout) {
#if SLUICE_HAVE_WEIGHT_BROADCAST
  if (rendezvous.empty()) {
    return Status::FailedPrecondition(
        "rank 0's launcher relays no weights to other hosts (its build has no "
        "CheckpointEngine broadcast, or its config no cluster.rollout_ranks)");
  }
  SLUICE_ASSIGN_OR_RETURN(const auto at, net::ParseHostPort(rendezvous));
  BroadcastWeights w;
  ce::VersionStoreOptions vo;
  vo.layout = layout;
  vo.reuse_buffers = true;  // a version every few seconds
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<ce::VersionStore> store, ce::VersionStore::Create(vo));
  w.store = std::move(store);
  ce::BroadcastSubscriberOptions so;
  so.rendezvous_address = rendezvous;
  so.group = "weights";
  SLUICE_ASSIGN_OR_RETURN(so.bind_address, net::LocalAddressToward(at.first));
  so.name = name;
  so.join_timeout = timeout;
  SLUICE_ASSIGN_OR_RETURN(w.subscriber, ce::BroadcastSubscriber::Start(so, w.store));
  return w;
#else
  (void)rendezvous, (void)layout, (void)name, (void)timeout;
  return Status::FailedPrecondition(
      "this build has no CheckpointEngine broadcast (Gloo was not found: install libgloo-dev and rebuild), which "
      "rollout replicas on other hosts receive the weights through");
#endif
}

// Versions a replica elsewhere committed from the broadcast.
uint64_t ReceivedVersions(const BroadcastWeights& w) {
#if SLUICE_HAVE_WEIGHT_BROADCAST
  if (w.subscriber) return w.subscriber->stats().versions_committed;
#endif
  (void)w;
  return 0;
}

// pipeline.trainer_ranks > 1: this trainer rank's place in the group, met
// through the ranks' store (null with one rank).
Result<std::shared_ptr<trainer::DataParallelGroup>> ConnectTrainerRanks(const RoleConnection& c,
                                                                        const PipelineOptions& po) {
  if (po.trainer_ranks <= 1) {
    if (c.trainer_rank != 0) {
      return Status::InvalidArgument("trainer rank " + std::to_string(c.trainer_rank) +
                                     " of a run with pipeline.trainer_ranks=1");
    }
    return std::shared_ptr<trainer::DataParallelGroup>();
  }
  trainer::DataParallelOptions dp;
  dp.rank = c.trainer_rank;
  dp.world_size = po.trainer_ranks;
  dp.store_served_by_launcher = true;
  dp.timeout = std::chrono::seconds(po.rank_timeout_seconds);
  if (!c.trainer_store_prefix.empty()) dp.key_prefix = c.trainer_store_prefix;
  if (Status parsed = dp.SetStore(c.trainer_store); !parsed.ok()) {
    return Status::InvalidArgument("pipeline.trainer_ranks > 1: --trainer-store: " + parsed.message());
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<trainer::DataParallelGroup> group, trainer::DataParallelGroup::Connect(dp));
  return std::shared_ptr<trainer::DataParallelGroup>(std::move(group));
}

// A rollout process on the launcher's host reads the weights from the run's
// shared-memory store (which the trainer creates once it has loaded).
Result<std::unique_ptr<ce::ShmSubscriber>> AttachWeightStore(const std::string& store, const ce::Layout& layout) {
  ce::ShmSubscriberOptions o;
  o.store_name = store;
  o.shm_prefix = kShmPrefix;
  o.expected_layout = layout;
  o.attach_timeout = milliseconds(120000);
  return ce::ShmSubscriber::Attach(o);
}

}  // namespace

// What the command needs to take the trainer's place (docs/python.md,
// "Trainers in Python").
std::string StreamRoles::ExternalTrainerInfo(const TrainingRun::State& s, const std::string& hub,
                                             const std::string& store, const std::string& model_dir) {
  const RunOptions& o = s.options;
  const trainer::TrainerOptions& t = o.rl.trainer;
  nlohmann::json info = {
      {"hub", hub},
      {"weight_store", store},
      {"shm_prefix", kShmPrefix},
      {"run_dir", o.run_dir},
      {"model_dir", model_dir},
      {"metrics", (fs::path(o.run_dir) / "metrics.jsonl").string()},
      {"partition", kRolloutPartition},
      {"task", kTrainTask},
      {"columns",
       {column::kPrompt, column::kResponse, column::kLogprobs, column::kVersions, column::kAnswerIndex,
        column::kReward}},
      {"start_step", s.step},
      {"start_version", s.version},
      {"steps", o.rl.steps},
      {"prompts_per_step", o.rl.prompts_per_step},
      {"group_size", o.rl.group_size},
      {"temperature", t.temperature},
      {"seed", o.seed},
      {"mode", PipelineModeName(o.pipeline.mode)},
      {"max_staleness", o.pipeline.EffectiveMaxStaleness()},
      {"sync_interval", o.pipeline.sync_interval},
      {"lease_seconds", o.pipeline.lease_seconds},
      {"lr", t.optimizer.lr},
      {"warmup_steps", t.optimizer.warmup_steps},
      {"loss_agg", t.loss.aggregation == trainer::LossAggregation::kSequenceMean ? "seq-mean" : "token-mean"},
      {"weight_decay", t.optimizer.weight_decay},
      {"max_grad_norm", t.optimizer.max_grad_norm},
      {"clip_low", t.loss.clip_low},
      {"clip_high", t.loss.clip_high},
      {"divide_adv_by_std", o.rl.divide_adv_by_std},
      {"dynamic_sampling", o.rl.dynamic_sampling},
      // run.trace: trace events (JSON Lines) written here join the run's trace.
      {"trace", o.trace ? nlohmann::json(TracePart(s, "trainer")) : nlohmann::json(nullptr)},
      {"trace_track", TraceTrack(PipelineRole::kTrainer)},
  };
  return info.dump(2) + "\n";
}

Result<uint64_t> StreamRoles::TrainTaskAcked(tq::TransferQueueClient& hub) {
  SLUICE_ASSIGN_OR_RETURN(tq::QueueStats stats, hub.Stats());
  uint64_t acked = 0;
  for (const auto& task : stats.controller.tasks) {
    if (task.task == kTrainTask) acked = task.acked_total;
  }
  return acked;
}

Status StreamRoles::CheckExternalTrainerAcked(const TrainingRun::State& s, tq::TransferQueueClient& hub) {
  const RlOptions& rl = s.options.rl;
  const uint64_t expected = static_cast<uint64_t>((rl.steps - s.step) * rl.prompts_per_step * rl.group_size);
  SLUICE_ASSIGN_OR_RETURN(const uint64_t acked, TrainTaskAcked(hub));
  if (acked < expected) {
    return Status::FailedPrecondition(
        "pipeline.trainer_command exited with status 0 having acked " + std::to_string(acked) + " of the run's " +
        std::to_string(expected) + " answers on the hub's '" + kTrainTask +
        "' task: it must train and ack every group of " + std::to_string(rl.steps - s.step) + " steps");
  }
  return Status::Ok();
}

Status StreamRoles::AdoptExternalResult(TrainingRun::State& s, tq::TransferQueueClient& hub,
                                        ce::WeightReader& weights) {
  const RlOptions& rl = s.options.rl;
  SLUICE_RETURN_IF_ERROR(CheckExternalTrainerAcked(s, hub));
  SLUICE_ASSIGN_OR_RETURN(ce::PinnedWeights latest, weights.PinLatest());
  if (latest.version <= s.version) {
    return Status::FailedPrecondition("pipeline.trainer_command exited 0 without publishing a weight version after " +
                                      std::to_string(s.version));
  }
  SLUICE_RETURN_IF_ERROR(model::LoadWeights(*s.policy, latest.tensors).WithContext("the trainer command's weights"));
  // NaN weights from the command ended a run with exit 0 and a final model
  // of NaN: refused here, naming the version.
  SLUICE_RETURN_IF_ERROR(model::CheckFiniteWeights(
      *s.policy, "pipeline.trainer_command published version " + std::to_string(latest.version)));
  SLUICE_LOG(INFO) << "the trainer command trained " << rl.steps - s.step << " steps and published version "
                   << latest.version;
  s.step = rl.steps;
  s.version = latest.version;
  return Status::Ok();
}

Status TrainingRun::TrainInProcesses(const std::atomic<bool>* stop) {
  State& s = *state_;
  const PipelineOptions& po = s.options.pipeline;
  // Ranks elsewhere cannot be started again from here.
  const bool restartable = !po.HasRemoteProcesses();
  for (int64_t restarts = 0;; ++restarts) {
    Status ran = RunProcessesOnce(stop, restarts > 0);
    if (ran.ok() || restarts >= po.max_restarts || !restartable || (stop != nullptr && stop->load())) return ran;
    const auto backoff = std::chrono::seconds(std::min<int64_t>(30, int64_t{1} << std::min<int64_t>(restarts, 5)));
    SLUICE_LOG(WARNING) << "the run's processes failed (" << ran.ToString() << "); restart " << restarts + 1 << " of "
                        << po.max_restarts << " from the latest checkpoint in " << backoff.count() << " s";
    for (auto until = std::chrono::steady_clock::now() + backoff; std::chrono::steady_clock::now() < until;) {
      if (stop != nullptr && stop->load()) return ran;
      std::this_thread::sleep_for(milliseconds(100));
    }
    bool loaded = false;
    SLUICE_RETURN_IF_ERROR(s.LoadLatestCheckpoint(&loaded).WithContext("restarting"));
    SLUICE_LOG(INFO) << "restarting from "
                     << (loaded ? "the checkpoint of step " + std::to_string(s.step) : "the start (no checkpoint yet)");
  }
}

Status TrainingRun::RunProcessesOnce(const std::atomic<bool>* stop, bool resumed) {
  LaunchAttempt attempt(*state_, resumed);
  return attempt.Run(stop);
}

// A rollout replica's process: its weights (the launcher's shared-memory
// store, or on another host the broadcast the launcher relays), its own copy
// of the model on the rollout's device and dtype, and the role.
Status StreamRoles::RunRolloutProcess(TrainingRun::State& s, const RoleConnection& c, tq::TransferQueueClient& client,
                                      RunHealth& health, HealthSlot slot, const std::function<bool()>& stopping) {
  const PipelineOptions& po = s.options.pipeline;
  const int64_t index = c.replica;
  const std::string name = ProcessName(c.role, index) + (c.remote ? "@" + HostName() : "");
  s.lease_holder = LeaseHolder(name, ::getpid());
  SLUICE_ASSIGN_OR_RETURN(TensorMap initial, model::ExportWeights(*s.policy));
  const ce::Layout layout = ce::LayoutOf(initial);
  initial.clear();
  std::unique_ptr<ce::ShmSubscriber> shm_weights;
  BroadcastWeights broadcast;  // on another host
  ce::WeightReader* weights = nullptr;
  if (c.remote) {
    const std::chrono::seconds timeout(po.rank_timeout_seconds);
    SLUICE_ASSIGN_OR_RETURN(
        broadcast, ReceiveWeights(c.weights_rendezvous, layout, name + "/" + std::to_string(::getpid()), timeout));
    // The run's weights as they are now (this host's model is the
    // starting point only when the run starts).
    SLUICE_ASSIGN_OR_RETURN(ce::PinnedWeights current, broadcast.store->WaitAndPin(c.start_version, timeout));
    SLUICE_RETURN_IF_ERROR(model::LoadWeights(*s.policy, current.tensors));
    s.version = current.version;
    weights = broadcast.store.get();
    SLUICE_LOG(INFO) << name << ": serving version " << s.version << " received over the broadcast";
  } else {
    SLUICE_ASSIGN_OR_RETURN(shm_weights, AttachWeightStore(c.weights, layout));
    weights = shm_weights.get();
  }
  // This process serves its own copy on the rollout's device and dtype.
  std::shared_ptr<model::Transformer> served = model::CloneModel(*s.policy, s.rollout_device, s.rollout_dtype);
  SLUICE_ASSIGN_OR_RETURN(auto standby, rollout::StandbyWeights::Create(served, s.version, *weights));
  RolloutRole::Options options = StreamRoles::RolloutOptions(s);
  options.replica = index;
  options.slot = slot;
  if (po.AllRolloutReplicas() > 1 || index > 0) options.process = ProcessName(c.role, index) + " ";
  SLUICE_ASSIGN_OR_RETURN(
      std::unique_ptr<RolloutRole> rollout,
      RolloutRole::Create(std::move(options), {served, standby.get(), weights, &client, &health, s.hooks}));
  const Status done = rollout->Run(stopping);
  standby->Stop();
  if (c.remote) {
    SLUICE_LOG(INFO) << name << ": " << health.replica(index).tokens << " tokens generated; "
                     << ReceivedVersions(broadcast) << " version(s) received over the broadcast, the last "
                     << weights->latest_version();
  }
  return done;
}

Status TrainingRun::RunRole(const RoleConnection& c, const ProgressFn& progress) {
  State& s = *state_;
  const PipelineOptions& po = s.options.pipeline;
  if (po.mode == PipelineMode::kDirect)
    return Status::InvalidArgument("a role process needs a streaming pipeline.mode");
  s.step = c.start_step;
  s.version = c.start_version;
  if (c.remote && c.role == PipelineRole::kTrainer && c.trainer_rank == 0) {
    return Status::InvalidArgument("trainer rank 0 runs on the launcher's host");
  }
  // The run's health on this host; a process on another host keeps its own,
  // which it reports to rank 0's launcher (below).
  std::unique_ptr<RunHealth> own_health;
  if (c.remote) {
    own_health = RunHealth::InProcess();
  } else {
    SLUICE_ASSIGN_OR_RETURN(own_health, RunHealth::OpenShared(c.health));
  }
  RunHealth& health = *own_health;
  tq::RemoteOptions ro;
  ro.token = c.hub_token;
  ro.shm = c.remote ? tq::ShmMode::kOff : tq::ShmMode::kAuto;
  if (!s.options.pipeline.hub_fast_paths) ro.shm_rings = 0, ro.direct_connections = 0;
  SLUICE_ASSIGN_OR_RETURN(tq::RemoteQueue queue, tq::ConnectTransferQueue(c.hub, ro));
  tq::TransferQueueClient client = queue.client();
  const bool follower = c.role == PipelineRole::kTrainer && c.trainer_rank > 0;
  const int64_t index = c.role == PipelineRole::kTrainer ? c.trainer_rank : c.replica;
  const HealthSlot slot(c.role, c.health_slot >= 0 ? static_cast<int>(c.health_slot) : static_cast<int>(c.role));
  // The launcher stops a role process on its host by signal and reads its
  // heartbeat in the run health. A process elsewhere stops when rank 0's launcher
  // marks the run ended in the ranks' store (or is gone: LauncherLife), ends
  // as the run did, and reports its heartbeat there once a second (for the
  // launcher's watchdog).
  std::atomic<bool> ended{false}, failed{true};  // failed: until the role returns OK
  std::mutex end_mu;
  Status run_end;  // (guarded by end_mu) how the run ended, once `ended`
  LauncherLife launcher(LauncherSilenceLimit(po));
  std::unique_ptr<trainer::DataParallelStore> link_store;
  // run.trace elsewhere: the process's part goes to a file on its host, and
  // from there through the ranks' store to rank 0's (TraceShipper).
  const std::string trace_file = c.remote && s.options.trace
                                     ? (fs::temp_directory_path() / ("sluice-trace-" + ProcessName(c.role, index) +
                                                                     "-" + std::to_string(::getpid()) + ".jsonl"))
                                           .string()
                                     : "";
  std::optional<TraceShipper> shipper;
  if (!trace_file.empty()) {
    std::remove(trace_file.c_str());
    shipper.emplace(trace_file, ProcessName(c.role, index), ::getpid());
  }
  BackgroundThread link("rank 0 link");
  if (c.remote) {
    SLUICE_ASSIGN_OR_RETURN(
        link_store,
        ConnectRanksStore(c.trainer_store, std::chrono::seconds(po.rank_timeout_seconds), c.trainer_store_prefix));
    const std::string key = RemoteBeatKey(ProcessName(c.role, index)), where = HostName();
    SLUICE_RETURN_IF_ERROR(link.Start([&, key, where](std::stop_token stop) {
      for (int64_t seq = 1; !stop.stop_requested(); ++seq) {
        if (shipper) shipper->Ship(*link_store, /*max_chunks=*/8);  // (before the report that announces it)
        (void)link_store->SetShared(key, EncodeRemoteBeat(health, slot.index, seq, ::getpid(), where));
        if (std::optional<Status> end; !ended.load() && (end = launcher.Ended(*link_store))) {
          if (!end->ok()) health.RequestStop();  // (a trainer rank waiting for a plan stops too)
          std::lock_guard lock(end_mu);
          run_end = *end;
          ended.store(true);
        }
        for (int i = 0; i < 10 && !stop.stop_requested(); ++i) std::this_thread::sleep_for(milliseconds(100));
      }
      // The last word (stopped after the role returned): the rest of the
      // trace, then finished or failed.
      if (shipper) {
        (void)TraceRecorder::Global().Finish();  // (done already unless the role failed early)
        shipper->Ship(*link_store, /*max_chunks=*/0);
        std::remove(trace_file.c_str());
      }
      (void)link_store->SetShared(key,
                                  EncodeRemoteBeat(health, slot.index, kFinalReport, ::getpid(), where, failed.load()));
    }));
  }
  auto stopping = [&] { return ended.load(); };
  // A process elsewhere that did its part ends as the run does: it waits
  // (heartbeats going on) for rank 0's word, so a failed attempt fails here
  // too (torchrun then starts this host's ranks again with the others').
  // A role stopped by a failed run reports the run's failure, its cause.
  auto end_as_the_run = [&](Status done) {
    if (!c.remote) return done;
    if (done.ok()) {
      while (!ended.load()) std::this_thread::sleep_for(milliseconds(100));
    }
    if (!ended.load()) return done;
    std::lock_guard lock(end_mu);
    return run_end.ok() ? done : run_end;
  };
  if (c.role != PipelineRole::kTrainer) {
    // Started again after the others finished the run's work (the trainer
    // may be gone, and its weight store with it): nothing to do.
    SLUICE_ASSIGN_OR_RETURN(const bool finished, StreamRoles::RoleDone(s, client, c.role));
    if (finished) {
      SLUICE_LOG(INFO) << ProcessName(c.role, index) << ": the run's work for this role is done";
      const Status done = end_as_the_run(Status::Ok());
      health.Finished(slot);
      failed.store(!done.ok());
      return done;
    }
  }
  if (!c.remote) {
    SLUICE_RETURN_IF_ERROR(StreamRoles::StartTrace(s, ProcessName(c.role, index)));
  } else if (shipper) {
    SLUICE_RETURN_IF_ERROR(TraceRecorder::Global().Start(trace_file).WithContext("run.trace"));
  }
  Status done;
  switch (c.role) {
    case PipelineRole::kTrainer: {
      SLUICE_ASSIGN_OR_RETURN(s.data_parallel, ConnectTrainerRanks(c, po));
      SLUICE_RETURN_IF_ERROR(PrepareTraining());
      if (!follower && (s.step != c.start_step || s.version != c.start_version)) {
        return Status::FailedPrecondition("the trainer resumed at step " + std::to_string(s.step) +
                                          ", the launcher at " + std::to_string(c.start_step));
      }
      std::unique_ptr<ce::ShmPublisher> publisher;
      if (!follower) {
        SLUICE_ASSIGN_OR_RETURN(TensorMap initial, model::ExportWeights(*s.policy));
        ce::ShmPublisherOptions pub;
        pub.store_name = c.weights;
        pub.shm_prefix = kShmPrefix;
        pub.layout = ce::LayoutOf(initial);
        SLUICE_ASSIGN_OR_RETURN(publisher, ce::ShmPublisher::Attach(pub));
        SLUICE_RETURN_IF_ERROR(publisher->Publish(s.version, initial));
        s.lease_holder = LeaseHolder(ProcessName(c.role, c.trainer_rank), ::getpid());  // named in the hub's ack log
      }
      std::unique_ptr<StreamRoles::RunLearner> learner;
      if (follower) {
        learner = StreamRoles::RunLearner::ForFollower(s, health);
      } else {
        SLUICE_ASSIGN_OR_RETURN(learner, StreamRoles::RunLearner::Open(
                                             s, health, [this] { return Evaluate(); }, progress));
      }
      TrainerRole::Options options = StreamRoles::TrainerOptions(s);
      options.slot = slot;
      done =
          TrainerRole(std::move(options), {learner.get(), &client, &health, publisher.get(), nullptr, s.hooks}).Run();
      break;
    }
    case PipelineRole::kRollout:
      done = StreamRoles::RunRolloutProcess(s, c, client, health, slot, stopping);
      break;
    case PipelineRole::kReward: {
      s.lease_holder = LeaseHolder(ProcessName(c.role, index) + (c.remote ? "@" + HostName() : ""), ::getpid());
      RewardRole::Options options = StreamRoles::RewardOptions(s);
      options.slot = slot;
      if (po.AllRewardWorkers() > 1 || index > 0) options.process = ProcessName(c.role, index) + " ";
      done = RewardRole(std::move(options), {s.task, s.tokenizer, &client, &health}).Run(stopping);
      if (c.remote && done.ok()) {
        SLUICE_LOG(INFO) << s.lease_holder << ": done scoring, " << health.reward_errors() << " reward error(s)";
      }
      break;
    }
  }
  done = end_as_the_run(done);
  health.Finished(slot);
  failed.store(!done.ok());  // (for a process elsewhere: its last report)
  // The others stop at their next check. Not for a rollout replica or reward
  // worker the launcher may start again: its supervisor decides.
  if (!done.ok() && (c.role == PipelineRole::kTrainer || po.max_restarts == 0)) health.RequestStop();
  if (Status traced = TraceRecorder::Global().Finish(); !traced.ok()) {
    SLUICE_LOG(WARNING) << "run.trace: " << traced.ToString();
  }
  return done;
}

}  // namespace sluice::pipeline
