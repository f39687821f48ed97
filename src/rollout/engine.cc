#include "sluice/rollout/engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "sampler.h"
#include "sluice/common/check.h"
#include "sluice/model/transformer.h"

namespace sluice::rollout {

Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return Status::InvalidArgument("sampling.temperature must be a finite number >= 0 (0 = greedy), got " +
                                   std::to_string(temperature));
  }
  if (top_k < 0) return Status::InvalidArgument("sampling.top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return Status::InvalidArgument("sampling.top_p must be in (0, 1], got " + std::to_string(top_p));
  }
  if (max_new_tokens < 1) {
    return Status::InvalidArgument("sampling.max_new_tokens must be >= 1, got " + std::to_string(max_new_tokens));
  }
  if (forced_length < 0) {
    return Status::InvalidArgument("sampling.forced_length must be >= 0 (0 = off), got " + std::to_string(forced_length));
  }
  return Status::Ok();
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos: return "eos";
    case FinishReason::kLength: return "length";
    case FinishReason::kForcedLength: return "forced_length";
  }
  return "?";
}

namespace {

struct Sequence {
  GenerationRequest request;
  GenerationResult result;
  int32_t limit = 0;  // most tokens this sequence may generate

  int64_t prompt_len() const { return static_cast<int64_t>(request.prompt.size()); }
  // Cache position where the last sampled token goes when it is fed back.
  int64_t next_position() const { return prompt_len() + static_cast<int64_t>(result.tokens.size()) - 1; }
};

SampleRow RowFor(const Sequence& s) {
  const SamplingParams& p = s.request.sampling;
  return SampleRow{p.temperature, p.top_k, p.top_p, StreamUniform(p.seed, s.result.tokens.size())};
}

bool SameArchitecture(const model::ModelConfig& a, const model::ModelConfig& b) {
  return a.hidden_size == b.hidden_size && a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads && a.num_key_value_heads == b.num_key_value_heads &&
         a.resolved_head_dim() == b.resolved_head_dim() && a.vocab_size == b.vocab_size &&
         a.max_position_embeddings == b.max_position_embeddings;
}

torch::Device ModelDevice(model::Transformer& m) {
  auto params = m.parameters();
  return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
}

}  // namespace

struct RolloutEngine::Impl {
  PolicySnapshot policy;
  EngineOptions options;
  torch::Device device{torch::kCPU};
  model::KvCache cache;
  std::deque<Sequence> waiting;
  std::vector<std::optional<Sequence>> slots;
  std::unordered_set<uint64_t> ids_in_flight;
  WeightSwapHook hook;
  std::optional<PolicySnapshot> pending;  // kAtBoundary: validated, waits for the slots to drain
  EngineStats stats;
  Status broken;  // sticky: set when libtorch failed mid-step

  int32_t NumRunning() const {
    return static_cast<int32_t>(std::count_if(slots.begin(), slots.end(), [](const auto& s) { return s.has_value(); }));
  }

  Status MaybeSwapWeights() {
    if (pending) {
      if (NumRunning() > 0) return Status::Ok();
      policy = std::move(*pending);
      pending.reset();
      ++stats.weight_swaps;
      return Status::Ok();
    }
    if (!hook) return Status::Ok();
    std::optional<PolicySnapshot> next = hook(policy.version);
    if (!next) return Status::Ok();
    if (!next->model) return Status::FailedPrecondition("weight-swap hook returned a snapshot without a model");
    if (next->version <= policy.version) {
      return Status::FailedPrecondition("weight-swap hook returned version " + std::to_string(next->version) +
                                        ", not newer than the serving version " + std::to_string(policy.version));
    }
    if (ModelDevice(*next->model) != device) {
      return Status::FailedPrecondition("weight-swap hook returned version " + std::to_string(next->version) +
                                        " on device " + ModelDevice(*next->model).str() + ", the engine runs on " +
                                        device.str());
    }
    if (!SameArchitecture(next->model->config(), policy.model->config())) {
      return Status::FailedPrecondition("weight-swap hook returned version " + std::to_string(next->version) +
                                        " with a different architecture than the serving model");
    }
    if (options.switch_policy == SwitchPolicy::kAtBoundary && NumRunning() > 0) {
      pending = std::move(*next);
      return Status::Ok();
    }
    policy = std::move(*next);
    ++stats.weight_swaps;
    return Status::Ok();
  }

  // Moves waiting requests into free slots; returns the slots filled.
  std::vector<int64_t> Admit(bool any_running) {
    std::vector<int64_t> admitted;
    if (options.scheduling == Scheduling::kStatic && any_running) return admitted;
    if (pending) return admitted;  // kAtBoundary: drain first, then switch
    int64_t budget = options.max_prefill_tokens > 0 ? options.max_prefill_tokens : INT64_MAX;
    for (size_t i = 0; i < slots.size() && !waiting.empty(); ++i) {
      if (slots[i].has_value()) continue;
      const int64_t len = waiting.front().prompt_len();
      if (!admitted.empty() && len > budget) break;  // always admit at least one
      budget -= len;
      slots[i] = std::move(waiting.front());
      waiting.pop_front();
      admitted.push_back(static_cast<int64_t>(i));
    }
    return admitted;
  }

  // One forward pass for the step: a decode block over the running
  // sequences (each feeds its last token) and one prefill block per admitted
  // prompt. Returns logits [running + admitted, V] in that order.
  torch::Tensor Forward(const std::vector<int64_t>& running, const std::vector<int64_t>& admitted) {
    std::vector<model::CachedBlock> blocks;
    std::vector<int64_t> tokens;
    // Running sequences decode in blocks of consecutive slots: the model reads
    // a consecutive range of the cache in place, while any other set of slots
    // would be gathered (copied) in every layer.
    for (size_t i = 0; i < running.size(); ++i) {
      if (i == 0 || running[i] != running[i - 1] + 1) blocks.push_back(model::CachedBlock{{}, {}, 1});
      const Sequence& s = *slots[running[i]];
      blocks.back().slots.push_back(running[i]);
      blocks.back().starts.push_back(s.next_position());
      tokens.push_back(s.result.tokens.back());
    }
    for (int64_t slot : admitted) {
      const auto& prompt = slots[slot]->request.prompt;
      blocks.push_back(model::CachedBlock{{slot}, {0}, static_cast<int64_t>(prompt.size())});
      tokens.insert(tokens.end(), prompt.begin(), prompt.end());
      stats.prefill_tokens += static_cast<int64_t>(prompt.size());
    }
    auto packed = torch::tensor(tokens, torch::kInt64).to(device);
    return policy.model->ForwardBlocks(packed, blocks, &cache, /*last_only=*/true);
  }

  // Appends one sampled token; returns true when the sequence is done.
  bool Append(Sequence& s, TokenId token, float logprob) {
    s.result.tokens.push_back(token);
    s.result.logprobs.push_back(logprob);
    s.result.versions.push_back(policy.version);
    ++stats.generated_tokens;
    const auto n = static_cast<int32_t>(s.result.tokens.size());
    const int32_t forced = s.request.sampling.forced_length;
    if (forced > 0) {
      if (n < forced) return false;
      s.result.finish = FinishReason::kForcedLength;
      return true;
    }
    if (options.eos_token_id >= 0 && token == options.eos_token_id) {
      s.result.finish = FinishReason::kEos;
      return true;
    }
    if (n >= s.limit) {
      s.result.finish = FinishReason::kLength;
      return true;
    }
    return false;
  }

  // When freed slots will not be refilled at the next step (nothing waiting,
  // or static batching mid-batch), moves the highest running sequences into
  // the lowest free slots: one consecutive range decodes as a single block.
  void Compact() {
    if (!waiting.empty() && options.scheduling == Scheduling::kContinuous) return;
    size_t lo = 0, hi = slots.size();
    while (true) {
      while (lo < slots.size() && slots[lo].has_value()) ++lo;
      while (hi > 0 && !slots[hi - 1].has_value()) --hi;
      if (lo >= hi) return;
      const size_t src = hi - 1;
      const int64_t used = slots[src]->next_position();  // positions [0, used) are valid
      for (size_t l = 0; l < cache.keys.size(); ++l) {
        cache.keys[l][lo].narrow(1, 0, used).copy_(cache.keys[l][src].narrow(1, 0, used));
        cache.values[l][lo].narrow(1, 0, used).copy_(cache.values[l][src].narrow(1, 0, used));
      }
      slots[lo] = std::move(slots[src]);
      slots[src].reset();
      ++stats.slot_compactions;
    }
  }

  std::vector<GenerationResult> RunStep() {
    c10::InferenceMode inference;
    std::vector<int64_t> running;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].has_value()) running.push_back(static_cast<int64_t>(i));
    }
    std::vector<int64_t> admitted = Admit(!running.empty());
    if (running.empty() && admitted.empty()) return {};

    std::vector<int64_t> order = running;  // slot of each logits row
    order.insert(order.end(), admitted.begin(), admitted.end());
    if (!running.empty()) {
      ++stats.decode_steps;
      stats.active_slot_steps += static_cast<int64_t>(running.size());
    }
    ++stats.steps;
    auto logits = Forward(running, admitted);
    std::vector<SampleRow> rows;
    rows.reserve(order.size());
    for (int64_t s : order) rows.push_back(RowFor(*slots[s]));
    SampledTokens sampled = SampleTokens(logits, rows);

    std::vector<GenerationResult> finished;
    for (size_t r = 0; r < order.size(); ++r) {
      std::optional<Sequence>& slot = slots[order[r]];
      if (Append(*slot, sampled.tokens[r], sampled.logprobs[r])) {
        ids_in_flight.erase(slot->request.id);
        finished.push_back(std::move(slot->result));
        slot.reset();
      }
    }
    if (!finished.empty()) Compact();
    return finished;
  }
};

RolloutEngine::RolloutEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RolloutEngine::~RolloutEngine() = default;

Result<std::unique_ptr<RolloutEngine>> RolloutEngine::Create(PolicySnapshot policy, const EngineOptions& options) {
  if (!policy.model) return Status::InvalidArgument("rollout engine needs a model (policy.model is null)");
  if (options.num_slots <= 0) {
    return Status::InvalidArgument("engine.num_slots must be positive, got " + std::to_string(options.num_slots));
  }
  if (options.max_prefill_tokens < 0) {
    return Status::InvalidArgument("engine.max_prefill_tokens must be >= 0, got " +
                                   std::to_string(options.max_prefill_tokens));
  }
  const model::ModelConfig& config = policy.model->config();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.max_seq_len == 0) impl->options.max_seq_len = static_cast<int32_t>(config.max_position_embeddings);
  if (impl->options.max_seq_len < 2 || impl->options.max_seq_len > config.max_position_embeddings) {
    return Status::InvalidArgument("engine.max_seq_len must be in [2, max_position_embeddings = " +
                                   std::to_string(config.max_position_embeddings) + "], got " +
                                   std::to_string(options.max_seq_len));
  }
  if (impl->options.eos_token_id < 0) impl->options.eos_token_id = static_cast<TokenId>(config.eos_token_id);
  if (impl->options.eos_token_id >= config.vocab_size) {
    return Status::InvalidArgument("engine.eos_token_id " + std::to_string(options.eos_token_id) +
                                   " is outside the vocabulary");
  }
  try {
    impl->device = ModelDevice(*policy.model);
    impl->cache = model::KvCache::Allocate(config, options.num_slots, impl->options.max_seq_len, impl->device);
  } catch (const c10::Error& e) {
    return Status::ResourceExhausted(std::string("cannot allocate the KV cache: ") + e.what_without_backtrace());
  }
  impl->slots.resize(options.num_slots);
  impl->policy = std::move(policy);
  return std::unique_ptr<RolloutEngine>(new RolloutEngine(std::move(impl)));
}

Status RolloutEngine::Submit(GenerationRequest request) {
  Impl& m = *impl_;
  SLUICE_RETURN_IF_ERROR(m.broken);
  const auto id = std::to_string(request.id);
  SLUICE_RETURN_IF_ERROR(request.sampling.Validate().WithContext("request " + id));
  if (request.prompt.empty()) return Status::InvalidArgument("request " + id + ": empty prompt");
  const int64_t vocab = m.policy.model->config().vocab_size;
  for (TokenId t : request.prompt) {
    if (t < 0 || t >= vocab) {
      return Status::InvalidArgument("request " + id + ": prompt token " + std::to_string(t) +
                                     " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  const int64_t room = m.options.max_seq_len - static_cast<int64_t>(request.prompt.size());
  if (room < 1) {
    return Status::OutOfRange("request " + id + ": prompt of " + std::to_string(request.prompt.size()) +
                              " tokens leaves no room for a response in max_seq_len " +
                              std::to_string(m.options.max_seq_len));
  }
  if (request.sampling.forced_length > room) {
    return Status::OutOfRange("request " + id + ": forced_length " + std::to_string(request.sampling.forced_length) +
                              " does not fit after a " + std::to_string(request.prompt.size()) +
                              "-token prompt in max_seq_len " + std::to_string(m.options.max_seq_len));
  }
  if (!m.ids_in_flight.insert(request.id).second) {
    return Status::AlreadyExists("request " + id + " is already in flight");
  }
  Sequence s;
  s.limit = static_cast<int32_t>(std::min<int64_t>(request.sampling.max_new_tokens, room));
  s.result.id = request.id;
  s.result.prompt = request.prompt;
  s.request = std::move(request);
  m.waiting.push_back(std::move(s));
  return Status::Ok();
}

Result<std::vector<GenerationResult>> RolloutEngine::Step() {
  Impl& m = *impl_;
  SLUICE_RETURN_IF_ERROR(m.broken);
  SLUICE_RETURN_IF_ERROR(m.MaybeSwapWeights());
  try {
    return m.RunStep();
  } catch (const c10::Error& e) {
    m.broken = Status::Internal(std::string("rollout step failed in libtorch: ") + e.what_without_backtrace());
    return m.broken;
  } catch (const std::exception& e) {
    m.broken = Status::Internal(std::string("rollout step failed: ") + e.what());
    return m.broken;
  }
}

Result<std::vector<GenerationResult>> RolloutEngine::RunUntilIdle() {
  std::vector<GenerationResult> all;
  while (!idle()) {
    SLUICE_ASSIGN_OR_RETURN(auto done, Step());
    for (auto& r : done) all.push_back(std::move(r));
  }
  return all;
}

void RolloutEngine::SetWeightSwapHook(WeightSwapHook hook) { impl_->hook = std::move(hook); }
std::optional<PolicyVersion> RolloutEngine::pending_version() const {
  if (!impl_->pending) return std::nullopt;
  return impl_->pending->version;
}
bool RolloutEngine::idle() const { return impl_->waiting.empty() && impl_->NumRunning() == 0; }
int32_t RolloutEngine::num_running() const { return impl_->NumRunning(); }
size_t RolloutEngine::num_waiting() const { return impl_->waiting.size(); }
PolicyVersion RolloutEngine::policy_version() const { return impl_->policy.version; }
const EngineOptions& RolloutEngine::options() const { return impl_->options; }
const EngineStats& RolloutEngine::stats() const { return impl_->stats; }

Result<int64_t> RunLockstepDecode(const PolicySnapshot& policy, int32_t batch, int32_t prompt_len, int32_t steps,
                                  uint64_t seed) {
  if (!policy.model) return Status::InvalidArgument("lockstep decode needs a model");
  const model::ModelConfig& config = policy.model->config();
  if (batch <= 0 || prompt_len <= 0 || steps <= 0) {
    return Status::InvalidArgument("lockstep decode needs positive batch, prompt_len and steps");
  }
  if (prompt_len + steps > config.max_position_embeddings) {
    return Status::OutOfRange("lockstep decode: prompt_len + steps exceeds max_position_embeddings");
  }
  try {
    c10::InferenceMode inference;
    torch::Device device = ModelDevice(*policy.model);
    auto cache = model::KvCache::Allocate(config, batch, prompt_len + steps, device);
    std::vector<int64_t> slots(batch), starts(batch, 0);
    for (int32_t b = 0; b < batch; ++b) slots[b] = b;
    auto gen = at::detail::createCPUGenerator(seed);
    auto prompt = torch::randint(0, config.vocab_size, {batch, prompt_len}, gen, torch::kInt64).to(device);
    auto logits = policy.model->ForwardCached(prompt, slots, starts, &cache).select(1, prompt_len - 1);
    std::vector<SampleRow> rows(batch);
    int64_t decoded = 0;
    for (int32_t step = 0; step < steps; ++step) {
      for (int32_t b = 0; b < batch; ++b) rows[b].uniform = StreamUniform(seed + b, step);
      SampledTokens next = SampleTokens(logits, rows);
      decoded += batch;
      if (step + 1 == steps) break;
      std::vector<int64_t> tokens(next.tokens.begin(), next.tokens.end());
      std::fill(starts.begin(), starts.end(), prompt_len + step);
      auto t = torch::tensor(tokens, torch::kInt64).view({batch, 1}).to(device);
      logits = policy.model->ForwardCached(t, slots, starts, &cache).squeeze(1);
    }
    return decoded;
  } catch (const c10::Error& e) {
    return Status::Internal(std::string("lockstep decode failed in libtorch: ") + e.what_without_backtrace());
  }
}

}  // namespace sluice::rollout
