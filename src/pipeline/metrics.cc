#include "sluice/pipeline/metrics.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace sluice::pipeline {

using nlohmann::json;

namespace {

nlohmann::json MetricsJson(const trainer::StepMetrics& m) {
  return {{"loss", m.loss},
          {"pg_loss", m.pg_loss},
          {"kl", m.kl},
          {"entropy", m.entropy},
          {"clip_frac", m.clip_frac},
          {"ratio_mean", m.ratio_mean},
          {"grad_norm", m.grad_norm},
          {"lr", m.lr},
          {"train_tokens", m.tokens},
          {"is_weight_mean", m.is_weight_mean},
          {"is_capped_frac", m.is_capped_frac},
          {"rollout_logprob_gap_mean", m.rollout_logprob_gap_mean},
          {"rollout_logprob_gap_max", m.rollout_logprob_gap_max}};
}

}  // namespace

std::string StepRecord::ToJson() const {
  json j = {{"step", step},
            {"reward_mean", reward_mean},
            {"accuracy", accuracy},
            {"response_len_mean", response_len_mean},
            {"response_len_max", response_len_max},
            {"groups_kept", groups_kept},
            {"samples_trained", samples_trained},
            {"generated_tokens", generated_tokens},
            {"gen_seconds", gen_seconds},
            {"train_seconds", train_seconds},
            {"elapsed_seconds", elapsed_seconds}};
  j.update(MetricsJson(train));
  j.update({{"version", version},
            {"staleness_mean", staleness_mean},
            {"staleness_max", staleness_max},
            {"token_staleness_mean", token_staleness_mean},
            {"wait_seconds", wait_seconds},
            {"queue_ready", queue_ready}});
  if (duplicate_groups > 0) j["duplicate_groups"] = duplicate_groups;
  if (reward_errors > 0) j["reward_errors"] = reward_errors;
  if (!prompts.empty()) j["prompts"] = prompts;
  if (!rank_train_seconds.empty()) {
    j.update({{"rank_train_seconds", rank_train_seconds},
              {"rank_collective_seconds", rank_collective_seconds},
              {"rank_tokens", rank_tokens}});
  }
  if (!replica_tokens.empty()) j.update({{"replica_tokens", replica_tokens}, {"replica_busy", replica_busy}});
  if (!staleness_hist.empty()) {
    j.update({{"rollout_tokens", rollout_tokens},
              {"rollout_busy", rollout_busy},
              {"trainer_busy", trainer_busy},
              {"staleness_hist", staleness_hist}});
  }
  if (agent) {
    j.update({{"agent_turns_mean", agent_turns_mean},
              {"agent_tool_calls_mean", agent_tool_calls_mean},
              {"agent_tool_use", agent_tool_use},
              {"agent_malformed_calls", agent_malformed_calls},
              {"agent_end_reasons", agent_end_reasons}});
  }
  if (has_eval) {
    j["eval_accuracy"] = eval.accuracy;
    j["eval_reward"] = eval.mean_reward;
    j["eval_response_len"] = eval.mean_length;
    if (eval.sampled_accuracy >= 0) j["eval_sampled_accuracy"] = eval.sampled_accuracy;
    if (eval.reward_errors > 0) j["eval_reward_errors"] = eval.reward_errors;
    if (eval.tool_use >= 0) j["eval_tool_use"] = eval.tool_use;
  }
  return j.dump();
}

std::string EvalResult::DifficultySummary() const {
  std::string out;
  for (const auto& [difficulty, bucket] : by_difficulty) {
    if (difficulty <= 0 || bucket.total == 0) continue;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s%d:%.0f%%(%lld)", out.empty() ? "" : " ", difficulty,
                  100.0 * static_cast<double>(bucket.correct) / static_cast<double>(bucket.total),
                  static_cast<long long>(bucket.total));
    out += buf;
  }
  return out;
}

}  // namespace sluice::pipeline
