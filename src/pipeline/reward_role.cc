// The reward role (reward_role.h).
#include "sluice/pipeline/reward_role.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "hub_records.h"
#include "role_support.h"
#include "sluice/agent/trajectory.h"
#include "sluice/common/logging.h"
#include "sluice/common/trace.h"
#include "sluice/model/tokenizer.h"
#include "sluice/reward/task.h"
#include "sluice/transfer_queue/client.h"

namespace sluice::pipeline {

RewardRole::Options RewardRole::Options::From(const RunOptions& run, int64_t start_step) {
  Options o;
  o.prompts = static_cast<uint64_t>(std::max<int64_t>(0, run.rl.steps - start_step) * run.rl.prompts_per_step);
  o.lease_seconds = run.pipeline.worker_lease_seconds;
  return o;
}

RewardRole::RewardRole(Options options, Wiring wiring) : o_(std::move(options)), w_(std::move(wiring)) {}

Status RewardRole::ScoreLoop(int loop) {
  tq::TransferQueueClient& hub = *w_.hub;
  RunHealth& health = *w_.health;
  const reward::Task& task = *w_.task;
  const auto lease = std::chrono::seconds(o_.lease_seconds);
  TraceThisThread(PipelineRole::kReward, o_.process + "scorer " + std::to_string(loop));
  tq::GetMetaRequest take;
  take.task = kRewardTask;
  take.columns = RecordColumns<AnswerToScore>();
  take.n = 1;
  take.partition = kRolloutPartition;
  take.timeout = kHubPoll;
  take.lease_timeout = lease;
  take.holder = o_.lease_holder;
  while (!all_scored_.load() && !stopping_() && !health.StopRequested() && !failed_.load()) {
    health.Beat(o_.slot);
    // What it scores comes from the hub: the answer, and the reference answer
    // the rollout wrote next to it (no lookup in the dataset).
    Result<tq::BatchMeta> meta = Status::Internal("not taken");
    {
      // Mostly waiting for answers: a span only when one came.
      const int64_t t0 = TraceNowUs();
      RoleDoing doing(health, o_.slot, RoleActivity::kTakeAnswer, /*traced=*/false);
      meta = hub.GetMeta(take);
      if (meta.ok()) {
        TraceRecorder::Global().Complete(RoleActivityName(RoleActivity::kTakeAnswer), "reward", t0, TraceNowUs());
      }
    }
    if (!meta.ok()) {
      if (meta.status().code() != StatusCode::kTimeout) return meta.status();
      // Every answer of the run is scored: by this process's loops, or
      // (reward workers, a restarted worker) by others, as the hub says.
      SLUICE_ASSIGN_OR_RETURN(const HubDepths depths, ReadHubDepths(hub));
      if (AllScored(depths, o_.prompts)) all_scored_.store(true);
      continue;
    }
    SLUICE_ASSIGN_OR_RETURN(std::optional<tq::BatchData> read, ReadLeasedRows(hub, *meta, lease, "reward"));
    if (!read) continue;
    SLUICE_ASSIGN_OR_RETURN(const AnswerToScore answer, DecodeRecord<AnswerToScore>(*read, 0));
    // Score sees the whole example, as in the direct loop and the evaluator
    // (its prompt, and whatever else the task's Score reads), from this
    // process's task by the index the hub carries; the reference answer the
    // hub carries must be that example's (else the prompt feeder's task is
    // not this worker's).
    if (answer.example < 0)
      return Status::DataLoss("reward: the hub's example index " + std::to_string(answer.example) + " is negative");
    SLUICE_ASSIGN_OR_RETURN(reward::Example ex, task.Get(reward::Split::kTrain, static_cast<uint64_t>(answer.example)));
    if (ex.answer != answer.reference_answer) {
      return Status::DataLoss("reward: training example " + std::to_string(answer.example) +
                              " has another reference answer in this worker's task than the prompt feeder wrote "
                              "to the hub: both must load the same task");
    }
    // An agent trajectory: the environment's reward when it gave one, else
    // the task's on the model's last turn.
    std::optional<agent::TrajectorySummary> agent_score;
    if (!answer.trajectory.empty()) {
      SLUICE_ASSIGN_OR_RETURN(agent_score, agent::ReadTrajectorySummary(answer.trajectory));
    }
    const std::string text = agent_score ? agent_score->content : model::DecodeKnown(*w_.tokenizer, answer.response);
    RewardRecord scored;
    if (agent_score && agent_score->env_reward) {
      scored.reward = static_cast<float>(*agent_score->env_reward);
    } else {
      RoleDoing doing(health, o_.slot, RoleActivity::kScore);
      scored.reward = static_cast<float>(task.Score(ex, text));
    }
    // This process's new score errors onto the run health (which reward
    // workers share), each once: the count only grows, loops finish out of order.
    const int64_t errors = static_cast<int64_t>(task.score_errors());
    for (int64_t shown = errors_shown_.load(); shown < errors;) {
      if (errors_shown_.compare_exchange_weak(shown, errors)) {
        health.AddRewardErrors(errors - shown);
        break;
      }
    }
    const tq::ColumnBatch cols = EncodeRecord(scored);
    RoleDoing doing(health, o_.slot, RoleActivity::kWriteReward);
    // An answer whose reward is written already: a worker that died before
    // its ack scored it (its lease ran out); the reward stands.
    auto renew_at = Clock::now() + lease / 3;
    SLUICE_RETURN_IF_ERROR(WriteAnswerOnce(
        hub, AnswerKey(static_cast<uint64_t>(meta->rows[0].tags.group_id), answer.answer_index), column::kReward,
        [&] { return hub.PutColumns(meta->row_ids(), cols); }, [&] { return stopping_() || health.StopRequested(); },
        [&]() -> Status {
          if (Clock::now() < renew_at) return Status::Ok();
          renew_at = Clock::now() + lease / 3;
          Result<tq::RenewResponse> renewed = hub.Renew(meta->lease_id, lease);
          return renewed.ok() || renewed.status().code() == StatusCode::kFailedPrecondition ? Status::Ok()
                                                                                            : renewed.status();
        }));
    // A lease that ran out meanwhile (a pause longer than it): the answer
    // went back to the stream, and whoever scores it finds the reward.
    if (Result<tq::AckResponse> acked = hub.Ack(meta->lease_id); !acked.ok()) {
      if (acked.status().code() != StatusCode::kFailedPrecondition) return acked.status();
      SLUICE_LOG(WARNING) << "reward: " << acked.status().message();
    }
  }
  return Status::Ok();
}

Status RewardRole::Run(const std::function<bool()>& stopping) {
  if (!w_.task || !w_.tokenizer || w_.hub == nullptr || w_.health == nullptr) {
    return Status::InvalidArgument("the reward role needs its task, tokenizer, hub and health");
  }
  stopping_ = stopping;
  // One loop per answer the task scores at once (reward.python: its
  // workers); each leases one answer at a time.
  const int loops = std::max(1, w_.task->max_parallel_scores());
  return RunLoops(
      loops, [this](int i) { return ScoreLoop(i); }, &failed_);
}

}  // namespace sluice::pipeline
