// The trainer: RL (GRPO / PPO) and supervised steps on a Transformer, with
// token-budget micro-batching and gradient accumulation, AdamW, gradient
// clipping and a learning-rate schedule. Optimizer state saves and loads as
// safetensors so a run resumes exactly.
//
// Thread safety: not thread-safe; one owner thread. The policy model is
// mutated by each step: callers must not run forwards on it concurrently
// (the sync loop generates only between steps).
#ifndef SLUICE_TRAINER_TRAINER_H_
#define SLUICE_TRAINER_TRAINER_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/host_tensor.h"
#include "sluice/common/ids.h"
#include "sluice/common/status.h"
#include "sluice/model/tokenizer.h"
#include "sluice/model/transformer.h"
#include "sluice/trainer/data_parallel.h"
#include "sluice/trainer/losses.h"
#include "sluice/trainer/types.h"

namespace sluice::trainer {

class Trainer {
 public:
  // `reference` is the frozen policy for the KL penalty; required iff
  // options.loss.kl_coef > 0. Errors: InvalidArgument for bad options.
  //
  // With a `data_parallel` group of N ranks, every rank creates its trainer
  // (a collective): the options and the model's shapes must agree across
  // the ranks (FailedPrecondition naming the ones that differ), and rank 0's
  // weights (policy and reference) are copied to the others. Every step is
  // then a collective too: each rank is given the same batch and trains its
  // shard of it (DataParallelShard); the others' samples are not read and
  // may be left empty.
  static Result<std::unique_ptr<Trainer>> Create(std::shared_ptr<model::Transformer> policy,
                                                 std::shared_ptr<model::Transformer> reference,
                                                 const TrainerOptions& options,
                                                 std::shared_ptr<DataParallelGroup> data_parallel = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One RL update on `samples` (advantages set): old logprobs recomputed
  // (if enabled), then ppo_epochs x mini_batches optimizer steps. Errors:
  // InvalidArgument for empty batches, empty prompts or responses, tokens
  // outside the vocabulary, mismatched per-token vectors; OutOfRange for a
  // sequence longer than micro_batch_tokens or the context (all checked before
  // any update; with data-parallel ranks each checks its shard, and the
  // others then fail with FailedPrecondition); Internal if libtorch fails
  // midway (gradients are cleared, the optimizer steps already taken stay
  // applied); with data-parallel ranks, FailedPrecondition when the ranks
  // disagree on the batch size or the optimizer step, Unavailable when a
  // collective fails (a rank died or timed out).
  Result<StepMetrics> RlStep(const std::vector<RolloutSample>& samples);

  // One optimizer step of cross-entropy on the targets (token mean); with
  // data-parallel ranks, each trains its shard as in RlStep.
  Result<StepMetrics> SftStep(const std::vector<SftExample>& examples);

  // log p(response token | prefix) under `model` with this trainer's
  // temperature, one vector per sample (no grad).
  Result<std::vector<std::vector<float>>> ResponseLogprobs(model::Transformer& model,
                                                           const std::vector<RolloutSample>& samples);

  // Optimizer state (moments) as named tensors, for checkpoints.
  // LoadOptimizerState checks every name and shape before copying any
  // (NotFound / InvalidArgument leave the state unchanged).
  TensorMap OptimizerState() const;
  Status LoadOptimizerState(const TensorMap& state, int64_t optimizer_steps);

  int64_t optimizer_steps() const { return optimizer_steps_; }
  double CurrentLr() const;
  const TrainerOptions& options() const { return options_; }
  // Changes micro_batch_threads, may_run and done_running between steps (a
  // pipeline lends the trainer cores while another role idles).
  // InvalidArgument outside 1..256.
  Status SetMicroBatchWorkers(int32_t threads, std::function<bool(int32_t)> may_run,
                              std::function<void(int32_t)> done_running = {});
  model::Transformer& policy() { return *policy_; }
  const std::shared_ptr<DataParallelGroup>& data_parallel() const { return data_parallel_; }
  // Gradient buckets summed over the ranks so far by overlapped sums
  // (overlap_gradient_sum), and how many of them were sent from a hook, while
  // a backward pass still ran (the rest went when the last pass returned, or
  // at the sum's end).
  struct GradientSums {
    int64_t buckets = 0;
    int64_t sent_during_backward = 0;
  };
  GradientSums gradient_sums() const { return gradient_sums_; }
  // With data-parallel ranks (a collective): every rank takes rank 0's
  // weights, reference weights, optimizer moments and step count (Create
  // does it once; again after rank 0 alone loaded a checkpoint).
  Status SyncFromRankZero();

 private:
  Trainer(std::shared_ptr<model::Transformer> policy, std::shared_ptr<model::Transformer> reference,
          const TrainerOptions& options, std::shared_ptr<DataParallelGroup> data_parallel);
  // The step's start on every rank: each says whether its shard packed and
  // what batch size and optimizer step it is at; any difference or refusal
  // fails the step on every rank (before any collective that could hang).
  Status AgreeOnStep(const Status& packed, size_t batch_size);
  // Sums `values` over the ranks (no-op on one).
  Status SumOverRanks(std::vector<double>& values);
  // The gradients summed over the ranks (every parameter's, zeros where a
  // rank had none): the sum begun by BeginGradientSum finished, or one sum
  // now. No other collective may come between the two (the ranks would
  // send them in different orders).
  Status SyncGradients();
  // Before a mini-batch's `micro_batches` backward passes on this rank: its
  // gradient buckets are sent as they become final (overlap_gradient_sum);
  // each pass calls BackwardDone after its backward(). No-op when off.
  Status BeginGradientSum(size_t micro_batches);
  void BackwardDone();
  struct Overlap;
  std::unique_ptr<Overlap> overlap_;  // null: no overlapped sums
  GradientSums gradient_sums_;
  uint64_t Fingerprint() const;
  struct Batch;
  Result<std::vector<Batch>> Pack(const std::vector<RolloutSample>& samples, const std::vector<size_t>& order) const;
  // fn(i, worker) for every micro-batch i < n: on the caller alone, or on
  // micro_batch_threads workers (see TrainerOptions). The first libtorch
  // error of any worker is rethrown on the caller after all have stopped.
  void ForEachMicroBatch(size_t n, const std::function<void(size_t, int32_t)>& fn);
  torch::Tensor TokenLogprobs(model::Transformer& model, const Batch& batch, torch::Tensor* logits_out);
  double OptimizerStep();  // clip, AdamW update, zero grads; returns the grad norm
  void ZeroGrads();        // and drops a gradient sum under way

  std::shared_ptr<model::Transformer> policy_;
  std::shared_ptr<model::Transformer> reference_;
  TrainerOptions options_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;  // by HF name
  std::map<std::string, torch::Tensor> exp_avg_, exp_avg_sq_;
  int64_t optimizer_steps_ = 0;
  std::shared_ptr<DataParallelGroup> data_parallel_;  // null: one process
};

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_TRAINER_H_
