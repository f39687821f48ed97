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

std::vector<tq::ColumnSchema> HubColumns() {
  return {{column::kPrompt, DType::kI32, {tq::kRaggedDim}},
          {column::kResponse, DType::kI32, {tq::kRaggedDim}},
          {column::kLogprobs, DType::kF32, {tq::kRaggedDim}},
          {column::kVersions, DType::kI64, {tq::kRaggedDim}},
          {column::kAnswerIndex, DType::kI32, {}},
          {column::kExample, DType::kI64, {}},
          {column::kReferenceAnswer, DType::kU8, {tq::kRaggedDim}},
          {column::kRow, DType::kU8, {tq::kRaggedDim}},
          {column::kTrajectory, DType::kU8, {tq::kRaggedDim}},
          {column::kReward, DType::kF32, {}},
          {column::kPublishedVersion, DType::kI64, {}}};
}

std::vector<std::string> HubTasks() { return {kRolloutTask, kRewardTask, kTrainTask, kProgressTask}; }

Status CreateHubPartitions(tq::TransferQueueClient& client, int64_t group_size) {
  SLUICE_RETURN_IF_ERROR(client.CreatePartition(kPromptPartition, 0, {kRolloutTask}));
  SLUICE_RETURN_IF_ERROR(
      client.CreatePartition(kRolloutPartition, static_cast<uint32_t>(group_size), {kRewardTask, kTrainTask}));
  return client.CreatePartition(kProgressPartition, 0, {kProgressTask});
}

std::string TrainerRecordKey(int64_t step) { return "trainer/step/" + std::to_string(step); }

Status WriteTrainerRecord(tq::TransferQueueClient& client, const TrainerRecord& r) {
  const std::string key = TrainerRecordKey(r.step);
  Status put = client.KvPutBatch(kProgressPartition, {key}, {}, EncodeRecord(PublishedVersionRecord{r.version}));
  if (put.code() != StatusCode::kAlreadyExists) return put;
  SLUICE_ASSIGN_OR_RETURN(const tq::KvValue there,
                          client.KvGet(kProgressPartition, key, RecordColumns<PublishedVersionRecord>()));
  SLUICE_ASSIGN_OR_RETURN(const PublishedVersionRecord recorded, DecodeRecord<PublishedVersionRecord>(there));
  const int64_t version = recorded.published_version;
  if (version != r.version) {
    return Status::DataLoss("the hub records step " + std::to_string(r.step) + " with version " +
                            std::to_string(version) + ", the trainer published " + std::to_string(r.version));
  }
  return Status::Ok();
}

Result<TrainerRecord> ReadTrainerRecord(tq::TransferQueueClient& client, const TrainerRecord& known) {
  TrainerRecord out = known;
  while (true) {
    Result<tq::KvValue> next =
        client.KvGet(kProgressPartition, TrainerRecordKey(out.step + 1), RecordColumns<PublishedVersionRecord>());
    if (!next.ok()) {
      if (next.status().code() == StatusCode::kNotFound) return out;  // not recorded yet
      return next.status();
    }
    SLUICE_ASSIGN_OR_RETURN(const PublishedVersionRecord recorded, DecodeRecord<PublishedVersionRecord>(*next));
    const int64_t version = recorded.published_version;
    if (version < out.version) {
      return Status::DataLoss("the trainer's record of step " + std::to_string(out.step + 1) + " says version " +
                              std::to_string(version) + ", after " + std::to_string(out.version));
    }
    out = {out.step + 1, version};
  }
}

}  // namespace sluice::pipeline
