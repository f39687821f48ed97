// The launched processes of a run other than rank 0's launcher: trainer
// ranks above 0 and rollout replicas or reward workers on other hosts (each
// meets rank 0's run in the ranks' store, checks its config, and runs its
// role, or supervises it), processes joining beyond the launch, hub storage
// ranks, and a torchrun restart attempt's wait for the one before.
#include "sluice/pipeline/rank_agent.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ranks_store.h"
#include "remote_link.h"
#include "run_state.h"
#include "sluice/common/logging.h"
#include "sluice/common/socket_util.h"
#include "sluice/model/config.h"
#include "sluice/runtime/supervisor.h"
#include "sluice/transfer_queue/remote.h"
#include "sluice/transfer_queue/server.h"
#include "stream_roles.h"

namespace sluice::pipeline {

using std::chrono::milliseconds;

namespace {

// A hub storage rank's heartbeat stops when its server's I/O thread has not
// gone round its loop (at least every 200 ms while it serves) for this long.
constexpr std::chrono::milliseconds kServerTurnLimit{2000};

// Rank 0's run as it published it in the ranks' store, checked: well
// formed, this process's config (a launched rank's refusal stops the run,
// which would wait for it; one that joins is only turned away), and, for a
// rollout replica joining, a run that relays weights to other hosts.
Result<nlohmann::json> ReadRunInfo(trainer::DataParallelStore& client, const PipelineOptions& po,
                                   const std::string& store, std::chrono::milliseconds wait, PipelineRole role,
                                   const std::string& who, bool joined) {
  Result<std::string> text = client.GetShared(kRanksRunInfoKey, wait);
  if (!text.ok()) {
    return Status::Unavailable(who + ": rank 0's `sluice train` published no run in the store at " + store +
                               " within " + std::to_string(wait.count() / 1000) + " s (" + text.status().message() +
                               ")");
  }
  auto malformed = [&] {
    return Status::DataLoss(who + ": the run rank 0 published in the store is malformed: " + text->substr(0, 200));
  };
  nlohmann::json info = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!info.is_object() || !info.contains("hub") || !info["hub"].is_string() || !info.contains("token") ||
      !info["token"].is_string() || !info.contains("start_step") || !info["start_step"].is_number_integer() ||
      !info.contains("start_version") || !info["start_version"].is_number_integer() ||
      !info.contains("config_digest") || !info["config_digest"].is_string() || !info.contains("weights") ||
      !info["weights"].is_string() || !info.contains("model_files") || !info["model_files"].is_object() ||
      info["model_files"].size() > 4096) {
    return malformed();
  }
  auto refuse = [&](const std::string& why) {
    const Status refused = Status::FailedPrecondition(who + ": " + why);
    if (!joined) (void)client.SetShared(kRanksRefusedKey, refused.message());
    return refused;
  };
  if (info["config_digest"].get<std::string>() != po.wiring.config_digest) {
    return refuse("this process's config (digest " + po.wiring.config_digest + ") differs from rank 0's (digest " +
                  info["config_digest"].get<std::string>() + "): start every rank with the same config and overrides");
  }
  // The same config names the same model.path: the files there must be
  // rank 0's too (its tokenizer and config above all; weights come from rank 0).
  std::map<std::string, std::string> theirs;
  for (const auto& [name, digest] : info["model_files"].items()) {
    if (!digest.is_string() || name.size() > 255 || digest.get<std::string>().size() > 64) {
      return malformed();
    }
    theirs[name] = digest.get<std::string>();
  }
  std::map<std::string, std::string> mine;
  if (!po.wiring.model_path.empty()) {
    Result<std::map<std::string, std::string>> here = model::ModelFilesDigests(po.wiring.model_path);
    if (!here.ok()) return refuse("model.path on this host: " + here.status().message());
    mine = std::move(*here);
  }
  if (const std::string diff = model::DescribeFilesDifference(mine, theirs, "rank 0's host"); !diff.empty()) {
    return refuse("model.path (" + po.wiring.model_path + ") holds another model on this host than on rank 0's (" +
                  diff + "): every host must load the same model");
  }
  if (joined && role == PipelineRole::kRollout && info["weights"].get<std::string>().empty()) {
    return Status::FailedPrecondition(who +
                                      ": the run relays no weights to other hosts (cluster.rollout_ranks=0), "
                                      "so no rollout replica can join it; launch it with cluster.rollout_ranks "
                                      ">= 1");
  }
  return info;
}

}  // namespace

Result<int64_t> ClaimJoinedIndex(const PipelineOptions& po, const std::string& store, PipelineRole role,
                                 std::chrono::milliseconds wait) {
  if (role == PipelineRole::kTrainer) {
    return Status::InvalidArgument("trainer ranks are fixed at launch; rollout replicas and reward workers may join");
  }
  const bool rollout = role == PipelineRole::kRollout;
  const std::string who = std::string("a ") + (rollout ? "rollout replica" : "reward worker") + " joining";
  SLUICE_ASSIGN_OR_RETURN(auto client, ConnectRanksStore(store, wait, StoreKeys(po), who + ": the ranks' store"));
  // Checked before it takes a number: one turned away leaves no gap.
  SLUICE_RETURN_IF_ERROR(ReadRunInfo(*client, po, store, wait, role, who, /*joined=*/true).status());
  SLUICE_ASSIGN_OR_RETURN(const int64_t joined,
                          client->AddShared(std::string(kRanksJoinedPrefix) + PipelineRoleName(role), 1));
  const int64_t index = (rollout ? po.AllRolloutReplicas() : po.AllRewardWorkers()) + joined - 1;
  if (index >= RunHealth::kMaxReplicas) {
    return Status::OutOfRange("joining: a run has at most " + std::to_string(RunHealth::kMaxReplicas) + " " +
                              (rollout ? "rollout replicas" : "reward workers") + "; this would be number " +
                              std::to_string(index + 1));
  }
  return index;
}

namespace {

// RunLaunchedRank's meeting: rank 0's run from the store, checked.
Result<RoleConnection> JoinLaunchedRun(const PipelineOptions& po, const std::string& store, PipelineRole role,
                                       int64_t index, std::chrono::milliseconds wait, bool joined) {
  const bool trainer = role == PipelineRole::kTrainer;
  const std::string who =
      PipelineProcessTitle(role, index) + (trainer ? " of " + std::to_string(po.trainer_ranks) : std::string());
  const int64_t declared = role == PipelineRole::kRollout ? po.AllRolloutReplicas() : po.AllRewardWorkers();
  const bool placed = trainer                          ? index >= 1 && index < po.trainer_ranks && !joined
                      : joined                         ? index >= declared && index < RunHealth::kMaxReplicas
                      : role == PipelineRole::kRollout ? index >= po.rollout_replicas && index < declared
                                                       : index >= po.reward_workers && index < declared;
  if (!placed) return Status::InvalidArgument(who + ": not a process of the run on another host");
  SLUICE_ASSIGN_OR_RETURN(auto client, ConnectRanksStore(store, wait, StoreKeys(po), who + ": the ranks' store"));
  SLUICE_ASSIGN_OR_RETURN(const nlohmann::json info, ReadRunInfo(*client, po, store, wait, role, who, joined));
  RoleConnection c;
  c.role = role;
  c.hub = info["hub"].get<std::string>();
  c.hub_token = info["token"].get<std::string>();
  c.start_step = info["start_step"].get<int64_t>();
  c.start_version = info["start_version"].get<int64_t>();
  c.trainer_rank = trainer ? index : 0;
  c.replica = trainer ? 0 : index;
  c.weights_rendezvous = info["weights"].get<std::string>();
  c.trainer_store = store;
  c.trainer_store_prefix = StoreKeys(po);
  c.remote = true;
  return c;
}

}  // namespace

Status RunLaunchedRank(TrainingRun& run, const std::string& store, PipelineRole role, int64_t index,
                       std::chrono::milliseconds wait, bool joined) {
  SLUICE_ASSIGN_OR_RETURN(const RoleConnection c,
                          JoinLaunchedRun(run.options().pipeline, store, role, index, wait, joined));
  return run.RunRole(c, nullptr);
}

Status SuperviseLaunchedRank(const PipelineOptions& po, const std::string& store, PipelineRole role, int64_t index,
                             std::chrono::milliseconds wait, const std::vector<std::string>& command,
                             const std::map<std::string, std::string>& child_env, bool joined) {
  if (role == PipelineRole::kTrainer) return Status::InvalidArgument("trainer ranks are not restarted alone");
  if (command.empty()) return Status::InvalidArgument("no command to start the " + PipelineRoleName(role) + " with");
  // The run's hub (to give back what a dead child held), and the config check.
  SLUICE_ASSIGN_OR_RETURN(const RoleConnection c, JoinLaunchedRun(po, store, role, index, wait, joined));
  tq::RemoteOptions ro;
  ro.token = c.hub_token;
  ro.shm = tq::ShmMode::kOff;
  SLUICE_ASSIGN_OR_RETURN(tq::RemoteQueue queue, tq::ConnectTransferQueue(c.hub, ro));
  tq::TransferQueueClient hub = queue.client();
  SLUICE_ASSIGN_OR_RETURN(auto supervisor, runtime::Supervisor::Create({}));
  runtime::ChildSpec spec;
  spec.name = ProcessName(role, index);
  spec.path = command.front();
  spec.args.assign(command.begin() + 1, command.end());
  spec.env = child_env;
  spec.max_restarts = static_cast<int32_t>(po.max_restarts);
  SLUICE_RETURN_IF_ERROR(supervisor->Start(spec).WithContext("starting " + spec.name));
  const std::string holder_name = spec.name + "@" + HostName();  // as RunRole names the child's leases
  pid_t seen = supervisor->PidOf(spec.name);
  SLUICE_LOG(INFO) << spec.name << " on this host: started (pid " << seen << "), restarted up to " << po.max_restarts
                   << " times if it fails";
  // A child that died: its hub leases go back to the others at once.
  auto release_dead = [&]() -> Status {
    const pid_t now = supervisor->PidOf(spec.name);
    if (now == seen) return Status::Ok();
    if (seen > 0) LogReleased(spec.name, seen, hub.ReleaseHolder(LeaseHolder(holder_name, seen)), false);
    seen = now;
    return Status::Ok();
  };
  // Once the run is over (rank 0's launcher marked it ended), nothing is
  // started again: a child waiting for its restart is not started, one
  // running gets kGrace to finish by itself. A run that failed, or a rank 0
  // that is gone (LauncherLife), ends this process at once with that error
  // (its child ends as the run did, so this host's torchrun sees a failure).
  SLUICE_ASSIGN_OR_RETURN(auto ranks, ConnectRanksStore(store, wait, c.trainer_store_prefix));
  constexpr auto kGrace = std::chrono::seconds(10);
  std::optional<std::chrono::steady_clock::time_point> over_since;
  auto next_look = std::chrono::steady_clock::now();
  LauncherLife launcher(LauncherSilenceLimit(po));
  const Status kRunOver = Status::Aborted("the run is over");
  auto watch = [&]() -> Status {
    SLUICE_RETURN_IF_ERROR(release_dead());
    const auto now = std::chrono::steady_clock::now();
    if (!over_since && now >= next_look) {
      next_look = now + std::chrono::seconds(1);
      if (std::optional<Status> ended = launcher.Ended(*ranks)) {
        SLUICE_RETURN_IF_ERROR(*ended);
        over_since = now;
      }
    }
    if (over_since && (supervisor->PidOf(spec.name) < 0 || now - *over_since > kGrace)) return kRunOver;
    return Status::Ok();
  };
  Status waited = supervisor->Wait(std::chrono::hours(24 * 365), nullptr, watch);
  supervisor->StopAll();
  if (waited.code() == StatusCode::kAborted && waited.message() == kRunOver.message()) {
    SLUICE_LOG(INFO) << spec.name << " on this host: the run is over, not starting it again";
    return Status::Ok();
  }
  return waited;
}

Status ServeHubStorage(const RunOptions& options, int64_t index, const std::string& placed) {
  const PipelineOptions& po = options.pipeline;
  const std::chrono::seconds timeout(po.rank_timeout_seconds);
  const std::string what = "hub storage unit " + std::to_string(index + 1);
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<trainer::DataParallelStore> store,
                          ConnectRanksStore(po.wiring.trainer_store, timeout, po.wiring.trainer_store_prefix));
  Result<std::string> text = store->GetShared(kHubStoragePlanKey, timeout);
  if (!text.ok()) return text.status().WithContext(what + ": waiting for rank 0's plan of the hub");
  // Rank 0's plan, from the network: checked whole.
  const nlohmann::json plan = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto string = [&](const char* k) {
    return plan.contains(k) && plan[k].is_string() && plan[k].get<std::string>().size() <= 256;
  };
  if (!plan.is_object() || !string("token") || !string("peer_token") || !string("config_digest") ||
      !plan.contains("units") || !plan["units"].is_number_unsigned()) {
    return Status::DataLoss(what + ": rank 0's plan of the hub is malformed: " + text->substr(0, 120));
  }
  auto refuse = [&](const std::string& why) {
    (void)store->SetShared(kRanksRefusedKey, why);  // rank 0 stops instead of waiting
    return Status::FailedPrecondition(why);
  };
  if (plan["config_digest"].get<std::string>() != po.wiring.config_digest) {
    return refuse(what + ": this process's config (digest " + po.wiring.config_digest +
                  ") differs from rank 0's (digest " + plan["config_digest"].get<std::string>() +
                  "): start every rank with the same config and overrides");
  }
  const uint64_t units = plan["units"].get<uint64_t>();
  if (units != static_cast<uint64_t>(1 + po.remote_storage_units) || static_cast<uint64_t>(index) + 1 >= units) {
    return refuse(what + ": rank 0 plans a hub of " + std::to_string(units) + " storage units, this process " +
                  std::to_string(1 + po.remote_storage_units) + " (cluster.storage_ranks)");
  }
  // Reachable where the rendezvous is: this host's address toward it.
  std::string rendezvous;
  int port = 0;
  SLUICE_RETURN_IF_ERROR(ParseListenAddress(po.wiring.trainer_store, &rendezvous, &port));
  std::string bind = "tcp://127.0.0.1:0";
  if (!tq::IsLoopbackEndpoint("tcp://" + rendezvous + ":0")) {
    SLUICE_ASSIGN_OR_RETURN(const std::string here, net::LocalAddressToward(rendezvous));
    bind = "tcp://" + here + ":0";
  }
  tq::ServerOptions so;
  so.bind = bind;
  so.token = plan["token"].get<std::string>();
  so.peer_token = plan["peer_token"].get<std::string>();
  so.storage_only = true;
  so.storage_units = static_cast<uint32_t>(units);
  so.first_unit = static_cast<uint32_t>(index + 1);
  so.unit_count = 1;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<tq::TransferQueueServer> server, tq::TransferQueueServer::Start(so));
  SLUICE_RETURN_IF_ERROR(store->SetShared(kHubStoragePrefix + std::to_string(index), server->endpoint()));
  std::fprintf(stderr, "sluice train: %s, %s of the run at %s, serving on %s\n", placed.c_str(), what.c_str(),
               po.wiring.trainer_store.c_str(), server->endpoint().c_str());
  // Until rank 0's hub has stopped (said after how the run ended, and before
  // its store goes), or at most 30 s after rank 0 ended the run well, or
  // at once when it failed; then ends as the run did. A store gone first, or
  // a launcher silent (LauncherLife), means rank 0 died.
  Status ended = Status::Ok();
  std::optional<std::chrono::steady_clock::time_point> run_ended;
  LauncherLife launcher(LauncherSilenceLimit(po));
  // Its heartbeat for rank 0's watchdog, once a second, as a role process
  // elsewhere reports its own: it beats while its server's I/O thread goes
  // round its loop, and what it does ("serve hub storage") dates from that
  // thread's last turn. A frozen process or server shows there by name.
  const std::unique_ptr<RunHealth> health = RunHealth::InProcess();
  const HealthSlot slot(PipelineRole::kTrainer, 0);  // (its own run health's first slot)
  (void)health->SetActivity(slot.index, static_cast<uint32_t>(RoleActivity::kServeHub));
  const std::string beat_key = RemoteBeatKey(HubStorageProcessName(index)), host = HostName();
  for (int64_t seq = 1;; ++seq) {
    const int64_t io_age_ms = server->counters().io_loop_age_ms;
    if (io_age_ms < kServerTurnLimit.count()) {
      health->Beat(slot);
      SlotHealth h = health->Slot(slot.index);
      h.activity_since_ns = (std::chrono::steady_clock::now() - milliseconds(io_age_ms)).time_since_epoch().count();
      health->Mirror(slot.index, h);
    }
    (void)store->SetShared(beat_key, EncodeRemoteBeat(*health, slot.index, seq, ::getpid(), host));
    Result<std::string> stopped = store->GetShared(kHubStoppedKey, milliseconds(1000));
    if (stopped.ok()) {
      (void)store->SetShared(kHubStoragePrefix + std::to_string(index) + "/done", "1");
      Result<std::string> said = store->GetShared(kRanksEndedKey, milliseconds(5000));
      ended = said.ok() ? RunEndedOutcome(*said) : said.status().WithContext("rank 0's hub stopped; how the run ended");
      break;
    }
    if (stopped.status().code() != StatusCode::kTimeout) {
      ended = stopped.status().WithContext("rank 0's store is gone before its hub said it stopped");
      break;
    }
    if (Status alive = launcher.Check(*store); !alive.ok()) {
      ended = alive;
      break;
    }
    if (!run_ended) {
      if (Result<std::string> said = store->GetShared(kRanksEndedKey, milliseconds(0)); said.ok()) {
        run_ended = std::chrono::steady_clock::now();
        ended = RunEndedOutcome(*said);
        if (!ended.ok()) break;  // (a failed attempt's rows are not read again)
      }
    }
    if (run_ended && std::chrono::steady_clock::now() - *run_ended > std::chrono::seconds(30)) {
      std::fprintf(stderr, "%s: the run ended 30 s ago and rank 0's hub has not said it stopped; stopping\n",
                   what.c_str());
      break;
    }
  }
  server->Stop();
  const tq::ServerCounters served = server->counters();
  std::fprintf(stderr, "%s: %llu requests served; done\n", what.c_str(),
               static_cast<unsigned long long>(served.requests));
  return ended.WithContext(what);
}

Result<bool> AwaitPreviousAttempt(const PipelineOptions& po) {
  if (po.wiring.previous_store_prefix.empty()) return false;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<trainer::DataParallelStore> store,
                          ConnectRanksStore(po.wiring.trainer_store, std::chrono::seconds(po.rank_timeout_seconds),
                                            po.wiring.previous_store_prefix));
  // A store without the attempt (torchrun's c10d rendezvous gives each
  // attempt a store of its own): nothing to wait for.
  if (!store->GetShared(kRanksRunInfoKey, milliseconds(0)).ok() &&
      !store->GetShared(kLauncherBeatKey, milliseconds(0)).ok()) {
    return false;
  }
  LauncherLife launcher(LauncherSilenceLimit(po));
  const auto start = std::chrono::steady_clock::now();
  bool told = false;
  while (true) {
    // Said, or a store or rank 0 gone (then this attempt's own wait decides).
    if (std::optional<Status> ended = launcher.Ended(*store, milliseconds(1000))) {
      if (told) SLUICE_LOG(INFO) << "the attempt before ended: " << (ended->ok() ? "ok" : ended->message());
      if (ended->ok()) return true;
      // Failed: its rank 0 still stops its hub and processes before its
      // agent starts the next one, whose wait starts once it let go (or
      // after the ranks' timeout: then this attempt's own wait decides).
      const auto let_go_by = std::chrono::steady_clock::now() + std::chrono::seconds(po.rank_timeout_seconds);
      while (!store->GetShared(kLauncherExitedKey, milliseconds(1000)).ok() && launcher.Check(*store).ok()) {
        if (std::chrono::steady_clock::now() > let_go_by) {
          SLUICE_LOG(WARNING) << "rank 0 of the previous attempt has not let go of it after " << po.rank_timeout_seconds
                              << " s; joining this one";
          break;
        }
      }
      return false;
    }
    if (!told && std::chrono::steady_clock::now() - start > std::chrono::seconds(2)) {
      told = true;
      SLUICE_LOG(INFO) << "waiting until rank 0 ends the previous attempt (" << po.wiring.previous_store_prefix
                       << " in the ranks' store) before joining this one";
    }
  }
}

}  // namespace sluice::pipeline
