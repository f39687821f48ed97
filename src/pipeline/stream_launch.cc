// Process mode of the streaming pipeline (pipeline.processes): the launcher
// (TrainingRun::TrainInProcesses) and what each role process runs
// (TrainingRun::RunRole). The processes launched on other hosts meet it
// through the ranks' store (ranks_store.h; their side: rank_agent.cc).
//
//   launcher: TransferQueueServer (shm arena) + RunHealth segment
//     ├─ trainer process  ── ShmPublisher ──┐  CheckpointEngine shm store
//     ├─ rollout process  ── ShmSubscriber ─┘  (+ StandbyWeights)
//     └─ reward process
//   every role: ConnectTransferQueue(hub) over the arena
//
// Staleness: the rollout process keeps its own StalenessAdmission and retires
// prompt_per_version prompts for every trainer version it sees published (it
// learns of versions late, never early, so the bound holds as in threads
// mode). Stopping: a role that fails exits non-zero; the supervisor then stops
// the others, as it does on the launcher's stop flag (SIGINT). Whatever way
// the run ends, the launcher removes the weight store, the run health and the hub's
// arena, and reaps every child.
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
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "metrics_log.h"
#include "ranks_store.h"
#include "remote_link.h"
#include "run_state.h"
#if SLUICE_HAVE_WEIGHT_BROADCAST
#include "sluice/checkpoint_engine/broadcast.h"
#include "sluice/checkpoint_engine/relay.h"
#include "sluice/checkpoint_engine/rendezvous.h"
#endif
#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/background_thread.h"
#include "sluice/common/file_util.h"
#include "sluice/common/logging.h"
#include "sluice/common/shm.h"
#include "sluice/common/socket_util.h"
#include "sluice/common/trace.h"
#include "sluice/model/config.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/runtime/supervisor.h"
#include "sluice/transfer_queue/remote.h"
#include "sluice/transfer_queue/server.h"
#include "stream_roles.h"
#include "watchdog.h"

namespace sluice::pipeline {

namespace ce = checkpoint_engine;
using std::chrono::milliseconds;

namespace {

constexpr char kShmPrefix[] = "sluice";
// 32 random hex digits (the hub's token when it listens beyond loopback).
Result<std::string> RandomToken() {
  std::ifstream in("/dev/urandom", std::ios::binary);
  unsigned char bytes[16];
  if (!in.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) return Status::Unavailable("cannot read /dev/urandom");
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back("0123456789abcdef"[b >> 4]);
    out.push_back("0123456789abcdef"[b & 15]);
  }
  return out;
}

// Rollout replicas on other hosts (cluster.rollout_ranks) receive the
// weights over the CheckpointEngine broadcast: the launcher serves the
// broadcast's rendezvous on the ranks' network and relays every version the
// trainer commits to this host's shared-memory store (ce::ShmBroadcastRelay:
// the trainer never waits for the network); the remote replicas stage each
// version into a store of their own, verified, before they switch to it.
// The first version waits (up to pipeline.rank_timeout_seconds) for every
// replica the cluster declares; later ones go to whoever is in the group,
// and a replica that joins between versions (started again, or late) is
// sent the current one at once. A version the group broke under is sent
// again (the newest); failing for rank_timeout_seconds ends the run.
class WeightRelay {
 public:
#if SLUICE_HAVE_WEIGHT_BROADCAST
  static Result<std::unique_ptr<WeightRelay>> Start(const std::string& ip, const std::string& store_name,
                                                    const ce::Layout& layout, int32_t replicas,
                                                    std::chrono::seconds timeout) {
    auto relay = std::unique_ptr<WeightRelay>(new WeightRelay());
    ce::RendezvousServerOptions ro;
    ro.bind_address = ip;
    SLUICE_ASSIGN_OR_RETURN(relay->rendezvous_, ce::RendezvousServer::Start(ro));
    ce::RelayOptions o;
    o.store_name = store_name;
    o.shm_prefix = kShmPrefix;
    o.broadcast.rendezvous_address = ip + ":" + std::to_string(relay->rendezvous_->port());
    o.broadcast.group = "weights";
    o.broadcast.bind_address = ip;
    o.broadcast.layout = layout;
    o.broadcast.min_subscribers = static_cast<size_t>(replicas);
    o.first_timeout = timeout;
    o.retry_for = timeout;
    relay->address_ = o.broadcast.rendezvous_address;
    SLUICE_ASSIGN_OR_RETURN(relay->relay_, ce::ShmBroadcastRelay::Start(o));
    return relay;
  }
  Status status() const { return relay_->status(); }
  uint64_t deliveries() const { return relay_->stats().deliveries; }
#else
  static Result<std::unique_ptr<WeightRelay>> Start(const std::string&, const std::string&, const ce::Layout&, int32_t,
                                                    std::chrono::seconds) {
    return Status::FailedPrecondition(
        "cluster.rollout_ranks: rollout replicas on other hosts receive the weights over the CheckpointEngine "
        "broadcast, which this build lacks (Gloo was not found: install libgloo-dev and rebuild)");
  }
  Status status() const { return Status::Ok(); }
  uint64_t deliveries() const { return 0; }
#endif
  // Where the remote replicas find the broadcast ("IP:PORT").
  const std::string& address() const { return address_; }

 private:
  WeightRelay() = default;
  std::string address_;
#if SLUICE_HAVE_WEIGHT_BROADCAST
  std::unique_ptr<ce::RendezvousServer> rendezvous_;
  std::unique_ptr<ce::ShmBroadcastRelay> relay_;  // destroyed before the rendezvous
#endif
};

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

// cluster.storage_ranks: the hub has one storage unit here and one on each
// storage rank. Publishes the plan (the clients' token, the secret the hub
// shares with its storage servers, the unit count, the config's digest) in
// the ranks' store, then waits for each storage rank to say where it serves
// (a storage rank that refuses the run stops the wait).
Status PlaceHubStorage(const PipelineOptions& po, trainer::DataParallelStore& store, tq::ServerOptions* so) {
  SLUICE_ASSIGN_OR_RETURN(so->peer_token, RandomToken());
  so->storage_units = static_cast<uint32_t>(1 + po.remote_storage_units);
  const nlohmann::json plan = {{"token", so->token},
                               {"peer_token", so->peer_token},
                               {"units", so->storage_units},
                               {"config_digest", po.wiring.config_digest}};
  SLUICE_RETURN_IF_ERROR(store.SetShared(kHubStoragePlanKey, plan.dump()));
  const std::chrono::seconds timeout(po.rank_timeout_seconds);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int32_t i = 0; i < po.remote_storage_units; ++i) {
    const std::string what = "hub storage rank " + std::to_string(i) + " (cluster.storage_ranks)";
    while (true) {
      Result<std::string> endpoint = store.GetShared(kHubStoragePrefix + std::to_string(i), milliseconds(1000));
      if (endpoint.ok()) {
        // (from the network: a ZeroMQ TCP endpoint of a sane length)
        if (endpoint->rfind("tcp://", 0) != 0 || endpoint->size() > 255) {
          return Status::DataLoss(what + " serves at '" + endpoint->substr(0, 80) + "', not a tcp:// endpoint");
        }
        so->storage_hosts.push_back({static_cast<uint32_t>(1 + i), 1, *endpoint});
        break;
      }
      if (Result<std::string> why = store.GetShared(kRanksRefusedKey, milliseconds(0)); why.ok()) {
        return Status::FailedPrecondition(*why);
      }
      if (endpoint.status().code() != StatusCode::kTimeout || std::chrono::steady_clock::now() >= deadline) {
        return endpoint.status().WithContext("waiting for " + what + " to say where it serves (" +
                                             std::to_string(timeout.count()) + " s, pipeline.rank_timeout_seconds)");
      }
    }
  }
  so->storage_connect_timeout = timeout;
  return Status::Ok();
}

// How long the run's hub keeps a write open before aborting it (see
// WriteAnswerOnce in stream_roles.cc: a restarted replica or worker waits
// that long for an answer a dead one was writing).
constexpr std::chrono::milliseconds kOpenWriteTimeout{10000};

// Hub capacity for the run: every answer that can be in flight, at its
// longest, with room to spare.
uint64_t HubBytes(const RunOptions& o) {
  const uint64_t rows = static_cast<uint64_t>(o.rl.prompts_per_step * o.rl.group_size) *
                        static_cast<uint64_t>(o.pipeline.EffectiveMaxStaleness() + 3);
  const uint64_t row_bytes = 2048 + 24 * static_cast<uint64_t>(std::max(o.rl.sampling.max_new_tokens, 1));
  return std::max<uint64_t>(uint64_t{64} << 20, 2 * rows * row_bytes);
}

// Removes what launchers killed without a chance to clean up (SIGKILL, a
// crash) left in shared memory: run health segments and weight stores are named
// after their launcher ("<pid>-<start time>-<n>"), so one whose launcher is
// gone belongs to a dead run. (The hub's arena is swept by the hub itself.)
void SweepDeadRuns() {
  Result<std::vector<std::string>> names = ListShmSegments({kShmPrefix});
  if (!names.ok()) return;
  const std::string health_prefix = ShmSegmentName({kShmPrefix, "health"}) + ".";
  const std::string store_prefix = ShmSegmentName({kShmPrefix}) + ".run-";
  std::set<std::string> dead_stores;
  for (const std::string& name : *names) {
    if (name.rfind(health_prefix, 0) == 0) {
      const std::optional<ProcessIdentity> owner = OwnerNamedIn(std::string_view(name).substr(health_prefix.size()));
      if (owner && !IsProcessAlive(*owner) && SharedMemorySegment::Unlink(name).ok()) {
        SLUICE_LOG(INFO) << "removed the run health segment " << name << " of a dead launcher (pid " << owner->pid
                         << ")";
      }
    } else if (name.rfind(store_prefix, 0) == 0) {
      const std::string_view rest = std::string_view(name).substr(store_prefix.size());
      const std::optional<ProcessIdentity> owner = OwnerNamedIn(rest);
      if (owner && !IsProcessAlive(*owner)) dead_stores.insert("run-" + std::string(rest.substr(0, rest.find('.'))));
    }
  }
  for (const std::string& store : dead_stores) {
    if (ce::DestroyShmStore(kShmPrefix, store).ok()) {
      SLUICE_LOG(INFO) << "removed the weight store " << store << " of a dead launcher";
    }
  }
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

namespace {

// The package's build directory next to this build's `sluice`
// (build/<preset>/apps/sluice -> build/<preset>/python), if there is one.
std::optional<std::string> BuiltPythonPackage(const std::string& sluice_exe) {
  const fs::path dir = fs::path(sluice_exe).parent_path().parent_path() / "python";
  std::error_code ec;
  if (fs::exists(dir / "sluice" / "__init__.py", ec)) return dir.string();
  return std::nullopt;
}

}  // namespace

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
  State& s = *state_;
  const PipelineOptions& po = s.options.pipeline;
  if (po.wiring.role_command.empty()) {
    return Status::FailedPrecondition("pipeline.processes needs a role command (set by the sluice front end)");
  }
  if (s.step >= s.options.rl.steps) return Status::Ok();
  const auto run_start = Clock::now();

  SweepDeadRuns();
  // Names of this run's shared-memory objects: unique per launcher process.
  static std::atomic<int> runs{0};
  const ProcessIdentity me = CurrentProcess();
  const std::string tag =
      std::to_string(me.pid) + "-" + std::to_string(me.start_time) + "-" + std::to_string(runs.fetch_add(1));
  const std::string store_name = "run-" + tag;
  const std::string health_name = ShmSegmentName({kShmPrefix, "health", tag});

  // The roles start from this process's weights (after the warm start, or
  // the resumed checkpoint's).
  const fs::path init_dir = fs::path(s.options.run_dir) / "roles" / "init";
  SLUICE_RETURN_IF_ERROR(s.SaveModel(init_dir.string()));

  // run.trace: the launcher's part (the prompt feeder); each role process
  // writes its own (a process started again appends to it), and all of them
  // become run_dir/trace.json at the end. Parts a killed launcher left go first.
  std::vector<std::string> trace_parts = {"launcher"};
  for (int64_t r = 0; r < po.trainer_ranks; ++r) trace_parts.push_back(ProcessName(PipelineRole::kTrainer, r));
  for (int64_t r = 0; r < po.rollout_replicas; ++r) trace_parts.push_back(ProcessName(PipelineRole::kRollout, r));
  for (int64_t r = 0; r < po.reward_workers; ++r) trace_parts.push_back(ProcessName(PipelineRole::kReward, r));
  for (const std::string& part : trace_parts) std::remove(StreamRoles::TracePart(s, part).c_str());
  SLUICE_RETURN_IF_ERROR(StreamRoles::StartTrace(s, "launcher"));
  struct FinishTrace {
    const State& s;
    const std::vector<std::string>& parts;
    ~FinishTrace() { StreamRoles::FinishTrace(s, parts); }
  } finish_trace{s, trace_parts};

  // pipeline.trainer_ranks > 1: where the ranks meet. All on this host: a
  // file store in the run's roles/ directory (nothing listens on the
  // network). Some elsewhere: a TCPStore served here for as long as they
  // run (TCPStore listens on every interface), or the launcher's agent's.
  std::unique_ptr<trainer::DataParallelStore> rank_store;
  const bool remote_processes = po.HasRemoteProcesses();
  std::string store_at, store_host = "127.0.0.1";
  const std::chrono::seconds rank_timeout(po.rank_timeout_seconds);
  struct RemoveFile {
    fs::path path;
    ~RemoveFile() {
      std::error_code ec;
      if (!path.empty()) fs::remove(path, ec);
    }
  } rank_file;
  if (po.trainer_ranks > 1 && !remote_processes) {
    rank_file.path = fs::path(s.options.run_dir) / "roles" / ("ranks-" + tag + ".store");
    std::error_code ec;
    fs::remove(rank_file.path, ec);  // a fresh file for every start
    store_at = "file:" + rank_file.path.string();
  } else if (po.trainer_ranks > 1 || remote_processes) {
    int port = 0;
    if (!po.wiring.trainer_store.empty()) {
      SLUICE_RETURN_IF_ERROR(
          ParseListenAddress(po.wiring.trainer_store, &store_host, &port).WithContext("the ranks' store"));
    }
    if (po.wiring.trainer_store_external) {
      SLUICE_ASSIGN_OR_RETURN(rank_store,
                              trainer::DataParallelStore::Connect(store_host, port, rank_timeout, StoreKeys(po)));
    } else {
      SLUICE_ASSIGN_OR_RETURN(rank_store,
                              trainer::DataParallelStore::Serve(store_host, port, rank_timeout, StoreKeys(po)));
    }
    store_at = store_host + ":" + std::to_string(rank_store->port());
  }
  // Said last, once everything below has stopped: the processes of the
  // next attempt elsewhere start their wait for its rank 0 from here
  // (AwaitPreviousAttempt), not from the word below, which comes before
  // this launcher's shutdown (seconds, more with a dead storage rank).
  struct ExitedForRanks {
    trainer::DataParallelStore* store;
    ~ExitedForRanks() {
      if (store != nullptr) (void)store->SetShared(kLauncherExitedKey, "1");
    }
  } exited_for_ranks{remote_processes ? rank_store.get() : nullptr};
  // How this attempt ended, said once in the ranks' store however it ends:
  // the ranks elsewhere stop waiting and exit as the run did (so a failed
  // attempt fails on every host, and torchrun starts every host's ranks
  // again).
  struct EndForRanks {
    trainer::DataParallelStore* store;
    bool said = false;
    bool ok = false;
    void Say(const Status& outcome) {
      if (store == nullptr || said) return;
      said = true;
      ok = outcome.ok();
      (void)store->SetShared(kRanksEndedKey, RunEndedValue(outcome));
    }
    ~EndForRanks() { Say(Status::Aborted("rank 0's launcher stopped before its run's processes")); }
  } end_for_ranks{rank_store.get()};
  // A torchrun restart: the attempt before ends now if it has not (its
  // rank 0 died), so its processes elsewhere stop, and the new ones stop
  // waiting for it (AwaitPreviousAttempt).
  if (rank_store && remote_processes && !po.wiring.previous_store_prefix.empty()) {
    Result<std::unique_ptr<trainer::DataParallelStore>> last =
        ConnectRanksStore(store_at, rank_timeout, po.wiring.previous_store_prefix);
    if (last.ok()) {
      if (!(*last)->GetShared(kRanksEndedKey, milliseconds(0)).ok()) {
        (void)(*last)->SetShared(
            kRanksEndedKey,
            RunEndedValue(Status::Aborted("rank 0 was started again (a torchrun restart) before it ended")));
      }
      (void)(*last)->SetShared(kLauncherExitedKey, "1");  // (its process is gone)
    }
  }
  // That this launcher lives, for the processes elsewhere (LauncherLife):
  // a beat once a second on a connection of its own.
  BackgroundThread launcher_beat("launcher beat");
  if (rank_store && remote_processes) {
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<trainer::DataParallelStore> beat_store,
                            ConnectRanksStore(store_at, rank_timeout, StoreKeys(po)));
    SLUICE_RETURN_IF_ERROR(launcher_beat.Start([beat_store](std::stop_token stop) {
      for (int64_t beat = 1; !stop.stop_requested(); ++beat) {
        (void)beat_store->SetShared(kLauncherBeatKey, std::to_string(beat));
        for (int i = 0; i < 10 && !stop.stop_requested(); ++i) std::this_thread::sleep_for(milliseconds(100));
      }
    }));
  }

  tq::ServerOptions so;
  // The hub's ack log (docs/pipeline.md, "The hub's ack log"): a line saying
  // from which step this attempt's hub starts, then a line per ack.
  so.controller.ack_log = (fs::path(s.options.run_dir) / kHubAckLog).string();
  SLUICE_RETURN_IF_ERROR(
      AppendToFile(so.controller.ack_log, "{\"hub\":\"started\",\"from_step\":" + std::to_string(s.step) + "}\n"));
  if (!po.wiring.hub_bind.empty()) {
    so.bind = po.wiring.hub_bind;
    if (!tq::IsLoopbackEndpoint(so.bind)) {
      SLUICE_ASSIGN_OR_RETURN(so.token, RandomToken());
    }
  }
  so.controller.columns = HubColumns();
  so.controller.tasks = HubTasks();
  so.shm_bytes = HubBytes(s.options);
  so.controller.capacity_bytes = so.shm_bytes / 4 * 3;
  // A role's write of an answer or a reward lasts milliseconds; one left
  // open is a dead process's, and holds the answer's cells until aborted.
  so.open_write_timeout = kOpenWriteTimeout;
  if (po.remote_storage_units > 0) SLUICE_RETURN_IF_ERROR(PlaceHubStorage(po, *rank_store, &so));
  SLUICE_ASSIGN_OR_RETURN(auto server, tq::TransferQueueServer::Start(so));
  if (!so.storage_hosts.empty()) {
    std::string where;
    for (const tq::StorageHost& h : so.storage_hosts)
      where += ", unit " + std::to_string(h.first_unit) + " at " + h.endpoint;
    SLUICE_LOG(INFO) << "hub: " << so.storage_units << " storage units, unit 0 on this host" << where;
  }
  // However the run ends, the storage ranks stop once the hub has; after a
  // run that finished, the ranks' store (which may be this process's) stays
  // until each has seen that, or for 5 s.
  struct StoppedForStorage {
    trainer::DataParallelStore* store;
    tq::TransferQueueServer* hub;
    int32_t ranks;
    EndForRanks& end;
    ~StoppedForStorage() {
      if (store == nullptr) return;
      hub->Stop();
      end.Say(Status::Aborted("rank 0's launcher stopped early"));  // (said already unless it failed)
      // (After a failure they exit at the word, and a dead one never says.)
      if (!store->SetShared(kHubStoppedKey, "1").ok() || !end.ok) return;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      for (int32_t i = 0; i < ranks; ++i) {
        const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
        (void)store->GetShared(kHubStoragePrefix + std::to_string(i) + "/done", std::max(left, milliseconds(0)));
      }
    }
  } stopped_for_storage{po.remote_storage_units > 0 ? rank_store.get() : nullptr, server.get(), po.remote_storage_units,
                        end_for_ranks};
  tq::TransferQueueClient local(server->controller(), server->storage());  // this process's view of the hub
  SLUICE_RETURN_IF_ERROR(CreateHubPartitions(local, s.options.rl.group_size));
  // (unlinked when it goes)
  SLUICE_ASSIGN_OR_RETURN(const std::unique_ptr<RunHealth> health, RunHealth::CreateShared(health_name));
  health->RecordTrainer(s.step, s.version);
  // pipeline.trainer_command replaces the trainer process with a user's; the
  // trainer ranks this launcher starts (the others were launched elsewhere).
  const bool external = !po.trainer_command.empty();
  const int64_t local_ranks = po.wiring.local_trainer_ranks > 0 ? po.wiring.local_trainer_ranks : po.trainer_ranks;
  const std::vector<RoleProcess> processes =
      RoleProcesses(external ? 1 : local_ranks, po.rollout_replicas, po.reward_workers);
  // Stopped before the run health and the hub go (it reads both).
  Result<std::unique_ptr<MetricsServer>> serving =
      StreamRoles::ServeMetrics(s, *health, local, processes, server.get());
  if (!serving.ok()) return serving.status().WithContext("run.metrics_listen");
  std::unique_ptr<MetricsServer> metrics_server = std::move(serving).value();

  // The prompts are fed from here, the one process that reads the training
  // split; a failure stops the roles.
  Status fed;
  BackgroundThread feeder("prompts");
  SLUICE_RETURN_IF_ERROR(feeder.Start([&](std::stop_token stop) {
    fed = StreamRoles::FeedPrompts(s, local, *health, [&] { return stop.stop_requested(); });
    if (!fed.ok()) health->RequestStop();
  }));

  Status result = [&]() -> Status {
    // pipeline.trainer_command: this process creates the weight store with
    // the starting version and keeps a reader on it (so the store outlives
    // the command's publisher and the result can be read), then hands the
    // publisher's place to the command.
    std::unique_ptr<ce::ShmSubscriber> store_reader;
    std::string info_path;
    if (external) {
      SLUICE_ASSIGN_OR_RETURN(TensorMap initial, model::ExportWeights(*s.policy));
      ce::ShmPublisherOptions pub;
      pub.store_name = store_name;
      pub.shm_prefix = kShmPrefix;
      pub.layout = ce::LayoutOf(initial);
      SLUICE_ASSIGN_OR_RETURN(auto publisher, ce::ShmPublisher::Attach(pub));
      ce::ShmSubscriberOptions sub;
      sub.store_name = store_name;
      sub.shm_prefix = kShmPrefix;
      sub.expected_layout = pub.layout;
      SLUICE_ASSIGN_OR_RETURN(store_reader, ce::ShmSubscriber::Attach(sub));
      SLUICE_RETURN_IF_ERROR(publisher->Publish(s.version, initial));
      publisher.reset();
      // The command's metrics lines go here; the report needs the file.
      SLUICE_RETURN_IF_ERROR(MetricsLog::Open(s.options.run_dir).status());
      info_path = (fs::path(s.options.run_dir) / "roles" / "trainer.json").string();
      SLUICE_RETURN_IF_ERROR(WriteFileAtomically(
          info_path, StreamRoles::ExternalTrainerInfo(s, server->endpoint(), store_name, init_dir.string())));
      SLUICE_LOG(INFO) << "trainer command: hub " << server->endpoint() << ", weight store " << store_name
                       << " (version " << s.version << " published), run info " << info_path;
    }
    std::unique_ptr<WeightRelay> relay;  // rollout replicas elsewhere
    if (rank_store) {
      const std::string& host = store_host;
      if (po.remote_rollout_replicas > 0) {
        SLUICE_ASSIGN_OR_RETURN(TensorMap weights, model::ExportWeights(*s.policy));
        SLUICE_ASSIGN_OR_RETURN(relay, WeightRelay::Start(host, store_name, ce::LayoutOf(weights),
                                                          po.remote_rollout_replicas, rank_timeout));
      }
      if (remote_processes) {
        std::map<std::string, std::string> model_files;  // (a preset: none)
        if (!po.wiring.model_path.empty()) {
          SLUICE_ASSIGN_OR_RETURN(model_files, model::ModelFilesDigests(po.wiring.model_path));
        }
        const nlohmann::json info = {{"hub", server->endpoint()},
                                     {"token", so.token},
                                     {"start_step", s.step},
                                     {"start_version", s.version},
                                     {"config_digest", po.wiring.config_digest},
                                     {"model_files", model_files},
                                     {"weights", relay ? relay->address() : ""}};
        SLUICE_RETURN_IF_ERROR(rank_store->SetShared(kRanksRunInfoKey, info.dump()));
      }
    }
    SLUICE_ASSIGN_OR_RETURN(auto supervisor, runtime::Supervisor::Create({}));
    std::vector<StallWatch::Role> watched;
    int trainer_command_slot = -1;  // pipeline.trainer_command's slot, when watched
    for (const auto& [role, rank, slot] : processes) {
      runtime::ChildSpec spec;
      spec.name = ProcessName(role, rank);
      spec.env["OMP_WAIT_POLICY"] = "PASSIVE";
      if (!so.token.empty()) spec.env[kHubTokenVariable] = so.token;  // not on the command line (ps shows it)
      if (role == PipelineRole::kTrainer && external) {
        spec.path = "/bin/sh";
        spec.args = {"-c", po.trainer_command};
        spec.env["SLUICE_RUN_INFO"] = info_path;
        if (std::optional<std::string> package = BuiltPythonPackage(po.wiring.role_command.front())) {
          const char* path = std::getenv("PYTHONPATH");
          spec.env["PYTHONPATH"] = *package + (path != nullptr && *path != 0 ? ":" + std::string(path) : "");
        }
        SLUICE_RETURN_IF_ERROR(supervisor->Start(spec).WithContext("starting pipeline.trainer_command"));
        // It beats no heartbeat of its own: what this launcher sees it do
        // (answers acked on the hub, weight versions published) is its
        // heartbeat, put on its slot by the check below.
        if (slot >= 0) {
          trainer_command_slot = slot;
          watched.push_back({spec.name, "pipeline.trainer_command", slot, supervisor->PidOf(spec.name)});
        }
        continue;
      }
      spec.path = po.wiring.role_command.front();
      spec.args.assign(po.wiring.role_command.begin() + 1, po.wiring.role_command.end());
      // The trainer takes up the checkpoint (its optimizer state and the
      // metrics lines it covers), also when this launcher resumed the run
      // (a torchrun restart resumes without run.resume in the saved config).
      if (resumed || s.options.resume) spec.args.push_back("run.resume=true");
      spec.args.push_back("--role=" + PipelineRoleName(role));
      spec.args.push_back("--hub=" + server->endpoint());
      spec.args.push_back("--weights=" + store_name);
      spec.args.push_back("--health=" + health_name);
      spec.args.push_back("--start-step=" + std::to_string(s.step));
      spec.args.push_back("--start-version=" + std::to_string(s.version));
      spec.args.push_back("--health-slot=" + std::to_string(slot));
      if (role == PipelineRole::kTrainer && po.trainer_ranks > 1) {
        spec.args.push_back("--trainer-rank=" + std::to_string(rank));
        spec.args.push_back("--trainer-store=" + store_at);
        spec.args.push_back("--trainer-store-prefix=" + StoreKeys(po));
        spec.args.push_back("--trainer-ranks=" + std::to_string(po.trainer_ranks));  // a launcher may have set them
      }
      if (role != PipelineRole::kTrainer) {
        spec.args.push_back("--replica=" + std::to_string(rank));
        // Started again alone: the hub and the others carry on (a trainer
        // rank's failure restarts everything from the checkpoint instead).
        spec.max_restarts = static_cast<int32_t>(po.max_restarts);
      }
      SLUICE_RETURN_IF_ERROR(supervisor->Start(spec).WithContext("starting the " + spec.name + " role"));
      if (slot < 0) continue;  // beyond the slots: not watched
      const bool one_of_many = role == PipelineRole::kTrainer   ? rank > 0
                               : role == PipelineRole::kRollout ? po.rollout_replicas > 1
                                                                : po.reward_workers > 1;
      const std::string what =
          one_of_many ? PipelineProcessTitle(role, rank) : "the " + PipelineRoleName(role) + " role";
      watched.push_back({spec.name, what, slot, supervisor->PidOf(spec.name)});
    }
    // Processes on other hosts: watched through the heartbeats they report
    // to the ranks' store, mirrored onto slots after the local ones
    // (those that join later too, as they join), with their counters and
    // (run.trace) their parts of the trace.
    StallWatch* watch_of_remote = nullptr;  // (set once the watch exists, before the first poll)
    RemoteBeats::Options remote_options;
    remote_options.on_new_life = [&](const std::string& name, const std::string& host, pid_t pid) {
      if (watch_of_remote != nullptr) watch_of_remote->SetHost(name, host, pid);
    };
    if (s.options.trace) {
      remote_options.trace_part = [&s](const std::string& name) { return StreamRoles::TracePart(s, name); };
    }
    RemoteBeats remote_beats(remote_options);
    int next_slot = 3;
    for (const RoleProcess& p : processes) next_slot = std::max(next_slot, p.slot + 1);
    // The next free slot, as at a process's start (none beyond the slots: not watched).
    auto fresh_slot = [&]() -> std::optional<int> {
      if (next_slot >= RunHealth::kSlots) return std::nullopt;
      const int slot = next_slot++;
      health->Restart(slot);
      return slot;
    };
    auto remote_role = [&](PipelineRole role, int64_t i) -> std::optional<StallWatch::Role> {
      const std::optional<int> slot = fresh_slot();
      if (!slot) return std::nullopt;
      health->Label(*slot, role, i);
      StallWatch::Role r{ProcessName(role, i), PipelineProcessTitle(role, i), *slot, -1};
      r.remote = true;
      remote_beats.Add(r.name, *slot, role == PipelineRole::kRollout ? i : -1);
      if (s.options.trace) {
        std::remove(StreamRoles::TracePart(s, r.name).c_str());  // one a killed run left
        trace_parts.push_back(r.name);
      }
      return r;
    };
    if (rank_store && remote_processes) {
      auto watch_remote = [&](PipelineRole role, int64_t from, int64_t to) {
        for (int64_t i = from; i < to; ++i) {
          if (std::optional<StallWatch::Role> r = remote_role(role, i)) watched.push_back(*r);
        }
      };
      watch_remote(PipelineRole::kTrainer, local_ranks, po.trainer_ranks);
      watch_remote(PipelineRole::kRollout, po.rollout_replicas, po.AllRolloutReplicas());
      watch_remote(PipelineRole::kReward, po.reward_workers, po.AllRewardWorkers());
    }
    // The hub's storage ranks too: each reports a heartbeat while its
    // server goes round its loop (ServeHubStorage). They stop after this
    // watch, once the hub has: no last report is waited for.
    RemoteBeats storage_beats({.on_new_life = remote_options.on_new_life, .trace_part = {}});
    for (int64_t i = 0; i < po.remote_storage_units; ++i) {
      const std::optional<int> slot = fresh_slot();
      if (!slot) break;
      health->LabelHubStorage(*slot, i);
      StallWatch::Role r{HubStorageProcessName(i), "hub storage rank " + std::to_string(i), *slot, -1};
      r.remote = true;
      storage_beats.Add(r.name, *slot);
      watched.push_back(std::move(r));
    }
    StallWatch watch(*health, std::move(watched), po, [&](const std::string& name) { return supervisor->PidOf(name); });
    watch_of_remote = &watch;
    // A rollout replica or reward worker that died: its hub leases go back
    // to the others at once, not when they run out (worker_lease_seconds).
    std::map<std::string, pid_t> holders;  // process name -> the pid last seen
    for (const auto& [role, rank, slot] : processes) {
      if (role != PipelineRole::kTrainer) holders[ProcessName(role, rank)] = supervisor->PidOf(ProcessName(role, rank));
    }
    auto release_dead = [&] {
      for (auto& [name, pid] : holders) {
        const pid_t now = supervisor->PidOf(name);
        if (now == pid) continue;
        if (pid > 0) {
          LogReleased(name, pid, server->controller()->ReleaseHolder({LeaseHolder(name, pid)}),
                      /*quiet_if_none=*/true);
        }
        pid = now;
      }
    };
    // A year is "no limit" for a run; SIGINT, failures and stalls end it sooner.
    // A trainer command that exits 0 before acking every answer would leave
    // the rollout waiting for its progress: that ends the run.
    bool checked_exit = false;
    auto next_refusal_check = std::chrono::steady_clock::now();
    uint64_t trainer_acked = 0;
    int64_t trainer_version = s.version;
    // The trainer command's progress record (TrainerRecord), which the
    // rollout's admission reads: its acks are its progress (it acks a step's
    // groups after publishing), in whole steps, with the version published
    // before them.
    TrainerRecord external_record{s.step, s.version};
    auto next_record = std::chrono::steady_clock::now();
    const uint64_t step_answers = static_cast<uint64_t>(s.options.rl.prompts_per_step * s.options.rl.group_size);
    std::map<PipelineRole, int64_t> joined = {{PipelineRole::kRollout, 0}, {PipelineRole::kReward, 0}};
    auto check = [&]() -> Status {
      release_dead();
      if (relay) SLUICE_RETURN_IF_ERROR(relay->status());
      if (!remote_beats.empty()) remote_beats.Poll(*rank_store, *health);
      if (!storage_beats.empty()) storage_beats.Poll(*rank_store, *health);
      // A rank launched elsewhere that refused the run, and processes that
      // joined it (once a second).
      if (rank_store && remote_processes && std::chrono::steady_clock::now() >= next_refusal_check) {
        next_refusal_check = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        if (Result<std::string> why = rank_store->GetShared(kRanksRefusedKey, milliseconds(0)); why.ok()) {
          return Status::FailedPrecondition(*why);
        }
        for (auto& [role, seen] : joined) {
          const std::string name = PipelineRoleName(role);
          Result<std::string> count = rank_store->GetShared(kRanksJoinedPrefix + name, milliseconds(0));
          // (a number from the network: no more than a run can have)
          const int64_t now = std::min<int64_t>(count.ok() ? std::atoll(count->c_str()) : 0, RunHealth::kMaxReplicas);
          if (now <= seen) continue;
          SLUICE_LOG(INFO) << now - seen << " more " << name << " process(es) joined the run from other hosts (" << now
                           << " beyond the launch)";
          // Watched from now on, as the declared ones elsewhere are.
          const int64_t declared = role == PipelineRole::kRollout ? po.AllRolloutReplicas() : po.AllRewardWorkers();
          for (int64_t i = seen; i < now; ++i) {
            if (std::optional<StallWatch::Role> r = remote_role(role, declared + i)) watch.Add(*r);
          }
          if (role == PipelineRole::kRollout) health->SetJoinedRolloutReplicas(static_cast<int32_t>(now));
          seen = now;
        }
      }
      // The trainer command's acks and publishes (every 20 ms): its progress
      // records, and each ack or publish is a turn of its loop for the watchdog.
      if (external && std::chrono::steady_clock::now() >= next_record) {
        next_record = std::chrono::steady_clock::now() + milliseconds(20);
        SLUICE_ASSIGN_OR_RETURN(const uint64_t acked, StreamRoles::TrainTaskAcked(local));
        const PolicyVersion version = store_reader->latest_version();  // (read after the acks)
        const int64_t trained =
            std::min<int64_t>(s.step + static_cast<int64_t>(acked / step_answers), s.options.rl.steps);
        while (external_record.step < trained) {
          external_record = {external_record.step + 1, std::max(version, external_record.version)};
          SLUICE_RETURN_IF_ERROR(WriteTrainerRecord(local, external_record));
        }
        if (trainer_command_slot >= 0 && (acked != trainer_acked || version != trainer_version)) {
          const RoleActivity did = version != trainer_version ? RoleActivity::kPublish : RoleActivity::kAck;
          trainer_acked = acked;
          trainer_version = version;
          const int64_t now_ns = std::chrono::steady_clock::now().time_since_epoch().count();
          health->Mirror(trainer_command_slot, {now_ns, static_cast<uint32_t>(did), now_ns});
        }
      }
      if (external && !checked_exit && supervisor->HasExited(PipelineRoleName(PipelineRole::kTrainer))) {
        checked_exit = true;
        SLUICE_RETURN_IF_ERROR(StreamRoles::CheckExternalTrainerAcked(s, local));
      }
      return watch.Check();
    };
    Status waited = supervisor->Wait(std::chrono::hours(24 * 365), stop, check);
    supervisor->StopAll();
    if (!remote_beats.empty()) {
      // The processes elsewhere stop now: their last counters and trace.
      end_for_ranks.Say(waited);
      remote_beats.Finish(*rank_store, *health, std::min<milliseconds>(rank_timeout, milliseconds(10000)));
      SLUICE_LOG(INFO) << "rollout: " << health->rollout().tokens << " tokens generated, " << remote_beats.tokens()
                       << " of them on other hosts; " << health->reward_errors() << " reward error(s), "
                       << remote_beats.reward_errors() << " of them on other hosts";
    }
    if (relay) {
      SLUICE_LOG(INFO) << "weight relay: " << relay->deliveries()
                       << " version deliveries over the broadcast to the rollout replicas on other hosts";
    }
    if (waited.ok() && external) waited = StreamRoles::AdoptExternalResult(s, local, *store_reader);
    return waited;
  }();

  health->RequestStop();
  feeder.Stop();
  // A feeding error is the cause when there is one (the roles it stopped fail after it).
  if (!fed.ok()) result = fed.WithContext("feeding prompts");
  end_for_ranks.Say(result);
  s.stream_stats = health->Summary(std::chrono::duration<double>(Clock::now() - run_start).count());
  const tq::ServerCounters hub = server->counters();
  s.stream_stats.hub_requests = static_cast<int64_t>(hub.requests);
  s.stream_stats.hub_ring_requests = static_cast<int64_t>(hub.ring_requests);
  s.stream_stats.hub_direct_requests = static_cast<int64_t>(hub.direct_requests);
  SLUICE_LOG(INFO) << "hub: " << hub.requests << " requests from the roles, " << hub.ring_requests
                   << " through shared-memory rings, " << hub.direct_requests << " through direct TCP connections"
                   << (po.hub_fast_paths ? "" : " (pipeline.hub_fast_paths off)");
  metrics_server.reset();
  // Cleanup, whatever happened: the roles are gone (reaped), so nothing is in use.
  server->Stop();
  Status destroyed = ce::DestroyShmStore(kShmPrefix, store_name);
  if (!destroyed.ok() && destroyed.code() != StatusCode::kNotFound) {
    SLUICE_LOG(WARNING) << "weight store " << store_name << ": " << destroyed.ToString();
  }
  SLUICE_RETURN_IF_ERROR(result);
  // A trainer command's weights were adopted above; Sluice keeps no
  // checkpoint of a trainer it does not run.
  if (!po.trainer_command.empty()) return Status::Ok();

  // The trained weights, step and version: the trainer's last checkpoint.
  bool loaded = false;
  SLUICE_RETURN_IF_ERROR(s.LoadLatestCheckpoint(&loaded));
  if (!loaded || s.step != s.options.rl.steps) {
    return Status::Internal("the trainer role ended without a checkpoint of the last step");
  }
  return Status::Ok();
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
      if (follower) {
        done = StreamRoles::FollowTrainer(s, client, health, slot);
        break;
      }
      SLUICE_ASSIGN_OR_RETURN(TensorMap initial, model::ExportWeights(*s.policy));
      ce::ShmPublisherOptions pub;
      pub.store_name = c.weights;
      pub.shm_prefix = kShmPrefix;
      pub.layout = ce::LayoutOf(initial);
      SLUICE_ASSIGN_OR_RETURN(auto publisher, ce::ShmPublisher::Attach(pub));
      SLUICE_RETURN_IF_ERROR(publisher->Publish(s.version, initial));
      initial.clear();
      StreamRoles::Trainer t;
      t.weights = publisher.get();
      s.lease_holder = LeaseHolder(ProcessName(c.role, c.trainer_rank), ::getpid());  // named in the hub's ack log
      done = StreamRoles::RunTrainer(
          s, client, t, health, [this] { return Evaluate(); }, progress);
      break;
    }
    case PipelineRole::kRollout: {
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
      StreamRoles::Rollout r{served,  standby.get(),
                             weights, slot,
                             index,   po.AllRolloutReplicas() > 1 || index > 0 ? ProcessName(c.role, index) + " " : ""};
      done = StreamRoles::RunRollout(s, client, r, health, stopping);
      standby->Stop();
      if (c.remote) {
        SLUICE_LOG(INFO) << name << ": " << health.replica(index).tokens << " tokens generated; "
                         << ReceivedVersions(broadcast) << " version(s) received over the broadcast, the last "
                         << weights->latest_version();
      }
      break;
    }
    case PipelineRole::kReward:
      s.lease_holder = LeaseHolder(ProcessName(c.role, index) + (c.remote ? "@" + HostName() : ""), ::getpid());
      done = StreamRoles::RunReward(s, client, health, stopping, slot,
                                    po.AllRewardWorkers() > 1 || index > 0 ? ProcessName(c.role, index) + " " : "");
      if (c.remote && done.ok()) {
        SLUICE_LOG(INFO) << s.lease_holder << ": done scoring, " << health.reward_errors() << " reward error(s)";
      }
      break;
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
