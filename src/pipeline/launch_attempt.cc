// One attempt of the launcher of pipeline.processes (launch_attempt.h).
#include "launch_attempt.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "metrics_log.h"
#include "ranks_store.h"
#if SLUICE_HAVE_WEIGHT_BROADCAST
#include "sluice/checkpoint_engine/relay.h"
#include "sluice/checkpoint_engine/rendezvous.h"
#endif
#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/common/file_util.h"
#include "sluice/common/logging.h"
#include "sluice/common/shm.h"
#include "sluice/model/config.h"
#include "sluice/transfer_queue/remote.h"
#include "stream_roles.h"

namespace sluice::pipeline {

using std::chrono::milliseconds;

namespace {

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

}  // namespace

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

namespace {

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

// The package's build directory next to this build's `sluice`
// (build/<preset>/apps/sluice -> build/<preset>/python), if there is one.
std::optional<std::string> BuiltPythonPackage(const std::string& sluice_exe) {
  const fs::path dir = fs::path(sluice_exe).parent_path().parent_path() / "python";
  std::error_code ec;
  if (fs::exists(dir / "sluice" / "__init__.py", ec)) return dir.string();
  return std::nullopt;
}

}  // namespace

LaunchAttempt::TraceEnd::~TraceEnd() {
  if (attempt != nullptr) StreamRoles::FinishTrace(attempt->s_, attempt->trace_parts_);
}

LaunchAttempt::RemoveFile::~RemoveFile() {
  std::error_code ec;
  if (!path.empty()) fs::remove(path, ec);
}

LaunchAttempt::ExitedForRanks::~ExitedForRanks() {
  if (store != nullptr) (void)store->SetShared(kLauncherExitedKey, "1");
}

void LaunchAttempt::EndForRanks::Say(const Status& outcome) {
  if (store == nullptr || said) return;
  said = true;
  ok = outcome.ok();
  (void)store->SetShared(kRanksEndedKey, RunEndedValue(outcome));
}

LaunchAttempt::EndForRanks::~EndForRanks() {
  Say(Status::Aborted("rank 0's launcher stopped before its run's processes"));
}

LaunchAttempt::StoppedForStorage::~StoppedForStorage() {
  if (store == nullptr) return;
  hub->Stop();
  end->Say(Status::Aborted("rank 0's launcher stopped early"));  // (said already unless it failed)
  // (After a failure they exit at the word, and a dead one never says.)
  if (!store->SetShared(kHubStoppedKey, "1").ok() || !end->ok) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (int32_t i = 0; i < ranks; ++i) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    (void)store->GetShared(kHubStoragePrefix + std::to_string(i) + "/done", std::max(left, milliseconds(0)));
  }
}

LaunchAttempt::LaunchAttempt(TrainingRun::State& s, bool resumed)
    : s_(s),
      po_(s.options.pipeline),
      resumed_(resumed),
      remote_processes_(s.options.pipeline.HasRemoteProcesses()),
      external_(!s.options.pipeline.trainer_command.empty()) {}

LaunchAttempt::~LaunchAttempt() { EndProcesses(); }

Status LaunchAttempt::Run(const std::atomic<bool>* stop) {
  if (po_.wiring.role_command.empty()) {
    return Status::FailedPrecondition("pipeline.processes needs a role command (set by the sluice front end)");
  }
  if (s_.step >= s_.options.rl.steps) return Status::Ok();
  run_start_ = Clock::now();
  SLUICE_RETURN_IF_ERROR(Prepare());
  SLUICE_RETURN_IF_ERROR(OpenRanksStore());
  SLUICE_RETURN_IF_ERROR(StartHub());
  SLUICE_RETURN_IF_ERROR(StartHealth());
  return Finish(RunProcesses(stop));
}

Status LaunchAttempt::Prepare() {
  SweepDeadRuns();
  // Names of this run's shared-memory objects: unique per launcher process.
  static std::atomic<int> runs{0};
  const ProcessIdentity me = CurrentProcess();
  tag_ = std::to_string(me.pid) + "-" + std::to_string(me.start_time) + "-" + std::to_string(runs.fetch_add(1));
  store_name_ = "run-" + tag_;
  health_name_ = ShmSegmentName({kShmPrefix, "health", tag_});

  // The roles start from this process's weights (after the warm start, or
  // the resumed checkpoint's).
  init_dir_ = fs::path(s_.options.run_dir) / "roles" / "init";
  SLUICE_RETURN_IF_ERROR(s_.SaveModel(init_dir_.string()));

  // run.trace: the launcher's part (the prompt feeder); each role process
  // writes its own (a process started again appends to it), and all of them
  // become run_dir/trace.json at the end. Parts a killed launcher left go first.
  trace_parts_ = {"launcher"};
  for (int64_t r = 0; r < po_.trainer_ranks; ++r) trace_parts_.push_back(ProcessName(PipelineRole::kTrainer, r));
  for (int64_t r = 0; r < po_.rollout_replicas; ++r) trace_parts_.push_back(ProcessName(PipelineRole::kRollout, r));
  for (int64_t r = 0; r < po_.reward_workers; ++r) trace_parts_.push_back(ProcessName(PipelineRole::kReward, r));
  for (const std::string& part : trace_parts_) std::remove(StreamRoles::TracePart(s_, part).c_str());
  SLUICE_RETURN_IF_ERROR(StreamRoles::StartTrace(s_, "launcher"));
  trace_end_.attempt = this;
  return Status::Ok();
}

// pipeline.trainer_ranks > 1: where the ranks meet. All on this host: a file
// store in the run's roles/ directory (nothing listens on the network). Some
// elsewhere: a TCPStore served here for as long as they run (TCPStore listens
// on every interface), or the launcher's agent's.
Status LaunchAttempt::OpenRanksStore() {
  const std::chrono::seconds rank_timeout(po_.rank_timeout_seconds);
  if (po_.trainer_ranks > 1 && !remote_processes_) {
    rank_file_.path = fs::path(s_.options.run_dir) / "roles" / ("ranks-" + tag_ + ".store");
    std::error_code ec;
    fs::remove(rank_file_.path, ec);  // a fresh file for every start
    store_at_ = "file:" + rank_file_.path.string();
  } else if (po_.trainer_ranks > 1 || remote_processes_) {
    int port = 0;
    if (!po_.wiring.trainer_store.empty()) {
      SLUICE_RETURN_IF_ERROR(
          ParseListenAddress(po_.wiring.trainer_store, &store_host_, &port).WithContext("the ranks' store"));
    }
    if (po_.wiring.trainer_store_external) {
      SLUICE_ASSIGN_OR_RETURN(rank_store_,
                              trainer::DataParallelStore::Connect(store_host_, port, rank_timeout, StoreKeys(po_)));
    } else {
      SLUICE_ASSIGN_OR_RETURN(rank_store_,
                              trainer::DataParallelStore::Serve(store_host_, port, rank_timeout, StoreKeys(po_)));
    }
    store_at_ = store_host_ + ":" + std::to_string(rank_store_->port());
  }
  exited_for_ranks_.store = remote_processes_ ? rank_store_.get() : nullptr;
  end_for_ranks_.store = rank_store_.get();
  if (!rank_store_ || !remote_processes_) return Status::Ok();
  // A torchrun restart: the attempt before ends now if it has not (its rank
  // 0 died), so its processes elsewhere stop, and the new ones stop waiting
  // for it (AwaitPreviousAttempt).
  if (!po_.wiring.previous_store_prefix.empty()) {
    Result<std::unique_ptr<trainer::DataParallelStore>> last =
        ConnectRanksStore(store_at_, rank_timeout, po_.wiring.previous_store_prefix);
    if (last.ok()) {
      if (!(*last)->GetShared(kRanksEndedKey, milliseconds(0)).ok()) {
        (void)(*last)->SetShared(
            kRanksEndedKey,
            RunEndedValue(Status::Aborted("rank 0 was started again (a torchrun restart) before it ended")));
      }
      (void)(*last)->SetShared(kLauncherExitedKey, "1");  // (its process is gone)
    }
  }
  // That this launcher lives, for the processes elsewhere (LauncherLife): a
  // beat once a second on a connection of its own.
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<trainer::DataParallelStore> beat_store,
                          ConnectRanksStore(store_at_, rank_timeout, StoreKeys(po_)));
  return launcher_beat_.Start([beat_store](std::stop_token stop) {
    for (int64_t beat = 1; !stop.stop_requested(); ++beat) {
      (void)beat_store->SetShared(kLauncherBeatKey, std::to_string(beat));
      for (int i = 0; i < 10 && !stop.stop_requested(); ++i) std::this_thread::sleep_for(milliseconds(100));
    }
  });
}

Status LaunchAttempt::StartHub() {
  // The hub's ack log (docs/pipeline.md, "The hub's ack log"): a line saying
  // from which step this attempt's hub starts, then a line per ack.
  so_.controller.ack_log = (fs::path(s_.options.run_dir) / kHubAckLog).string();
  SLUICE_RETURN_IF_ERROR(
      AppendToFile(so_.controller.ack_log, "{\"hub\":\"started\",\"from_step\":" + std::to_string(s_.step) + "}\n"));
  if (!po_.wiring.hub_bind.empty()) {
    so_.bind = po_.wiring.hub_bind;
    if (!tq::IsLoopbackEndpoint(so_.bind)) {
      SLUICE_ASSIGN_OR_RETURN(so_.token, RandomToken());
    }
  }
  so_.controller.columns = HubColumns();
  so_.controller.tasks = HubTasks();
  so_.shm_bytes = HubBytes(s_.options);
  so_.controller.capacity_bytes = so_.shm_bytes / 4 * 3;
  // A role's write of an answer or a reward lasts milliseconds; one left
  // open is a dead process's, and holds the answer's cells until aborted.
  so_.open_write_timeout = kOpenWriteTimeout;
  if (po_.remote_storage_units > 0) SLUICE_RETURN_IF_ERROR(PlaceHubStorage(po_, *rank_store_, &so_));
  SLUICE_ASSIGN_OR_RETURN(server_, tq::TransferQueueServer::Start(so_));
  if (!so_.storage_hosts.empty()) {
    std::string where;
    for (const tq::StorageHost& h : so_.storage_hosts)
      where += ", unit " + std::to_string(h.first_unit) + " at " + h.endpoint;
    SLUICE_LOG(INFO) << "hub: " << so_.storage_units << " storage units, unit 0 on this host" << where;
  }
  if (po_.remote_storage_units > 0) {
    stopped_for_storage_.hub = server_.get();
    stopped_for_storage_.ranks = po_.remote_storage_units;
    stopped_for_storage_.end = &end_for_ranks_;
    stopped_for_storage_.store = rank_store_.get();  // armed
  }
  local_.emplace(server_->controller(), server_->storage());
  return CreateHubPartitions(*local_, s_.options.rl.group_size);
}

Status LaunchAttempt::StartHealth() {
  SLUICE_ASSIGN_OR_RETURN(health_, RunHealth::CreateShared(health_name_));
  health_->RecordTrainer(s_.step, s_.version);
  // pipeline.trainer_command replaces the trainer process with a user's; the
  // trainer ranks this launcher starts (the others were launched elsewhere).
  local_ranks_ = po_.wiring.local_trainer_ranks > 0 ? po_.wiring.local_trainer_ranks : po_.trainer_ranks;
  processes_ = RoleProcesses(external_ ? 1 : local_ranks_, po_.rollout_replicas, po_.reward_workers);
  Result<std::unique_ptr<MetricsServer>> serving =
      StreamRoles::ServeMetrics(s_, *health_, *local_, processes_, server_.get());
  if (!serving.ok()) return serving.status().WithContext("run.metrics_listen");
  metrics_server_ = std::move(serving).value();
  // The prompts are fed from here, the one process that reads the training
  // split; a failure stops the roles.
  return feeder_.Start([this](std::stop_token stop) {
    fed_ = StreamRoles::FeedPrompts(s_, *local_, *health_, [&] { return stop.stop_requested(); });
    if (!fed_.ok()) {
      feed_failed_.store(true);
      health_->RequestStop();
    }
  });
}

// pipeline.trainer_command: this process creates the weight store with the
// starting version and keeps a reader on it (so the store outlives the
// command's publisher and the result can be read), then hands the
// publisher's place to the command.
Status LaunchAttempt::PrepareExternalTrainer() {
  SLUICE_ASSIGN_OR_RETURN(TensorMap initial, model::ExportWeights(*s_.policy));
  ce::ShmPublisherOptions pub;
  pub.store_name = store_name_;
  pub.shm_prefix = kShmPrefix;
  pub.layout = ce::LayoutOf(initial);
  SLUICE_ASSIGN_OR_RETURN(auto publisher, ce::ShmPublisher::Attach(pub));
  ce::ShmSubscriberOptions sub;
  sub.store_name = store_name_;
  sub.shm_prefix = kShmPrefix;
  sub.expected_layout = pub.layout;
  SLUICE_ASSIGN_OR_RETURN(store_reader_, ce::ShmSubscriber::Attach(sub));
  SLUICE_RETURN_IF_ERROR(publisher->Publish(s_.version, initial));
  publisher.reset();
  // The command's metrics lines go here; the report needs the file.
  SLUICE_RETURN_IF_ERROR(MetricsLog::Open(s_.options.run_dir).status());
  info_path_ = (fs::path(s_.options.run_dir) / "roles" / "trainer.json").string();
  SLUICE_RETURN_IF_ERROR(WriteFileAtomically(
      info_path_, StreamRoles::ExternalTrainerInfo(s_, server_->endpoint(), store_name_, init_dir_.string())));
  SLUICE_LOG(INFO) << "trainer command: hub " << server_->endpoint() << ", weight store " << store_name_ << " (version "
                   << s_.version << " published), run info " << info_path_;
  return Status::Ok();
}

// Rollout replicas elsewhere get the weights through the relay; every
// process elsewhere reads the run info from the ranks' store.
Status LaunchAttempt::PublishRunInfo() {
  if (!rank_store_) return Status::Ok();
  if (po_.remote_rollout_replicas > 0) {
    SLUICE_ASSIGN_OR_RETURN(TensorMap weights, model::ExportWeights(*s_.policy));
    SLUICE_ASSIGN_OR_RETURN(
        relay_, WeightRelay::Start(store_host_, store_name_, ce::LayoutOf(weights), po_.remote_rollout_replicas,
                                   std::chrono::seconds(po_.rank_timeout_seconds)));
  }
  if (!remote_processes_) return Status::Ok();
  std::map<std::string, std::string> model_files;  // (a preset: none)
  if (!po_.wiring.model_path.empty()) {
    SLUICE_ASSIGN_OR_RETURN(model_files, model::ModelFilesDigests(po_.wiring.model_path));
  }
  const nlohmann::json info = {{"hub", server_->endpoint()},
                               {"token", so_.token},
                               {"start_step", s_.step},
                               {"start_version", s_.version},
                               {"config_digest", po_.wiring.config_digest},
                               {"model_files", model_files},
                               {"weights", relay_ ? relay_->address() : ""}};
  return rank_store_->SetShared(kRanksRunInfoKey, info.dump());
}

Status LaunchAttempt::StartProcesses() {
  SLUICE_ASSIGN_OR_RETURN(supervisor_, runtime::Supervisor::Create({}));
  for (const auto& [role, rank, slot] : processes_) {
    runtime::ChildSpec spec;
    spec.name = ProcessName(role, rank);
    spec.env["OMP_WAIT_POLICY"] = "PASSIVE";
    if (!so_.token.empty()) spec.env[kHubTokenVariable] = so_.token;  // not on the command line (ps shows it)
    if (role == PipelineRole::kTrainer && external_) {
      spec.path = "/bin/sh";
      spec.args = {"-c", po_.trainer_command};
      spec.env["SLUICE_RUN_INFO"] = info_path_;
      if (std::optional<std::string> package = BuiltPythonPackage(po_.wiring.role_command.front())) {
        const char* path = std::getenv("PYTHONPATH");
        spec.env["PYTHONPATH"] = *package + (path != nullptr && *path != 0 ? ":" + std::string(path) : "");
      }
      SLUICE_RETURN_IF_ERROR(supervisor_->Start(spec).WithContext("starting pipeline.trainer_command"));
      // It beats no heartbeat of its own: what this launcher sees it do
      // (answers acked on the hub, weight versions published) is its
      // heartbeat, put on its slot by RecordExternalProgress.
      if (slot >= 0) {
        trainer_command_slot_ = slot;
        watched_.push_back({spec.name, "pipeline.trainer_command", slot, supervisor_->PidOf(spec.name)});
      }
      continue;
    }
    spec.path = po_.wiring.role_command.front();
    spec.args.assign(po_.wiring.role_command.begin() + 1, po_.wiring.role_command.end());
    // The trainer takes up the checkpoint (its optimizer state and the
    // metrics lines it covers), also when this launcher resumed the run (a
    // torchrun restart resumes without run.resume in the saved config).
    if (resumed_ || s_.options.resume) spec.args.push_back("run.resume=true");
    spec.args.push_back("--role=" + PipelineRoleName(role));
    spec.args.push_back("--hub=" + server_->endpoint());
    spec.args.push_back("--weights=" + store_name_);
    spec.args.push_back("--health=" + health_name_);
    spec.args.push_back("--start-step=" + std::to_string(s_.step));
    spec.args.push_back("--start-version=" + std::to_string(s_.version));
    spec.args.push_back("--health-slot=" + std::to_string(slot));
    if (role == PipelineRole::kTrainer && po_.trainer_ranks > 1) {
      spec.args.push_back("--trainer-rank=" + std::to_string(rank));
      spec.args.push_back("--trainer-store=" + store_at_);
      spec.args.push_back("--trainer-store-prefix=" + StoreKeys(po_));
      spec.args.push_back("--trainer-ranks=" + std::to_string(po_.trainer_ranks));  // a launcher may have set them
    }
    if (role != PipelineRole::kTrainer) {
      spec.args.push_back("--replica=" + std::to_string(rank));
      // Started again alone: the hub and the others carry on (a trainer
      // rank's failure restarts everything from the checkpoint instead).
      spec.max_restarts = static_cast<int32_t>(po_.max_restarts);
    }
    SLUICE_RETURN_IF_ERROR(supervisor_->Start(spec).WithContext("starting the " + spec.name + " role"));
    if (role != PipelineRole::kTrainer) holders_[spec.name] = supervisor_->PidOf(spec.name);
    if (slot < 0) continue;  // beyond the slots: not watched
    const bool one_of_many = role == PipelineRole::kTrainer   ? rank > 0
                             : role == PipelineRole::kRollout ? po_.rollout_replicas > 1
                                                              : po_.reward_workers > 1;
    const std::string what = one_of_many ? PipelineProcessTitle(role, rank) : "the " + PipelineRoleName(role) + " role";
    watched_.push_back({spec.name, what, slot, supervisor_->PidOf(spec.name)});
  }
  return Status::Ok();
}

// The next free slot, as at a process's start (none beyond the slots: not watched).
std::optional<int> LaunchAttempt::FreshSlot() {
  if (next_slot_ >= RunHealth::kSlots) return std::nullopt;
  const int slot = next_slot_++;
  health_->Restart(slot);
  return slot;
}

std::optional<StallWatch::Role> LaunchAttempt::RemoteRole(PipelineRole role, int64_t index) {
  const std::optional<int> slot = FreshSlot();
  if (!slot) return std::nullopt;
  health_->Label(*slot, role, index);
  StallWatch::Role r{ProcessName(role, index), PipelineProcessTitle(role, index), *slot, -1};
  r.remote = true;
  remote_beats_->Add(r.name, *slot, role == PipelineRole::kRollout ? index : -1);
  if (s_.options.trace) {
    std::remove(StreamRoles::TracePart(s_, r.name).c_str());  // one a killed run left
    trace_parts_.push_back(r.name);
  }
  return r;
}

// Processes on other hosts: watched through the heartbeats they report to the
// ranks' store, mirrored onto slots after the local ones (those that join
// later too, as they join), with their counters and (run.trace) their parts
// of the trace; the hub's storage ranks too, each reporting a heartbeat while
// its server goes round its loop (ServeHubStorage): they stop after this
// watch, once the hub has, so no last report is waited for.
void LaunchAttempt::WatchProcessesElsewhere() {
  RemoteBeats::Options remote_options;
  remote_options.on_new_life = [this](const std::string& name, const std::string& host, pid_t pid) {
    if (watch_) watch_->SetHost(name, host, pid);
  };
  if (s_.options.trace) {
    remote_options.trace_part = [this](const std::string& name) { return StreamRoles::TracePart(s_, name); };
  }
  remote_beats_ = std::make_unique<RemoteBeats>(remote_options);
  for (const RoleProcess& p : processes_) next_slot_ = std::max(next_slot_, p.slot + 1);
  if (rank_store_ && remote_processes_) {
    auto watch_remote = [&](PipelineRole role, int64_t from, int64_t to) {
      for (int64_t i = from; i < to; ++i) {
        if (std::optional<StallWatch::Role> r = RemoteRole(role, i)) watched_.push_back(*r);
      }
    };
    watch_remote(PipelineRole::kTrainer, local_ranks_, po_.trainer_ranks);
    watch_remote(PipelineRole::kRollout, po_.rollout_replicas, po_.AllRolloutReplicas());
    watch_remote(PipelineRole::kReward, po_.reward_workers, po_.AllRewardWorkers());
  }
  storage_beats_ =
      std::make_unique<RemoteBeats>(RemoteBeats::Options{.on_new_life = remote_options.on_new_life, .trace_part = {}});
  for (int64_t i = 0; i < po_.remote_storage_units; ++i) {
    const std::optional<int> slot = FreshSlot();
    if (!slot) break;
    health_->LabelHubStorage(*slot, i);
    StallWatch::Role r{HubStorageProcessName(i), "hub storage rank " + std::to_string(i), *slot, -1};
    r.remote = true;
    storage_beats_->Add(r.name, *slot);
    watched_.push_back(std::move(r));
  }
}

// A rollout replica or reward worker that died: its hub leases go back to the
// others at once, not when they run out (worker_lease_seconds).
void LaunchAttempt::ReleaseDeadHolders() {
  for (auto& [name, pid] : holders_) {
    const pid_t now = supervisor_->PidOf(name);
    if (now == pid) continue;
    if (pid > 0) {
      LogReleased(name, pid, server_->controller()->ReleaseHolder({LeaseHolder(name, pid)}), /*quiet_if_none=*/true);
    }
    pid = now;
  }
}

// A rank launched elsewhere that refused the run, and processes that joined
// it (once a second).
Status LaunchAttempt::CheckRanksElsewhere() {
  if (!rank_store_ || !remote_processes_ || std::chrono::steady_clock::now() < next_ranks_check_) return Status::Ok();
  next_ranks_check_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  if (Result<std::string> why = rank_store_->GetShared(kRanksRefusedKey, milliseconds(0)); why.ok()) {
    return Status::FailedPrecondition(*why);
  }
  for (auto& [role, seen] : joined_) {
    const std::string name = PipelineRoleName(role);
    Result<std::string> count = rank_store_->GetShared(kRanksJoinedPrefix + name, milliseconds(0));
    // (a number from the network: no more than a run can have)
    const int64_t now = std::min<int64_t>(count.ok() ? std::atoll(count->c_str()) : 0, RunHealth::kMaxReplicas);
    if (now <= seen) continue;
    SLUICE_LOG(INFO) << now - seen << " more " << name << " process(es) joined the run from other hosts (" << now
                     << " beyond the launch)";
    // Watched from now on, as the declared ones elsewhere are.
    const int64_t declared = role == PipelineRole::kRollout ? po_.AllRolloutReplicas() : po_.AllRewardWorkers();
    for (int64_t i = seen; i < now; ++i) {
      if (std::optional<StallWatch::Role> r = RemoteRole(role, declared + i)) watch_->Add(*r);
    }
    if (role == PipelineRole::kRollout) health_->SetJoinedRolloutReplicas(static_cast<int32_t>(now));
    seen = now;
  }
  return Status::Ok();
}

// The trainer command's acks and publishes (every 20 ms): its progress
// records (TrainerRecord, which the rollout's admission reads: its acks are
// its progress, in whole steps, as it acks a step's groups after
// publishing, with the version published before them), and each ack or
// publish is a turn of its loop for the watchdog.
Status LaunchAttempt::RecordExternalProgress() {
  if (!external_ || std::chrono::steady_clock::now() < next_record_) return Status::Ok();
  next_record_ = std::chrono::steady_clock::now() + milliseconds(20);
  SLUICE_ASSIGN_OR_RETURN(const uint64_t acked, StreamRoles::TrainTaskAcked(*local_));
  const PolicyVersion version = store_reader_->latest_version();  // (read after the acks)
  const uint64_t step_answers = static_cast<uint64_t>(s_.options.rl.prompts_per_step * s_.options.rl.group_size);
  const int64_t trained = std::min<int64_t>(s_.step + static_cast<int64_t>(acked / step_answers), s_.options.rl.steps);
  while (external_record_.step < trained) {
    external_record_ = {external_record_.step + 1, std::max(version, external_record_.version)};
    SLUICE_RETURN_IF_ERROR(WriteTrainerRecord(*local_, external_record_));
  }
  if (trainer_command_slot_ >= 0 && (acked != trainer_acked_ || version != trainer_version_)) {
    const RoleActivity did = version != trainer_version_ ? RoleActivity::kPublish : RoleActivity::kAck;
    trainer_acked_ = acked;
    trainer_version_ = version;
    const int64_t now_ns = std::chrono::steady_clock::now().time_since_epoch().count();
    health_->Mirror(trainer_command_slot_, {now_ns, static_cast<uint32_t>(did), now_ns});
  }
  return Status::Ok();
}

Status LaunchAttempt::Check() {
  ReleaseDeadHolders();
  if (relay_) SLUICE_RETURN_IF_ERROR(relay_->status());
  if (!remote_beats_->empty()) remote_beats_->Poll(*rank_store_, *health_);
  if (!storage_beats_->empty()) storage_beats_->Poll(*rank_store_, *health_);
  SLUICE_RETURN_IF_ERROR(CheckRanksElsewhere());
  SLUICE_RETURN_IF_ERROR(RecordExternalProgress());
  // A trainer command that exits 0 before acking every answer would leave
  // the rollout waiting for its progress: that ends the run.
  if (external_ && !checked_exit_ && supervisor_->HasExited(PipelineRoleName(PipelineRole::kTrainer))) {
    checked_exit_ = true;
    SLUICE_RETURN_IF_ERROR(StreamRoles::CheckExternalTrainerAcked(s_, *local_));
  }
  return watch_->Check();
}

Status LaunchAttempt::RunProcesses(const std::atomic<bool>* stop) {
  struct End {
    LaunchAttempt* a;
    ~End() { a->EndProcesses(); }
  } end{this};
  if (external_) SLUICE_RETURN_IF_ERROR(PrepareExternalTrainer());
  SLUICE_RETURN_IF_ERROR(PublishRunInfo());
  SLUICE_RETURN_IF_ERROR(StartProcesses());
  WatchProcessesElsewhere();
  watch_ = std::make_unique<StallWatch>(*health_, std::move(watched_), po_,
                                        [this](const std::string& name) { return supervisor_->PidOf(name); });
  trainer_version_ = s_.version;
  external_record_ = {s_.step, s_.version};
  next_ranks_check_ = next_record_ = std::chrono::steady_clock::now();
  // A year is "no limit" for a run; SIGINT, failures and stalls end it sooner.
  Status waited = supervisor_->Wait(std::chrono::hours(24 * 365), stop, [this] { return Check(); });
  supervisor_->StopAll();
  if (!remote_beats_->empty()) {
    // The processes elsewhere stop now: their last counters and trace.
    end_for_ranks_.Say(waited);
    remote_beats_->Finish(*rank_store_, *health_,
                          std::min<milliseconds>(std::chrono::seconds(po_.rank_timeout_seconds), milliseconds(10000)));
    SLUICE_LOG(INFO) << "rollout: " << health_->rollout().tokens << " tokens generated, " << remote_beats_->tokens()
                     << " of them on other hosts; " << health_->reward_errors() << " reward error(s), "
                     << remote_beats_->reward_errors() << " of them on other hosts";
  }
  if (relay_) {
    SLUICE_LOG(INFO) << "weight relay: " << relay_->deliveries()
                     << " version deliveries over the broadcast to the rollout replicas on other hosts";
  }
  if (waited.ok() && external_) waited = StreamRoles::AdoptExternalResult(s_, *local_, *store_reader_);
  return waited;
}

// What RunProcesses started goes, in the reverse order (each reset is a
// no-op the second time).
void LaunchAttempt::EndProcesses() {
  watch_.reset();
  storage_beats_.reset();
  remote_beats_.reset();
  supervisor_.reset();
  relay_.reset();
  store_reader_.reset();
}

Status LaunchAttempt::Finish(Status result) {
  // A feeding error is the cause when it came first: the roles it stopped
  // fail after it. One that comes after the run failed is the failure's
  // consequence (a write the feeder had under way to a hub storage rank the
  // watchdog found frozen ends on the hub's timeout) and is logged.
  const bool feeder_failed_first = feed_failed_.load();
  health_->RequestStop();
  feeder_.Stop();
  if (!fed_.ok() && (feeder_failed_first || result.ok())) {
    result = fed_.WithContext("feeding prompts");
  } else if (!fed_.ok()) {
    SLUICE_LOG(WARNING) << "feeding prompts, after the run failed: " << fed_.ToString();
  }
  end_for_ranks_.Say(result);
  s_.stream_stats = health_->Summary(std::chrono::duration<double>(Clock::now() - run_start_).count());
  const tq::ServerCounters hub = server_->counters();
  s_.stream_stats.hub_requests = static_cast<int64_t>(hub.requests);
  s_.stream_stats.hub_ring_requests = static_cast<int64_t>(hub.ring_requests);
  s_.stream_stats.hub_direct_requests = static_cast<int64_t>(hub.direct_requests);
  SLUICE_LOG(INFO) << "hub: " << hub.requests << " requests from the roles, " << hub.ring_requests
                   << " through shared-memory rings, " << hub.direct_requests << " through direct TCP connections"
                   << (po_.hub_fast_paths ? "" : " (pipeline.hub_fast_paths off)");
  metrics_server_.reset();
  // Cleanup, whatever happened: the roles are gone (reaped), so nothing is in use.
  server_->Stop();
  Status destroyed = ce::DestroyShmStore(kShmPrefix, store_name_);
  if (!destroyed.ok() && destroyed.code() != StatusCode::kNotFound) {
    SLUICE_LOG(WARNING) << "weight store " << store_name_ << ": " << destroyed.ToString();
  }
  SLUICE_RETURN_IF_ERROR(result);
  // A trainer command's weights were adopted above; Sluice keeps no
  // checkpoint of a trainer it does not run.
  if (external_) return Status::Ok();
  // The trained weights, step and version: the trainer's last checkpoint.
  bool loaded = false;
  SLUICE_RETURN_IF_ERROR(s_.LoadLatestCheckpoint(&loaded));
  if (!loaded || s_.step != s_.options.rl.steps) {
    return Status::Internal("the trainer role ended without a checkpoint of the last step");
  }
  return Status::Ok();
}

}  // namespace sluice::pipeline
