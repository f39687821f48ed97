// The roles of the streaming modes (rollout, reward, trainer) as functions
// over what they share: the TransferQueue client (in process or remote), the
// weights (a publish function for the trainer, standby weights for the
// rollout) and a RoleBoard of counters and flags. The same bodies run as
// threads of one process (stream_train.cc, TrainStreaming) or each in its
// own process (TrainingRun::RunRole, started by the launcher in
// stream_launch.cc).
//
// Thread safety: each function is one role's loop; the board's fields are
// atomics, and everything else they share is thread-safe.
#ifndef SLUICE_SRC_PIPELINE_STREAM_ROLES_H_
#define SLUICE_SRC_PIPELINE_STREAM_ROLES_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "run_state.h"
#include "sluice/checkpoint_engine/weights.h"
#include "sluice/common/metrics_server.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/schedule/staleness.h"
#include "sluice/transfer_queue/client.h"
#include "sluice/transfer_queue/server.h"

namespace sluice::pipeline {

namespace tq = transfer_queue;

// A role process's place on the RoleBoard (threads mode: each role thread's):
// its role (for the trace) and its slot. Slots 0..2 are each role's first
// process, indexed by PipelineRole; from 3 on, the launcher numbers the
// others (trainer ranks above 0, rollout replicas and reward workers after
// the first). A slot outside the board is not watched.
struct BoardSlot {
  BoardSlot(PipelineRole r) : role(r), index(static_cast<int>(r)) {}  // NOLINT: a role's first process
  BoardSlot(PipelineRole r, int i) : role(r), index(i) {}
  PipelineRole role;
  int index;
};

// One process of a role (or the role's thread) and its board slot.
struct BoardProcess {
  PipelineRole role;
  int64_t index;  // trainer rank, rollout replica or reward worker
  int slot;       // -1: beyond the board (not watched)
};
// A run's role processes in start order (trainer ranks, rollout replicas,
// reward workers) with their slots: each role's first its own, the others
// numbered from 3 as far as the board has slots.
std::vector<BoardProcess> BoardProcesses(int64_t trainers, int64_t rollout_replicas, int64_t reward_workers);

// What the roles tell each other besides samples and weights. Lock-free,
// address-free atomics only, all zero at start: it lives on the stack in
// threads mode and in a shared-memory segment the launcher creates in process
// mode.
struct RoleBoard {
  std::atomic<uint32_t> rollout_idle;    // 1 while the rollout has nothing to decode
  std::atomic<uint32_t> stop;            // 1: every role stops at its next check
  std::atomic<int64_t> rollout_busy_us;  // decoding time so far
  std::atomic<int64_t> rollout_tokens;   // tokens generated so far (trained or not)
  // The same two per rollout replica (pipeline.rollout_replicas), by index.
  static constexpr int kMaxReplicas = 64;
  std::atomic<int64_t> replica_busy_us[kMaxReplicas];
  std::atomic<int64_t> replica_tokens[kMaxReplicas];
  std::atomic<int64_t> rollout_slot_steps;         // sum over the engines' decode steps of their slots
  std::atomic<int64_t> rollout_active_slot_steps;  // ... and of the sequences running (EngineStats)
  // Trainer workers running on the rollout's lent cores now. A lent worker
  // counts itself in, then checks rollout_idle; the rollout clears
  // rollout_idle, then waits for this to reach 0 before decoding: so a lent
  // core and the rollout never compute at the same time.
  std::atomic<int32_t> lent_workers_running;
  // The reward role's task's score_errors() (reward.python failures), for
  // the trainer's metrics when the roles are processes.
  std::atomic<int64_t> reward_errors;
  // For the launcher's watchdog (pipeline.stall_seconds), per slot (see
  // BoardSlot): the steady clock, in ns, when the process last went round
  // its loop; 0 before its first turn, kRoleFinished once it has returned.
  // The steady clock is CLOCK_MONOTONIC, one clock for every process on the
  // host.
  static constexpr int kSlots = 128;
  static constexpr int64_t kRoleFinished = -1;
  std::atomic<int64_t> heartbeat_ns[kSlots];
  static bool Watched(BoardSlot s) { return s.index >= 0 && s.index < kSlots; }
  void Beat(BoardSlot s) {
    if (Watched(s)) {
      heartbeat_ns[s.index].store(std::chrono::steady_clock::now().time_since_epoch().count(),
                                  std::memory_order_relaxed);
    }
  }
  void Finished(BoardSlot s) {
    if (Watched(s)) heartbeat_ns[s.index].store(kRoleFinished);
  }
  // Also for the watchdog, per slot: what the process is doing (a
  // RoleActivity) and since when (steady clock ns; 0: since it started).
  std::atomic<uint32_t> activity[kSlots];
  std::atomic<int64_t> activity_since_ns[kSlots];
  // The trainer's progress, for the live counters (run.metrics_listen).
  std::atomic<int64_t> trainer_step;
  std::atomic<int64_t> trainer_version;
  // Which process each slot watches, for the live counters: 0 for none,
  // else (role + 1) << 16 | index, or kHubStorageLabel << 16 | index for a
  // hub storage rank. Set by the launcher (for the processes elsewhere too,
  // whose heartbeats it mirrors onto their slots).
  std::atomic<uint32_t> slot_process[kSlots];
  static constexpr uint32_t kHubStorageLabel = 4;
  void Label(int slot, PipelineRole role, int64_t index) { LabelSlot(slot, static_cast<uint32_t>(role) + 1, index); }
  void LabelHubStorage(int slot, int64_t index) { LabelSlot(slot, kHubStorageLabel, index); }
  void LabelSlot(int slot, uint32_t kind, int64_t index) {
    if (slot >= 0 && slot < kSlots && index >= 0 && index < 0x10000) {
      slot_process[slot].store(kind << 16 | static_cast<uint32_t>(index));
    }
  }
  // Rollout replicas that joined the run beyond its launch (`sluice train
  // --join`), for the prompt feeder's look-ahead.
  std::atomic<int32_t> joined_rollout_replicas;

  // What the run measured, for TrainingRun::stream_summary().
  StreamSummary Summary(double wall_seconds) const;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free);

// What a role is doing, for the watchdog's reports and the run's trace
// (run.trace): the names are the trace's span names.
// The data of rows this process just leased, or nullopt when the lease was
// lost before it read them: a process paused (SIGSTOP, a swapped-out host)
// past its lease finds its rows handed to another process, which may have
// finished them, so the hub freed them and reading them is NotFound. That
// take is dropped, with a warning naming `who` (its rows are the other
// process's now), not the run. Other errors: GetData's and Renew's.
Result<std::optional<transfer_queue::BatchData>> ReadLeasedRows(transfer_queue::TransferQueueClient& client,
                                                                const transfer_queue::BatchMeta& meta,
                                                                std::chrono::seconds lease, const char* who);

enum class RoleActivity : uint32_t {
  kStarting = 0,  // before its first activity
  kPutPrompts,    // the launcher's prompt feeder
  kTakePrompts,   // rollout
  kDecodeStep,
  kWriteAnswer,
  kWaitAdmission,  // rollout: nothing to decode and no prompt admitted
  kTakeAnswer,     // reward
  kScore,
  kWriteReward,
  kWaitForGroups,  // trainer
  kTrainStep,
  kPublish,
  kAck,
  kEvaluate,
  kWaitForPlan,  // trainer ranks above 0
  kReadShard,
  kServeHub,  // a hub storage rank (cluster.storage_ranks): since its server last went round its loop
  kCount,
};
const char* RoleActivityName(RoleActivity a);
// What the process in `slot` is doing as the board says: its activity's
// name, "starting" before its first turn, "between activities" in the rest
// of its loop.
std::string DescribeSlotActivity(const RoleBoard& board, int slot);

// The trace track of a role (one per role, whether roles are threads or
// processes; 0 is the launcher's), and naming the calling thread's.
int32_t TraceTrack(PipelineRole role);
void TraceThisThread(PipelineRole role, const std::string& thread_name);

// Marks `role` as doing `activity` on the board from construction to
// destruction (then back to what it did before), and records it as a span
// of the run's trace when `traced` (leave idle waits untraced: they would
// flood the trace).
class RoleDoing {
 public:
  RoleDoing(RoleBoard& board, BoardSlot slot, RoleActivity activity, bool traced = true);
  ~RoleDoing();
  RoleDoing(const RoleDoing&) = delete;
  RoleDoing& operator=(const RoleDoing&) = delete;

 private:
  RoleBoard& board_;
  const BoardSlot slot_;
  const RoleActivity activity_;
  const uint32_t before_;
  const int64_t start_us_;  // -1: not traced
};

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

// The hub's two partitions and three consuming tasks:
//   prompts   one row per prompt (group id = its cursor in the run's prompt
//             order; columns prompt, example, reference_answer), written by
//             the prompt feeder, consumed by the rollout
//   rollouts  one row per answer, G rows a group, consumed by reward and train
inline constexpr char kPromptPartition[] = "prompts";
inline constexpr char kRolloutPartition[] = "rollouts";
inline constexpr char kRolloutTask[] = "rollout";
inline constexpr char kRewardTask[] = "reward";
inline constexpr char kTrainTask[] = "train";
// The hub's ack log in the run directory: {"hub":"started","from_step":S}
// when an attempt's hub starts (S: the step it resumes after), then the
// controller's line per ack (transfer_queue/controller.h, ack_log).
inline constexpr char kHubAckLog[] = "hub_acks.jsonl";
// Each trainer rank's record of the hub rows it trains, step by step, in
// <run.dir>/trained_rows-rank<R>.jsonl: {"step":S,"rank":R,"rows":[...]}.
inline constexpr char kTrainedRowsPrefix[] = "trained_rows-rank";

// The hub's columns, named once. A row is one answer; its group id tag is
// the prompt's cursor in the run's prompt order.
namespace column {
inline constexpr char kPrompt[] = "prompt";                     // I32 [tokens]: the prompt the rollout fed
inline constexpr char kResponse[] = "response";                 // I32 [tokens]
inline constexpr char kLogprobs[] = "logprobs";                 // F32 [tokens]: behaviour logprob per token
inline constexpr char kVersions[] = "versions";                 // I64 [tokens]: policy version per token
inline constexpr char kAnswerIndex[] = "answer_index";          // I32 []: which of the group's G answers
inline constexpr char kExample[] = "example";                   // I64 []: index in the task's train split
inline constexpr char kReferenceAnswer[] = "reference_answer";  // U8 [bytes]: what the reward compares with
inline constexpr char kReward[] = "reward";                     // F32 []: written by the reward role
}  // namespace column

// The hub's columns with their types, as listed above, and its tasks.
std::vector<tq::ColumnSchema> HubColumns();
std::vector<std::string> HubTasks();
// Creates the two partitions, each with its consumers.
Status CreateHubPartitions(tq::TransferQueueClient& client, int64_t group_size);

struct StreamRoles {
  // Writes the run's prompts (cursors s.step * P .. rl.steps * P - 1) into
  // the prompt partition, in order, each with its example id, tokens and
  // reference answer: the one place the training split is read. Keeps a
  // bounded window ahead of the rollout (what admission can let it take
  // before it finishes more prompts); returns when all are written, or at
  // board.stop / `stopping`.
  static Status FeedPrompts(const TrainingRun::State& s, tq::TransferQueueClient& client, RoleBoard& board,
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
    BoardSlot slot = PipelineRole::kRollout;  // this replica's
    int64_t replica = 0;                      // its index (pipeline.rollout_replicas)
    std::string process;                      // names its threads in the trace: "rollout-1 " (with a space)
    // >= 0 for a replica on another host, whose weights arrive after the
    // trainer acked the step they come from (the launcher relays them): the
    // trainer's version at the run's start_step. The rollout then reads the
    // trainer's progress in whole steps and reckons the version each one
    // published, instead of trusting its store to be ahead of the acks.
    PolicyVersion trainer_start_version = -1;
  };
  // Takes the run's prompts from the hub (as admission allows), generates G
  // answers each and writes each finished answer to the hub; acks a batch
  // of prompts once all their answers are in. Returns when every prompt's
  // answers are written, or at board.stop / `stopping`.
  //
  // Staleness admission is the rollout's own (schedule::StalenessAdmission), fed
  // from what the hub and the weights say, the same way in threads and
  // processes: the trainer's progress is the rows it has acked in the hub
  // (task "train" acked_total: it acks a step's groups only after the
  // update that trained them is published) and its version is the newest
  // published one. Progress is read first, so a retirement is never seen
  // without the version published before it.
  //
  // Rollout replicas (pipeline.rollout_replicas, or one that may be
  // restarted) share the hub's prompt stream: admission counts the prompts
  // every replica took (the hub's rollout task), a prompt handed to this
  // replica past what its weights may start waits here, and it ends when
  // every prompt of the run is finished, by whichever replica. Prompts are
  // leased for pipeline.worker_lease_seconds, renewed every third of it;
  // answers are written keyed by prompt and answer index, so a prompt
  // generated again after its replica died adds only the answers missing.
  static Status RunRollout(TrainingRun::State& s, tq::TransferQueueClient& client, const Rollout& r, RoleBoard& board,
                           const std::function<bool()>& stopping);

  // Scores answers as they appear (task "reward", each leased for
  // pipeline.worker_lease_seconds); returns once the hub says every answer
  // of the run is scored (by this process or other reward workers), or at
  // board.stop / `stopping`. An answer whose reward a dead worker wrote
  // before its ack keeps that reward.
  static Status RunReward(TrainingRun::State& s, tq::TransferQueueClient& client, RoleBoard& board,
                          const std::function<bool()>& stopping, BoardSlot slot = PipelineRole::kReward,
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
  static Status RunTrainer(TrainingRun::State& s, tq::TransferQueueClient& client, const Trainer& t, RoleBoard& board,
                           const std::function<Result<EvalResult>()>& evaluate, const ProgressFn& progress);

  // pipeline.trainer_ranks > 1, ranks above 0: for each step, waits for
  // rank 0's plan of it (the samples, as hub rows, in training order), reads
  // this rank's shard of those rows from the hub and takes the data-parallel
  // update with the others (s.data_parallel); publishes, logs and acks
  // nothing. Returns after rl.steps, or at board.stop.
  static Status FollowTrainer(TrainingRun::State& s, tq::TransferQueueClient& client, RoleBoard& board, BoardSlot slot);

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

  // run.metrics_listen: serves the run's live counters (the board's, per
  // role process labelled on it (`processes` are labelled here, the
  // launcher labels those elsewhere as it learns of them), and the hub's;
  // with `hub_server`, the requests the role processes made, by path) until
  // destroyed; null when not asked for.
  static Result<std::unique_ptr<MetricsServer>> ServeMetrics(const TrainingRun::State& s, RoleBoard& board,
                                                             tq::TransferQueueClient& hub,
                                                             const std::vector<BoardProcess>& processes,
                                                             const tq::TransferQueueServer* hub_server);
  static Status AdoptExternalResult(TrainingRun::State& s, tq::TransferQueueClient& hub,
                                    checkpoint_engine::WeightReader& weights);
};

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_STREAM_ROLES_H_
