// The rollout role (rollout_role.h): the role's shared intake and the loop
// of each of its engines.
#include "sluice/pipeline/rollout_role.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "agent_driver.h"
#include "hub_records.h"
#include "role_support.h"
#include "sluice/checkpoint_engine/weights.h"
#include "sluice/common/logging.h"
#include "sluice/common/trace.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/schedule/intake.h"
#include "sluice/transfer_queue/client.h"

namespace sluice::pipeline {

using std::chrono::milliseconds;

namespace {
// How often an idle engine looks again for prompts to admit.
constexpr auto kIdlePoll = milliseconds(2);
}  // namespace

RolloutRole::Options RolloutRole::Options::From(const RunOptions& run, int64_t start_step,
                                                PolicyVersion start_version) {
  const RlOptions& rl = run.rl;
  const PipelineOptions& po = run.pipeline;
  Options o;
  schedule::IntakeOptions& io = o.intake;
  io.prompts_per_step = rl.prompts_per_step;
  io.group_size = rl.group_size;
  io.sync_interval = po.sync_interval;
  io.max_staleness = po.EffectiveMaxStaleness();
  io.version = start_version;
  io.start_step = start_step;
  io.steps = rl.steps;
  io.engines = std::max(1, po.rollout_engines);
  // Replicas share the hub's one prompt stream; so does a replica that may
  // be started again mid-run (by this launcher, or on another host by
  // whatever supervises it there). Then the stream's cursor is the hub's.
  io.replicas = std::max(1, po.AllRolloutReplicas());
  io.shared = po.processes && (po.max_restarts > 0 || po.remote_rollout_replicas > 0);
  o.slots = rl.rollout_slots;
  o.sampling = rl.sampling;
  o.seed = run.seed;
  o.switch_policy = po.switch_policy;
  o.threads = po.rollout_threads;
  o.lease_seconds = po.worker_lease_seconds;
  o.agent = run.agent;
  o.tokenizer_dir = run.tokenizer_dir;
  return o;
}

Result<std::unique_ptr<RolloutRole>> RolloutRole::Create(Options options, Wiring wiring) {
  if (!wiring.model || wiring.standby == nullptr || wiring.weights == nullptr || wiring.hub == nullptr ||
      wiring.health == nullptr) {
    return Status::InvalidArgument("the rollout role needs its model, standby weights, weight store, hub and health");
  }
  SLUICE_ASSIGN_OR_RETURN(auto intake, schedule::PromptIntake::Create(options.intake));
  return std::unique_ptr<RolloutRole>(new RolloutRole(std::move(options), std::move(wiring), std::move(intake)));
}

RolloutRole::RolloutRole(Options options, Wiring wiring, std::unique_ptr<schedule::PromptIntake> intake)
    : o_(std::move(options)), w_(std::move(wiring)) {
  MutexLock lock(&mu_);
  intake_ = std::move(intake);
  untaken_ = intake_->end_cursor() - intake_->cursor();
  run_prompts_ = static_cast<uint64_t>(untaken_);
  record_step_ = o_.intake.start_step;
}

RolloutRole::~RolloutRole() = default;

Result<schedule::TrainerProgress> RolloutRole::ReadProgress() {
  tq::TransferQueueClient& hub = *w_.hub;
  SLUICE_ASSIGN_OR_RETURN(const TrainerRecord record, ReadTrainerRecord(hub, {record_step_, record_version_}));
  record_step_ = record.step;
  record_version_ = record.version;
  SLUICE_ASSIGN_OR_RETURN(const HubDepths depths, ReadHubDepths(hub));
  const tq::TaskDepth& train = depths.train;
  schedule::TrainerProgress p;
  p.trained_steps = record.step - o_.intake.start_step;
  p.latest_version = std::max(record.version, w_.weights->latest_version());
  p.waiting = train.waiting > 0 || (train.leased == 0 && train.acked_total == 0);
  p.taken_prompts = static_cast<int64_t>(depths.rollout.acked_total + depths.rollout.leased);
  prompts_done_ = depths.rollout.acked_total;
  return p;
}

// One engine of the replica and its loop: take the prompts admission allows
// (parked ones first), start their answers, decode a step, write what
// finished and ack the prompts whose answers are all in the hub.
class RolloutRole::Engine {
 public:
  Engine(RolloutRole& role, int32_t index, rollout::WeightSwapHook hook)
      : r_(role), o_(role.o_), hub_(*role.w_.hub), health_(*role.w_.health), index_(index), hook_(std::move(hook)) {}

  Status Run();

 private:
  // This engine's prompts in flight, as the hub gave them (what the reward
  // needs travels on with each answer), and the leases that hold them
  // (renewed while the engine lives): a lease is acked when every answer
  // of its prompts is in the hub, so the prompts of a rollout that dies
  // are delivered again. A prompt delivered again while in flight here
  // (its lease ran out) is not generated twice: its new lease is finished
  // with the first delivery's answers.
  struct InFlight {
    PromptRecord prompt;
    std::vector<tq::LeaseId> leases;
    int64_t answers_left = 0;
    bool decoding = false;  // a step has run since its answers were submitted
  };
  // A prompt taken from the hub, not yet started.
  struct Parked {
    uint64_t cursor;
    PromptRecord prompt;
    tq::LeaseId lease;
  };
  struct Taken {
    tq::BatchMeta meta;
    tq::BatchData data;
  };

  bool Stopping() const { return r_.stopping_() || health_.StopRequested() || r_.failed_.load(); }
  void SetBusy(bool b) {
    if (b != busy_) r_.active_ += b ? 1 : -1;
    busy_ = b;
    health_.SetRolloutIdle(r_.active_.load() == 0);
  }
  Status RenewDue();
  Status StartPrompt(Parked p);
  Result<schedule::TrainerProgress> ProgressNow() SLUICE_REQUIRES(r_.mu_);
  Result<bool> AnsweredBefore(uint64_t c) SLUICE_REQUIRES(r_.mu_);
  Status HoldForSwitch();
  // This turn's prompts from the hub (admission's, parked ones started
  // first); *over once every answer of the run is in the hub.
  Status TakePrompts(std::vector<Taken>* taken, bool* over);
  Status StartTaken(std::vector<Taken>& taken);
  Status DecodeStep();
  Status WriteAnswer(rollout::GenerationResult& res);
  // An agent trajectory that ended, as its answer.
  Status WriteTrajectory(AgentDriver::Finished& f);
  // The answer's row, once: then its prompt's lease is acked if it was its last.
  Status WriteRow(uint64_t c, AnswerRecord& answer, const tq::RowTags& tags);
  // Nothing decoding, waiting for an environment or queued.
  bool Idle() const { return engine_->idle() && (!agent_ || agent_->in_flight() == 0); }

  RolloutRole& r_;
  const Options& o_;
  tq::TransferQueueClient& hub_;
  RunHealth& health_;
  const int32_t index_;
  const rollout::WeightSwapHook hook_;
  std::unique_ptr<rollout::RolloutEngine> engine_;
  std::unique_ptr<AgentDriver> agent_;  // agent runs
  int32_t slots_ = 0;
  bool busy_ = false;  // this engine's share of the rollout's idle flag
  rollout::EngineStats seen_;
  PolicyVersion traced_version_ = -1;
  std::map<uint64_t, InFlight> in_flight_;
  std::map<tq::LeaseId, int64_t> prompts_left_;  // by lease
  // Prompts taken past what this engine may start yet (shared stream: the
  // other replicas took the ones admission counted on), by cursor: the
  // lowest start first, so a prompt the trainer waits for (one a dead
  // replica held, handed out again) never waits behind a later one.
  std::multimap<uint64_t, Parked> parked_;
  Clock::time_point renew_at_;
  Clock::time_point peek_at_;
  bool peeking_ = false;  // this turn takes one prompt past admission, to look
  // The trainer's progress, asked of the hub at most once a turn (parked
  // prompts, the intake and the prompts taken all use it; the engine's
  // version moves only in its step, after them).
  std::optional<schedule::TrainerProgress> progress_this_turn_;
  // RunHooks::hold_for_switch: the prompts this engine has stopped for a
  // weight switch (each once).
  std::set<uint64_t> held_;
};

// Keep what this engine holds, every third of the lease: a lease that ran
// out regardless (a pause longer than the lease) is done with; its prompts
// went back to the stream and whoever takes them finds the answers written
// (its ack is refused and logged).
Status RolloutRole::Engine::RenewDue() {
  const auto lease = std::chrono::seconds(o_.lease_seconds);
  if (Clock::now() < renew_at_) return Status::Ok();
  renew_at_ = Clock::now() + lease / 3;
  for (const auto& [held, prompts] : prompts_left_) {
    Result<tq::RenewResponse> renewed = hub_.Renew(held, lease);
    if (renewed.ok()) continue;
    if (renewed.status().code() != StatusCode::kFailedPrecondition) return renewed.status();
    SLUICE_LOG(WARNING) << "rollout: " << renewed.status().message();
  }
  return Status::Ok();
}

Status RolloutRole::Engine::StartPrompt(Parked p) {
  if (auto it = in_flight_.find(p.cursor); it != in_flight_.end()) {
    it->second.leases.push_back(p.lease);
    return Status::Ok();
  }
  const int64_t G = o_.intake.group_size;
  if (agent_ && p.prompt.row.empty()) {
    return Status::DataLoss("prompt " + std::to_string(p.cursor) +
                            " has no row for the environment (agent.env is set "
                            "here and not where the prompts were fed)");
  }
  for (int64_t g = 0; g < G && agent_; ++g) {
    rollout::SamplingParams sampling = o_.sampling;
    sampling.seed = AnswerSeed(o_.seed, o_.intake.prompts_per_step, G, p.cursor, g);
    if (r_.w_.hooks.forced_length) sampling.forced_length = r_.w_.hooks.forced_length(p.cursor, g);
    agent_->Start(p.cursor * static_cast<uint64_t>(G) + static_cast<uint64_t>(g), p.prompt.row, sampling);
  }
  for (int64_t g = 0; g < G && !agent_; ++g) {
    rollout::GenerationRequest req;
    req.id = p.cursor * static_cast<uint64_t>(G) + static_cast<uint64_t>(g);
    req.prompt = p.prompt.prompt;
    req.sampling = o_.sampling;
    req.sampling.seed = AnswerSeed(o_.seed, o_.intake.prompts_per_step, G, p.cursor, g);
    if (r_.w_.hooks.forced_length) req.sampling.forced_length = r_.w_.hooks.forced_length(p.cursor, g);
    SLUICE_RETURN_IF_ERROR(engine_->Submit(std::move(req)));
  }
  in_flight_[p.cursor] = {std::move(p.prompt), {p.lease}, G, false};
  return Status::Ok();
}

Result<schedule::TrainerProgress> RolloutRole::Engine::ProgressNow() {
  if (!progress_this_turn_) {
    SLUICE_ASSIGN_OR_RETURN(schedule::TrainerProgress p, r_.ReadProgress());
    progress_this_turn_ = p;
  }
  return *progress_this_turn_;
}

// A prompt handed out again (its lease ran out, or its replica died) whose
// answers are all in the hub, or were trained: done with, not generated
// again (the answers would be written anew once the trainer consumed the
// first ones, and reach it twice). Asked in this order: the trainer
// publishes the version that trained a prompt before its ack frees the
// answers, so answers gone are a prompt trained.
Result<bool> RolloutRole::Engine::AnsweredBefore(uint64_t c) {
  SLUICE_ASSIGN_OR_RETURN(const schedule::TrainerProgress before, ProgressNow());
  if (static_cast<int64_t>(c) < r_.intake_->TrainedEnd(before.latest_version)) {
    SLUICE_LOG(INFO) << "rollout: prompt " << c << " was handed out again after it was trained";
    return true;
  }
  std::vector<std::string> keys;
  for (int64_t g = 0; g < o_.intake.group_size; ++g) keys.push_back(AnswerKey(c, g));
  Result<tq::KvBatch> there = hub_.KvGetBatch(kRolloutPartition, keys, {column::kAnswerIndex});
  if (!there.ok() && there.status().code() != StatusCode::kNotFound) return there.status();
  if (there.ok()) {
    SLUICE_LOG(INFO) << "rollout: prompt " << c << " was handed out again with all its answers in the hub";
    return true;
  }
  SLUICE_ASSIGN_OR_RETURN(const schedule::TrainerProgress now, r_.ReadProgress());
  if (static_cast<int64_t>(c) < r_.intake_->TrainedEnd(now.latest_version)) {
    SLUICE_LOG(INFO) << "rollout: prompt " << c << " was handed out again after it was trained";
    return true;
  }
  return false;
}

Status RolloutRole::Engine::HoldForSwitch() {
  const RunHooks& hooks = r_.w_.hooks;
  if (!hooks.hold_for_switch || engine_->num_waiting() > 0 || engine_->num_running() == 0) return Status::Ok();
  std::optional<uint64_t> flagged;
  for (const auto& [c, prompt] : in_flight_) {
    if (prompt.decoding && held_.count(c) == 0 && hooks.hold_for_switch(c)) {
      flagged = c;
      break;
    }
  }
  if (!flagged) return Status::Ok();
  // Only while the steps the trainer's next version needs are all out of
  // this engine (else it would wait for answers held here).
  uint64_t lowest = in_flight_.begin()->first;
  if (!parked_.empty()) lowest = std::min(lowest, parked_.begin()->first);
  int64_t trained_steps = 0;
  {
    MutexLock lock(&r_.mu_);
    SLUICE_ASSIGN_OR_RETURN(const schedule::TrainerProgress progress, ProgressNow());
    trained_steps = progress.trained_steps;
  }
  const int64_t needed_end = (o_.intake.start_step + trained_steps + std::max<int64_t>(1, o_.intake.sync_interval)) *
                             o_.intake.prompts_per_step;
  if (static_cast<int64_t>(lowest) < needed_end) return Status::Ok();  // not yet: asked again next turn
  held_.insert(*flagged);
  const PolicyVersion from = engine_->policy_version();
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  RoleDoing doing(health_, o_.slot, RoleActivity::kWaitAdmission, /*traced=*/false);
  while (engine_->policy_version() == from && !engine_->pending_version() && Clock::now() < give_up && !Stopping()) {
    health_.Beat(o_.slot);
    SLUICE_RETURN_IF_ERROR(RenewDue());
    SLUICE_RETURN_IF_ERROR(engine_->PollWeights());
    std::this_thread::sleep_for(kIdlePoll);
  }
  if (engine_->policy_version() == from && !engine_->pending_version()) {
    SLUICE_LOG(WARNING) << "rollout: held the answers of prompt " << *flagged << " for a weight switch, and none "
                        << "came (hold_for_switch)";
  }
  return Status::Ok();
}

Status RolloutRole::Engine::TakePrompts(std::vector<Taken>* taken, bool* over) {
  const bool shared = o_.intake.Shared();
  // Keep about one batch of prompts waiting so freed slots refill at once.
  const int64_t queued = static_cast<int64_t>(engine_->num_waiting()) + engine_->num_running();
  MutexLock lock(&r_.mu_);
  auto progress = [this]() SLUICE_NO_THREAD_SAFETY_ANALYSIS { return ProgressNow(); };  // under mu_
  if (!shared && r_.untaken_ == 0 && Idle()) {                                          // every answer is in the hub
    *over = true;
    return Status::Ok();
  }
  // Parked prompts first, as far as the engine's version allows.
  if (!parked_.empty()) {
    SLUICE_ASSIGN_OR_RETURN(const int64_t limit, r_.intake_->StartLimit(engine_->policy_version(), progress));
    while (!parked_.empty() && static_cast<int64_t>(parked_.begin()->first) < limit) {
      SLUICE_RETURN_IF_ERROR(StartPrompt(std::move(parked_.begin()->second)));
      parked_.erase(parked_.begin());
    }
  }
  SLUICE_ASSIGN_OR_RETURN(const int64_t admitted,
                          r_.intake_->Take(slots_, queued, engine_->policy_version(), progress));
  // Shared: what is admitted now (the count is the stream's, not ours to
  // owe). An engine with nothing to do looks at the stream's next prompt
  // regardless (every kHubPoll): the stream's cursor counts the prompts taken,
  // but prompts a dead replica held come back below it (the lowest are
  // handed out first), and admission alone would wait for them forever. One
  // it may not start goes straight back.
  r_.owed_ = shared ? admitted : r_.owed_ + admitted;
  peeking_ = false;
  if (shared && r_.owed_ == 0 && engine_->idle() && in_flight_.empty() && Clock::now() >= peek_at_) {
    peek_at_ = Clock::now() + kHubPoll;
    r_.owed_ = 1;
    peeking_ = true;
  }
  // The admitted prompts, in order, from the hub's prompt partition, one
  // lease each: a prompt is acked the moment its last answer is in the hub.
  // (A lease of several would keep a finished prompt unacked while the
  // others generate; were this replica to die then, its prompt would be
  // generated again after the trainer consumed its answers, and the group
  // would reach the trainer twice.)
  if (r_.owed_ > 0) {
    RoleDoing doing(health_, o_.slot, RoleActivity::kTakePrompts);
    const auto lease = std::chrono::seconds(o_.lease_seconds);
    tq::GetMetaRequest take;
    take.task = kRolloutTask;
    take.columns = RecordColumns<PromptRecord>();
    take.partition = kPromptPartition;
    // Held while generating, renewed every third of it: a replica that dies
    // leaves its prompts to the others after at most this.
    take.lease_timeout = lease;
    take.holder = o_.lease_holder;
    take.n = 1;
    for (int64_t asked = r_.owed_; asked > 0; --asked) {
      auto got = hub_.GetMeta(take);
      if (!got.ok() && got.status().code() != StatusCode::kTimeout) return got.status();
      if (!got.ok()) break;  // none ready
      SLUICE_ASSIGN_OR_RETURN(std::optional<tq::BatchData> d, ReadLeasedRows(hub_, *got, lease, "rollout"));
      if (!d) continue;
      // A prompt handed out again (a lease that ran out) was admitted and
      // counted when first taken. (Shared: the stream counts.)
      const bool again = !shared && got->rows.size() == 1 &&
                         !r_.taken_before_.insert(static_cast<uint64_t>(got->rows[0].tags.group_id)).second;
      if (!again) {
        r_.owed_ -= static_cast<int64_t>(got->rows.size());
        r_.untaken_ -= static_cast<int64_t>(got->rows.size());
      }
      taken->push_back({std::move(*got), std::move(*d)});
    }
  }
  // (Take asked the hub just now: an idle engine always wants prompts.)
  if (shared && taken->empty() && Idle() && parked_.empty() && in_flight_.empty() &&
      r_.prompts_done_ >= r_.run_prompts_) {
    *over = true;  // every answer of the run is in the hub
  }
  return Status::Ok();
}

Status RolloutRole::Engine::StartTaken(std::vector<Taken>& taken) {
  const bool shared = o_.intake.Shared();
  int64_t limit = std::numeric_limits<int64_t>::max();  // shared: the cursors this engine may start now
  if (shared && !taken.empty()) {
    MutexLock lock(&r_.mu_);
    auto progress = [this]() SLUICE_NO_THREAD_SAFETY_ANALYSIS { return ProgressNow(); };  // under mu_
    SLUICE_ASSIGN_OR_RETURN(limit, r_.intake_->StartLimit(engine_->policy_version(), progress));
  }
  for (Taken& t : taken) {
    if (t.meta.rows.size() != 1) {
      return Status::DataLoss("the hub leased " + std::to_string(t.meta.rows.size()) + " prompts, asked for one");
    }
    const uint64_t c = static_cast<uint64_t>(t.meta.rows[0].tags.group_id);
    SLUICE_ASSIGN_OR_RETURN(PromptRecord prompt, DecodeRecord<PromptRecord>(t.data, 0));
    if (prompt.prompt.empty()) return Status::DataLoss("prompt row of cursor " + std::to_string(c) + " has no tokens");
    if (peeking_ && static_cast<int64_t>(c) >= limit) {  // not one this engine may start: back it goes
      if (Result<tq::ReleaseResponse> back = hub_.Release(t.meta.lease_id);
          !back.ok() && back.status().code() != StatusCode::kFailedPrecondition) {
        return back.status();
      }
      continue;
    }
    if (in_flight_.count(c) == 0) {
      bool done = false;
      {
        MutexLock lock(&r_.mu_);
        SLUICE_ASSIGN_OR_RETURN(done, AnsweredBefore(c));
      }
      if (done) {
        Result<tq::AckResponse> acked = hub_.Ack(t.meta.lease_id);
        if (!acked.ok() && acked.status().code() != StatusCode::kFailedPrecondition) return acked.status();
        continue;
      }
    }
    ++prompts_left_[t.meta.lease_id];
    Parked p{c, std::move(prompt), t.meta.lease_id};
    if (static_cast<int64_t>(c) >= limit) {
      parked_.emplace(c, std::move(p));
    } else {
      SLUICE_RETURN_IF_ERROR(StartPrompt(std::move(p)));
    }
  }
  return Status::Ok();
}

Status RolloutRole::Engine::DecodeStep() {
  // A step on an idle engine still runs the weight-swap hook.
  const auto t0 = Clock::now();
  std::vector<rollout::GenerationResult> done;
  {
    // A step on an idle engine only runs the hook: not traced.
    RoleDoing doing(health_, o_.slot, RoleActivity::kDecodeStep, !engine_->idle());
    SLUICE_ASSIGN_OR_RETURN(done, engine_->Step());
  }
  if (r_.w_.hooks.hold_for_switch) {
    for (auto& [c, prompt] : in_flight_) prompt.decoding = true;
  }
  if (engine_->policy_version() != traced_version_) {  // switched weights in that step
    traced_version_ = engine_->policy_version();
    TraceRecorder::Global().Counter("serving version", TraceNowUs(), static_cast<double>(traced_version_));
  }
  if (!engine_->idle() || !done.empty()) {  // (summed over replicas)
    const int64_t busy_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count() /
                            std::max(1, o_.intake.engines);
    health_.AddDecoding(o_.replica, busy_us, 0);
  }
  const rollout::EngineStats& now = engine_->stats();
  health_.AddSlotSteps((now.decode_steps - seen_.decode_steps) * slots_,
                       now.active_slot_steps - seen_.active_slot_steps);
  seen_ = now;
  if (agent_) {
    // Model turns to their environments, the environments' answers to the
    // next turns; the trajectories that ended are answers.
    SLUICE_ASSIGN_OR_RETURN(std::vector<AgentDriver::Finished> ended, agent_->Advance(&done));
    for (auto& f : ended) SLUICE_RETURN_IF_ERROR(WriteTrajectory(f));
  }
  for (auto& res : done) SLUICE_RETURN_IF_ERROR(WriteAnswer(res));
  return Status::Ok();
}

Status RolloutRole::Engine::WriteAnswer(rollout::GenerationResult& res) {
  const int64_t G = o_.intake.group_size;
  health_.AddDecoding(o_.replica, 0, static_cast<int64_t>(res.tokens.size()));
  const uint64_t c = res.id / static_cast<uint64_t>(G);
  auto prompt_it = in_flight_.find(c);
  if (prompt_it == in_flight_.end()) return Status::Internal("answer " + std::to_string(res.id) + " of no prompt");
  InFlight& prompt = prompt_it->second;
  tq::RowTags tags;
  tags.group_id = static_cast<GroupId>(c);
  tags.policy_version = res.versions.empty() ? engine_->policy_version() : res.versions.front();
  tags.token_length = static_cast<int64_t>(res.tokens.size());
  AnswerRecord answer;
  answer.answer_index = static_cast<int32_t>(res.id % static_cast<uint64_t>(G));
  answer.prompt = std::move(res.prompt);
  answer.response = std::move(res.tokens);
  answer.logprobs = std::move(res.logprobs);
  answer.versions = std::move(res.versions);
  answer.example = prompt.prompt.example;
  answer.reference_answer = prompt.prompt.reference_answer;
  return WriteRow(c, answer, tags);
}

Status RolloutRole::Engine::WriteTrajectory(AgentDriver::Finished& f) {
  const int64_t G = o_.intake.group_size;
  const uint64_t c = f.id / static_cast<uint64_t>(G);
  auto prompt_it = in_flight_.find(c);
  if (prompt_it == in_flight_.end()) return Status::Internal("trajectory " + std::to_string(f.id) + " of no prompt");
  const PromptRecord& prompt = prompt_it->second.prompt;
  AnswerRecord answer;
  answer.answer_index = static_cast<int32_t>(f.id % static_cast<uint64_t>(G));
  answer.example = prompt.example;
  answer.reference_answer = prompt.reference_answer;
  AgentAnswer a = AnswerOfTrajectory(f, prompt.prompt, o_.eos_id);
  answer.prompt = std::move(a.prompt);
  answer.response = std::move(a.response);
  answer.logprobs = std::move(a.logprobs);
  answer.versions = std::move(a.versions);
  answer.trajectory = std::move(a.summary);
  if (f.reason == agent::EndReason::kEnvError || f.reason == agent::EndReason::kEnvTimeout) {
    SLUICE_LOG(WARNING) << "rollout: trajectory " << f.id << " ended " << agent::EndReasonName(f.reason)
                        << (f.detail.empty() ? "" : ": " + f.detail);
  }
  int64_t sampled = 0;
  for (PolicyVersion v : answer.versions) sampled += v >= 0 ? 1 : 0;
  health_.AddDecoding(o_.replica, 0, sampled);
  tq::RowTags tags;
  tags.group_id = static_cast<GroupId>(c);
  trainer::RolloutSample versions_only;
  versions_only.versions = answer.versions;
  tags.policy_version = trainer::OldestSampledVersion(versions_only, engine_->policy_version());
  tags.token_length = static_cast<int64_t>(answer.response.size());
  return WriteRow(c, answer, tags);
}

Status RolloutRole::Engine::WriteRow(uint64_t c, AnswerRecord& answer, const tq::RowTags& tags) {
  auto prompt_it = in_flight_.find(c);
  InFlight& prompt = prompt_it->second;
  const tq::ColumnBatch cols = EncodeRecord(answer);
  const std::string key = AnswerKey(c, answer.answer_index);
  RoleDoing doing(health_, o_.slot, RoleActivity::kWriteAnswer);
  // Keyed by prompt and answer, so an answer is in the hub once: a replica
  // that died before acking its prompt may have written some of them, and
  // the one the prompt went to next finds them there.
  SLUICE_RETURN_IF_ERROR(WriteAnswerOnce(
      hub_, key, column::kResponse, [&] { return hub_.KvPutBatch(kRolloutPartition, {key}, {tags}, cols); },
      [&] { return r_.stopping_() || health_.StopRequested(); }, [&] { return RenewDue(); }));
  // The prompt's last answer: done with it; a lease's last prompt: ack it.
  if (--prompt.answers_left > 0) return Status::Ok();
  const std::vector<tq::LeaseId> leases = std::move(prompt.leases);
  in_flight_.erase(prompt_it);
  for (tq::LeaseId lease : leases) {
    if (--prompts_left_[lease] > 0) continue;
    prompts_left_.erase(lease);
    if (r_.w_.hooks.lose_prompt_ack && r_.w_.hooks.lose_prompt_ack(c)) continue;
    Result<tq::AckResponse> acked = hub_.Ack(lease);
    if (!acked.ok() && acked.status().code() != StatusCode::kFailedPrecondition) return acked.status();
    // A lease that ran out: its prompts were handed out again, and whoever
    // took them finds these answers in the hub.
    if (!acked.ok()) SLUICE_LOG(WARNING) << "rollout: " << acked.status().message();
  }
  return Status::Ok();
}

Status RolloutRole::Engine::Run() {
  TraceThisThread(PipelineRole::kRollout, o_.process + "engine " + std::to_string(index_));
  const int32_t engines = std::max(1, o_.intake.engines);
  if (o_.threads > 0) SetIntraOpThreadsHere(std::max(1, o_.threads / engines));
  rollout::EngineOptions eo;
  eo.num_slots = o_.slots / engines + (index_ < o_.slots % engines ? 1 : 0);
  eo.eos_token_id = o_.eos_id;
  eo.switch_policy = o_.switch_policy;
  eo.kept_cache_bytes = o_.agent.KeptCacheBytes();
  slots_ = eo.num_slots;
  SLUICE_ASSIGN_OR_RETURN(engine_, rollout::RolloutEngine::Create({r_.w_.model, o_.intake.version}, eo));
  engine_->SetWeightSwapHook(hook_);
  if (o_.agent.enabled()) {
    SLUICE_ASSIGN_OR_RETURN(AgentSettings settings,
                            AgentSettingsFor(o_.agent, o_.tokenizer_dir, o_.model, o_.sampling.max_new_tokens));
    if (r_.w_.hooks.make_environment) settings.make_env = r_.w_.hooks.make_environment;
    SLUICE_ASSIGN_OR_RETURN(agent_, AgentDriver::Create(std::move(settings), engine_.get()));
  }
  struct NotBusyOnExit {
    Engine* e;
    ~NotBusyOnExit() { e->SetBusy(false); }
  } not_busy{this};
  renew_at_ = Clock::now() + std::chrono::seconds(o_.lease_seconds) / 3;
  peek_at_ = Clock::now();
  while (!Stopping()) {
    progress_this_turn_.reset();
    health_.Beat(o_.slot);
    SetBusy(!engine_->idle());
    SLUICE_RETURN_IF_ERROR(RenewDue());
    std::vector<Taken> taken;  // this turn's prompts, a lease each
    bool over = false;
    SLUICE_RETURN_IF_ERROR(TakePrompts(&taken, &over));
    if (over) return Status::Ok();
    if (taken.empty() && engine_->idle()) {
      RoleDoing doing(health_, o_.slot, RoleActivity::kWaitAdmission, /*traced=*/false);
      std::this_thread::sleep_for(kIdlePoll);
    }
    SLUICE_RETURN_IF_ERROR(StartTaken(taken));
    SetBusy(!engine_->idle());
    // Lent cores come back before decoding: wait for the trainer's lent
    // workers to finish their micro-batches (bounded by one micro-batch).
    while (!engine_->idle() && health_.lent_workers_running() > 0 && !health_.StopRequested() && !r_.stopping_()) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    SLUICE_RETURN_IF_ERROR(HoldForSwitch());
    SLUICE_RETURN_IF_ERROR(DecodeStep());
  }
  return Status::Ok();
}

Status RolloutRole::Run(const std::function<bool()>& stopping) {
  stopping_ = stopping;
  const int32_t engines = std::max(1, o_.intake.engines);
  // Data-parallel engines share the admission and the prompts' intake (both
  // under mu_) and the weights (one shared hook, so the standby buffer an
  // engine still reads is never refilled).
  const std::vector<rollout::WeightSwapHook> hooks =
      rollout::ShareWeightSwapHook(w_.standby->Hook(), engines, o_.intake.version);
  struct IdleOnExit {
    RunHealth* health;
    ~IdleOnExit() { health->SetRolloutIdle(true); }
  } idle_on_exit{w_.health};
  std::vector<std::unique_ptr<Engine>> loops;
  for (int32_t e = 0; e < engines; ++e)
    loops.push_back(std::make_unique<Engine>(*this, e, hooks[static_cast<size_t>(e)]));
  return RunLoops(
      engines, [&](int e) { return loops[static_cast<size_t>(e)]->Run(); }, &failed_);
}

}  // namespace sluice::pipeline
