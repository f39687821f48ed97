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
#include "sluice/trainer/losses.h"

namespace sluice::trainer {

using model::TokenId;

// One response to one prompt, as rollout and reward produced it.
struct RolloutSample {
  uint64_t id = 0;
  GroupId group_id = 0;  // samples of one prompt share it (GRPO group)
  std::vector<TokenId> prompt;
  std::vector<TokenId> response;
  std::vector<float> behavior_logprobs;  // one per response token
  std::vector<PolicyVersion> versions;   // policy version per response token
  double reward = 0;
  double advantage = 0;  // set by the caller (GroupAdvantages)
};

// A supervised example: the loss is cross-entropy on `target` given `prompt`.
struct SftExample {
  std::vector<TokenId> prompt;
  std::vector<TokenId> target;
};

struct OptimizerOptions {
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;   // decoupled (AdamW)
  double max_grad_norm = 1.0;  // <= 0: no clipping
  int64_t warmup_steps = 0;    // linear warm-up from 0
  int64_t decay_steps = 0;     // cosine decay to min_lr_ratio * lr over this many steps after warm-up (0: constant)
  double min_lr_ratio = 0.1;
};

struct TrainerOptions {
  OptimizerOptions optimizer;
  PolicyLossOptions loss;
  int64_t micro_batch_tokens = 8192;   // padded tokens per forward/backward (>= the longest sequence)
  int64_t mini_batches = 1;            // optimizer steps per RL batch (per epoch)
  int64_t ppo_epochs = 1;              // passes over the RL batch
  bool recompute_old_logprobs = true;  // else the behaviour logprobs serve as the proximal policy
  float temperature = 1.0f;            // logits / temperature, as rollout sampled
  int32_t pad_token = 0;               // any id in the vocabulary: padding is masked
  // Threads computing micro-batches at once (data parallel inside the step:
  // each runs libtorch with one intra-op thread and gradients accumulate into
  // the shared model). Two one-thread workers train ~2x one thread, where
  // two intra-op threads give 1.2-1.6x. 1: micro-batches one after another
  // on the caller's thread, bit-for-bit deterministic; > 1 splits the batch
  // into micro-batches of micro_batch_tokens / threads so each has work, and
  // the order gradients are summed in (so the last bits) varies.
  int32_t micro_batch_threads = 1;
  // With micro_batch_threads > 1: worker w > 0 takes the next micro-batch
  // only while may_run(w) is true (worker 0, the caller, always runs), and
  // calls done_running(w) (if set) when that micro-batch is finished. Lets a
  // pipeline lend the trainer a core only while its owner is idle, and the
  // owner wait until its core is handed back. Unset: every worker always runs.
  std::function<bool(int32_t worker)> may_run;
  std::function<void(int32_t worker)> done_running;

  Status Validate() const;
};

struct StepMetrics {
  double loss = 0, pg_loss = 0, kl = 0, entropy = 0, clip_frac = 0, ratio_mean = 0;
  double grad_norm = 0, lr = 0;
  // Off-policy correction (0 when off): mean behaviour weight pi_prox/pi_behav
  // and the fraction of tokens whose weight was capped or masked.
  double is_weight_mean = 0, is_capped_frac = 0;
  int64_t tokens = 0, sequences = 0, micro_batches = 0, optimizer_steps = 0;
};

class Trainer {
 public:
  // `reference` is the frozen policy for the KL penalty; required iff
  // options.loss.kl_coef > 0. Errors: InvalidArgument for bad options.
  static Result<std::unique_ptr<Trainer>> Create(std::shared_ptr<model::Transformer> policy,
                                                 std::shared_ptr<model::Transformer> reference,
                                                 const TrainerOptions& options);

  // One RL update on `samples` (advantages set): old logprobs recomputed
  // (if enabled), then ppo_epochs x mini_batches optimizer steps. Errors:
  // InvalidArgument for empty batches, empty prompts or responses, tokens
  // outside the vocabulary, mismatched per-token vectors; OutOfRange for a
  // sequence longer than micro_batch_tokens or the context (all checked before
  // any update); Internal if libtorch fails midway (gradients are cleared, the
  // optimizer steps already taken stay applied).
  Result<StepMetrics> RlStep(const std::vector<RolloutSample>& samples);

  // One optimizer step of cross-entropy on the targets (token mean).
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

 private:
  Trainer(std::shared_ptr<model::Transformer> policy, std::shared_ptr<model::Transformer> reference,
          const TrainerOptions& options);
  struct Batch;
  Result<std::vector<Batch>> Pack(const std::vector<RolloutSample>& samples, const std::vector<size_t>& order) const;
  // fn(i, worker) for every micro-batch i < n: on the caller alone, or on
  // micro_batch_threads workers (see TrainerOptions). The first libtorch
  // error of any worker is rethrown on the caller after all have stopped.
  void ForEachMicroBatch(size_t n, const std::function<void(size_t, int32_t)>& fn);
  torch::Tensor TokenLogprobs(model::Transformer& model, const Batch& batch, torch::Tensor* logits_out);
  double OptimizerStep();  // clip, AdamW update, zero grads; returns the grad norm
  void ZeroGrads();

  std::shared_ptr<model::Transformer> policy_;
  std::shared_ptr<model::Transformer> reference_;
  TrainerOptions options_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;  // by HF name
  std::map<std::string, torch::Tensor> exp_avg_, exp_avg_sq_;
  int64_t optimizer_steps_ = 0;
};

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_TRAINER_H_
