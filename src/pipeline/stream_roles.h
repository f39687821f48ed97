// The roles of the streaming modes (rollout, reward, trainer) as functions
// over what they share: the TransferQueue client (in process or remote), the
// weights (a publish function for the trainer, standby weights for the
// rollout) and the run's health and control service (RunHealth). The same bodies run as
// threads of one process (stream_train.cc, TrainStreaming) or each in its
// own process (TrainingRun::RunRole, started by the launcher in
// stream_launch.cc).
//
// Thread safety: each function is one role's loop; everything they share is
// thread-safe.
#ifndef SLUICE_SRC_PIPELINE_STREAM_ROLES_H_
#define SLUICE_SRC_PIPELINE_STREAM_ROLES_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "hub_records.h"
#include "run_state.h"
#include "sluice/checkpoint_engine/weights.h"
#include "sluice/common/metrics_server.h"
#include "sluice/pipeline/run_health.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/schedule/staleness.h"
#include "sluice/transfer_queue/client.h"
#include "sluice/transfer_queue/server.h"

namespace sluice::pipeline {

namespace tq = transfer_queue;

// The data of rows this process just leased, or nullopt when the lease was
// lost before it read them: a process paused (SIGSTOP, a swapped-out host)
// past its lease finds its rows handed to another process, which may have
// finished them, so the hub freed them and reading them is NotFound. That
// take is dropped, with a warning naming `who` (its rows are the other
// process's now), not the run. Other errors: GetData's and Renew's.
Result<std::optional<transfer_queue::BatchData>> ReadLeasedRows(transfer_queue::TransferQueueClient& client,
                                                                const transfer_queue::BatchMeta& meta,
                                                                std::chrono::seconds lease, const char* who);

// The trace track of a role (one per role, whether roles are threads or
// processes; 0 is the launcher's), and naming the calling thread's.
int32_t TraceTrack(PipelineRole role);
void TraceThisThread(PipelineRole role, const std::string& thread_name);

// Keys in the trainer ranks' store (pipeline.trainer_ranks > 1), besides
// each step's plan: what rank 0's launcher tells ranks launched elsewhere
// (JSON: hub, token, start_step, start_version, config_digest), that the
// run has ended and how ("ok" or "failed: <why>", set however it ends; the
// ranks then stop waiting, and exit as the run did), and rank 0's
// launcher's beat (a counter it sets once a second while it runs), and
// that the launcher has let go of the attempt (its hub stopped, its
// processes ended: a torchrun agent may start the next attempt's rank 0).
inline constexpr char kRanksRunInfoKey[] = "run";
inline constexpr char kRanksEndedKey[] = "ended";
inline constexpr char kLauncherBeatKey[] = "launcher/beat";
inline constexpr char kLauncherExitedKey[] = "launcher/exited";
// Set by a launched rank that refuses the run (why): rank 0's launcher then
// stops the run instead of waiting for it.
inline constexpr char kRanksRefusedKey[] = "refused";
// Counters of the processes that joined the run beyond the launch
// (`sluice train --join`), by role: "joined/rollout", "joined/reward".
inline constexpr char kRanksJoinedPrefix[] = "joined/";
// Hub storage units on other hosts (cluster.storage_ranks): rank 0's plan
// (JSON: token, peer_token, units, config_digest), each storage rank's
// endpoint ("hub_storage/<index>"), and that rank 0's hub has stopped.
inline constexpr char kHubStoragePlanKey[] = "hub_storage/plan";
inline constexpr char kHubStoragePrefix[] = "hub_storage/";
inline constexpr char kHubStoppedKey[] = "hub_storage/stopped";

struct StreamRoles {
  // Writes the run's prompts (cursors s.step * P .. rl.steps * P - 1) into
  // the prompt partition, in order, each with its example id, tokens and
  // reference answer: the one place the training split is read. Keeps a
  // bounded window ahead of the rollout (what admission can let it take
  // before it finishes more prompts); returns when all are written, or at
  // health.StopRequested() / `stopping`.
  static Status FeedPrompts(const TrainingRun::State& s, tq::TransferQueueClient& client, RunHealth& health,
                            const std::function<bool()>& stopping);

  // Whether the hub says every prompt of the run has its answers (rollout),
  // or that and no answer waits to be scored (reward): a replica or worker
  // started again late has nothing left to do. False for the trainer.
  static Result<bool> RoleDone(const TrainingRun::State& s, tq::TransferQueueClient& client, PipelineRole role);

  struct Rollout {
    std::shared_ptr<model::Transformer> model;  // served; refreshed through `standby`
    rollout::StandbyWeights* standby = nullptr;
    // Where the trainer's versions are read (the standby buffer fills from
    // it; admission reads its latest version).
    checkpoint_engine::WeightReader* weights = nullptr;
    HealthSlot slot = PipelineRole::kRollout;  // this replica's
    int64_t replica = 0;                       // its index (pipeline.rollout_replicas)
    std::string process;                       // names its threads in the trace: "rollout-1 " (with a space)
  };
  // Takes the run's prompts from the hub (as admission allows), generates G
  // answers each and writes each finished answer to the hub; acks a batch
  // of prompts once all their answers are in. Returns when every prompt's
  // answers are written, or at health.StopRequested() / `stopping`.
  //
  // Staleness admission is the rollout's own (schedule::StalenessAdmission), fed
  // from what the hub and the weights say, the same way in threads and
  // processes and on every host: the trainer's progress is its record in
  // the hub (TrainerRecord: the steps it trained, each recorded after its
  // update is published and before its groups are acked, with the newest
  // version published by then).
  //
  // Rollout replicas (pipeline.rollout_replicas, or one that may be
  // restarted) share the hub's prompt stream: admission counts the prompts
  // every replica took (the hub's rollout task), a prompt handed to this
  // replica past what its weights may start waits here, and it ends when
  // every prompt of the run is finished, by whichever replica. Prompts are
  // leased for pipeline.worker_lease_seconds, renewed every third of it;
  // answers are written keyed by prompt and answer index, so a prompt
  // generated again after its replica died adds only the answers missing.
  static Status RunRollout(TrainingRun::State& s, tq::TransferQueueClient& client, const Rollout& r, RunHealth& health,
                           const std::function<bool()>& stopping);

  // Scores answers as they appear (task "reward", each leased for
  // pipeline.worker_lease_seconds); returns once the hub says every answer
  // of the run is scored (by this process or other reward workers), or at
  // health.StopRequested() / `stopping`. An answer whose reward a dead worker wrote
  // before its ack keeps that reward.
  static Status RunReward(TrainingRun::State& s, tq::TransferQueueClient& client, RunHealth& health,
                          const std::function<bool()>& stopping, HealthSlot slot = PipelineRole::kReward,
                          const std::string& process = "");

  struct Trainer {
    // Where every sync_interval-th step's weights are published.
    checkpoint_engine::WeightPublisher* weights = nullptr;
    // Polled while waiting for data: an error (another role failed) ends the run.
    std::function<Status()> check;
  };
  // Takes whole groups as they complete, trains, publishes every
  // sync_interval steps, until rl.steps; metrics, evaluations, checkpoints
  // and progress as in the direct loop. Each group stays leased
  // (pipeline.lease_seconds) until its step's update is applied and
  // published, then is acked: the hub redelivers what a dead trainer held.
  static Status RunTrainer(TrainingRun::State& s, tq::TransferQueueClient& client, const Trainer& t, RunHealth& health,
                           const std::function<Result<EvalResult>()>& evaluate, const ProgressFn& progress);

  // pipeline.trainer_ranks > 1, ranks above 0: for each step, waits for
  // rank 0's plan of it (the samples, as hub rows, in training order), reads
  // this rank's shard of those rows from the hub and takes the data-parallel
  // update with the others (s.data_parallel); publishes, logs and acks
  // nothing. Returns after rl.steps, or at health.StopRequested().
  static Status FollowTrainer(TrainingRun::State& s, tq::TransferQueueClient& client, RunHealth& health,
                              HealthSlot slot);

  // pipeline.trainer_command (stream_launch.cc): the run info the command
  // reads (JSON: the hub's endpoint, the weight store, the run's settings);
  // the check, once it exited 0, that it acked every answer of the run on
  // the train task (FailedPrecondition naming the count otherwise: the
  // rollout would wait for it forever); and then the check that it
  // published a newer version, whose weights become s.policy (s.step =
  // rl.steps, s.version = that version).
  static std::string ExternalTrainerInfo(const TrainingRun::State& s, const std::string& hub, const std::string& store,
                                         const std::string& model_dir);
  static Status CheckExternalTrainerAcked(const TrainingRun::State& s, tq::TransferQueueClient& hub);
  // The answers acked on the hub's train task so far (the trainer command's
  // progress, for the watchdog too).
  static Result<uint64_t> TrainTaskAcked(tq::TransferQueueClient& hub);

  // run.trace: this process starts recording into
  // run_dir/roles/trace-<part>.jsonl (no-op when tracing is off); and the
  // run's end: the recorder stops and the named parts (missing ones
  // skipped) become run_dir/trace.json. Finishing logs, never fails a run.
  static std::string TracePart(const TrainingRun::State& s, const std::string& part);
  static Status StartTrace(const TrainingRun::State& s, const std::string& part);
  static void FinishTrace(const TrainingRun::State& s, const std::vector<std::string>& parts);

  // run.metrics_listen: serves the run's live counters (the run
  // health's, per role process labelled there (`processes` are labelled here, the
  // launcher labels those elsewhere as it learns of them), and the hub's;
  // with `hub_server`, the requests the role processes made, by path) until
  // destroyed; null when not asked for.
  static Result<std::unique_ptr<MetricsServer>> ServeMetrics(const TrainingRun::State& s, RunHealth& health,
                                                             tq::TransferQueueClient& hub,
                                                             const std::vector<RoleProcess>& processes,
                                                             const tq::TransferQueueServer* hub_server);
  static Status AdoptExternalResult(TrainingRun::State& s, tq::TransferQueueClient& hub,
                                    checkpoint_engine::WeightReader& weights);
};

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_STREAM_ROLES_H_
