#include "sluice/rollout/engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "sampler.h"
#include "sluice/common/check.h"
#include "sluice/common/enum_names.h"
#include "sluice/model/transformer.h"

namespace sluice::rollout {

Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return Status::InvalidArgument("sampling.temperature must be a finite number >= 0 (0 = greedy), got " +
                                   std::to_string(temperature));
  }
  // Logits divided by a tinier temperature overflow float to inf, and the
  // softmax of infs is NaN: such a temperature means greedy, so say so.
  if (temperature > 0.0f && temperature < kMinTemperature) {
    return Status::InvalidArgument("sampling.temperature " + std::to_string(temperature) + " is below " +
                                   std::to_string(kMinTemperature) +
                                   ", where logits / temperature overflow; use 0 for greedy decoding");
  }
  if (top_k < 0) return Status::InvalidArgument("sampling.top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return Status::InvalidArgument("sampling.top_p must be in (0, 1], got " + std::to_string(top_p));
  }
  if (max_new_tokens < 1) {
    return Status::InvalidArgument("sampling.max_new_tokens must be >= 1, got " + std::to_string(max_new_tokens));
  }
  if (forced_length < 0) {
    return Status::InvalidArgument("sampling.forced_length must be >= 0 (0 = off), got " +
                                   std::to_string(forced_length));
  }
  return Status::Ok();
}

const char* FinishReasonName(FinishReason reason) {
  static constexpr const char* kNames[] = {"eos", "length", "forced_length"};
  static_assert(std::size(kNames) == static_cast<size_t>(FinishReason::kForcedLength) + 1);
  return EnumName(kNames, reason);
}

namespace {

struct Sequence {
  GenerationRequest request;
  GenerationResult result;
  int32_t limit = 0;  // most tokens this sequence may generate
  // The logits after the prompt and the weights that computed them and the
  // prompt's keys/values (shared by requests with the same prompt).
  torch::Tensor prompt_logits;
  PolicyVersion prompt_version = -1;

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

// The keys and values a finished request left (keep_cache).
struct KeptCache {
  std::vector<TokenId> tokens;              // the positions held
  PolicyVersion version = -1;               // the weights serving when it finished
  std::vector<torch::Tensor> keys, values;  // per layer: [kv heads, tokens, head dim]
  int64_t bytes = 0;
  uint64_t age = 0;  // order kept (the oldest is dropped first)
};

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
  Status broken;                                 // sticky: set when libtorch failed mid-step
  std::unordered_map<uint64_t, KeptCache> kept;  // by request id
  int64_t kept_bytes = 0;
  uint64_t kept_age = 0;

  void DropKept(std::unordered_map<uint64_t, KeptCache>::iterator it) {
    kept_bytes -= it->second.bytes;
    kept.erase(it);
  }

  // Keeps the cache of the sequence in `slot` (finished, its slot not yet
  // freed), dropping the oldest kept ones to make room.
  void Keep(int64_t slot) {
    const Sequence& s = *slots[slot];
    const int64_t len = s.next_position();  // positions [0, len) hold keys and values
    if (len <= 0) return;
    if (auto old = kept.find(s.request.id); old != kept.end()) DropKept(old);
    int64_t bytes = 0;
    for (size_t l = 0; l < cache.keys.size(); ++l) {
      bytes += 2 * cache.keys[l][slot].narrow(1, 0, len).numel() * cache.keys[l].element_size();
    }
    if (bytes > options.kept_cache_bytes) {
      ++stats.caches_dropped;
      return;
    }
    while (kept_bytes + bytes > options.kept_cache_bytes && !kept.empty()) {
      auto oldest = std::min_element(kept.begin(), kept.end(),
                                     [](const auto& a, const auto& b) { return a.second.age < b.second.age; });
      DropKept(oldest);
      ++stats.caches_dropped;
    }
    KeptCache k;
    k.tokens = s.request.prompt;
    k.tokens.insert(k.tokens.end(), s.result.tokens.begin(), s.result.tokens.end() - 1);
    k.version = policy.version;
    for (size_t l = 0; l < cache.keys.size(); ++l) {
      k.keys.push_back(cache.keys[l][slot].narrow(1, 0, len).clone());
      k.values.push_back(cache.values[l][slot].narrow(1, 0, len).clone());
    }
    k.bytes = bytes;
    k.age = kept_age++;
    kept_bytes += bytes;
    kept[s.request.id] = std::move(k);
    ++stats.caches_kept;
  }

  // Positions of the prompt in `slot` that a kept cache of its request fills
  // (copied in); 0 when there is none it may use (an unusable one is
  // dropped).
  int64_t Resume(int64_t slot) {
    const Sequence& s = *slots[slot];
    auto it = kept.find(s.request.id);
    if (it == kept.end()) return 0;
    const KeptCache& k = it->second;
    const auto len = static_cast<int64_t>(k.tokens.size());
    const bool usable = len < s.prompt_len() &&
                        std::equal(k.tokens.begin(), k.tokens.end(), s.request.prompt.begin()) &&
                        (options.switch_policy == SwitchPolicy::kInFlight || k.version == policy.version);
    if (!usable) {
      DropKept(it);
      ++stats.caches_dropped;
      return 0;
    }
    for (size_t l = 0; l < cache.keys.size(); ++l) {
      cache.keys[l][slot].narrow(1, 0, len).copy_(k.keys[l]);
      cache.values[l][slot].narrow(1, 0, len).copy_(k.values[l]);
    }
    DropKept(it);
    ++stats.caches_reused;
    stats.kept_tokens += len;
    return len;
  }

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
      const auto& prompt = waiting.front().request.prompt;
      // A prompt admitted in this step already is computed once (Forward).
      const bool repeat =
          std::any_of(admitted.begin(), admitted.end(), [&](int64_t j) { return slots[j]->request.prompt == prompt; });
      const int64_t len = repeat ? 0 : static_cast<int64_t>(prompt.size());
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
  // prompt not already in the cache. Prompt sharing (GRPO groups): an admitted
  // request whose prompt another sequence has in the cache, computed by the
  // serving weights (admitted in this step, or running since one with these
  // weights), copies its keys/values and samples its first token from the
  // same last-position logits; the same weights on the same tokens give the
  // same result. Returns logits [running + admitted, V] in that order.
  // `running` in block order (PlanDecodeBlocks).
  torch::Tensor Forward(const std::vector<model::CachedBlock>& decode_blocks, const std::vector<int64_t>& running,
                        const std::vector<int64_t>& admitted) {
    std::vector<model::CachedBlock> blocks = decode_blocks;
    std::vector<int64_t> tokens;
    for (int64_t slot : running) tokens.push_back(slots[slot]->result.tokens.back());
    // Where each admitted prompt comes from: its own prefill block, or
    // another slot's cache (a running sequence, or a block of this pass).
    std::map<std::vector<TokenId>, int64_t> in_cache;  // prompt -> slot holding it
    if (!admitted.empty()) {
      for (int64_t slot : running) {
        const Sequence& s = *slots[slot];
        if (s.prompt_version == policy.version && s.prompt_logits.defined()) in_cache.emplace(s.request.prompt, slot);
      }
    }
    std::vector<std::pair<int64_t, int64_t>> copies;  // (source slot, admitted slot)
    std::vector<int64_t> prefilled;                   // admitted slots computed in this pass
    for (int64_t slot : admitted) {
      const auto& prompt = slots[slot]->request.prompt;
      auto [it, fresh] = in_cache.try_emplace(prompt, slot);
      if (!fresh) {
        copies.emplace_back(it->second, slot);
        continue;
      }
      prefilled.push_back(slot);
      // A kept cache of this request fills the positions it holds.
      const int64_t from = kept.empty() ? 0 : Resume(slot);
      const auto len = static_cast<int64_t>(prompt.size()) - from;
      blocks.push_back(model::CachedBlock{{slot}, {from}, len});
      tokens.insert(tokens.end(), prompt.begin() + from, prompt.end());
      stats.prefill_tokens += len;
    }
    auto packed = torch::tensor(tokens, torch::kInt64).to(device);
    auto logits = policy.model->ForwardBlocks(packed, blocks, &cache, /*last_only=*/true);
    const auto num_running = static_cast<int64_t>(running.size());
    for (size_t i = 0; i < prefilled.size(); ++i) {
      Sequence& s = *slots[prefilled[i]];
      s.prompt_logits = logits[num_running + static_cast<int64_t>(i)].clone();
      s.prompt_version = policy.version;
    }
    if (copies.empty()) return logits;
    for (const auto& [src, dst] : copies) {
      const Sequence& from = *slots[src];
      const auto len = static_cast<int64_t>(from.request.prompt.size());
      for (size_t l = 0; l < cache.keys.size(); ++l) {
        cache.keys[l][dst].narrow(1, 0, len).copy_(cache.keys[l][src].narrow(1, 0, len));
        cache.values[l][dst].narrow(1, 0, len).copy_(cache.values[l][src].narrow(1, 0, len));
      }
      slots[dst]->prompt_logits = from.prompt_logits;
      slots[dst]->prompt_version = policy.version;
      ++stats.shared_prefills;
    }
    // Rows in admission order: the running ones, then each admitted prompt's
    // last-position logits.
    std::vector<torch::Tensor> rows = {logits.narrow(0, 0, num_running)};
    for (int64_t slot : admitted) rows.push_back(slots[slot]->prompt_logits.unsqueeze(0));
    return torch::cat(rows);
  }

  // The decode blocks of a step, with `running` reordered to match. A model
  // that attends decode rows in place (the CPU kernels) takes them all as one
  // block. Otherwise the model attends per block over the block's longest context, so a block
  // that mixes a 500-token sequence with short ones computes (and reads from
  // the cache) 500 positions for every row; a block whose slots are not a
  // consecutive range also has its cache rows gathered (copied) in every
  // layer, and every block has a fixed cost. The sequences, sorted by
  // context, are split into the groups that minimise that estimate (exact
  // dynamic programme over the sorted order; n <= slots).
  std::vector<model::CachedBlock> PlanDecodeBlocks(std::vector<int64_t>& running) const {
    // Costs per layer in row-positions of attention: measured on CPU
    // (libtorch 1.13, OpenBLAS, one thread): ~90 ns per row-position, ~25 us
    // per block, a gather ~1/4 of the attention it feeds.
    constexpr double kBlockCost = 300, kGatherCost = 0.25;
    const size_t n = running.size();
    if (n == 0) return {};
    if (policy.model->AttendsDecodeRowsInPlace()) {  // each row over its own context: one block
      std::sort(running.begin(), running.end());
      model::CachedBlock block{running, {}, 1};
      for (int64_t slot : running) block.starts.push_back(slots[slot]->next_position());
      return {std::move(block)};
    }
    auto context = [&](int64_t slot) { return slots[slot]->next_position() + 1; };
    std::sort(running.begin(), running.end(),
              [&](int64_t a, int64_t b) { return context(a) != context(b) ? context(a) < context(b) : a < b; });
    std::vector<double> best(n + 1, 0);
    std::vector<size_t> first(n + 1, 0);  // best split: the last group is [first[j], j)
    for (size_t j = 1; j <= n; ++j) {
      best[j] = std::numeric_limits<double>::infinity();
      const auto longest = static_cast<double>(context(running[j - 1]));
      int64_t lo = running[j - 1], hi = running[j - 1];
      for (size_t i = j; i-- > 0;) {
        lo = std::min(lo, running[i]);
        hi = std::max(hi, running[i]);
        const auto rows = static_cast<int64_t>(j - i);
        const bool consecutive = hi - lo + 1 == rows;
        const double cost =
            best[i] + kBlockCost + static_cast<double>(rows) * longest * (consecutive ? 1 : 1 + kGatherCost);
        if (cost < best[j]) {
          best[j] = cost;
          first[j] = i;
        }
      }
    }
    std::vector<std::pair<size_t, size_t>> groups;
    for (size_t j = n; j > 0; j = first[j]) groups.emplace_back(first[j], j);
    std::vector<model::CachedBlock> blocks;
    std::vector<int64_t> ordered;
    for (auto g = groups.rbegin(); g != groups.rend(); ++g) {
      std::vector<int64_t> group(running.begin() + g->first, running.begin() + g->second);
      std::sort(group.begin(), group.end());  // a consecutive range is then read in place
      model::CachedBlock block{{}, {}, 1};
      for (int64_t slot : group) {
        block.slots.push_back(slot);
        block.starts.push_back(slots[slot]->next_position());
        ordered.push_back(slot);
      }
      blocks.push_back(std::move(block));
    }
    running = std::move(ordered);
    return blocks;
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
    const std::vector<model::CachedBlock> decode_blocks = PlanDecodeBlocks(running);

    std::vector<int64_t> order = running;  // slot of each logits row
    order.insert(order.end(), admitted.begin(), admitted.end());
    if (!running.empty()) {
      ++stats.decode_steps;
      stats.active_slot_steps += static_cast<int64_t>(running.size());
    }
    ++stats.steps;
    auto logits = Forward(decode_blocks, running, admitted);
    std::vector<SampleRow> rows;
    rows.reserve(order.size());
    for (int64_t s : order) rows.push_back(RowFor(*slots[s]));
    SampledTokens sampled = SampleTokens(logits, rows);

    std::vector<GenerationResult> finished;
    for (size_t r = 0; r < order.size(); ++r) {
      std::optional<Sequence>& slot = slots[order[r]];
      if (Append(*slot, sampled.tokens[r], sampled.logprobs[r])) {
        if (slot->request.keep_cache && options.kept_cache_bytes > 0) Keep(order[r]);
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
  if (options.kept_cache_bytes < 0) {
    return Status::InvalidArgument("engine.kept_cache_bytes must be >= 0, got " +
                                   std::to_string(options.kept_cache_bytes));
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
    // The cache in the model's dtype: a bfloat16 rollout model halves it.
    impl->cache = model::KvCache::Allocate(config, options.num_slots, impl->options.max_seq_len, impl->device,
                                           policy.model->compute_dtype());
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

void RolloutEngine::DropKeptCache(uint64_t id) {
  if (auto it = impl_->kept.find(id); it != impl_->kept.end()) impl_->DropKept(it);
}
int64_t RolloutEngine::kept_cache_bytes() const { return impl_->kept_bytes; }

void RolloutEngine::SetWeightSwapHook(WeightSwapHook hook) { impl_->hook = std::move(hook); }
Status RolloutEngine::PollWeights() {
  SLUICE_RETURN_IF_ERROR(impl_->broken);
  return impl_->MaybeSwapWeights();
}
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
    auto cache = model::KvCache::Allocate(config, batch, prompt_len + steps, device, policy.model->compute_dtype());
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
