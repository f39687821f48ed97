// The pipeline's records in the hub, read and written by the roles: the
// hub's schema (partitions, tasks, columns), the trainer's progress
// records, the cells of the typed columns (checked against the type each column is
// written with), an answer's tokens as the trainer reads them, the answer
// keys and the write that may have been made already, the step plan trainer
// rank 0 hands the other ranks, each rank's record of the rows it trained,
// and the hub's three tasks as the roles watch them.
//
// Thread safety: pure functions and values.
#ifndef SLUICE_SRC_PIPELINE_HUB_RECORDS_H_
#define SLUICE_SRC_PIPELINE_HUB_RECORDS_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"
#include "sluice/model/tokenizer.h"
#include "sluice/trainer/types.h"
#include "sluice/transfer_queue/client.h"

namespace sluice::pipeline {

namespace tq = transfer_queue;

// The hub's schema: three partitions and three consuming tasks:
//   prompts   one row per prompt (group id = its cursor in the run's prompt
//             order; columns prompt, example, reference_answer), written by
//             the prompt feeder, consumed by the rollout
//   rollouts  one row per answer, G rows a group, consumed by reward and train
//   progress  the trainer's records (TrainerRecord), read by key: its task
//             ("progress") never takes them (a partition's rows count as
//             ready for each of its tasks, and a partition without any is
//             every task's)
inline constexpr char kPromptPartition[] = "prompts";
inline constexpr char kRolloutPartition[] = "rollouts";
inline constexpr char kProgressPartition[] = "progress";
inline constexpr char kRolloutTask[] = "rollout";
inline constexpr char kRewardTask[] = "reward";
inline constexpr char kTrainTask[] = "train";
inline constexpr char kProgressTask[] = "progress";
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
inline constexpr char kRow[] = "row";                           // U8 [bytes]: agent runs: the task's row, JSON
inline constexpr char kTrajectory[] = "trajectory";             // U8 [bytes]: agent runs: turns, end reason, ... (JSON)
inline constexpr char kReward[] = "reward";                     // F32 []: written by the reward role
inline constexpr char kPublishedVersion[] = "published_version";  // I64 []: a trainer record's
}  // namespace column

// The hub's columns with their types, as listed above, and its tasks.
std::vector<tq::ColumnSchema> HubColumns();
std::vector<std::string> HubTasks();
// Creates the three partitions, each with its consumers.
Status CreateHubPartitions(tq::TransferQueueClient& client, int64_t group_size);

template <typename T>
HostTensor VectorTensor(DType dtype, const std::vector<T>& v) {
  return HostTensor::Copy(dtype, {static_cast<int64_t>(v.size())}, v.data(), v.size() * sizeof(T));
}

// A cell read back with the type its column was written with (checked: the
// hub validates writes against the schema, so a mismatch is data loss).
template <typename T>
Result<std::vector<T>> TensorVector(const HostTensor& t, DType dtype, const char* column) {
  if (t.dtype != dtype || t.nbytes % sizeof(T) != 0) {
    return Status::DataLoss(std::string("hub column '") + column + "' holds " + std::string(DTypeName(t.dtype)) +
                            ", expected " + std::string(DTypeName(dtype)));
  }
  std::vector<T> v(t.nbytes / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.data, v.size() * sizeof(T));
  return v;
}

template <typename T>
Result<T> TensorScalar(const HostTensor& t, DType dtype, const char* column) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<T> v, TensorVector<T>(t, dtype, column));
  if (v.size() != 1) {
    return Status::DataLoss(std::string("hub column '") + column + "' holds " + std::to_string(v.size()) +
                            " values, expected one");
  }
  return v[0];
}

// The cell of `column` in row i of a batch (DataLoss if the hub left it out).
Result<const HostTensor*> Cell(const tq::BatchData& data, const char* column, size_t i);

// The pipeline's rows, typed. A record lists its columns once (Fields():
// each column's name and the member it fills); EncodeRecord and
// DecodeRecord turn it into the hub's cells and back, the cell type
// following the member's (int32_t I32, int64_t I64, float F32 as scalars
// `[]`; vectors of them and std::string's bytes (U8) ragged `[n]`), checked
// on the way back: a cell missing or of another type is DataLoss naming its
// column. The roles read and write the hub's rows only through these.
template <typename R, typename T>
struct RecordField {
  const char* column;
  T R::*member;
};

namespace record_detail {
template <typename T>
struct Element;
template <>
struct Element<int32_t> {
  static constexpr DType kDType = DType::kI32;
};
template <>
struct Element<int64_t> {
  static constexpr DType kDType = DType::kI64;
};
template <>
struct Element<float> {
  static constexpr DType kDType = DType::kF32;
};
template <typename T>
struct Cells {  // a scalar
  static constexpr DType kDType = Element<T>::kDType;
  static constexpr bool kRagged = false;
  static HostTensor Encode(const T& v) { return HostTensor::Copy(kDType, {}, &v, sizeof(v)); }
  static Result<T> Decode(const HostTensor& t, const char* column) { return TensorScalar<T>(t, kDType, column); }
};
template <typename E>
struct Cells<std::vector<E>> {
  static constexpr DType kDType = Element<E>::kDType;
  static constexpr bool kRagged = true;
  static HostTensor Encode(const std::vector<E>& v) { return VectorTensor(kDType, v); }
  static Result<std::vector<E>> Decode(const HostTensor& t, const char* column) {
    return TensorVector<E>(t, kDType, column);
  }
};
template <>
struct Cells<std::string> {
  static constexpr DType kDType = DType::kU8;
  static constexpr bool kRagged = true;
  static HostTensor Encode(const std::string& v) {
    return HostTensor::Copy(kDType, {static_cast<int64_t>(v.size())}, v.data(), v.size());
  }
  static Result<std::string> Decode(const HostTensor& t, const char* column) {
    SLUICE_ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, TensorVector<uint8_t>(t, kDType, column));
    return std::string(bytes.begin(), bytes.end());
  }
};
}  // namespace record_detail

// The record's columns (what a GetMeta or KvGet asks for to decode it).
template <typename R>
std::vector<std::string> RecordColumns() {
  std::vector<std::string> out;
  std::apply([&](const auto&... f) { (out.emplace_back(f.column), ...); }, R::Fields());
  return out;
}

// Appends one row's cells to `cols` (a batch of rows is appended in order).
template <typename R>
void AppendRecord(const R& r, tq::ColumnBatch* cols) {
  std::apply(
      [&](const auto&... f) {
        ((*cols)[f.column].push_back(
             record_detail::Cells<std::remove_cvref_t<decltype(r.*(f.member))>>::Encode(r.*(f.member))),
         ...);
      },
      R::Fields());
}

template <typename R>
tq::ColumnBatch EncodeRecord(const R& r) {
  tq::ColumnBatch cols;
  AppendRecord(r, &cols);
  return cols;
}

// The record of row i of `data`; or of a key's value (KvGet).
template <typename R>
Result<R> DecodeRecord(const tq::BatchData& data, size_t i) {
  R r;
  Status st;
  auto field = [&](const auto& f) {
    if (!st.ok()) return;
    using T = std::remove_cvref_t<decltype(r.*(f.member))>;
    Result<const HostTensor*> cell = Cell(data, f.column, i);
    if (!cell.ok()) {
      st = cell.status();
      return;
    }
    Result<T> v = record_detail::Cells<T>::Decode(**cell, f.column);
    if (!v.ok()) {
      st = v.status();
      return;
    }
    r.*(f.member) = std::move(*v);
  };
  std::apply([&](const auto&... f) { (field(f), ...); }, R::Fields());
  if (!st.ok()) return st;
  return r;
}
template <typename R>
Result<R> DecodeRecord(const tq::KvValue& value) {
  tq::BatchData one;
  for (const auto& [name, cell] : value.columns) one.columns[name].push_back(cell);
  return DecodeRecord<R>(one, 0);
}

// Whether each of the record's columns has, in `schema`, the type and rank
// its member gives it (InvalidArgument naming the first that does not).
template <typename R>
Status CheckRecordSchema(const std::vector<tq::ColumnSchema>& schema) {
  Status st;
  auto field = [&](const auto& f) {
    using C = record_detail::Cells<std::remove_cvref_t<decltype(std::declval<R&>().*(f.member))>>;
    if (!st.ok()) return;
    for (const tq::ColumnSchema& c : schema) {
      if (c.name != f.column) continue;
      if (c.dtype != C::kDType || (c.shape.size() == 1) != C::kRagged || c.shape.size() > 1) {
        st =
            Status::InvalidArgument(std::string("hub column '") + f.column + "' is " + std::string(DTypeName(c.dtype)) +
                                    " " + ShapeToString(c.shape) + " in the schema, the record writes " +
                                    std::string(DTypeName(C::kDType)) + (C::kRagged ? " [n]" : " []"));
      }
      return;
    }
    st = Status::InvalidArgument(std::string("hub column '") + f.column + "' is not in the schema");
  };
  std::apply([&](const auto&... f) { (field(f), ...); }, R::Fields());
  return st;
}

// A prompt row (partition prompts; its group id tag is the prompt's cursor
// in the run's prompt order): written by the prompt feeder, taken by the rollout.
struct PromptRecord {
  std::vector<model::TokenId> prompt;
  int64_t example = 0;           // index in the task's train split
  std::string reference_answer;  // what the reward compares with
  std::string row;               // agent runs: the environment's reset argument (AgentRow); else empty
  static constexpr auto Fields() {
    return std::make_tuple(
        RecordField<PromptRecord, std::vector<model::TokenId>>{column::kPrompt, &PromptRecord::prompt},
        RecordField<PromptRecord, int64_t>{column::kExample, &PromptRecord::example},
        RecordField<PromptRecord, std::string>{column::kReferenceAnswer, &PromptRecord::reference_answer},
        RecordField<PromptRecord, std::string>{column::kRow, &PromptRecord::row});
  }
};

// An answer row (partition rollouts, keyed AnswerKey; tags: group id = the
// prompt's cursor, policy version of its first token, token length) as the
// rollout writes it: the prompt's fields travel with it so the reward needs
// no lookup.
struct AnswerRecord {
  std::vector<model::TokenId> prompt;
  std::vector<model::TokenId> response;
  std::vector<float> logprobs;  // behaviour logprob per token
  // The policy version that sampled each token; -1 for a token the model
  // did not sample (an environment's, in an agent trajectory): not trained.
  std::vector<PolicyVersion> versions;
  int32_t answer_index = 0;  // which of the group's G answers
  int64_t example = 0;
  std::string reference_answer;
  std::string trajectory;  // agent runs: AgentAnswer's JSON; else empty
  static constexpr auto Fields() {
    using A = AnswerRecord;
    return std::make_tuple(RecordField<A, std::vector<model::TokenId>>{column::kPrompt, &A::prompt},
                           RecordField<A, std::vector<model::TokenId>>{column::kResponse, &A::response},
                           RecordField<A, std::vector<float>>{column::kLogprobs, &A::logprobs},
                           RecordField<A, std::vector<PolicyVersion>>{column::kVersions, &A::versions},
                           RecordField<A, int32_t>{column::kAnswerIndex, &A::answer_index},
                           RecordField<A, int64_t>{column::kExample, &A::example},
                           RecordField<A, std::string>{column::kReferenceAnswer, &A::reference_answer},
                           RecordField<A, std::string>{column::kTrajectory, &A::trajectory});
  }
};

// What the reward role reads of an answer, and the reward it writes next to it.
struct AnswerToScore {
  std::vector<model::TokenId> response;
  int32_t answer_index = 0;
  int64_t example = 0;
  std::string reference_answer;
  std::string trajectory;
  static constexpr auto Fields() {
    using A = AnswerToScore;
    return std::make_tuple(RecordField<A, std::vector<model::TokenId>>{column::kResponse, &A::response},
                           RecordField<A, int32_t>{column::kAnswerIndex, &A::answer_index},
                           RecordField<A, int64_t>{column::kExample, &A::example},
                           RecordField<A, std::string>{column::kReferenceAnswer, &A::reference_answer},
                           RecordField<A, std::string>{column::kTrajectory, &A::trajectory});
  }
};
struct RewardRecord {
  float reward = 0;
  static constexpr auto Fields() {
    return std::make_tuple(RecordField<RewardRecord, float>{column::kReward, &RewardRecord::reward});
  }
};

// What a trainer rank reads of an answer to train it: its tokens (every
// rank, its shard) and, on rank 0, which answer it is and its reward.
struct AnswerTokens {
  std::vector<model::TokenId> prompt;
  std::vector<model::TokenId> response;
  std::vector<float> logprobs;
  std::vector<PolicyVersion> versions;
  static constexpr auto Fields() {
    using A = AnswerTokens;
    return std::make_tuple(RecordField<A, std::vector<model::TokenId>>{column::kPrompt, &A::prompt},
                           RecordField<A, std::vector<model::TokenId>>{column::kResponse, &A::response},
                           RecordField<A, std::vector<float>>{column::kLogprobs, &A::logprobs},
                           RecordField<A, std::vector<PolicyVersion>>{column::kVersions, &A::versions});
  }
};
struct AnswerToTrain {
  std::vector<model::TokenId> prompt;
  std::vector<model::TokenId> response;
  std::vector<float> logprobs;
  std::vector<PolicyVersion> versions;
  int32_t answer_index = 0;
  float reward = 0;
  std::string trajectory;
  static constexpr auto Fields() {
    using A = AnswerToTrain;
    return std::make_tuple(RecordField<A, std::vector<model::TokenId>>{column::kPrompt, &A::prompt},
                           RecordField<A, std::vector<model::TokenId>>{column::kResponse, &A::response},
                           RecordField<A, std::vector<float>>{column::kLogprobs, &A::logprobs},
                           RecordField<A, std::vector<PolicyVersion>>{column::kVersions, &A::versions},
                           RecordField<A, int32_t>{column::kAnswerIndex, &A::answer_index},
                           RecordField<A, float>{column::kReward, &A::reward},
                           RecordField<A, std::string>{column::kTrajectory, &A::trajectory});
  }
};

// A trainer record's value (partition progress, key TrainerRecordKey).
struct PublishedVersionRecord {
  PolicyVersion published_version = 0;
  static constexpr auto Fields() {
    return std::make_tuple(RecordField<PublishedVersionRecord, PolicyVersion>{
        column::kPublishedVersion, &PublishedVersionRecord::published_version});
  }
};

// A record's tokens into a training sample (its prompt, response, behaviour
// logprobs and per-token versions).
template <typename A>
void MoveAnswerTokens(A&& a, trainer::RolloutSample* smp) {
  smp->prompt = std::move(a.prompt);
  smp->response = std::move(a.response);
  smp->behavior_logprobs = std::move(a.logprobs);
  smp->versions = std::move(a.versions);
}

// pipeline.trainer_ranks > 1: what rank 0 tells the other ranks of a step,
// through the ranks' rendezvous store under StepPlanKey(step): the samples
// to train, in order, each as the hub row holding it, its sample and group
// ids and its reward (for the group advantages, which every rank computes
// from all the step's rewards). Each rank reads only its shard's rows from
// the hub. Little-endian: "SLP1", step i64, count u64, then per sample row
// u64, id u64, group i64, reward f64.
struct StepPlan {
  struct Entry {
    tq::RowId row = 0;
    uint64_t id = 0;
    int64_t group = 0;
    double reward = 0;
  };
  int64_t step = 0;
  std::vector<Entry> entries;

  static constexpr char kMagic[4] = {'S', 'L', 'P', '1'};
  static constexpr size_t kHeader = 4 + 8 + 8, kEntry = 8 + 8 + 8 + 8;

  std::string Encode() const;
  // DataLoss naming what is wrong for bytes that are not the plan of `step`.
  static Result<StepPlan> Decode(const std::string& bytes, int64_t expected_step);
};

std::string StepPlanKey(int64_t step);

// Before a trainer rank trains a step: the hub rows of its shard of the
// step's samples, a line {"step":S,"rank":R,"rows":[...]} appended to
// <run.dir>/trained_rows-rank<R>.jsonl (kTrainedRowsPrefix). Written before
// training, so every step that survives into a checkpoint has every rank's
// line; a step trained again after a restart has a later line.
// tests/ack_ledger_check.py checks each rank's rows against the hub's ack log.
Status RecordShard(const std::string& run_dir, int64_t step, int64_t rank, const std::vector<tq::RowId>& rows);

// The hub key of answer g of prompt c (rollout rows are keyed, so an answer
// is in the hub once however many times its prompt is generated).
std::string AnswerKey(uint64_t c, int64_t g);

// A write of `column` (and others) for the answer `key` that may have been
// made already, by a process that died before its ack. AlreadyExists is
// done only once the hub has the column committed: a dead writer's write
// still open holds the cells until the hub aborts it (its
// open_write_timeout, 10 s for the pipeline's: stream_launch.cc), and then the
// write is tried again; `keep_alive` runs meanwhile (renew leases).
Status WriteAnswerOnce(tq::TransferQueueClient& client, const std::string& key, const std::string& column,
                       const std::function<Status()>& write, const std::function<bool()>& stopping,
                       const std::function<Status()>& keep_alive);

// The hub's three tasks as it sees them now (one Stats call): for the
// trainer, the rows it has acked (its progress: whole groups, each after the
// update that trained it) and whether it is blocked waiting for rows (its
// demand); for the rollout and reward, what their workers took and finished.
struct HubDepths {
  tq::TaskDepth rollout, reward, train;
};
Result<HubDepths> ReadHubDepths(tq::TransferQueueClient& client);

// Every answer of the run's `prompts` (counted from its start) is scored:
// every prompt's answers are written (none come after) and none waits to be
// scored. (Not a count of rewards: an answer generated again after its
// prompt was trained is scored too.)
bool AllScored(const HubDepths& depths, uint64_t prompts);

// The trainer's progress, recorded in the hub for the rollout's admission on
// every host: after the update of step S is applied and published (when S
// publishes a version) and before S's groups are acked, trainer rank 0 (for
// pipeline.trainer_command, the launcher: that command's acks are its
// progress) writes the key TrainerRecordKey(S) with the newest version
// published, once. Steps are recorded in order, every one from the run's
// start.
struct TrainerRecord {
  int64_t step = 0;           // steps trained (the run's, counted from 0)
  PolicyVersion version = 0;  // the newest version published by then
};
std::string TrainerRecordKey(int64_t step);
// Writes `r` (a record there already, from the same trainer, stands: OK if
// it says the same, DataLoss if not).
Status WriteTrainerRecord(tq::TransferQueueClient& client, const TrainerRecord& r);
// The newest record after `known` (the attempt's start step with version
// 0, or what the caller read last): the steps after it, in order, up to the
// first not recorded yet; `known` when none is. DataLoss for a record whose
// version is below the one before it.
Result<TrainerRecord> ReadTrainerRecord(tq::TransferQueueClient& client, const TrainerRecord& known);

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_HUB_RECORDS_H_
