// A run's health and control service: what the role processes tell the
// launcher and each other besides samples and weights.
//
//   control     stop (every role stops at its next check)
//   health      per process slot: a heartbeat (each turn of its loop), what
//               it is doing now and since when (RoleActivity), and which
//               process the slot watches (its label); the launcher's
//               watchdog (pipeline.stall_seconds) and the live counters
//               (run.metrics_listen) read them
//   counters    the rollout's decoding time and tokens (in all and per
//               replica), its engines' slot occupancy, the reward role's
//               score errors
//   progress    the trainer's step and newest published version, as the
//               trainer records them (for the live counters; the rollout's
//               admission reads the trainer's record in the hub,
//               hub_records.h, which reaches every host)
//   lent cores  the handshake between the rollout and the trainer workers
//               that run on its cores while it is idle (pipeline.lend_cores)
//
// Where it lives. RunHealth is one typed interface over lock-free atomics
// in one of two places: in the process (roles as threads, and a process on
// another host, which keeps its own) or in a shared-memory segment the
// launcher creates and the role processes on its host open (same-host).
// Processes on other hosts reach rank 0's launcher through the ranks' store
// (remote_link.h: each reports its own RunHealth's slot and counters once a
// second; the launcher mirrors them onto its RunHealth, and their stop comes
// from the run's end there).
//
// Thread safety: every method is thread-safe (lock-free, address-free
// atomics: the same in a segment several processes map).
#ifndef SLUICE_PIPELINE_RUN_HEALTH_H_
#define SLUICE_PIPELINE_RUN_HEALTH_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/common/ids.h"
#include "sluice/common/status.h"
#include "sluice/pipeline/metrics.h"
#include "sluice/pipeline/roles.h"

namespace sluice::pipeline {

// What a role is doing, for the watchdog's reports and the run's trace
// (run.trace): RoleActivityName is the trace's span name.
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

// A role process's slot (threads mode: each role thread's): its role (for
// the trace) and its index. Slots 0..2 are each role's first process,
// indexed by PipelineRole; from 3 on, the launcher numbers the others
// (trainer ranks above 0, rollout replicas and reward workers after the
// first). A slot outside 0..RunHealth::kSlots-1 is not watched.
struct HealthSlot {
  HealthSlot(PipelineRole r) : role(r), index(static_cast<int>(r)) {}  // NOLINT: a role's first process
  HealthSlot(PipelineRole r, int i) : role(r), index(i) {}
  PipelineRole role;
  int index;
};

// One process of a role (or the role's thread) and its slot.
struct RoleProcess {
  PipelineRole role;
  int64_t index;  // trainer rank, rollout replica or reward worker
  int slot;       // -1: beyond the slots (not watched)
};
// A run's role processes in start order (trainer ranks, rollout replicas,
// reward workers) with their slots: each role's first its own, the others
// numbered from 3 as far as there are slots.
std::vector<RoleProcess> RoleProcesses(int64_t trainers, int64_t rollout_replicas, int64_t reward_workers);

// What a slot says now.
struct SlotHealth {
  // The steady clock (CLOCK_MONOTONIC: one clock for every process on the
  // host), in ns, when the process last went round its loop; 0 before its
  // first turn; kFinished once it has returned.
  int64_t beat_ns = 0;
  static constexpr int64_t kFinished = -1;
  uint32_t activity = 0;          // a RoleActivity (anything else: unknown, from a newer peer)
  int64_t activity_since_ns = 0;  // steady clock; 0: since it started
};

// Decoding so far (tokens generated, trained or not).
struct RolloutCounters {
  int64_t busy_us = 0;
  int64_t tokens = 0;
};

class RunHealth {
 public:
  static constexpr int kSlots = 128;
  static constexpr int kMaxReplicas = 64;  // rollout replicas counted one by one

  // In this process, every value zero.
  static std::unique_ptr<RunHealth> InProcess();
  // Same-host: a new segment `name` (every value zero; the launcher's, which
  // unlinks it when destroyed), or the launcher's opened by a role process
  // (DataLoss if it is not one). Errors: SharedMemorySegment's.
  static Result<std::unique_ptr<RunHealth>> CreateShared(const std::string& name);
  static Result<std::unique_ptr<RunHealth>> OpenShared(const std::string& name);
  ~RunHealth();
  RunHealth(const RunHealth&) = delete;
  RunHealth& operator=(const RunHealth&) = delete;

  // Control.
  void RequestStop();
  bool StopRequested() const;

  // Health, per slot (a slot that is not watched is ignored).
  static bool Watched(int slot) { return slot >= 0 && slot < kSlots; }
  void Beat(HealthSlot s);
  void Finished(HealthSlot s);
  // A process's new life (started or started again): nothing said yet.
  void Restart(int slot);
  SlotHealth Slot(int slot) const;
  // A process elsewhere, as its reports say (RemoteBeats).
  void Mirror(int slot, const SlotHealth& h);
  // Marks what the slot's process does now and since when; returns what it
  // did before (RoleDoing).
  uint32_t SetActivity(int slot, uint32_t activity);
  // What the slot's process is doing: its activity's name, "starting" before
  // its first turn, "between activities" in the rest of its loop.
  std::string DescribeActivity(int slot) const;
  // Which process the slot watches, for the live counters (the launcher's
  // labels, for the processes elsewhere too).
  void Label(int slot, PipelineRole role, int64_t index);
  void LabelHubStorage(int slot, int64_t index);
  struct SlotLabel {
    bool hub_storage = false;  // a hub storage rank, else a role's process
    PipelineRole role = PipelineRole::kTrainer;
    int64_t index = 0;
  };
  std::optional<SlotLabel> LabelOf(int slot) const;  // nullopt: not labelled

  // Counters. A replica outside 0..kMaxReplicas-1 counts in the totals only.
  void AddDecoding(int64_t replica, int64_t busy_us, int64_t tokens);
  void AddSlotSteps(int64_t slot_steps, int64_t active_slot_steps);
  void AddRewardErrors(int64_t n);
  RolloutCounters rollout() const;
  RolloutCounters replica(int64_t replica) const;
  int64_t slot_steps() const;
  int64_t active_slot_steps() const;
  int64_t reward_errors() const;
  // Rollout replicas that joined the run beyond its launch (`sluice train
  // --join`), for the prompt feeder's look-ahead.
  void SetJoinedRolloutReplicas(int32_t n);
  int32_t joined_rollout_replicas() const;

  // The trainer's progress (the live counters).
  void RecordTrainer(int64_t step, PolicyVersion version);
  int64_t trainer_step() const;
  PolicyVersion trainer_version() const;

  // Lent cores (pipeline.lend_cores). A trainer worker on a lent core counts
  // itself in, then looks at the rollout's idle flag (EnterLentCore: false,
  // counted out again, when the rollout is busy); the rollout clears the flag,
  // then waits for the count to reach 0 before decoding: so a lent core and
  // the rollout never compute at the same time.
  void SetRolloutIdle(bool idle);
  bool rollout_idle() const;
  bool EnterLentCore();
  void LeaveLentCore();
  int32_t lent_workers_running() const;

  // What the run measured, for TrainingRun::stream_summary().
  StreamSummary Summary(double wall_seconds) const;

 private:
  struct Cells;
  class Segment;
  RunHealth(Cells* cells, std::unique_ptr<Cells> owned, std::unique_ptr<Segment> segment);
  Cells* const cells_;
  std::unique_ptr<Cells> owned_;
  std::unique_ptr<Segment> segment_;
};

// Marks `slot` as doing `activity` from construction to destruction (then
// back to what it did before), and records it as a span of the run's trace
// when `traced` (leave idle waits untraced: they would flood the trace).
class RoleDoing {
 public:
  RoleDoing(RunHealth& health, HealthSlot slot, RoleActivity activity, bool traced = true);
  ~RoleDoing();
  RoleDoing(const RoleDoing&) = delete;
  RoleDoing& operator=(const RoleDoing&) = delete;

 private:
  RunHealth& health_;
  const HealthSlot slot_;
  const RoleActivity activity_;
  const uint32_t before_;
  const int64_t start_us_;  // -1: not traced
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_RUN_HEALTH_H_
