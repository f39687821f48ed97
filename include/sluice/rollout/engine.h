// The rollout engine: generation with a preallocated KV cache and continuous
// batching over a fixed number of slots.
//
// Each Step() is one scheduling round on one weight snapshot:
//   1. the weight-swap hook runs; a snapshot it returns serves from now on
//      (so one forward pass never mixes two weight sets);
//   2. waiting requests take free slots (continuous mode: any free slot;
//      static mode: only when every slot is free);
//   3. one forward pass decodes one token for every running sequence and
//      prefills the newly admitted prompts (which samples their first token);
//   4. finished sequences leave their slots, which step 2 refills next time.
// Every generated token records its log-probability and the policy version
// that produced it.
//
// Sampling is a pure function of (logits row, request's SamplingParams, token
// index): each request draws from its own counter-based random stream seeded
// by SamplingParams::seed, so a request's output does not depend on which other
// requests share the batch, the slot count, or arrival order.
//
// Logprobs are log-softmax(logits / T) of the sampled token, before top-k /
// top-p truncation (T = 1 for greedy): the distribution a trainer recomputes.
//
// Kept caches: a request with keep_cache leaves its keys and values (every
// position computed: its prompt and its tokens but the last, which was never
// fed back) in the engine's memory when it finishes, while the caches kept
// fit EngineOptions::kept_cache_bytes (else the oldest are dropped). A later
// request with the same id whose prompt begins with exactly those tokens
// copies them into its slot and prefills only the rest. Under kInFlight the
// cache may have been computed by older weights, as a sequence in flight
// across a switch continues on its cache; under kAtBoundary only the same
// weights' cache is used. A trajectory waiting for its environment holds no
// slot, and its next turn does not compute its context again.
//
// Thread safety: not thread-safe; one owner thread calls everything. Other
// threads hand in new weights through the hook (which the engine calls on its
// own thread between steps).
#ifndef SLUICE_ROLLOUT_ENGINE_H_
#define SLUICE_ROLLOUT_ENGINE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "sluice/common/ids.h"
#include "sluice/common/status.h"
#include "sluice/model/tokenizer.h"

namespace sluice::model {
class Transformer;
}

namespace sluice::rollout {

using model::TokenId;
using sluice::PolicyVersion;  // sluice/common/ids.h

// The smallest temperature that samples (0 is greedy); below it logits /
// temperature overflow float.
inline constexpr float kMinTemperature = 1e-3f;

struct SamplingParams {
  float temperature = 1.0f;      // 0: greedy (argmax); else >= kMinTemperature
  int32_t top_k = 0;             // 0: no top-k truncation
  float top_p = 1.0f;            // 1: no nucleus truncation; in (0, 1]
  uint64_t seed = 0;             // the request's own random stream
  int32_t max_new_tokens = 256;  // also capped by the engine's context length
  // > 0: generate exactly this many tokens whatever is sampled (EOS included);
  // for throughput benchmarks that fix response lengths up front.
  int32_t forced_length = 0;

  // InvalidArgument naming the field.
  Status Validate() const;
};

struct GenerationRequest {
  uint64_t id = 0;  // caller's id, returned in the result; unique among requests in flight
  std::vector<TokenId> prompt;
  SamplingParams sampling;
  // Multi-turn callers (agent trajectories): keep this sequence's keys and
  // values when it finishes, within EngineOptions::kept_cache_bytes, for
  // the next request of the same id whose prompt continues it (see Kept
  // caches in the file comment).
  bool keep_cache = false;
};

enum class FinishReason { kEos, kLength, kForcedLength };
const char* FinishReasonName(FinishReason reason);

struct GenerationResult {
  uint64_t id = 0;
  std::vector<TokenId> prompt;
  std::vector<TokenId> tokens;          // response, EOS included when sampled
  std::vector<float> logprobs;          // one per token
  std::vector<PolicyVersion> versions;  // one per token: the weights that produced it
  FinishReason finish = FinishReason::kLength;
};

// An immutable weight set and its version. The engine only reads the model.
struct PolicySnapshot {
  std::shared_ptr<model::Transformer> model;
  PolicyVersion version = 0;
};

// Called between steps with the version being served; returns a newer
// snapshot to switch to, or nullopt to keep the current one. The engine owns a
// returned snapshot from then on; with SwitchPolicy::kAtBoundary it may wait
// (pending) before serving it, and the hook is not called while one is pending.
// Once the hook sees `current` equal to a snapshot's version, the engine no
// longer reads the snapshot it replaced.
using WeightSwapHook = std::function<std::optional<PolicySnapshot>(PolicyVersion current)>;

// When a snapshot handed in by the hook starts serving.
enum class SwitchPolicy {
  // At the next step: sequences in flight continue on the new weights (their
  // later tokens carry the new version; their KV cache was computed by the old
  // weights). No stall beyond the pointer swap.
  kInFlight,
  // Once the sequences in flight have finished on the old weights: while a
  // snapshot is pending, no waiting request is admitted; when no sequence is
  // running the snapshot starts serving. Every sequence is one version.
  kAtBoundary,
};

enum class Scheduling {
  kContinuous,  // a freed slot is refilled at the next step
  kStatic,      // a new batch starts only when the whole previous batch ended
};

struct EngineOptions {
  int32_t num_slots = 8;
  // Prompt + response positions per slot; 0: the model's max_position_embeddings.
  int32_t max_seq_len = 0;
  // Token that ends a sequence; -1: the model config's eos_token_id (if none, only lengths stop).
  TokenId eos_token_id = -1;
  Scheduling scheduling = Scheduling::kContinuous;
  SwitchPolicy switch_policy = SwitchPolicy::kInFlight;
  // Upper bound on prompt tokens prefilled in one step (new requests wait
  // beyond it); 0: no bound. Bounds the latency added to running sequences.
  int32_t max_prefill_tokens = 0;
  // Memory for the keys and values kept of finished sequences
  // (GenerationRequest::keep_cache), outside the slots; 0: none kept.
  int64_t kept_cache_bytes = 0;
};

struct EngineStats {
  int64_t steps = 0;         // Step() calls that ran a forward pass
  int64_t decode_steps = 0;  // steps with at least one decoding sequence
  int64_t generated_tokens = 0;
  int64_t prefill_tokens = 0;     // prompt tokens computed
  int64_t shared_prefills = 0;    // prompts copied from another request's (same step, or running on the same weights)
  int64_t active_slot_steps = 0;  // sum over decode steps of running sequences
  int64_t weight_swaps = 0;
  int64_t slot_compactions = 0;  // sequences moved to a lower slot
  // Kept caches (keep_cache): sequences whose cache was kept when they
  // finished; requests that continued one (their prompt's kept positions
  // copied, not computed, `kept_tokens` in all); caches dropped for the
  // budget (the oldest first), or not kept because one alone exceeds it,
  // or found unusable (another prompt; other weights under kAtBoundary).
  int64_t caches_kept = 0, caches_reused = 0, kept_tokens = 0, caches_dropped = 0;
  // Mean fraction of slots generating per decode step.
  double occupancy(int32_t num_slots) const {
    return decode_steps == 0 ? 0.0 : static_cast<double>(active_slot_steps) / (decode_steps * num_slots);
  }
};

class RolloutEngine {
 public:
  // Errors: InvalidArgument for zero or negative slots, a null model, or a
  // context longer than the model's max_position_embeddings.
  static Result<std::unique_ptr<RolloutEngine>> Create(PolicySnapshot policy, const EngineOptions& options);
  ~RolloutEngine();
  RolloutEngine(const RolloutEngine&) = delete;
  RolloutEngine& operator=(const RolloutEngine&) = delete;

  // Queues a request. Errors (request not queued): InvalidArgument (empty
  // prompt, token outside the vocabulary, bad sampling params), OutOfRange
  // (prompt leaves no room for a response in max_seq_len, or forced_length
  // does not fit), AlreadyExists (id already in flight).
  Status Submit(GenerationRequest request);

  // One scheduling round (see the file comment). Returns the requests that
  // finished in it. Errors: Internal if libtorch fails; the engine is then
  // broken and every later call returns the same error.
  Result<std::vector<GenerationResult>> Step();

  // Drops the cache kept for request `id` (a trajectory that ended), if any.
  void DropKeptCache(uint64_t id);
  // Bytes of the caches kept now.
  int64_t kept_cache_bytes() const;

  // Steps until no request is waiting or running; results in finish order.
  Result<std::vector<GenerationResult>> RunUntilIdle();

  void SetWeightSwapHook(WeightSwapHook hook);
  // Asks the weight-swap hook for newer weights, as Step does first, without
  // decoding: a caller that holds its sequences still sees a version land
  // (switched at once under kInFlight, pending under kAtBoundary).
  Status PollWeights();

  bool idle() const;
  int32_t num_running() const;
  size_t num_waiting() const;
  PolicyVersion policy_version() const;
  // The version handed in by the hook and waiting for the sequences in flight
  // to finish (SwitchPolicy::kAtBoundary); nullopt if none.
  std::optional<PolicyVersion> pending_version() const;
  const EngineOptions& options() const;
  const EngineStats& stats() const;

 private:
  struct Impl;
  explicit RolloutEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A plain decode loop at full batch, no scheduling: `batch` sequences with a
// `prompt_len`-token prompt each decode `steps` tokens in lockstep. The upper
// bound that continuous batching is measured against. Returns tokens decoded.
Result<int64_t> RunLockstepDecode(const PolicySnapshot& policy, int32_t batch, int32_t prompt_len, int32_t steps,
                                  uint64_t seed);

}  // namespace sluice::rollout

#endif  // SLUICE_ROLLOUT_ENGINE_H_
