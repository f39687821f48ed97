#include "sluice/simulate/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <queue>
#include <tuple>

#include "sluice/schedule/intake.h"
#include "sluice/schedule/packing.h"

namespace sluice::simulate {

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
// The pipeline's polling intervals (src/pipeline/rollout_role.cc,
// src/trainer/trainer.cc): an idle engine sleeps 2 ms before its next loop; a
// lent worker that may not run looks again after 1 ms; an engine waiting for
// lent workers looks every 200 us (half of it on average).
constexpr double kIdlePollS = 0.002;
constexpr double kLentPollS = 0.001;
constexpr double kLentReturnS = 0.0001;
constexpr int64_t kMaxEvents = 200'000'000;

struct Sequence {
  int64_t id = 0;  // answer id: cursor x G + g
  int64_t cursor = 0;
  int32_t prompt = 0;
  int32_t length = 0;
  int32_t generated = 0;    // when admitted (a preempted sequence keeps its tokens)
  int64_t admitted_at = 0;  // the engine's decode step that admitted it
  PolicyVersion first_version = -1;
};

struct Answer {
  int64_t cursor = 0;
  PolicyVersion first_version = 0;
};

class Run {
 public:
  Run(const Workload& w, const Layout& l, const CostProfile& c) : w_(w), l_(l), c_(c), shared_(c.cores > 0) {}

  Result<SimResult> Go();

 private:
  enum class EnginePhase { kLoopTop, kIdleStep, kBeforeStep };
  // An engine's batch, kept so that a decode step costs O(log rows) here
  // however many rows it decodes: each row's generated tokens follow from
  // the step it was admitted at, the sums the cost needs are kept up to
  // date, and rows finish off a heap of finishing steps.
  struct Engine {
    int64_t slots = 0;
    std::deque<Sequence> waiting;
    std::map<int64_t, Sequence> running;  // by admission order (the newest is preempted first)
    std::priority_queue<std::pair<int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>, std::greater<>>
        finish_at;                           // (decode step it finishes at, admission key); stale ones skipped
    std::map<int64_t, int64_t> cursor_rows;  // rows running per prompt (its prefix cached while any)
    int64_t prompt_tokens = 0;               // of the cached prompts
    int64_t generated_tokens = 0;            // of the running rows
    int64_t attended = 0;                    // sum over running rows of prompt + generated
    int64_t step = 0;                        // decode steps taken
    int64_t next_key = 0;
    std::vector<Sequence> finishing;  // done at the end of the step under way
    PolicyVersion version = 0;
    EnginePhase phase = EnginePhase::kLoopTop;
    bool busy = false;  // the pipeline's flag: set at the loop's top and after taking prompts
    bool waits_for_lent = false;
    bool sleeping = false;  // idle, polling from poll_origin on
    double poll_origin = 0;
    bool idle() const { return waiting.empty() && running.empty(); }
    int64_t kv_tokens() const { return prompt_tokens + generated_tokens; }
    int32_t Generated(const Sequence& s) const { return s.generated + static_cast<int32_t>(step - s.admitted_at); }
    void Add(Sequence s) {
      s.admitted_at = step;
      const int64_t key = next_key++;
      if (cursor_rows[s.cursor]++ == 0) prompt_tokens += s.prompt;
      generated_tokens += s.generated;
      attended += s.prompt + s.generated;
      // Admitted at this step, it generates a token in it: done after the
      // step at which it reaches its length.
      finish_at.emplace(step + (s.length - s.generated) - 1, key);
      running.emplace(key, s);
    }
    Sequence Remove(std::map<int64_t, Sequence>::iterator it) {
      Sequence s = it->second;
      s.generated = Generated(s);
      running.erase(it);
      generated_tokens -= s.generated;
      attended -= s.prompt + s.generated;
      auto rows = cursor_rows.find(s.cursor);
      if (--rows->second == 0) prompt_tokens -= s.prompt, cursor_rows.erase(rows);
      return s;
    }
  };
  enum class TrainerPhase { kWaitGroups, kTraining, kUpdating, kFinishing, kDone };
  struct Worker {
    bool running = false;
    bool lent = false;
  };

  // Actors: engines 0..E-1, the reward scorer, the trainer, its workers.
  size_t RewardActor() const { return engines_.size(); }
  size_t TrainerActor() const { return engines_.size() + 1; }
  size_t WorkerActor(size_t w) const { return engines_.size() + 2 + w; }

  void Schedule(size_t actor, double t) {
    wake_[actor] = t;
    if (t < kNever) events_.emplace(t, next_seq_++, actor);
  }
  // Work on an actor's thread: `work` seconds at full speed, run at the
  // speed the number of working threads allows (CostProfile::Slowdown); its
  // finish moves whenever a thread starts or stops working.
  void Begin(size_t actor, double t, double work) {
    if (work <= 0) {
      Schedule(actor, t);
      return;
    }
    Settle(t);
    working_[actor] = true;
    remaining_[actor] = work;
    began_[actor] = t;
    since_[actor] = t;
    ++working_count_;
    Reschedule(t, actor);
  }
  void End(size_t actor, double t) {
    working_[actor] = false;
    remaining_[actor] = 0;
    --working_count_;
    if (actor < engines_.size()) out_.rollout_busy_s += (t - began_[actor]) / static_cast<double>(engines_.size());
    Reschedule(t, actor);
  }
  // Brings every working actor's remaining work up to `t` (with cores of
  // their own, speeds never change, and nothing is done here).
  void Settle(double t) {
    if (!shared_) return;
    for (size_t a = 0; a < working_.size(); ++a) {
      if (!working_[a]) continue;
      remaining_[a] = std::max(0.0, remaining_[a] - (t - since_[a]) / Slow(a));
      since_[a] = t;
    }
  }
  // After `changed` started or stopped: every working actor's finish at the
  // speed it has now (only `changed`'s own without shared cores).
  void Reschedule(double t, size_t changed) {
    if (!shared_) {
      if (working_[changed]) Schedule(changed, t + remaining_[changed]);
      return;
    }
    for (size_t a = 0; a < working_.size(); ++a) {
      if (working_[a]) since_[a] = t, Schedule(a, t + remaining_[a] * Slow(a));
    }
  }
  // How much slower the actor's work runs now.
  double Slow(size_t actor) const {
    return c_.Slowdown(actor < engines_.size() ? CostProfile::Work::kRollout : CostProfile::Work::kTrainer,
                       working_count_);
  }
  // The newest version the rollout can switch to at `t`.
  PolicyVersion Switchable(double t) const {
    for (auto it = fills_.rbegin(); it != fills_.rend(); ++it) {
      if (it->first <= t) return it->second;
    }
    return 0;
  }
  // An idle engine's first poll at or after `t` (never before its first).
  static double NextPoll(const Engine& en, double t) {
    const double k = std::max(1.0, std::ceil((t - en.poll_origin) / kIdlePollS - 1e-9));
    return en.poll_origin + k * kIdlePollS;
  }
  // The trainer's progress changed: idle engines poll at their next poll.
  void WakeIdleEngines(double t) {
    for (size_t e = 0; e < engines_.size(); ++e) {
      if (engines_[e].sleeping) Poke(e, NextPoll(engines_[e], t));
    }
  }
  // Wakes a sleeping actor at `t` if it would wake later.
  void Poke(size_t actor, double t) {
    if (wake_[actor] > t) Schedule(actor, t);
  }
  bool RolloutIdle() const {
    return std::none_of(engines_.begin(), engines_.end(), [](const Engine& e) { return e.busy; });
  }
  int32_t PromptTokens(int64_t cursor) const {
    return w_.prompt_tokens.size() == 1 ? w_.prompt_tokens[0] : w_.prompt_tokens[static_cast<size_t>(cursor)];
  }

  Status EngineWake(size_t e, double t);
  void RewardWake(double t);
  Status TrainerWake(double t);
  void StartPart(double t);
  void WorkerWake(size_t w, double t);

  const Workload& w_;
  const Layout& l_;
  const CostProfile& c_;
  const bool shared_;  // threads share cores and slow each other
  std::unique_ptr<schedule::PromptIntake> intake_;
  std::vector<Engine> engines_;
  std::vector<Worker> workers_;
  std::vector<double> wake_;
  std::vector<bool> working_;
  std::vector<double> remaining_, since_, began_;
  int64_t working_count_ = 0;
  std::priority_queue<std::tuple<double, int64_t, size_t>, std::vector<std::tuple<double, int64_t, size_t>>,
                      std::greater<>>
      events_;
  int64_t next_seq_ = 0;

  // Shared state, as the roles see each other through the hub and the store.
  PolicyVersion published_ = 0;
  // Published versions and when the rollout's standby copy of each is ready.
  std::vector<std::pair<double, PolicyVersion>> fills_;
  int64_t trained_steps_ = 0;
  bool trainer_waiting_ = true;
  int32_t lent_running_ = 0;
  std::deque<Answer> to_score_;
  std::deque<int64_t> complete_;  // cursors whose whole group is scored, in that order
  bool scoring_ = false;
  Answer scored_now_;
  std::vector<int32_t> rewarded_;              // answers scored, per cursor
  std::vector<PolicyVersion> oldest_version_;  // per cursor: its answers' oldest first version
  std::vector<double> cursor_staleness_base_;  // per cursor: the sum of its answers' first versions

  TrainerPhase phase_ = TrainerPhase::kWaitGroups;
  int64_t step_ = 0;
  PolicyVersion trainer_version_ = 0;
  double wait_start_ = 0;
  // The step's parts (one per optimizer update), each its micro-batches.
  std::vector<std::vector<std::vector<size_t>>> parts_;
  size_t part_ = 0;
  std::vector<std::vector<size_t>> micro_batches_;  // the part under way
  // The pass before the update (CostProfile::train_proximal_share) is under
  // way, over every part's micro-batches; `share_` of each micro-batch's
  // cost is the phase's under way.
  bool proximal_pass_ = false;
  double share_ = 1;
  std::vector<int64_t> sample_lengths_;
  size_t next_micro_batch_ = 0;
  bool publishing_ = false;

  SimResult out_;
  double active_rows_ = 0, slot_steps_ = 0;
};

Status Run::EngineWake(size_t e, double t) {
  Engine& en = engines_[e];
  if (en.phase == EnginePhase::kIdleStep) {
    en.sleeping = false;
    // The step an idle engine still takes: only the weight-swap hook.
    en.phase = EnginePhase::kLoopTop;
    if (Switchable(t) > en.version) {
      en.version = Switchable(t);
      Begin(e, t, c_.weight_switch_s);
      return Status::Ok();
    }
  }
  if (en.phase == EnginePhase::kLoopTop) {
    for (const Sequence& s : en.finishing) {
      to_score_.push_back({s.cursor, s.first_version});
      out_.generated_tokens += s.length;
    }
    if (!en.finishing.empty()) Poke(RewardActor(), t);
    en.finishing.clear();
    en.busy = !en.idle();
    const int64_t queued = static_cast<int64_t>(en.waiting.size() + en.running.size());
    auto progress = [&]() -> Result<schedule::TrainerProgress> {
      schedule::TrainerProgress p;
      p.trained_steps = trained_steps_;
      p.latest_version = published_;
      // (A trainer that takes whatever completes waits for no prompts in
      // particular: nothing is held back for it.)
      p.waiting = trainer_waiting_ && !l_.completion_order;
      return p;
    };
    const int64_t first = intake_->cursor();
    SLUICE_ASSIGN_OR_RETURN(const int64_t taken, intake_->Take(en.slots, queued, en.version, progress));
    for (int64_t c = first; c < first + taken; ++c) {
      for (int64_t g = 0; g < w_.group_size; ++g) {
        Sequence s;
        s.id = c * w_.group_size + g;
        s.cursor = c;
        s.prompt = PromptTokens(c);
        s.length = w_.response_tokens[static_cast<size_t>(s.id)];
        en.waiting.push_back(s);
      }
    }
    if (taken == 0 && en.idle()) {
      // Polls every kIdlePollS; the polls that cannot find anything new (no
      // version to switch to, the trainer's progress unchanged) are skipped.
      en.phase = EnginePhase::kIdleStep;
      en.sleeping = true;
      en.poll_origin = t;
      double wake = kNever;
      for (const auto& [at, version] : fills_) {
        if (version > en.version) {
          wake = NextPoll(en, at);
          break;
        }
      }
      Schedule(e, wake);
      return Status::Ok();
    }
    en.busy = !en.idle();
    en.phase = EnginePhase::kBeforeStep;
  }
  // kBeforeStep: lent cores come back before decoding.
  if (!en.idle() && lent_running_ > 0) {
    en.waits_for_lent = true;
    Schedule(e, kNever);
    return Status::Ok();
  }
  en.waits_for_lent = false;
  double cost = 0;
  if (Switchable(t) > en.version) {  // in-flight switch: at any step
    en.version = Switchable(t);
    cost += c_.weight_switch_s;
    if (l_.recompute_on_switch && !en.running.empty()) {
      // Interrupted: every row's cache is computed again under the new
      // weights, its prompt once per group.
      cost += c_.Prefill(static_cast<int64_t>(en.cursor_rows.size()), en.kv_tokens());
      out_.recomputed_tokens += en.kv_tokens();
    }
  }
  en.phase = EnginePhase::kLoopTop;
  if (en.idle()) {
    Begin(e, t, cost);
    return Status::Ok();
  }
  const int64_t capacity = l_.kv_capacity_tokens;
  // Room in the cache for every row's next token: the newest rows are
  // preempted (and later computed again) until there is.
  while (capacity > 0 && !en.running.empty() && en.kv_tokens() + static_cast<int64_t>(en.running.size()) > capacity) {
    en.waiting.push_front(en.Remove(std::prev(en.running.end())));
    ++out_.preemptions;
  }
  // One forward pass: a decode block over the running sequences, a prefill
  // per admitted prompt not already in the cache (a group shares one), and
  // a preempted sequence's tokens again.
  const int64_t rows = static_cast<int64_t>(en.running.size());
  const auto attended = static_cast<double>(en.attended);
  int64_t prefill_prompts = 0, prefill_tokens = 0;
  while (!en.waiting.empty() && static_cast<int64_t>(en.running.size()) < en.slots) {
    Sequence s = en.waiting.front();
    const bool cached = en.cursor_rows.count(s.cursor) > 0;
    if (capacity > 0 &&
        en.kv_tokens() + (cached ? 0 : s.prompt) + s.generated + static_cast<int64_t>(en.running.size()) + 1 >
            capacity) {
      break;
    }
    en.waiting.pop_front();
    if (!cached) ++prefill_prompts, prefill_tokens += s.prompt;
    prefill_tokens += s.generated;
    if (s.first_version < 0) s.first_version = en.version;
    en.Add(s);
  }
  cost += c_.DecodeStep(rows, attended) + c_.Prefill(prefill_prompts, prefill_tokens);
  if (rows > 0) {
    ++out_.decode_steps;
    active_rows_ += static_cast<double>(rows);
    slot_steps_ += static_cast<double>(en.slots);
  }
  // Every row, admitted ones too, generates a token in this step.
  const auto all = static_cast<int64_t>(en.running.size());
  en.generated_tokens += all;
  en.attended += all;
  ++en.step;
  // More steps in the same event while nothing inside the engine can change:
  // no row finishes before the last of them, and the cache holds their
  // tokens (nothing waiting can be admitted then either).
  while (!en.finish_at.empty() && en.running.count(en.finish_at.top().second) == 0) en.finish_at.pop();
  int64_t more = en.finish_at.empty() ? 0 : en.finish_at.top().first - en.step + 1;
  more = std::min<int64_t>(more, l_.max_steps_per_event - 1);
  if (capacity > 0 && all > 0) more = std::min(more, (capacity - en.kv_tokens()) / all);
  for (int64_t j = 0; j < more; ++j) {
    cost += c_.DecodeStep(all, static_cast<double>(en.attended));
    ++out_.decode_steps;
    active_rows_ += static_cast<double>(all);
    slot_steps_ += static_cast<double>(en.slots);
    en.generated_tokens += all;
    en.attended += all;
    ++en.step;
  }
  out_.rollout_compute_s += cost;
  while (!en.finish_at.empty() && en.finish_at.top().first < en.step) {
    const int64_t key = en.finish_at.top().second;
    en.finish_at.pop();
    auto it = en.running.find(key);
    if (it != en.running.end()) en.finishing.push_back(en.Remove(it));
  }
  Begin(e, t, cost);
  return Status::Ok();
}

void Run::RewardWake(double t) {
  if (scoring_) {
    scoring_ = false;
    const auto c = static_cast<size_t>(scored_now_.cursor);
    if (++rewarded_[c] == w_.group_size) complete_.push_back(scored_now_.cursor);
    cursor_staleness_base_[c] += static_cast<double>(scored_now_.first_version);
    oldest_version_[c] = std::min(oldest_version_[c], scored_now_.first_version);
    if (phase_ == TrainerPhase::kWaitGroups) Poke(TrainerActor(), t);
  }
  if (to_score_.empty()) {
    Schedule(RewardActor(), kNever);
    return;
  }
  scored_now_ = to_score_.front();
  to_score_.pop_front();
  scoring_ = true;
  Schedule(RewardActor(), t + c_.reward_answer_s);
}

void Run::StartPart(double t) {
  if (proximal_pass_) {
    micro_batches_.clear();
    for (const auto& part : parts_) micro_batches_.insert(micro_batches_.end(), part.begin(), part.end());
    share_ = c_.train_proximal_share;
  } else {
    micro_batches_ = parts_[part_];
    share_ = 1 - c_.train_proximal_share;
  }
  next_micro_batch_ = 0;
  phase_ = TrainerPhase::kTraining;
  // As the trainer's ForEachMicroBatch: min(workers, micro-batches) of them.
  const size_t active = std::min(workers_.size(), micro_batches_.size());
  for (size_t w = 0; w < active; ++w) Poke(WorkerActor(w), t);
  Schedule(TrainerActor(), kNever);
}

Status Run::TrainerWake(double t) {
  const int64_t P = w_.prompts_per_step, G = w_.group_size;
  if (phase_ == TrainerPhase::kWaitGroups) {
    // The step's prompts: the next P by cursor (the pipeline's trainer), or
    // the first P whose groups completed (completion_order).
    std::vector<int64_t> cursors;
    if (l_.completion_order) {
      if (static_cast<int64_t>(complete_.size()) >= P) {
        cursors.assign(complete_.begin(), complete_.begin() + P);
        complete_.erase(complete_.begin(), complete_.begin() + P);
      }
    } else if (std::all_of(rewarded_.begin() + step_ * P, rewarded_.begin() + (step_ + 1) * P,
                           [&](int32_t n) { return n == G; })) {
      for (int64_t k = 0; k < P; ++k) cursors.push_back(step_ * P + k);
    }
    if (cursors.empty()) {
      if (!trainer_waiting_) WakeIdleEngines(t);
      trainer_waiting_ = true;
      Schedule(TrainerActor(), kNever);
      return Status::Ok();
    }
    if (trainer_waiting_) WakeIdleEngines(t);
    trainer_waiting_ = false;
    out_.trainer_wait_s += t - wait_start_;
    StepTiming timing;
    timing.start_s = t;
    double stale = 0;
    sample_lengths_.clear();
    std::vector<size_t> order;
    for (const int64_t c : cursors) {
      stale += static_cast<double>(trainer_version_) * static_cast<double>(G) -
               cursor_staleness_base_[static_cast<size_t>(c)];
      timing.staleness_max = std::max(timing.staleness_max, trainer_version_ - oldest_version_[static_cast<size_t>(c)]);
      for (int64_t g = 0; g < G; ++g) {
        order.push_back(sample_lengths_.size());
        sample_lengths_.push_back(PromptTokens(c) + w_.response_tokens[static_cast<size_t>(c * G + g)]);
      }
    }
    timing.staleness_mean = stale / static_cast<double>(P * G);
    out_.steps.push_back(timing);
    // As the trainer's RlStep: consecutive parts of the samples, one per
    // optimizer update, each packed on its own.
    const auto n = static_cast<int64_t>(order.size());
    const int64_t parts = std::min<int64_t>(l_.mini_batches, n);
    parts_.clear();
    for (int64_t k = 0; k < parts; ++k) {
      std::vector<size_t> part(order.begin() + k * n / parts, order.begin() + (k + 1) * n / parts);
      parts_.push_back(schedule::PackMicroBatches(sample_lengths_, part, l_.micro_batch_tokens,
                                                  l_.trainer_workers + l_.lent_workers));
    }
    part_ = 0;
    // As RlStep: the proximal (and reference) log-probabilities of every
    // micro-batch first, a phase of its own.
    proximal_pass_ = c_.train_proximal_share > 0;
    StartPart(t);
    return Status::Ok();
  }
  if (phase_ == TrainerPhase::kTraining && proximal_pass_) {
    proximal_pass_ = false;
    StartPart(t);
    return Status::Ok();
  }
  if (phase_ == TrainerPhase::kTraining && part_ + 1 < parts_.size()) {
    // A part trained: its update, then the next part.
    out_.trainer_compute_s += c_.train_update_s;
    phase_ = TrainerPhase::kUpdating;
    Begin(TrainerActor(), t, c_.train_update_s);
    return Status::Ok();
  }
  if (phase_ == TrainerPhase::kUpdating) {
    ++part_;
    StartPart(t);
    return Status::Ok();
  }
  if (phase_ == TrainerPhase::kTraining) {
    ++step_;
    publishing_ = step_ % l_.sync_interval == 0 || step_ == w_.steps;
    const double cost = c_.train_step_s + c_.train_update_s + (publishing_ ? c_.publish_s : 0.0);
    out_.trainer_compute_s += cost;
    phase_ = TrainerPhase::kFinishing;
    Begin(TrainerActor(), t, cost);
    return Status::Ok();
  }
  if (phase_ == TrainerPhase::kFinishing) {
    // Published first, then acked.
    if (publishing_) {
      published_ = ++trainer_version_;
      fills_.emplace_back(t + c_.weight_fill_s, published_);
    }
    ++trained_steps_;
    WakeIdleEngines(t);
    out_.steps.back().end_s = t;
    if (step_ == w_.steps) {
      phase_ = TrainerPhase::kDone;
      out_.wall_s = t;
      Schedule(TrainerActor(), kNever);
      return Status::Ok();
    }
    phase_ = TrainerPhase::kWaitGroups;
    wait_start_ = t;
    return TrainerWake(t);
  }
  Schedule(TrainerActor(), kNever);
  return Status::Ok();
}

void Run::WorkerWake(size_t w, double t) {
  Worker& wk = workers_[w];
  if (wk.running) {
    wk.running = false;
    if (wk.lent) {
      --lent_running_;
      for (size_t e = 0; e < engines_.size(); ++e) {
        if (engines_[e].waits_for_lent && lent_running_ == 0) Poke(e, t + kLentReturnS);
      }
    }
  }
  if (phase_ == TrainerPhase::kTraining && next_micro_batch_ < micro_batches_.size()) {
    wk.lent = w >= static_cast<size_t>(l_.trainer_workers);
    if (wk.lent && !RolloutIdle()) {
      Schedule(WorkerActor(w), t + kLentPollS);
      return;
    }
    const std::vector<size_t>& mb = micro_batches_[next_micro_batch_++];
    double cost = 0;
    if (l_.unpadded_micro_batches) {
      // Samples packed end to end: each token attends only its own sample.
      double tokens = 0, squares = 0;
      for (size_t i : mb) {
        const auto n = static_cast<double>(sample_lengths_[i]);
        tokens += n, squares += n * n;
      }
      cost = c_.train_micro_batch_s + c_.train_token_s * tokens + c_.train_token_context_s * squares;
    } else {
      int64_t longest = 0;
      for (size_t i : mb) longest = std::max(longest, sample_lengths_[i]);
      cost = c_.MicroBatch(schedule::PaddedTokens(sample_lengths_, mb), longest);
    }
    cost *= share_;
    out_.trainer_compute_s += cost;
    if (wk.lent) ++lent_running_, ++out_.lent_micro_batches;
    wk.running = true;
    Begin(WorkerActor(w), t, cost);
    return;
  }
  Schedule(WorkerActor(w), kNever);
  // The step's last micro-batch done: the trainer goes on.
  const bool any_running = std::any_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.running; });
  if (phase_ == TrainerPhase::kTraining && next_micro_batch_ >= micro_batches_.size() && !any_running) {
    Poke(TrainerActor(), t);
  }
}

Result<SimResult> Run::Go() {
  schedule::IntakeOptions io;
  io.prompts_per_step = w_.prompts_per_step;
  io.group_size = w_.group_size;
  io.sync_interval = l_.sync_interval;
  io.max_staleness = l_.mode == Mode::kSync ? 0 : l_.mode == Mode::kOneStepOff ? 1 : l_.max_staleness;
  io.steps = w_.steps;
  io.engines = l_.rollout_engines;
  SLUICE_ASSIGN_OR_RETURN(intake_, schedule::PromptIntake::Create(io));
  engines_.resize(static_cast<size_t>(l_.rollout_engines));
  for (size_t e = 0; e < engines_.size(); ++e) {
    engines_[e].slots = l_.rollout_slots / l_.rollout_engines +
                        (static_cast<int64_t>(e) < l_.rollout_slots % l_.rollout_engines ? 1 : 0);
  }
  workers_.resize(static_cast<size_t>(l_.trainer_workers + l_.lent_workers));
  const size_t actors = engines_.size() + 2 + workers_.size();
  wake_.assign(actors, kNever);
  working_.assign(actors, false);
  remaining_.assign(actors, 0.0);
  since_.assign(actors, 0.0);
  began_.assign(actors, 0.0);
  const auto prompts = static_cast<size_t>(w_.steps * w_.prompts_per_step);
  rewarded_.assign(prompts, 0);
  cursor_staleness_base_.assign(prompts, 0.0);
  oldest_version_.assign(prompts, std::numeric_limits<PolicyVersion>::max());
  for (size_t e = 0; e < engines_.size(); ++e) Schedule(e, 0.0);
  Schedule(TrainerActor(), 0.0);
  for (int64_t n = 0; phase_ != TrainerPhase::kDone; ++n) {
    if (events_.empty() || n > kMaxEvents) {
      return Status::Internal("the simulation stopped making progress at step " + std::to_string(step_ + 1) + " of " +
                              std::to_string(w_.steps) + " (a bug in the simulator)");
    }
    const auto [t, seq, actor] = events_.top();
    events_.pop();
    if (wake_[actor] != t) continue;  // superseded
    wake_[actor] = kNever;
    if (working_[actor]) {
      if (shared_) {
        Settle(t);
      } else {
        remaining_[actor] = std::max(0.0, remaining_[actor] - (t - since_[actor]));
        since_[actor] = t;
      }
      // Woken early, its work goes on (what is left of a finish at `t` is
      // rounding, relative to the clock).
      if (remaining_[actor] > 1e-12 * std::max(1.0, t)) {
        Schedule(actor, t + remaining_[actor] * Slow(actor));
        continue;
      }
      End(actor, t);
    }
    if (actor < engines_.size()) {
      SLUICE_RETURN_IF_ERROR(EngineWake(actor, t));
    } else if (actor == RewardActor()) {
      RewardWake(t);
    } else if (actor == TrainerActor()) {
      SLUICE_RETURN_IF_ERROR(TrainerWake(t));
    } else {
      WorkerWake(actor - engines_.size() - 2, t);
    }
  }
  out_.occupancy = slot_steps_ > 0 ? active_rows_ / slot_steps_ : 0;
  double stale = 0;
  for (const StepTiming& s : out_.steps) stale += s.staleness_mean, out_.trainer_busy_s += s.end_s - s.start_s;
  out_.staleness_mean = out_.steps.empty() ? 0 : stale / static_cast<double>(out_.steps.size());
  return out_;
}

}  // namespace

Status Workload::Validate() const {
  auto bad = [](const std::string& what) { return Status::InvalidArgument("workload: " + what); };
  if (steps < 1) return bad("steps must be >= 1");
  if (prompts_per_step < 1) return bad("prompts_per_step must be >= 1");
  if (group_size < 1) return bad("group_size must be >= 1");
  const int64_t prompts = steps * prompts_per_step;
  if (prompt_tokens.size() != 1 && static_cast<int64_t>(prompt_tokens.size()) != prompts) {
    return bad("prompt_tokens has " + std::to_string(prompt_tokens.size()) +
               " entries; need 1 or steps x P = " + std::to_string(prompts));
  }
  if (static_cast<int64_t>(response_tokens.size()) != prompts * group_size) {
    return bad("response_tokens has " + std::to_string(response_tokens.size()) +
               " entries; need steps x P x G = " + std::to_string(prompts * group_size));
  }
  for (int32_t n : prompt_tokens) {
    if (n < 1) return bad("a prompt of " + std::to_string(n) + " tokens (need >= 1)");
  }
  for (int32_t n : response_tokens) {
    if (n < 1) return bad("an answer of " + std::to_string(n) + " tokens (need >= 1)");
  }
  return Status::Ok();
}

Status Layout::Validate() const {
  auto bad = [](const std::string& what) { return Status::InvalidArgument("layout: " + what); };
  if (max_staleness < 0) return bad("max_staleness must be >= 0");
  if (sync_interval < 1) return bad("sync_interval must be >= 1");
  if (rollout_engines < 1) return bad("rollout_engines must be >= 1");
  if (rollout_slots < rollout_engines) return bad("rollout_slots must be >= rollout_engines (a slot per engine)");
  if (trainer_workers < 1) return bad("trainer_workers must be >= 1");
  if (lent_workers < 0) return bad("lent_workers must be >= 0");
  if (mode == Mode::kSync && lent_workers > 0) return bad("sync mode lends no workers (its roles alternate)");
  if (micro_batch_tokens < 1) return bad("micro_batch_tokens must be >= 1");
  if (mini_batches < 1) return bad("mini_batches must be >= 1");
  if (kv_capacity_tokens < 0) return bad("kv_capacity_tokens must be >= 0 (0: unlimited)");
  if (max_steps_per_event < 1) return bad("max_steps_per_event must be >= 1");
  return Status::Ok();
}

Result<SimResult> Simulate(const Workload& workload, const Layout& layout, const CostProfile& costs) {
  SLUICE_RETURN_IF_ERROR(workload.Validate());
  SLUICE_RETURN_IF_ERROR(layout.Validate());
  SLUICE_RETURN_IF_ERROR(costs.Validate());
  for (int64_t c = 0; c < workload.steps * workload.prompts_per_step; ++c) {
    const int64_t p =
        workload.prompt_tokens.size() == 1 ? workload.prompt_tokens[0] : workload.prompt_tokens[static_cast<size_t>(c)];
    for (int64_t g = 0; g < workload.group_size; ++g) {
      const int64_t len = p + workload.response_tokens[static_cast<size_t>(c * workload.group_size + g)];
      if (layout.kv_capacity_tokens > 0 && len + 1 > layout.kv_capacity_tokens) {
        return Status::InvalidArgument("workload: answer " + std::to_string(c * workload.group_size + g) + " needs " +
                                       std::to_string(len + 1) + " tokens of KV cache with its prompt, over " +
                                       "kv_capacity_tokens " + std::to_string(layout.kv_capacity_tokens) +
                                       " (an engine's cache)");
      }
      if (len > layout.micro_batch_tokens) {
        return Status::InvalidArgument("workload: answer " + std::to_string(c * workload.group_size + g) + " has " +
                                       std::to_string(len) + " tokens with its prompt, over micro_batch_tokens " +
                                       std::to_string(layout.micro_batch_tokens));
      }
    }
  }
  Run run(workload, layout, costs);
  return run.Go();
}

}  // namespace sluice::simulate
