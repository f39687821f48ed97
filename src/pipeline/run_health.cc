// The run's health and control service (sluice/pipeline/run_health.h): its
// cells, in the process or in a shared-memory segment.
#include "sluice/pipeline/run_health.h"

#include <atomic>
#include <chrono>
#include <iterator>

#include "sluice/common/enum_names.h"
#include "sluice/common/logging.h"
#include "sluice/common/shm.h"
#include "sluice/common/trace.h"

namespace sluice::pipeline {

namespace {

int64_t SteadyNs() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

// A slot's label: 0 for none, else kind << 16 | index (kind: role + 1, or
// kHubStorageLabel).
constexpr uint32_t kHubStorageLabel = 4;

}  // namespace

// Lock-free, address-free atomics only, all zero at start (a new segment is
// zero-filled). Its layout is this build's: the launcher and its role
// processes are one binary.
struct RunHealth::Cells {
  std::atomic<uint32_t> stop;
  std::atomic<uint32_t> rollout_idle;  // 1 while the rollout has nothing to decode
  std::atomic<int32_t> lent_workers_running;
  std::atomic<int32_t> joined_rollout_replicas;
  std::atomic<int64_t> rollout_busy_us;
  std::atomic<int64_t> rollout_tokens;
  std::atomic<int64_t> replica_busy_us[kMaxReplicas];
  std::atomic<int64_t> replica_tokens[kMaxReplicas];
  std::atomic<int64_t> slot_steps;         // sum over the engines' decode steps of their slots
  std::atomic<int64_t> active_slot_steps;  // ... and of the sequences running (EngineStats)
  std::atomic<int64_t> reward_errors;
  std::atomic<int64_t> trainer_step;
  std::atomic<int64_t> trainer_version;
  std::atomic<int64_t> heartbeat_ns[kSlots];
  std::atomic<uint32_t> activity[kSlots];
  std::atomic<int64_t> activity_since_ns[kSlots];
  std::atomic<uint32_t> label[kSlots];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free);

// A mapped segment; the creator's is unlinked when it goes.
class RunHealth::Segment {
 public:
  Segment(SharedMemorySegment segment, bool owner) : segment_(std::move(segment)), owner_(owner) {}
  ~Segment() {
    if (!owner_) return;
    const std::string name = segment_.name();
    segment_.Reset();
    if (Status gone = SharedMemorySegment::Unlink(name); !gone.ok()) {
      SLUICE_LOG(WARNING) << "run health: " << gone.ToString();
    }
  }
  Cells* cells() const { return reinterpret_cast<Cells*>(segment_.data()); }

 private:
  SharedMemorySegment segment_;
  const bool owner_;
};

RunHealth::RunHealth(Cells* cells, std::unique_ptr<Cells> owned, std::unique_ptr<Segment> segment)
    : cells_(cells), owned_(std::move(owned)), segment_(std::move(segment)) {}

RunHealth::~RunHealth() = default;

std::unique_ptr<RunHealth> RunHealth::InProcess() {
  auto cells = std::make_unique<Cells>();  // value-initialized: every atomic zero
  Cells* raw = cells.get();
  return std::unique_ptr<RunHealth>(new RunHealth(raw, std::move(cells), nullptr));
}

Result<std::unique_ptr<RunHealth>> RunHealth::CreateShared(const std::string& name) {
  SLUICE_ASSIGN_OR_RETURN(SharedMemorySegment segment, SharedMemorySegment::Create(name, sizeof(Cells)));
  auto mapped = std::make_unique<Segment>(std::move(segment), /*owner=*/true);
  Cells* cells = mapped->cells();
  return std::unique_ptr<RunHealth>(new RunHealth(cells, nullptr, std::move(mapped)));
}

Result<std::unique_ptr<RunHealth>> RunHealth::OpenShared(const std::string& name) {
  SLUICE_ASSIGN_OR_RETURN(SharedMemorySegment segment, SharedMemorySegment::Open(name, ShmAccess::kReadWrite));
  if (segment.size() != sizeof(Cells)) {
    return Status::DataLoss("run health segment " + name + " is " + std::to_string(segment.size()) +
                            " bytes, expected " + std::to_string(sizeof(Cells)) + " (not this build's launcher?)");
  }
  auto mapped = std::make_unique<Segment>(std::move(segment), /*owner=*/false);
  Cells* cells = mapped->cells();
  return std::unique_ptr<RunHealth>(new RunHealth(cells, nullptr, std::move(mapped)));
}

void RunHealth::RequestStop() { cells_->stop.store(1); }
bool RunHealth::StopRequested() const { return cells_->stop.load() != 0; }

void RunHealth::Beat(HealthSlot s) {
  if (Watched(s.index)) cells_->heartbeat_ns[s.index].store(SteadyNs(), std::memory_order_relaxed);
}

void RunHealth::Finished(HealthSlot s) {
  if (Watched(s.index)) cells_->heartbeat_ns[s.index].store(SlotHealth::kFinished);
}

void RunHealth::Restart(int slot) { Mirror(slot, SlotHealth{}); }

SlotHealth RunHealth::Slot(int slot) const {
  SlotHealth h;
  if (!Watched(slot)) return h;
  h.beat_ns = cells_->heartbeat_ns[slot].load(std::memory_order_relaxed);
  h.activity = cells_->activity[slot].load(std::memory_order_relaxed);
  h.activity_since_ns = cells_->activity_since_ns[slot].load(std::memory_order_relaxed);
  return h;
}

void RunHealth::Mirror(int slot, const SlotHealth& h) {
  if (!Watched(slot)) return;
  cells_->heartbeat_ns[slot].store(h.beat_ns);
  cells_->activity[slot].store(h.activity);
  cells_->activity_since_ns[slot].store(h.activity_since_ns);
}

uint32_t RunHealth::SetActivity(int slot, uint32_t activity) {
  if (!Watched(slot)) return 0;
  const uint32_t before = cells_->activity[slot].exchange(activity, std::memory_order_relaxed);
  cells_->activity_since_ns[slot].store(SteadyNs(), std::memory_order_relaxed);
  return before;
}

std::string RunHealth::DescribeActivity(int slot) const {
  if (!Watched(slot)) return "unknown";
  const SlotHealth h = Slot(slot);
  if (h.activity >= static_cast<uint32_t>(RoleActivity::kCount)) return "unknown";
  if (h.activity == static_cast<uint32_t>(RoleActivity::kStarting) && h.beat_ns != 0) return "between activities";
  return RoleActivityName(static_cast<RoleActivity>(h.activity));
}

namespace {
void StoreLabel(std::atomic<uint32_t>* labels, int slot, uint32_t kind, int64_t index) {
  if (RunHealth::Watched(slot) && index >= 0 && index < 0x10000) {
    labels[slot].store(kind << 16 | static_cast<uint32_t>(index));
  }
}
}  // namespace

void RunHealth::Label(int slot, PipelineRole role, int64_t index) {
  StoreLabel(cells_->label, slot, static_cast<uint32_t>(role) + 1, index);
}

void RunHealth::LabelHubStorage(int slot, int64_t index) { StoreLabel(cells_->label, slot, kHubStorageLabel, index); }

std::optional<RunHealth::SlotLabel> RunHealth::LabelOf(int slot) const {
  if (!Watched(slot)) return std::nullopt;
  const uint32_t p = cells_->label[slot].load(), kind = p >> 16;
  SlotLabel out;
  out.index = p & 0xffff;
  if (kind == kHubStorageLabel) {
    out.hub_storage = true;
  } else if (kind >= 1 && kind - 1 <= static_cast<uint32_t>(PipelineRole::kReward)) {
    out.role = static_cast<PipelineRole>(kind - 1);
  } else {
    return std::nullopt;
  }
  return out;
}

void RunHealth::AddDecoding(int64_t replica, int64_t busy_us, int64_t tokens) {
  cells_->rollout_busy_us += busy_us;
  cells_->rollout_tokens += tokens;
  if (replica >= 0 && replica < kMaxReplicas) {
    cells_->replica_busy_us[replica] += busy_us;
    cells_->replica_tokens[replica] += tokens;
  }
}

void RunHealth::AddSlotSteps(int64_t slot_steps, int64_t active_slot_steps) {
  cells_->slot_steps += slot_steps;
  cells_->active_slot_steps += active_slot_steps;
}

void RunHealth::AddRewardErrors(int64_t n) { cells_->reward_errors += n; }

RolloutCounters RunHealth::rollout() const { return {cells_->rollout_busy_us.load(), cells_->rollout_tokens.load()}; }

RolloutCounters RunHealth::replica(int64_t replica) const {
  if (replica < 0 || replica >= kMaxReplicas) return {};
  return {cells_->replica_busy_us[replica].load(), cells_->replica_tokens[replica].load()};
}

int64_t RunHealth::slot_steps() const { return cells_->slot_steps.load(); }
int64_t RunHealth::active_slot_steps() const { return cells_->active_slot_steps.load(); }
int64_t RunHealth::reward_errors() const { return cells_->reward_errors.load(); }

void RunHealth::SetJoinedRolloutReplicas(int32_t n) { cells_->joined_rollout_replicas.store(n); }
int32_t RunHealth::joined_rollout_replicas() const { return cells_->joined_rollout_replicas.load(); }

void RunHealth::RecordTrainer(int64_t step, PolicyVersion version) {
  cells_->trainer_version.store(version);
  cells_->trainer_step.store(step);
}
int64_t RunHealth::trainer_step() const { return cells_->trainer_step.load(); }
PolicyVersion RunHealth::trainer_version() const { return cells_->trainer_version.load(); }

void RunHealth::SetRolloutIdle(bool idle) { cells_->rollout_idle.store(idle ? 1 : 0); }
bool RunHealth::rollout_idle() const { return cells_->rollout_idle.load() != 0; }

bool RunHealth::EnterLentCore() {
  cells_->lent_workers_running.fetch_add(1);  // in first, then look
  if (cells_->rollout_idle.load() != 0) return true;
  cells_->lent_workers_running.fetch_sub(1);
  return false;
}
void RunHealth::LeaveLentCore() { cells_->lent_workers_running.fetch_sub(1); }
int32_t RunHealth::lent_workers_running() const { return cells_->lent_workers_running.load(); }

StreamSummary RunHealth::Summary(double wall_seconds) const {
  StreamSummary out;
  out.wall_seconds = wall_seconds;
  out.rollout_busy_seconds = static_cast<double>(cells_->rollout_busy_us.load()) / 1e6;
  out.rollout_tokens = cells_->rollout_tokens.load();
  const int64_t steps = cells_->slot_steps.load();
  out.rollout_occupancy =
      steps > 0 ? static_cast<double>(cells_->active_slot_steps.load()) / static_cast<double>(steps) : 0;
  return out;
}

std::vector<RoleProcess> RoleProcesses(int64_t trainers, int64_t rollout_replicas, int64_t reward_workers) {
  std::vector<RoleProcess> out;
  int next_slot = 3;
  auto add = [&](PipelineRole role, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      out.push_back({role, i, i == 0 ? static_cast<int>(role) : next_slot < RunHealth::kSlots ? next_slot++ : -1});
    }
  };
  add(PipelineRole::kTrainer, trainers);
  add(PipelineRole::kRollout, rollout_replicas);
  add(PipelineRole::kReward, reward_workers);
  return out;
}

const char* RoleActivityName(RoleActivity a) {
  static constexpr const char* kNames[] = {
      "starting",    "put prompts", "take prompts",       "decode step",     "write answer",     "wait for admission",
      "take answer", "score",       "write reward",       "wait for groups", "train step",       "publish",
      "ack",         "evaluate",    "wait for step plan", "read shard",      "serve hub storage"};
  static_assert(std::size(kNames) == static_cast<size_t>(RoleActivity::kCount));
  return EnumName(kNames, a, "unknown");
}

RoleDoing::RoleDoing(RunHealth& health, HealthSlot slot, RoleActivity activity, bool traced)
    : health_(health),
      slot_(slot),
      activity_(activity),
      before_(health.SetActivity(slot.index, static_cast<uint32_t>(activity))),
      start_us_(traced && TraceRecorder::Global().enabled() ? TraceNowUs() : -1) {}

RoleDoing::~RoleDoing() {
  if (start_us_ >= 0) {
    static constexpr const char* kCategory[] = {"trainer", "rollout", "reward"};  // by PipelineRole
    TraceRecorder::Global().Complete(RoleActivityName(activity_), kCategory[static_cast<int>(slot_.role)], start_us_,
                                     TraceNowUs());
  }
  (void)health_.SetActivity(slot_.index, before_);
}

}  // namespace sluice::pipeline
