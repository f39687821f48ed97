#include "hub_records.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include "run_state.h"
#include "sluice/common/file_util.h"
#include "sluice/common/logging.h"
#include "stream_roles.h"

namespace sluice::pipeline {

using std::chrono::milliseconds;

Result<const HostTensor*> Cell(const tq::BatchData& data, const char* column, size_t i) {
  auto it = data.columns.find(column);
  if (it == data.columns.end() || it->second.size() <= i) {
    return Status::DataLoss(std::string("the hub returned no '") + column + "' for row " + std::to_string(i));
  }
  return &it->second[i];
}

Status ReadAnswerTokens(const tq::BatchData& data, size_t i, trainer::RolloutSample* smp) {
  SLUICE_ASSIGN_OR_RETURN(const HostTensor* prompt, Cell(data, column::kPrompt, i));
  SLUICE_ASSIGN_OR_RETURN(smp->prompt, TensorVector<model::TokenId>(*prompt, DType::kI32, column::kPrompt));
  SLUICE_ASSIGN_OR_RETURN(const HostTensor* response, Cell(data, column::kResponse, i));
  SLUICE_ASSIGN_OR_RETURN(smp->response, TensorVector<model::TokenId>(*response, DType::kI32, column::kResponse));
  SLUICE_ASSIGN_OR_RETURN(const HostTensor* logprobs, Cell(data, column::kLogprobs, i));
  SLUICE_ASSIGN_OR_RETURN(smp->behavior_logprobs, TensorVector<float>(*logprobs, DType::kF32, column::kLogprobs));
  SLUICE_ASSIGN_OR_RETURN(const HostTensor* versions, Cell(data, column::kVersions, i));
  SLUICE_ASSIGN_OR_RETURN(smp->versions, TensorVector<PolicyVersion>(*versions, DType::kI64, column::kVersions));
  return Status::Ok();
}

std::string StepPlan::Encode() const {
  std::string out(kHeader + kEntry * entries.size(), '\0');
  char* p = out.data();
  auto put = [&p](const auto& v) {
    std::memcpy(p, &v, sizeof(v));
    p += sizeof(v);
  };
  std::memcpy(p, kMagic, 4);
  p += 4;
  put(step);
  put(static_cast<uint64_t>(entries.size()));
  for (const Entry& e : entries) put(e.row), put(e.id), put(e.group), put(e.reward);
  return out;
}

Result<StepPlan> StepPlan::Decode(const std::string& bytes, int64_t expected_step) {
  const std::string what = "the step plan of step " + std::to_string(expected_step) + " from trainer rank 0";
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, 4) != 0) {
    return Status::DataLoss(what + " is not a step plan (" + std::to_string(bytes.size()) + " bytes)");
  }
  const char* p = bytes.data() + 4;
  auto get = [&p](auto& v) {
    std::memcpy(&v, p, sizeof(v));
    p += sizeof(v);
  };
  StepPlan plan;
  uint64_t count = 0;
  get(plan.step);
  get(count);
  if (plan.step != expected_step) {
    return Status::DataLoss(what + " is for step " + std::to_string(plan.step));
  }
  if (count > (bytes.size() - kHeader) / kEntry || bytes.size() != kHeader + kEntry * count) {
    return Status::DataLoss(what + " says " + std::to_string(count) + " samples in " + std::to_string(bytes.size()) +
                            " bytes");
  }
  plan.entries.resize(count);
  for (Entry& e : plan.entries) get(e.row), get(e.id), get(e.group), get(e.reward);
  return plan;
}

std::string StepPlanKey(int64_t step) { return "step/" + std::to_string(step); }

Status RecordShard(const std::string& run_dir, int64_t step, int64_t rank, const std::vector<tq::RowId>& rows) {
  std::string line = "{\"step\":" + std::to_string(step) + ",\"rank\":" + std::to_string(rank) + ",\"rows\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i > 0) line += ',';
    line += std::to_string(rows[i]);
  }
  line += "]}\n";
  const std::string path =
      (std::filesystem::path(run_dir) / (kTrainedRowsPrefix + std::to_string(rank) + ".jsonl")).string();
  return AppendToFile(path, line).WithContext("the trainer's record of the rows it trains");
}

std::string AnswerKey(uint64_t c, int64_t g) { return "answer-" + std::to_string(c) + "-" + std::to_string(g); }

Status WriteAnswerOnce(tq::TransferQueueClient& client, const std::string& key, const std::string& column,
                       const std::function<Status()>& write, const std::function<bool()>& stopping,
                       const std::function<Status()>& keep_alive) {
  const auto start = Clock::now(), give_up = start + std::chrono::minutes(5);
  for (bool said = false;; said = true) {
    Status st = write();
    if (st.code() != StatusCode::kAlreadyExists) {
      if (said) {
        SLUICE_LOG(INFO) << "answer " << key << ": written after "
                         << std::chrono::duration<double>(Clock::now() - start).count() << " s";
      }
      return st;
    }
    Result<tq::KvValue> there = client.KvGet(kRolloutPartition, key, {column});
    if (there.ok()) return Status::Ok();  // written: it stands
    if (there.status().code() != StatusCode::kNotFound) return there.status();
    if (!said) {
      SLUICE_LOG(INFO) << "answer " << key << ": its " << column
                       << " is being written by another write (a dead process's?): waiting for it to commit or "
                          "for the hub to abort it";
    }
    if (stopping()) return Status::Aborted("the run was stopped");
    SLUICE_RETURN_IF_ERROR(keep_alive());
    if (Clock::now() >= give_up) {
      return Status::Timeout("answer " + key + ": its " + column + " is held by another write for 5 minutes (" +
                             st.message() + ")");
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
}

Result<HubDepths> ReadHubDepths(tq::TransferQueueClient& client) {
  SLUICE_ASSIGN_OR_RETURN(tq::ControllerStats stats, client.controller()->Stats());
  HubDepths out;
  int found = 0;
  for (const tq::TaskDepth& t : stats.tasks) {
    tq::TaskDepth* into = t.task == kRolloutTask  ? &out.rollout
                          : t.task == kRewardTask ? &out.reward
                          : t.task == kTrainTask  ? &out.train
                                                  : nullptr;
    if (into != nullptr) {
      *into = t;
      ++found;
    }
  }
  if (found != 3) return Status::FailedPrecondition("the hub lacks the run's tasks (rollout, reward, train)");
  return out;
}

bool AllScored(const HubDepths& depths, uint64_t prompts) {
  return depths.rollout.acked_total >= prompts && depths.reward.ready == 0 && depths.reward.leased == 0;
}

}  // namespace sluice::pipeline
