#include "sluice/trainer/trainer.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "sluice/common/check.h"
#include "sluice/common/logging.h"
#include "sluice/common/random.h"
#include "sluice/model/weights.h"
#include "sluice/schedule/packing.h"

namespace sluice::trainer {

Status TrainerOptions::Validate() const {
  const OptimizerOptions& o = optimizer;
  if (!(o.lr >= 0)) return Status::InvalidArgument("trainer lr must be >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) {
    return Status::InvalidArgument("trainer betas must be in [0, 1)");
  }
  if (!(o.eps > 0)) return Status::InvalidArgument("trainer eps must be > 0");
  if (o.warmup_steps < 0 || o.decay_steps < 0) return Status::InvalidArgument("warm-up and decay steps must be >= 0");
  if (micro_batch_tokens < 1) return Status::InvalidArgument("micro_batch_tokens must be >= 1");
  if (micro_batch_threads < 1 || micro_batch_threads > 256) {
    return Status::InvalidArgument("micro_batch_threads must be in 1..256");
  }
  if (mini_batches < 1) return Status::InvalidArgument("mini_batches must be >= 1");
  if (ppo_epochs < 1) return Status::InvalidArgument("ppo_epochs must be >= 1");
  if (!(temperature > 0)) return Status::InvalidArgument("trainer temperature must be > 0");
  if (!(loss.clip_low >= 0 && loss.clip_low < 1) || !(loss.clip_high >= 0)) {
    return Status::InvalidArgument("clip ratios must satisfy 0 <= clip_low < 1 and clip_high >= 0");
  }
  if (!(loss.kl_coef >= 0)) return Status::InvalidArgument("kl_coef must be >= 0");
  if (!(loss.is_cap > 0)) return Status::InvalidArgument("is_cap must be > 0");
  if (loss.correction != OffPolicyCorrection::kNone && loss.correction != OffPolicyCorrection::kBehavior &&
      !recompute_old_logprobs) {
    // Without a recomputed proximal policy, pi_prox is the behaviour policy
    // and every behaviour weight is exactly 1: the correction would be a no-op.
    return Status::InvalidArgument(
        "trainer.off_policy_correction " + OffPolicyCorrectionName(loss.correction) +
        " needs trainer.recompute_old_logprobs=true (without it the correction does nothing)");
  }
  return Status::Ok();
}

// A right-padded micro-batch. Per-token tensors are [B, L-1]: position j holds
// what predicts token j + 1.
struct Trainer::Batch {
  torch::Tensor tokens;  // [B, L] int64
  torch::Tensor mask;    // 1 where token j + 1 is a response token
  torch::Tensor advantages;
  torch::Tensor behavior;
  torch::Tensor old_logprobs, ref_logprobs;
  std::vector<size_t> samples;
  std::vector<int64_t> prompt_len, response_len;
  int64_t sequences() const { return static_cast<int64_t>(samples.size()); }
};

Trainer::Trainer(std::shared_ptr<model::Transformer> policy, std::shared_ptr<model::Transformer> reference,
                 const TrainerOptions& options, std::shared_ptr<DataParallelGroup> data_parallel)
    : policy_(std::move(policy)),
      reference_(std::move(reference)),
      options_(options),
      data_parallel_(std::move(data_parallel)) {
  for (auto& p : policy_->named_parameters()) {
    params_.emplace_back(p.key(), p.value());
    exp_avg_[p.key()] = torch::zeros_like(p.value());
    exp_avg_sq_[p.key()] = torch::zeros_like(p.value());
  }
}

namespace {

// The parameter whose hook fired last on this thread in the current pass.
struct LastHooked {
  const void* overlap = nullptr;
  uint64_t generation = 0;
  int64_t param = -1;
};
thread_local LastHooked t_last_hooked;
std::atomic<uint64_t> g_mini_batches{0};  // numbers the overlapped sums of every trainer

}  // namespace

// Gradient buckets sent while the backward passes run. libtorch 1.13's
// stable API has no hook after a parameter's gradient is accumulated (PyTorch 2.1
// added one to its Python API), only before: a leaf's hook runs just before its AccumulateGrad
// node, on the thread running that backward pass (on CPU, the caller's), and
// that thread runs one node at a time. So when a hook fires, the parameter
// whose hook fired last on the same thread is accumulated; the pass's last
// is accumulated once backward() returns (BackwardDone). A parameter is
// final when every pass of the mini-batch has accumulated into it.
struct Trainer::Overlap {
  std::vector<torch::Tensor> params;  // the sum's order: the model's last parameters first
  std::vector<std::pair<torch::Tensor, unsigned>> hooks;
  std::unique_ptr<std::atomic<int64_t>[]> remaining;  // passes still to accumulate, per parameter
  std::unique_ptr<DataParallelGroup::PendingSum> pending;
  std::atomic<bool> armed{false};
  // The mini-batch's number, unique in the process: a thread-local entry
  // left by an earlier one (a pass that threw) is ignored.
  std::atomic<uint64_t> generation{0};
  // Buckets sent from a hook, i.e. while a backward pass still ran.
  std::atomic<int64_t> sent_in_backward{0};

  // `in_pass`: called from a hook (a pass still runs), not after backward().
  void Accumulated(size_t k, bool in_pass) {
    if (remaining[k].fetch_sub(1) != 1) return;
    const int64_t sent = pending->Ready(k, params[k].grad());
    if (in_pass) sent_in_backward.fetch_add(sent);
  }
  // The parameter whose hook fired last on this thread in this mini-batch
  // is accumulated; this thread's next is `next` (-1: the pass is over).
  void AccumulatedLast(bool in_pass, int64_t next) {
    LastHooked& last = t_last_hooked;
    const uint64_t now = generation.load();
    if (last.overlap == this && last.generation == now && last.param >= 0) {
      Accumulated(static_cast<size_t>(last.param), in_pass);
    }
    last = {this, now, next};
  }
};

Trainer::~Trainer() {
  if (!overlap_) return;
  for (auto& [param, hook] : overlap_->hooks) {
    try {
      param.remove_hook(hook);
    } catch (const std::exception& e) {
      SLUICE_LOG(WARNING) << "removing a gradient hook: " << e.what();
    }
  }
}

Status Trainer::BeginGradientSum(size_t micro_batches) {
  if (!overlap_) return Status::Ok();
  Overlap& o = *overlap_;
  SLUICE_ASSIGN_OR_RETURN(o.pending, data_parallel_->BeginSum(o.params));
  for (size_t k = 0; k < o.params.size(); ++k) o.remaining[k].store(static_cast<int64_t>(micro_batches));
  o.generation.store(g_mini_batches.fetch_add(1) + 1);
  o.sent_in_backward.store(0);
  o.armed.store(true);
  return Status::Ok();
}

void Trainer::BackwardDone() {
  if (overlap_ && overlap_->armed.load()) overlap_->AccumulatedLast(/*in_pass=*/false, -1);
}

Result<std::unique_ptr<Trainer>> Trainer::Create(std::shared_ptr<model::Transformer> policy,
                                                 std::shared_ptr<model::Transformer> reference,
                                                 const TrainerOptions& options,
                                                 std::shared_ptr<DataParallelGroup> data_parallel) {
  if (!policy) return Status::InvalidArgument("trainer needs a policy model");
  SLUICE_RETURN_IF_ERROR(options.Validate());
  if (options.pad_token < 0 || options.pad_token >= policy->config().vocab_size) {
    return Status::InvalidArgument("trainer pad_token " + std::to_string(options.pad_token) +
                                   " is outside the vocabulary");
  }
  if (options.loss.kl_coef > 0 && !reference) {
    return Status::InvalidArgument("kl_coef > 0 needs a reference model");
  }
  std::unique_ptr<Trainer> trainer(new Trainer(std::move(policy), std::move(reference), options, data_parallel));
  const bool on_cpu = trainer->params_.empty() || trainer->params_.front().second.device().is_cpu();
  // A tensor listed twice would have two hooks, the second taken for the
  // first's accumulation: then one sum after the passes.
  std::set<const void*> distinct;
  for (const auto& [name, p] : trainer->params_) distinct.insert(p.unsafeGetTensorImpl());
  const bool each_once = distinct.size() == trainer->params_.size();
  if (data_parallel && data_parallel->size() > 1 && options.overlap_gradient_sum && on_cpu && each_once &&
      !trainer->params_.empty()) {
    // On CUDA a backward pass runs on the device's thread, not the caller's,
    // and a gradient is final only once its stream says so: one sum after
    // the passes there.
    auto o = std::make_unique<Overlap>();
    const size_t n = trainer->params_.size();
    o->remaining = std::make_unique<std::atomic<int64_t>[]>(n);
    for (size_t k = 0; k < n; ++k) o->params.push_back(trainer->params_[n - 1 - k].second);
    Overlap* raw = o.get();
    for (size_t k = 0; k < n; ++k) {
      torch::Tensor& p = o->params[k];
      if (!p.requires_grad()) continue;  // no gradient: zeros, sent at the end
      const unsigned hook = p.register_hook([raw, k](const torch::Tensor&) {
        if (raw->armed.load()) raw->AccumulatedLast(/*in_pass=*/true, static_cast<int64_t>(k));
      });
      o->hooks.emplace_back(p, hook);
    }
    trainer->overlap_ = std::move(o);
  }
  if (data_parallel && data_parallel->size() > 1) {
    SLUICE_RETURN_IF_ERROR(data_parallel->CheckSame("trainer options or model shapes", trainer->Fingerprint()));
    SLUICE_RETURN_IF_ERROR(trainer->SyncFromRankZero());
  }
  return trainer;
}

Status Trainer::SyncFromRankZero() {
  if (!data_parallel_ || data_parallel_->size() == 1) return Status::Ok();
  std::vector<torch::Tensor> state;
  for (auto& [name, p] : params_) {
    state.push_back(p.detach());
    state.push_back(exp_avg_.at(name));
    state.push_back(exp_avg_sq_.at(name));
  }
  if (reference_) {
    for (auto& p : reference_->parameters()) state.push_back(p.detach());
  }
  torch::Tensor steps = torch::tensor({optimizer_steps_}, torch::kInt64);
  state.push_back(steps);
  SLUICE_RETURN_IF_ERROR(data_parallel_->Broadcast(state, 0));
  optimizer_steps_ = steps.item<int64_t>();
  return Status::Ok();
}

namespace {

// One field of a fingerprint (FNV-1a, fields separated).
void Mix(uint64_t& h, const std::string& text) { h = Fnv1a("\xff", Fnv1a(text, h)); }

std::string Whole(double x) { return std::to_string(static_cast<int64_t>(x)); }

std::string Exact(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%a", x);
  return buf;
}

}  // namespace

uint64_t Trainer::Fingerprint() const {
  uint64_t h = kFnv1aStart;
  const OptimizerOptions& o = options_.optimizer;
  for (double x : {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.max_grad_norm, o.min_lr_ratio}) Mix(h, Exact(x));
  for (int64_t x : {o.warmup_steps, o.decay_steps, options_.mini_batches, options_.ppo_epochs,
                    static_cast<int64_t>(options_.recompute_old_logprobs), static_cast<int64_t>(options_.pad_token),
                    static_cast<int64_t>(overlap_ != nullptr)}) {
    Mix(h, std::to_string(x));
  }
  const PolicyLossOptions& l = options_.loss;
  for (double x : {l.clip_low, l.clip_high, l.kl_coef, l.is_cap, static_cast<double>(options_.temperature)}) {
    Mix(h, Exact(x));
  }
  for (int x : {static_cast<int>(l.aggregation), static_cast<int>(l.kl_estimator), static_cast<int>(l.correction)}) {
    Mix(h, std::to_string(x));
  }
  Mix(h, model::ModelConfigToJson(policy_->config()));
  for (const auto& [name, p] : params_) {
    Mix(h, name);
    for (int64_t d : p.sizes()) Mix(h, std::to_string(d));
  }
  Mix(h, reference_ ? "reference" : "no reference");
  return h;
}

Status Trainer::AgreeOnStep(const Status& packed, size_t batch_size) {
  if (!data_parallel_ || data_parallel_->size() == 1) return packed;
  const double steps = static_cast<double>(optimizer_steps_), n = static_cast<double>(batch_size);
  std::vector<double> v = {packed.ok() ? 0.0 : 1.0, steps, -steps, n, -n};
  SLUICE_RETURN_IF_ERROR(data_parallel_->AllReduce(v, DataParallelGroup::Reduce::kMax));
  SLUICE_RETURN_IF_ERROR(packed);
  if (v[0] > 0) {
    return Status::FailedPrecondition("another data-parallel rank refused its shard of this batch (see its log)");
  }
  if (v[1] != -v[2]) {
    return Status::FailedPrecondition("data-parallel ranks are at different optimizer steps (" + Whole(-v[2]) + " to " +
                                      Whole(v[1]) + ")");
  }
  if (v[3] != -v[4]) {
    return Status::FailedPrecondition("data-parallel ranks were given batches of different sizes (" + Whole(-v[4]) +
                                      " to " + Whole(v[3]) + " samples)");
  }
  return Status::Ok();
}

Status Trainer::SumOverRanks(std::vector<double>& values) {
  if (!data_parallel_) return Status::Ok();
  return data_parallel_->AllReduce(values, DataParallelGroup::Reduce::kSum);
}

namespace {

// p's gradient, zeros where this rank had none (every rank sums every one).
torch::Tensor DefinedGrad(torch::Tensor& p) {
  if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  return p.grad();
}

}  // namespace

Status Trainer::SyncGradients() {
  if (!data_parallel_ || data_parallel_->size() == 1) return Status::Ok();
  if (overlap_ && overlap_->armed.load()) {
    Overlap& o = *overlap_;
    o.armed.store(false);
    std::vector<torch::Tensor> finals;
    for (torch::Tensor& p : o.params) finals.push_back(DefinedGrad(p));
    gradient_sums_.sent_during_backward += o.sent_in_backward.exchange(0);
    gradient_sums_.buckets += o.pending->buckets();
    Status summed = o.pending->Finish(finals);
    o.pending.reset();
    return summed;
  }
  std::vector<torch::Tensor> grads;
  for (auto& [name, p] : params_) grads.push_back(DefinedGrad(p));
  return data_parallel_->AllReduce(grads, DataParallelGroup::Reduce::kSum);
}

Result<std::vector<Trainer::Batch>> Trainer::Pack(const std::vector<RolloutSample>& samples,
                                                  const std::vector<size_t>& order) const {
  const model::ModelConfig& config = policy_->config();
  const int64_t budget = options_.micro_batch_tokens;
  for (size_t i : order) {
    const RolloutSample& s = samples[i];
    const std::string which = "sample " + std::to_string(s.id);
    if (s.prompt.empty()) return Status::InvalidArgument(which + ": empty prompt");
    if (s.response.empty()) return Status::InvalidArgument(which + ": empty response");
    if (s.behavior_logprobs.size() != s.response.size()) {
      return Status::InvalidArgument(which + ": " + std::to_string(s.behavior_logprobs.size()) + " logprobs for " +
                                     std::to_string(s.response.size()) + " response tokens");
    }
    if (!s.versions.empty() && s.versions.size() != s.response.size()) {
      return Status::InvalidArgument(which + ": " + std::to_string(s.versions.size()) + " versions for " +
                                     std::to_string(s.response.size()) + " response tokens");
    }
    const int64_t len = static_cast<int64_t>(s.prompt.size() + s.response.size());
    if (len > config.max_position_embeddings) {
      return Status::OutOfRange(which + ": " + std::to_string(len) + " tokens exceed the context of " +
                                std::to_string(config.max_position_embeddings));
    }
    if (len > budget) {
      return Status::OutOfRange(which + ": " + std::to_string(len) + " tokens exceed micro_batch_tokens " +
                                std::to_string(budget));
    }
    for (const auto* seq : {&s.prompt, &s.response}) {
      for (TokenId t : *seq) {
        if (t < 0 || t >= config.vocab_size) {
          return Status::InvalidArgument(which + ": token " + std::to_string(t) + " is outside the vocabulary");
        }
      }
    }
  }
  // The packing the simulator replays (sluice/schedule/packing.h).
  std::vector<int64_t> lengths(samples.size(), 0);
  for (size_t i : order) lengths[i] = static_cast<int64_t>(samples[i].prompt.size() + samples[i].response.size());
  const std::vector<std::vector<size_t>> groups =
      schedule::PackMicroBatches(lengths, order, budget, options_.micro_batch_threads);
  std::vector<Batch> out;
  auto device = policy_->parameters().front().device();
  for (const auto& g : groups) {
    Batch b;
    b.samples = g;
    int64_t L = 0;
    for (size_t i : g) L = std::max<int64_t>(L, samples[i].prompt.size() + samples[i].response.size());
    const int64_t B = static_cast<int64_t>(g.size());
    std::vector<int64_t> tokens(B * L, options_.pad_token);
    std::vector<float> mask(B * (L - 1), 0.f), adv(B * (L - 1), 0.f), behavior(B * (L - 1), 0.f);
    for (int64_t r = 0; r < B; ++r) {
      const RolloutSample& s = samples[g[r]];
      const int64_t P = static_cast<int64_t>(s.prompt.size()), R = static_cast<int64_t>(s.response.size());
      std::copy(s.prompt.begin(), s.prompt.end(), tokens.begin() + r * L);
      std::copy(s.response.begin(), s.response.end(), tokens.begin() + r * L + P);
      for (int64_t j = 0; j < R; ++j) {
        const int64_t pos = r * (L - 1) + P - 1 + j;
        // A token the policy did not sample (an environment's) is context only.
        mask[pos] = s.versions.empty() || s.versions[j] >= 0 ? 1.f : 0.f;
        adv[pos] = static_cast<float>(s.advantage);
        behavior[pos] = s.behavior_logprobs[j];
      }
      b.prompt_len.push_back(P);
      b.response_len.push_back(R);
    }
    auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    b.tokens = torch::tensor(tokens, torch::kInt64).view({B, L}).to(device);
    b.mask = torch::tensor(mask, f32).view({B, L - 1}).to(device);
    b.advantages = torch::tensor(adv, f32).view({B, L - 1}).to(device);
    b.behavior = torch::tensor(behavior, f32).view({B, L - 1}).to(device);
    out.push_back(std::move(b));
  }
  return out;
}

namespace {

// CUDA autocast to bfloat16 for the forward pass of this thread (autocast
// state is thread-local, so every micro-batch worker sets its own): matrix
// products in bfloat16 on the float32 master weights, reductions and the
// loss in float32. The cache of bfloat16 weight casts is dropped when the
// outermost guard ends, so the next forward sees the updated weights.
class CudaBf16Autocast {
 public:
  explicit CudaBf16Autocast(bool on) : on_(on) {
    if (!on_) return;
#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
    was_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    was_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
#else
    was_enabled_ = at::autocast::is_enabled();
    was_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
#endif
    at::autocast::increment_nesting();
  }
  ~CudaBf16Autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, was_dtype_);
#else
    at::autocast::set_enabled(was_enabled_);
    at::autocast::set_autocast_gpu_dtype(was_dtype_);
#endif
  }
  CudaBf16Autocast(const CudaBf16Autocast&) = delete;
  CudaBf16Autocast& operator=(const CudaBf16Autocast&) = delete;

 private:
  bool on_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace

torch::Tensor Trainer::TokenLogprobs(model::Transformer& model, const Batch& batch, torch::Tensor* logits_out) {
  const int64_t L = batch.tokens.size(1);
  torch::Tensor logits;
  {
    CudaBf16Autocast autocast(options_.bf16_autocast && batch.tokens.is_cuda());
    logits = model.Forward(batch.tokens).narrow(1, 0, L - 1);  // float32 (Transformer::Logits)
  }
  if (options_.temperature != 1.0f) logits = logits / options_.temperature;
  auto logp = torch::log_softmax(logits, -1).gather(2, batch.tokens.narrow(1, 1, L - 1).unsqueeze(2)).squeeze(2);
  if (logits_out != nullptr) *logits_out = logits;
  return logp;
}

double Trainer::CurrentLr() const {
  const OptimizerOptions& o = options_.optimizer;
  const int64_t s = optimizer_steps_;
  if (o.warmup_steps > 0 && s < o.warmup_steps) return o.lr * static_cast<double>(s + 1) / o.warmup_steps;
  if (o.decay_steps <= 0) return o.lr;
  const double progress = std::min(1.0, static_cast<double>(s - o.warmup_steps) / o.decay_steps);
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

void Trainer::ZeroGrads() {
  if (overlap_) {
    overlap_->armed.store(false);
    overlap_->pending.reset();
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params_) {
    if (p.grad().defined()) p.grad().zero_();
  }
}

double Trainer::OptimizerStep() {
  torch::NoGradGuard no_grad;
  const OptimizerOptions& o = options_.optimizer;
  double sq = 0;
  for (auto& [name, p] : params_) {
    if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(sq);
  if (!std::isfinite(norm)) {
    SLUICE_LOG(WARNING) << "non-finite gradient norm; skipping this optimizer step";
    ZeroGrads();
    return norm;
  }
  const double scale = (o.max_grad_norm > 0 && norm > o.max_grad_norm) ? o.max_grad_norm / (norm + 1e-6) : 1.0;
  const double lr = CurrentLr();
  const int64_t t = optimizer_steps_ + 1;
  const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
  for (auto& [name, p] : params_) {
    if (!p.grad().defined()) continue;
    auto g = p.grad() * scale;
    torch::Tensor& m = exp_avg_[name];
    torch::Tensor& v = exp_avg_sq_[name];
    m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
    v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
    if (o.weight_decay > 0) p.mul_(1.0 - lr * o.weight_decay);
    p.addcdiv_(m / bc1, (v / bc2).sqrt_().add_(o.eps), -lr);
    p.grad().zero_();
  }
  ++optimizer_steps_;
  return norm;
}

Status Trainer::SetMicroBatchWorkers(int32_t threads, std::function<bool(int32_t)> may_run,
                                     std::function<void(int32_t)> done_running) {
  if (threads < 1 || threads > 256) return Status::InvalidArgument("micro_batch_threads must be in 1..256");
  options_.micro_batch_threads = threads;
  options_.may_run = std::move(may_run);
  options_.done_running = std::move(done_running);
  return Status::Ok();
}

void Trainer::ForEachMicroBatch(size_t n, const std::function<void(size_t, int32_t)>& fn) {
  const int32_t threads = static_cast<int32_t>(std::min<size_t>(options_.micro_batch_threads, n));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<size_t> next{0};
  std::mutex error_mu;
  std::exception_ptr error;
  auto work = [&](int32_t worker) {
    try {
      for (;;) {
        const bool lent = worker > 0 && options_.may_run;
        if (lent && !options_.may_run(worker)) {
          if (next.load() >= n) return;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the core is lent only when idle
          continue;
        }
        struct Done {
          const TrainerOptions& o;
          int32_t worker;
          bool lent;
          ~Done() {
            if (lent && o.done_running) o.done_running(worker);
          }
        } done{options_, worker, lent};
        const size_t i = next.fetch_add(1);
        if (i >= n) return;
        fn(i, worker);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      next.store(n);  // the others stop after their current micro-batch
    }
  };
  // One intra-op thread per worker, the caller included, for the duration.
  const int caller_threads = torch::get_num_threads();
  torch::set_num_threads(1);
  std::vector<std::thread> helpers;
  for (int32_t w = 1; w < threads; ++w) {
    helpers.emplace_back([&, w] {
      torch::set_num_threads(1);
      work(w);
    });
  }
  work(0);
  for (auto& t : helpers) t.join();
  torch::set_num_threads(caller_threads);
  if (error) std::rethrow_exception(error);
}

Result<StepMetrics> Trainer::RlStep(const std::vector<RolloutSample>& samples) {
  if (samples.empty()) return Status::InvalidArgument("RL step on an empty batch");
  const int64_t N = static_cast<int64_t>(samples.size());
  // This rank's members of each mini-batch (all of them on one process).
  const int64_t rank = data_parallel_ ? data_parallel_->rank() : 0;
  const int64_t world = data_parallel_ ? data_parallel_->size() : 1;
  std::vector<std::vector<Batch>> mini_batches;
  Status packed = Status::Ok();
  for (const std::vector<size_t>& order : DataParallelShard(samples.size(), options_.mini_batches, rank, world)) {
    auto batches = Pack(samples, order);
    if (!batches.ok()) {
      packed = batches.status();
      break;
    }
    mini_batches.push_back(std::move(batches).value());
  }
  SLUICE_RETURN_IF_ERROR(AgreeOnStep(packed, samples.size()));
  StepMetrics m;
  double gap_total = 0, gap_counted = 0;
  try {
    if (options_.recompute_old_logprobs || options_.loss.kl_coef > 0) {
      // The proximal and reference policies, before any update.
      const auto pass_start = std::chrono::steady_clock::now();
      std::vector<Batch*> all;
      for (auto& mini : mini_batches) {
        for (Batch& b : mini) all.push_back(&b);
      }
      std::vector<double> gap_sum(all.size(), 0.0), gap_max(all.size(), 0.0), gap_tokens(all.size(), 0.0);
      ForEachMicroBatch(all.size(), [&](size_t i, int32_t) {
        torch::NoGradGuard no_grad;  // thread-local: set in every worker
        Batch& b = *all[i];
        // The proximal policy: the weights before this update, recomputed,
        // or the behaviour policy (not recomputed, or kBehavior, where the
        // recomputation only measures the gap).
        const torch::Tensor prox =
            options_.recompute_old_logprobs ? TokenLogprobs(*policy_, b, nullptr) : torch::Tensor();
        b.old_logprobs =
            prox.defined() && options_.loss.correction != OffPolicyCorrection::kBehavior ? prox : b.behavior;
        if (prox.defined()) {
          const auto gap = (prox - b.behavior).abs() * b.mask;
          gap_sum[i] = gap.sum().item<double>();
          gap_max[i] = gap.max().item<double>();
          gap_tokens[i] = b.mask.sum().item<double>();
        }
        if (options_.loss.kl_coef > 0) b.ref_logprobs = TokenLogprobs(*reference_, b, nullptr);
      });
      for (size_t i = 0; i < all.size(); ++i) {  // in micro-batch order: deterministic
        gap_total += gap_sum[i];
        gap_counted += gap_tokens[i];
        m.rollout_logprob_gap_max = std::max(m.rollout_logprob_gap_max, gap_max[i]);
      }
      m.proximal_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - pass_start).count();
    } else {
      for (auto& mini : mini_batches) {
        for (Batch& b : mini) b.old_logprobs = b.behavior;
      }
    }
    // Sums per micro-batch, added up in micro-batch order (deterministic
    // whatever the thread schedule).
    struct Sums {
      double loss = 0, pg = 0, kl = 0, clipped = 0, ratio = 0, is_weight = 0, is_capped = 0, tokens = 0, entropy = 0;
    };
    double pg = 0, kl = 0, clipped = 0, ratio = 0, is_weight = 0, is_capped = 0, tokens = 0, entropy = 0, loss = 0,
           grad_norm = 0;
    for (int64_t epoch = 0; epoch < options_.ppo_epochs; ++epoch) {
      for (auto& mini : mini_batches) {
        // What normalizes the loss: the whole mini-batch's tokens or
        // sequences (over every rank).
        std::vector<double> mini_size = {0, 0};
        for (const Batch& b : mini) {
          mini_size[0] += b.mask.sum().item<double>();
          mini_size[1] += static_cast<double>(b.sequences());
        }
        SLUICE_RETURN_IF_ERROR(SumOverRanks(mini_size));
        // (At least 1: a mini-batch of agent trajectories whose openings all
        // failed has no trained token, and no gradient.)
        const double normalizer =
            std::max(1.0, options_.loss.aggregation == LossAggregation::kTokenMean ? mini_size[0] : mini_size[1]);
        std::vector<Sums> sums(mini.size());
        SLUICE_RETURN_IF_ERROR(BeginGradientSum(mini.size()));
        ForEachMicroBatch(mini.size(), [&](size_t i, int32_t) {
          const Batch& b = mini[i];
          torch::Tensor logits;
          auto logp = TokenLogprobs(*policy_, b, &logits);
          PolicyLossInputs in{logp, b.old_logprobs, b.behavior, b.advantages, b.mask, b.ref_logprobs};
          PolicyLossResult r = PolicyLoss(in, options_.loss, normalizer);
          r.loss.backward();
          BackwardDone();
          Sums& s = sums[i];
          s.loss = r.loss.item<double>();
          s.pg = r.pg_loss_sum;
          s.kl = r.kl_sum;
          s.clipped = r.clipped_tokens;
          s.ratio = r.ratio_sum;
          s.is_weight = r.is_weight_sum;
          s.is_capped = r.is_capped_tokens;
          s.tokens = r.tokens;
          torch::NoGradGuard no_grad;
          s.entropy = (Entropy(logits.detach()) * b.mask).sum().item<double>();
        });
        for (const Sums& s : sums) {
          loss += s.loss, pg += s.pg, kl += s.kl, clipped += s.clipped, ratio += s.ratio;
          is_weight += s.is_weight, is_capped += s.is_capped, tokens += s.tokens, entropy += s.entropy;
        }
        m.micro_batches += static_cast<int64_t>(mini.size());
        if (Status synced = SyncGradients(); !synced.ok()) {
          ZeroGrads();
          return synced;
        }
        grad_norm = OptimizerStep();
        ++m.optimizer_steps;
      }
    }
    // The metrics over every rank's shard.
    std::vector<double> sums = {loss,    pg,        kl,          clipped,
                                ratio,   is_weight, is_capped,   tokens,
                                entropy, gap_total, gap_counted, static_cast<double>(m.micro_batches)};
    SLUICE_RETURN_IF_ERROR(SumOverRanks(sums));
    loss = sums[0], pg = sums[1], kl = sums[2], clipped = sums[3], ratio = sums[4], is_weight = sums[5];
    is_capped = sums[6], tokens = sums[7], entropy = sums[8], gap_total = sums[9], gap_counted = sums[10];
    m.micro_batches = static_cast<int64_t>(sums[11]);
    if (data_parallel_) {
      std::vector<double> gap_max = {m.rollout_logprob_gap_max};
      SLUICE_RETURN_IF_ERROR(data_parallel_->AllReduce(gap_max, DataParallelGroup::Reduce::kMax));
      m.rollout_logprob_gap_max = gap_max[0];
    }
    m.rollout_logprob_gap_mean = gap_counted > 0 ? gap_total / gap_counted : 0.0;
    m.tokens = static_cast<int64_t>(tokens / options_.ppo_epochs);
    m.sequences = N;
    tokens = std::max(tokens, 1.0);
    m.loss = loss / m.optimizer_steps;
    m.pg_loss = pg / tokens;
    m.kl = kl / tokens;
    m.clip_frac = clipped / tokens;
    m.ratio_mean = ratio / tokens;
    m.is_weight_mean = is_weight / tokens;
    m.is_capped_frac = is_capped / tokens;
    m.entropy = entropy / tokens;
    m.grad_norm = grad_norm;
    m.lr = CurrentLr();
  } catch (const c10::Error& e) {
    ZeroGrads();
    return Status::Internal(std::string("RL step failed in libtorch: ") + e.what_without_backtrace());
  }
  return m;
}

Result<StepMetrics> Trainer::SftStep(const std::vector<SftExample>& examples) {
  if (examples.empty()) return Status::InvalidArgument("SFT step on an empty batch");
  const int64_t rank = data_parallel_ ? data_parallel_->rank() : 0;
  const int64_t world = data_parallel_ ? data_parallel_->size() : 1;
  const std::vector<size_t> order = DataParallelShard(examples.size(), 1, rank, world)[0];
  std::vector<RolloutSample> samples(examples.size());
  for (size_t i : order) {
    const SftExample& e = examples[i];
    if (!e.trained.empty() && e.trained.size() != e.target.size()) {
      return Status::InvalidArgument("SFT example " + std::to_string(i) + ": " + std::to_string(e.trained.size()) +
                                     " trained flags for " + std::to_string(e.target.size()) + " target tokens");
    }
    samples[i].id = i;
    samples[i].prompt = e.prompt;
    samples[i].response = e.target;
    samples[i].behavior_logprobs.assign(e.target.size(), 0.f);
    // Context tokens as the packer reads them: version -1.
    for (uint8_t t : e.trained) samples[i].versions.push_back(t ? 0 : -1);
  }
  auto packed = Pack(samples, order);
  SLUICE_RETURN_IF_ERROR(AgreeOnStep(packed.status(), examples.size()));
  std::vector<Batch> batches = std::move(packed).value();
  StepMetrics m;
  try {
    std::vector<double> total_tokens = {0};
    for (const Batch& b : batches) total_tokens[0] += b.mask.sum().item<double>();
    SLUICE_RETURN_IF_ERROR(SumOverRanks(total_tokens));
    const double total = total_tokens[0];
    std::vector<std::pair<double, double>> sums(batches.size());  // loss, entropy
    SLUICE_RETURN_IF_ERROR(BeginGradientSum(batches.size()));
    ForEachMicroBatch(batches.size(), [&](size_t i, int32_t) {
      const Batch& b = batches[i];
      torch::Tensor logits;
      auto logp = TokenLogprobs(*policy_, b, &logits);
      auto loss = -(logp * b.mask).sum() / total;
      loss.backward();
      BackwardDone();
      torch::NoGradGuard no_grad;
      sums[i] = {loss.item<double>(), (Entropy(logits.detach()) * b.mask).sum().item<double>()};
    });
    if (Status synced = SyncGradients(); !synced.ok()) {
      ZeroGrads();
      return synced;
    }
    std::vector<double> totals = {0, 0, static_cast<double>(batches.size())};  // loss, entropy, micro-batches
    for (const auto& [loss, entropy] : sums) totals[0] += loss, totals[1] += entropy;
    SLUICE_RETURN_IF_ERROR(SumOverRanks(totals));
    m.loss = totals[0];
    m.micro_batches = static_cast<int64_t>(totals[2]);
    m.entropy = totals[1] / total;
    m.tokens = static_cast<int64_t>(total);
    m.sequences = static_cast<int64_t>(examples.size());
    m.grad_norm = OptimizerStep();
    m.optimizer_steps = 1;
    m.lr = CurrentLr();
  } catch (const c10::Error& e) {
    ZeroGrads();
    return Status::Internal(std::string("SFT step failed in libtorch: ") + e.what_without_backtrace());
  }
  return m;
}

Result<std::vector<std::vector<float>>> Trainer::ResponseLogprobs(model::Transformer& model,
                                                                  const std::vector<RolloutSample>& samples) {
  std::vector<size_t> order(samples.size());
  std::iota(order.begin(), order.end(), 0);
  SLUICE_ASSIGN_OR_RETURN(auto batches, Pack(samples, order));
  std::vector<std::vector<float>> out(samples.size());
  torch::NoGradGuard no_grad;
  for (const Batch& b : batches) {
    auto logp = TokenLogprobs(model, b, nullptr).to(torch::kCPU).contiguous();
    const int64_t stride = logp.size(1);
    const float* data = logp.data_ptr<float>();
    for (int64_t r = 0; r < b.sequences(); ++r) {
      const int64_t begin = r * stride + b.prompt_len[r] - 1;
      out[b.samples[r]].assign(data + begin, data + begin + b.response_len[r]);
    }
  }
  return out;
}

TensorMap Trainer::OptimizerState() const {
  TensorMap state;
  for (const auto& [name, p] : params_) {
    state.emplace(name + ".exp_avg", *model::FromTorch(exp_avg_.at(name)));
    state.emplace(name + ".exp_avg_sq", *model::FromTorch(exp_avg_sq_.at(name)));
  }
  return state;
}

Status Trainer::LoadOptimizerState(const TensorMap& state, int64_t optimizer_steps) {
  if (optimizer_steps < 0) return Status::InvalidArgument("optimizer step count must be >= 0");
  if (state.size() != 2 * params_.size()) {
    return Status::InvalidArgument("optimizer state holds " + std::to_string(state.size()) + " tensors, expected " +
                                   std::to_string(2 * params_.size()));
  }
  // Check every tensor before copying any: a bad file leaves the state as it was.
  for (auto& [name, p] : params_) {
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
      auto it = state.find(name + suffix);
      if (it == state.end()) return Status::NotFound("optimizer state lacks '" + name + suffix + "'");
      const HostTensor& t = it->second;
      const bool is_float = t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16;
      if (!is_float || !std::equal(t.shape.begin(), t.shape.end(), p.sizes().begin(), p.sizes().end())) {
        return Status::InvalidArgument("optimizer state '" + name + suffix +
                                       "' does not match the parameter's shape or is not a float tensor");
      }
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params_) {
    SLUICE_ASSIGN_OR_RETURN(torch::Tensor m, model::ToTorch(state.at(name + ".exp_avg")));
    SLUICE_ASSIGN_OR_RETURN(torch::Tensor v, model::ToTorch(state.at(name + ".exp_avg_sq")));
    exp_avg_[name].copy_(m);
    exp_avg_sq_[name].copy_(v);
  }
  optimizer_steps_ = optimizer_steps;
  return Status::Ok();
}

}  // namespace sluice::trainer
