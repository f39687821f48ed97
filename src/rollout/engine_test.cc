#include "sluice/rollout/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "common/testing/status_macros.h"
#include "sluice/model/decode_kernels_switch.h"
#include "sluice/model/transformer.h"

namespace sluice::rollout {
namespace {

using model::ModelConfig;
using model::Transformer;

std::shared_ptr<Transformer> TinyModel(uint64_t seed = 11) {
  ModelConfig c = *model::PresetModelConfig("tiny");
  c.max_position_embeddings = 96;
  auto m = std::make_shared<Transformer>(c, seed);
  // Sharpen the random model so sampled text is not uniform noise and EOS
  // (token 258) ends some sequences early: lengths vary, as in real rollouts.
  torch::NoGradGuard g;
  auto params = m->named_parameters();
  params["model.embed_tokens.weight"].mul_(12.0);
  params["model.embed_tokens.weight"][model::ByteTokenizer::kEos].mul_(2.5);
  return m;
}

std::vector<GenerationRequest> MixedRequests(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<GenerationRequest> out;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.id = 100 + i;
    int len = 1 + static_cast<int>(rng() % 12);
    for (int t = 0; t < len; ++t) r.prompt.push_back(static_cast<TokenId>(rng() % 256));
    r.sampling.seed = rng();
    r.sampling.max_new_tokens = 4 + static_cast<int>(rng() % 40);
    switch (i % 4) {
      case 0:
        r.sampling.temperature = 0.0f;
        break;
      case 1:
        r.sampling.temperature = 1.0f;
        break;
      case 2:
        r.sampling.temperature = 0.8f;
        r.sampling.top_k = 20;
        break;
      case 3:
        r.sampling.temperature = 1.2f;
        r.sampling.top_p = 0.9f;
        break;
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::unique_ptr<RolloutEngine> MakeEngine(std::shared_ptr<Transformer> m, int32_t slots,
                                          Scheduling scheduling = Scheduling::kContinuous) {
  EngineOptions o;
  o.num_slots = slots;
  o.scheduling = scheduling;
  auto engine = RolloutEngine::Create(PolicySnapshot{std::move(m), 1}, o);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

std::map<uint64_t, GenerationResult> ById(std::vector<GenerationResult> results) {
  std::map<uint64_t, GenerationResult> out;
  for (auto& r : results) out.emplace(r.id, std::move(r));
  return out;
}

void ExpectSameGeneration(const GenerationResult& got, const GenerationResult& want) {
  ASSERT_EQ(got.tokens, want.tokens) << "request " << want.id;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 1e-4) << want.id;
  EXPECT_EQ(got.versions, want.versions);
  EXPECT_EQ(got.finish, want.finish);
}

// Runs `check(kernels)` on both model paths: the CPU decode kernels (one
// decode block, each row over its own context) and libtorch (decode blocks
// split by context length, as on GPUs); the kernels are back on after.
template <typename Check>
void OnBothDecodePaths(Check check) {
  struct KernelsBackOn {
    ~KernelsBackOn() { model::SetDecodeKernelsEnabled(true); }
  } back_on;
  for (bool kernels : {true, false}) {
    SCOPED_TRACE(kernels ? "decode kernels" : "libtorch path");
    model::SetDecodeKernelsEnabled(kernels);
    check(kernels);
  }
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = TinyModel();
    requests_ = MixedRequests(14, 5);
    GenerateAlone();
  }
  void GenerateAlone() {
    alone_.clear();
    for (const auto& r : requests_) {  // each request generated alone, in a 1-slot engine
      auto engine = MakeEngine(model_, 1);
      ASSERT_TRUE(engine->Submit(r).ok());
      auto done = engine->RunUntilIdle();
      ASSERT_TRUE(done.ok()) << done.status().ToString();
      ASSERT_EQ(done->size(), 1u);
      alone_.emplace(r.id, std::move(done->front()));
    }
  }
  void CheckContinuousBatchingMatchesAlone();
  std::shared_ptr<Transformer> model_;
  std::vector<GenerationRequest> requests_;
  std::map<uint64_t, GenerationResult> alone_;
};

TEST_F(EngineTest, WorkloadHasVariedLengthsAndFinishReasons) {
  std::set<size_t> lengths;
  std::set<TokenId> distinct;
  int eos = 0;
  for (const auto& [id, r] : alone_) {
    lengths.insert(r.tokens.size());
    distinct.insert(r.tokens.begin(), r.tokens.end());
    eos += r.finish == FinishReason::kEos;
    EXPECT_EQ(r.versions, std::vector<PolicyVersion>(r.tokens.size(), 1));
    EXPECT_EQ(r.logprobs.size(), r.tokens.size());
  }
  EXPECT_GE(lengths.size(), 4u);
  EXPECT_GE(distinct.size(), 20u) << "sampled text should not be degenerate";
  EXPECT_GE(eos, 1);
  EXPECT_LT(eos, static_cast<int>(alone_.size()));
}

// On both model paths: the CPU decode kernels (one decode block, each row
// over its own context) and libtorch (decode blocks split by context length,
// as on GPUs).
TEST_F(EngineTest, ContinuousBatchingMatchesGeneratingEachRequestAlone) {
  OnBothDecodePaths([&](bool kernels) {
    if (!kernels) GenerateAlone();
    CheckContinuousBatchingMatchesAlone();
  });
}

void EngineTest::CheckContinuousBatchingMatchesAlone() {
  std::mt19937_64 rng(3);
  for (int32_t slots : {2, 3, 5, 16}) {
    for (int order = 0; order < 2; ++order) {
      auto shuffled = requests_;
      std::shuffle(shuffled.begin(), shuffled.end(), rng);
      auto engine = MakeEngine(model_, slots);
      // Half arrive up front, the rest one per step while others run.
      size_t next = 0;
      for (; next < shuffled.size() / 2; ++next) ASSERT_TRUE(engine->Submit(shuffled[next]).ok());
      std::vector<GenerationResult> all;
      while (!engine->idle() || next < shuffled.size()) {
        if (next < shuffled.size()) {
          ASSERT_TRUE(engine->Submit(shuffled[next++]).ok());
        }
        auto done = engine->Step();
        ASSERT_TRUE(done.ok()) << done.status().ToString();
        for (auto& r : *done) all.push_back(std::move(r));
      }
      auto got = ById(std::move(all));
      ASSERT_EQ(got.size(), alone_.size()) << "slots " << slots;
      for (const auto& [id, want] : alone_) ExpectSameGeneration(got.at(id), want);
      EXPECT_LE(engine->stats().active_slot_steps, engine->stats().decode_steps * slots);
    }
  }
}

TEST_F(EngineTest, RequestsWithTheSamePromptShareOnePrefill) {
  // GRPO groups: four answers per prompt, different seeds and sampling. Each
  // answer must be what it is alone; a group admitted in one step computes
  // its prompt once.
  std::vector<GenerationRequest> grouped;
  std::map<uint64_t, GenerationResult> want;
  int64_t prompt_tokens = 0;
  for (size_t p = 0; p < 3; ++p) {
    prompt_tokens += static_cast<int64_t>(requests_[p].prompt.size());
    for (size_t g = 0; g < 4; ++g) {
      GenerationRequest r = requests_[(p + g) % requests_.size()];
      r.id = 1000 + 10 * p + g;
      r.prompt = requests_[p].prompt;
      auto alone = MakeEngine(model_, 1);
      ASSERT_TRUE(alone->Submit(r).ok());
      auto done = alone->RunUntilIdle();
      ASSERT_TRUE(done.ok()) << done.status().ToString();
      want.emplace(r.id, std::move(done->front()));
      grouped.push_back(std::move(r));
    }
  }
  auto engine = MakeEngine(model_, 12);
  for (const auto& r : grouped) ASSERT_TRUE(engine->Submit(r).ok());
  auto got = engine->RunUntilIdle();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  auto by_id = ById(std::move(*got));
  ASSERT_EQ(by_id.size(), want.size());
  for (const auto& [id, w] : want) ExpectSameGeneration(by_id.at(id), w);
  EXPECT_EQ(engine->stats().prefill_tokens, prompt_tokens);
  EXPECT_EQ(engine->stats().shared_prefills, 9);

  // Slots for only part of a group: the rest join later, copying the prompt
  // from a running member.
  auto small = MakeEngine(model_, 3);
  for (const auto& r : grouped) ASSERT_TRUE(small->Submit(r).ok());
  auto got_small = small->RunUntilIdle();
  ASSERT_TRUE(got_small.ok()) << got_small.status().ToString();
  auto small_by_id = ById(std::move(*got_small));
  for (const auto& [id, w] : want) ExpectSameGeneration(small_by_id.at(id), w);
  EXPECT_GE(small->stats().prefill_tokens, prompt_tokens);
  EXPECT_GT(small->stats().shared_prefills, 0);
}

TEST_F(EngineTest, StaticBatchingGivesTheSameTokensWithLowerOccupancy) {
  auto cont = MakeEngine(model_, 4), stat = MakeEngine(model_, 4, Scheduling::kStatic);
  for (const auto& r : requests_) {
    ASSERT_TRUE(cont->Submit(r).ok());
    ASSERT_TRUE(stat->Submit(r).ok());
  }
  auto a = cont->RunUntilIdle();
  auto b = stat->RunUntilIdle();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  auto sa = ById(std::move(*a)), sb = ById(std::move(*b));
  for (const auto& [id, want] : alone_) {
    ExpectSameGeneration(sa.at(id), want);
    ExpectSameGeneration(sb.at(id), want);
  }
  EXPECT_EQ(cont->stats().generated_tokens, stat->stats().generated_tokens);
  EXPECT_LT(cont->stats().decode_steps, stat->stats().decode_steps);
  EXPECT_GT(cont->stats().occupancy(4), stat->stats().occupancy(4));
}

TEST_F(EngineTest, GreedyIsDeterministicAndSeedsMatter) {
  GenerationRequest r = requests_[1];  // temperature 1
  r.sampling.max_new_tokens = 30;
  r.sampling.forced_length = 30;
  auto run = [&](GenerationRequest req) {
    auto engine = MakeEngine(model_, 2);
    EXPECT_TRUE(engine->Submit(std::move(req)).ok());
    return std::move(engine->RunUntilIdle()->front());
  };
  auto a = run(r), b = run(r);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.logprobs, b.logprobs);
  GenerationRequest other = r;
  other.sampling.seed ^= 0x5555;
  EXPECT_NE(run(other).tokens, a.tokens);
  GenerationRequest greedy = r;
  greedy.sampling.temperature = 0.0f;
  auto g1 = run(greedy);
  greedy.sampling.seed = 999;  // the seed does not matter for greedy
  EXPECT_EQ(run(greedy).tokens, g1.tokens);
}

TEST_F(EngineTest, ForcedLengthIgnoresEosAndLengthsStopAtTheirLimits) {
  const GenerationResult& first = alone_.at(requests_[0].id);  // greedy
  EngineOptions o;
  o.num_slots = 2;
  o.eos_token_id = first.tokens[0];  // the greedy first token now counts as EOS
  auto engine = std::move(RolloutEngine::Create(PolicySnapshot{model_, 1}, o)).value();
  GenerationRequest stop = requests_[0], forced = requests_[0];
  forced.id = 1;
  forced.sampling.forced_length = 7;
  ASSERT_TRUE(engine->Submit(stop).ok());
  ASSERT_TRUE(engine->Submit(forced).ok());
  auto done = ById(*engine->RunUntilIdle());
  EXPECT_EQ(done.at(stop.id).tokens.size(), 1u);
  EXPECT_EQ(done.at(stop.id).finish, FinishReason::kEos);
  EXPECT_EQ(done.at(1).tokens.size(), 7u);
  EXPECT_EQ(done.at(1).finish, FinishReason::kForcedLength);
  EXPECT_EQ(done.at(1).tokens[0], first.tokens[0]);

  // max_new_tokens, and the context cap when the prompt nearly fills it.
  EngineOptions small;
  small.num_slots = 1;
  small.max_seq_len = 12;
  small.eos_token_id = 0;  // byte 0 never appears: only lengths stop
  auto capped = std::move(RolloutEngine::Create(PolicySnapshot{model_, 1}, small)).value();
  GenerationRequest r;
  r.id = 5;
  r.prompt = std::vector<TokenId>(9, 65);
  r.sampling.max_new_tokens = 100;
  ASSERT_TRUE(capped->Submit(r).ok());
  auto out = capped->RunUntilIdle();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->front().tokens.size(), 3u);
  EXPECT_EQ(out->front().finish, FinishReason::kLength);
}

// Qwen3 (q/k head norms, head_dim apart from hidden/heads) and Llama 3.1's
// rope_scaling through the engine: greedy decoding over the KV cache, with
// other requests batched alongside, picks what a full recomputation of the
// sequence picks at every step, and logs its probability.
// Kept caches (multi-turn): each request's second turn (its first turn's
// prompt and tokens and three more tokens, the same id) generates exactly
// what it generates prefilled from scratch, whether its first turn's cache
// was kept (and only the rest prefilled) or not; a second turn that does not
// continue its first drops the kept cache and is prefilled whole; nothing is
// left kept after. Fails if a kept cache is copied to the wrong positions,
// the rest is prefilled from the wrong start, the last sampled token's
// position is taken as computed, or a cache is used for another prompt.
TEST_F(EngineTest, KeptCachesContinueSequencesExactly) {
  OnBothDecodePaths([&](bool) {
    std::map<uint64_t, GenerationResult> second[2];
    int64_t kept_positions = 0;
    for (int kept = 0; kept < 2; ++kept) {
      EngineOptions o;
      o.num_slots = 3;
      o.kept_cache_bytes = kept ? 1 << 22 : 0;
      SLUICE_ASSERT_OK_AND_ASSIGN(auto engine, RolloutEngine::Create(PolicySnapshot{model_, 1}, o));
      std::vector<GenerationRequest> firsts = requests_;
      for (auto& r : firsts) {
        r.keep_cache = true;
        ASSERT_TRUE(engine->Submit(r).ok());
      }
      SLUICE_ASSERT_OK_AND_ASSIGN(auto done, engine->RunUntilIdle());
      EXPECT_EQ(engine->stats().caches_kept, kept ? static_cast<int64_t>(firsts.size()) : 0);
      for (const GenerationResult& r : done) {
        GenerationRequest next;
        next.id = r.id;
        next.prompt = r.prompt;
        next.prompt.insert(next.prompt.end(), r.tokens.begin(), r.tokens.end());
        // Request 100's second turn starts differently: its kept cache does not apply.
        if (r.id == 100) next.prompt[0] = (next.prompt[0] + 1) % 256;
        for (TokenId t : {10, 32, 65}) next.prompt.push_back(t);
        next.sampling = requests_[r.id - 100].sampling;
        next.sampling.max_new_tokens = 8;
        if (kept && r.id != 100) kept_positions += static_cast<int64_t>(r.prompt.size() + r.tokens.size()) - 1;
        ASSERT_TRUE(engine->Submit(next).ok());
      }
      SLUICE_ASSERT_OK_AND_ASSIGN(auto again, engine->RunUntilIdle());
      second[kept] = ById(std::move(again));
      EXPECT_EQ(engine->stats().caches_reused, kept ? static_cast<int64_t>(firsts.size()) - 1 : 0);
      EXPECT_EQ(engine->stats().caches_dropped, kept ? 1 : 0);
      EXPECT_EQ(engine->stats().kept_tokens, kept_positions);
      EXPECT_EQ(engine->kept_cache_bytes(), 0);  // each second turn took (or dropped) its cache
    }
    ASSERT_EQ(second[0].size(), requests_.size());
    ASSERT_EQ(second[1].size(), requests_.size());
    for (const auto& [id, want] : second[0]) ExpectSameGeneration(second[1].at(id), want);
  });
}

// A budget that holds some of the caches: the oldest are dropped first.
TEST_F(EngineTest, KeptCachesPastTheBudgetDropTheOldest) {
  EngineOptions o;
  o.num_slots = 1;  // one request at a time: they finish (and are kept) in order
  // tiny: 2 layers x (keys + values) x 2 kv heads x 8 dims x 4 bytes = 256 bytes a position.
  o.kept_cache_bytes = 256 * 3 * 40;
  SLUICE_ASSERT_OK_AND_ASSIGN(auto engine, RolloutEngine::Create(PolicySnapshot{model_, 1}, o));
  for (uint64_t id = 0; id < 6; ++id) {
    GenerationRequest r;
    r.id = id;
    r.prompt.assign(20, static_cast<TokenId>(65 + id));
    r.sampling.forced_length = 21;  // 40 positions computed
    r.keep_cache = true;
    ASSERT_TRUE(engine->Submit(r).ok());
    ASSERT_TRUE(engine->RunUntilIdle().ok());
  }
  EXPECT_EQ(engine->stats().caches_kept, 6);
  EXPECT_EQ(engine->stats().caches_dropped, 3);
  EXPECT_EQ(engine->kept_cache_bytes(), 256 * 3 * 40);
  engine->DropKeptCache(5);
  EXPECT_EQ(engine->kept_cache_bytes(), 256 * 2 * 40);
}

TEST(EngineArchitectures, CachedGreedyDecodingMatchesFullRecomputation) {
  ModelConfig qwen3 = *model::PresetModelConfig("tiny");
  qwen3.model_type = "qwen3";
  qwen3.head_dim = 16;
  ModelConfig llama31 = *model::PresetModelConfig("tiny");
  llama31.rope_scaling = model::RopeScaling{"llama3", 8.0, 1.0, 4.0, 32};
  for (ModelConfig c : {qwen3, llama31}) {
    SCOPED_TRACE(c.model_type + (c.rope_scaling.type.empty() ? "" : " rope_scaling llama3"));
    c.max_position_embeddings = 96;
    auto m = std::make_shared<Transformer>(c, 21);
    {
      torch::NoGradGuard g;
      auto gen = at::detail::createCPUGenerator(22);
      for (auto& p : m->parameters()) p.add_(torch::randn(p.sizes(), gen) * 0.1);  // norms away from 1
      m->named_parameters()["model.embed_tokens.weight"].mul_(12.0);
    }
    auto engine = MakeEngine(m, 4);
    std::vector<GenerationRequest> requests = MixedRequests(6, 9);
    for (auto& r : requests) {
      r.sampling.forced_length = 40;  // long enough for positions past the scaled context
      ASSERT_TRUE(engine->Submit(r).ok());
    }
    auto done = engine->RunUntilIdle();
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    auto got = ById(std::move(*done));
    int64_t checked = 0;
    for (const auto& r : requests) {
      if (r.sampling.temperature != 0.0f) continue;
      const GenerationResult& g = got.at(r.id);
      std::vector<int64_t> seq(r.prompt.begin(), r.prompt.end());
      torch::NoGradGuard no_grad;
      for (size_t t = 0; t < g.tokens.size(); ++t) {
        auto logits = m->Forward(torch::tensor(seq, torch::kInt64).unsqueeze(0))[0][-1];
        const auto logprobs = torch::log_softmax(logits, -1);
        const int64_t want = logprobs.argmax().item<int64_t>();
        ASSERT_EQ(g.tokens[t], want) << "token " << t << " of request " << r.id;
        EXPECT_NEAR(g.logprobs[t], logprobs[want].item<float>(), 1e-4) << "token " << t;
        seq.push_back(want);
        ++checked;
      }
    }
    EXPECT_GE(checked, 40) << "greedy requests decoded";
  }
}

TEST(EngineBadInput, ClearErrorsNeverCrashes) {
  auto m = TinyModel();
  EngineOptions zero;
  zero.num_slots = 0;
  auto e = RolloutEngine::Create(PolicySnapshot{m, 1}, zero);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("num_slots"), std::string::npos);
  EngineOptions too_long;
  too_long.max_seq_len = 10000;
  EXPECT_NE(RolloutEngine::Create(PolicySnapshot{m, 1}, too_long).status().message().find("max_seq_len"),
            std::string::npos);
  EXPECT_EQ(RolloutEngine::Create(PolicySnapshot{nullptr, 1}, EngineOptions{}).status().code(),
            StatusCode::kInvalidArgument);

  auto engine = std::move(RolloutEngine::Create(PolicySnapshot{m, 1}, EngineOptions{})).value();
  auto expect = [&](GenerationRequest r, StatusCode code, const char* needle) {
    Status s = engine->Submit(std::move(r));
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
  };
  GenerationRequest ok;
  ok.id = 1;
  ok.prompt = {1, 2, 3};
  GenerationRequest r = ok;
  r.prompt.clear();
  expect(r, StatusCode::kInvalidArgument, "empty prompt");
  r = ok;
  r.prompt = {1, 259};
  expect(r, StatusCode::kInvalidArgument, "259");
  r = ok;
  r.prompt.assign(96, 7);
  expect(r, StatusCode::kOutOfRange, "no room");
  r = ok;
  r.prompt.assign(200, 7);
  expect(r, StatusCode::kOutOfRange, "200 tokens");
  r = ok;
  r.sampling.forced_length = 94;
  expect(r, StatusCode::kOutOfRange, "forced_length");
  r = ok;
  r.sampling.temperature = -1;
  expect(r, StatusCode::kInvalidArgument, "temperature");
  r = ok;
  r.sampling.temperature = NAN;
  expect(r, StatusCode::kInvalidArgument, "temperature");
  r = ok;
  r.sampling.top_p = 0;
  expect(r, StatusCode::kInvalidArgument, "top_p");
  r = ok;
  r.sampling.top_k = -3;
  expect(r, StatusCode::kInvalidArgument, "top_k");
  r = ok;
  r.sampling.max_new_tokens = 0;
  expect(r, StatusCode::kInvalidArgument, "max_new_tokens");
  ASSERT_TRUE(engine->Submit(ok).ok());
  expect(ok, StatusCode::kAlreadyExists, "already in flight");
  // The rejected requests left nothing behind.
  EXPECT_EQ(engine->num_waiting(), 1u);
  auto done = engine->RunUntilIdle();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->size(), 1u);
  EXPECT_TRUE(engine->Submit(ok).ok()) << "an id may be reused once its request finished";
}

// A model whose logits are all zero: every token it samples has logprob
// exactly -log(V), which makes the producing weights recoverable from output.
std::shared_ptr<Transformer> FlatModel(const Transformer& like) {
  auto m = std::make_shared<Transformer>(like.config(), 1);
  torch::NoGradGuard g;
  m->named_parameters()["model.norm.weight"].zero_();
  return m;
}

TEST(EngineWeightSwap, EveryTokenRecordsTheWeightsThatProducedIt) {
  auto v1 = TinyModel();
  auto v2 = FlatModel(*v1);
  const double flat_logprob = -std::log(static_cast<double>(v1->config().vocab_size));
  EngineOptions o;
  o.num_slots = 3;
  o.eos_token_id = 0;
  auto engine = std::move(RolloutEngine::Create(PolicySnapshot{v1, 1}, o)).value();
  int steps = 0;
  engine->SetWeightSwapHook([&](PolicyVersion current) -> std::optional<PolicySnapshot> {
    if (steps == 6 && current == 1) return PolicySnapshot{v2, 2};
    return std::nullopt;
  });
  // One prompt for all (a group): answers admitted after the switch must not
  // reuse the prompt computed by the old weights (they would start with a
  // version-1 token recorded as version 2), but share the new one.
  auto requests = MixedRequests(6, 9);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].prompt = requests[0].prompt;
    requests[i].sampling.forced_length = 8 + 4 * static_cast<int32_t>(i);
    ASSERT_TRUE(engine->Submit(requests[i]).ok());
  }
  std::vector<GenerationResult> all;
  while (!engine->idle()) {
    auto done = engine->Step();
    ++steps;
    ASSERT_TRUE(done.ok());
    for (auto& r : *done) all.push_back(std::move(r));
  }
  EXPECT_EQ(engine->stats().weight_swaps, 1);
  EXPECT_EQ(engine->policy_version(), 2);
  int v1_tokens = 0, v2_tokens = 0;
  for (const auto& r : all) {
    ASSERT_EQ(r.versions.size(), r.tokens.size());
    EXPECT_TRUE(std::is_sorted(r.versions.begin(), r.versions.end()));
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      bool flat = std::abs(r.logprobs[i] - flat_logprob) < 1e-5;
      EXPECT_EQ(flat, r.versions[i] == 2) << "request " << r.id << " token " << i;
      (r.versions[i] == 1 ? v1_tokens : v2_tokens)++;
    }
  }
  EXPECT_GT(v1_tokens, 0);
  EXPECT_GT(v2_tokens, 0);
  EXPECT_GT(engine->stats().shared_prefills, 0);
}

TEST(EngineWeightSwap, OlderVersionOrOtherArchitectureIsRefused) {
  auto v1 = TinyModel();
  auto engine = std::move(RolloutEngine::Create(PolicySnapshot{v1, 5}, EngineOptions{})).value();
  engine->SetWeightSwapHook([&](PolicyVersion) { return std::optional<PolicySnapshot>(PolicySnapshot{v1, 5}); });
  GenerationRequest r;
  r.id = 1;
  r.prompt = {1, 2};
  ASSERT_TRUE(engine->Submit(r).ok());
  auto s = engine->Step();
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  ModelConfig other = v1->config();
  other.num_hidden_layers = 3;
  engine->SetWeightSwapHook([&](PolicyVersion) {
    return std::optional<PolicySnapshot>(PolicySnapshot{std::make_shared<Transformer>(other, 1), 6});
  });
  s = engine->Step();
  EXPECT_NE(s.status().message().find("architecture"), std::string::npos) << s.status().ToString();
  engine->SetWeightSwapHook(nullptr);
  auto done = engine->RunUntilIdle();
  ASSERT_TRUE(done.ok()) << "a refused swap leaves the engine serving version 5";
  EXPECT_EQ(done->front().versions.front(), 5);
}

// PollWeights takes a version between steps without decoding: under
// kInFlight it switches at once (the sequence then spans both versions),
// under kAtBoundary it waits as pending until the sequences in flight end.
TEST(EngineWeightSwap, PollWeightsSwitchesWithoutDecoding) {
  auto v1 = TinyModel();
  auto v2 = FlatModel(*v1);
  for (SwitchPolicy policy : {SwitchPolicy::kInFlight, SwitchPolicy::kAtBoundary}) {
    SCOPED_TRACE(policy == SwitchPolicy::kInFlight ? "in_flight" : "at_boundary");
    EngineOptions o;
    o.num_slots = 1;
    o.eos_token_id = 0;
    o.switch_policy = policy;
    auto engine = std::move(RolloutEngine::Create(PolicySnapshot{v1, 1}, o)).value();
    GenerationRequest r;
    r.id = 1;
    r.prompt = {1, 2};
    r.sampling.max_new_tokens = 6;
    r.sampling.forced_length = 6;
    ASSERT_TRUE(engine->Submit(r).ok());
    ASSERT_TRUE(engine->Step().ok());  // admitted: its first token, version 1
    bool offered = false;
    engine->SetWeightSwapHook([&](PolicyVersion current) -> std::optional<PolicySnapshot> {
      if (current != 1 || offered) return std::nullopt;
      offered = true;
      return PolicySnapshot{v2, 2};
    });
    const int64_t decoded = engine->stats().generated_tokens;
    ASSERT_TRUE(engine->PollWeights().ok());
    EXPECT_TRUE(offered);
    EXPECT_EQ(engine->stats().generated_tokens, decoded) << "PollWeights decoded";
    if (policy == SwitchPolicy::kInFlight) {
      EXPECT_EQ(engine->policy_version(), 2);
      EXPECT_FALSE(engine->pending_version().has_value());
    } else {
      EXPECT_EQ(engine->policy_version(), 1);
      EXPECT_EQ(engine->pending_version(), std::optional<PolicyVersion>(2));
    }
    auto done = engine->RunUntilIdle();
    ASSERT_TRUE(done.ok());
    ASSERT_EQ(done->size(), 1u);
    const std::vector<PolicyVersion>& versions = done->front().versions;
    ASSERT_EQ(versions.size(), 6u);
    EXPECT_EQ(versions.front(), 1);
    EXPECT_EQ(versions.back(), policy == SwitchPolicy::kInFlight ? 2 : 1);
    ASSERT_TRUE(engine->PollWeights().ok());
    EXPECT_EQ(engine->policy_version(), 2) << "the pending version is taken once the sequence ends";
  }
}

TEST(LockstepDecode, DecodesTheRequestedTokens) {
  auto m = TinyModel();
  auto n = RunLockstepDecode(PolicySnapshot{m, 1}, 4, 5, 12, 1);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 48);
  EXPECT_FALSE(RunLockstepDecode(PolicySnapshot{m, 1}, 4, 90, 12, 1).ok());
}

}  // namespace
}  // namespace sluice::rollout
