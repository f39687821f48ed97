// `sluice plan` (docs/simulator.md, "GPU clusters"): given a model, a cluster
// and a length distribution, simulate the training policies people use
// under the same roofline costs, search the rollout:trainer split and the
// staleness, and recommend one; or reproduce a published regime.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sluice/common/file_util.h"
#include "sluice/launch/commands.h"
#include "sluice/launch/plan_report.h"
#include "sluice/model/config.h"
#include "sluice/runtime/flags.h"
#include "sluice/simulate/gpu.h"
#include "sluice/simulate/lengths.h"
#include "sluice/simulate/regime_fit.h"
#include "sluice/simulate/simulator.h"

namespace sluice::launch {
namespace {

using runtime::FlagSet;
using simulate::Policy;

// How one of a regime's parameters was set, and the values its sensitivity
// band tries (`--sensitivity`), the regime's own among them.
struct Band {
  const char* flag;    // a plan flag, or "baseline": the policy compared with
  const char* set_by;  // "fitted ...", "assumed", "source" (the publication's own)
  std::vector<std::string> values;
};

// A published setting: the flags that describe it, what was reported, and
// what is assumed where the publication does not say. `standing` says
// whether the simulated figure is fitted (the unknowns set from the same
// figures it is compared with) or predicted (set from other data).
struct Regime {
  const char* name;
  const char* standing;
  std::string source;
  std::string assumed;
  std::vector<std::pair<const char*, const char*>> flags;
  Policy published;  // the system's policy
  Policy baseline;   // what it was compared with
  double reported;   // its speedup over the baseline
  const char* reported_text;
  std::vector<Band> bands;
};

// verl's unknowns as `sluice plan --predictive-check` fits them on its
// 32-GPU runs (the first block of docs/simulator_predictive.txt).
constexpr const char* kVerlMedian = "150";
constexpr const char* kVerlSpread = "1.9";
constexpr const char* kVerlMfu = "0.99";
constexpr const char* kVerlSlowdown = "2.05";

// verl's fully asynchronous trainer at 32, 64 and 128 H20 (half generating).
Regime VerlAsync(const char* name, const char* standing, const char* gpus, const char* rollout_gpus,
                 const char* reported_text, double reported) {
  return {name,
          standing,
          "verl's fully asynchronous trainer, https://github.com/verl-project/verl/blob/"
          "1dda039b9c6311889a9c9a26040677e1254814f9/verl/experimental/fully_async_policy/README.md, table "
          "\"Asynchronous Training on 7B Model\" (reported: its 400-step total times), with shell/"
          "dapo_7b_math_fsdp2_{16_16,32_32,64_64}.sh at that commit: Qwen2.5-Math-7B, DAPO, H20, answers up to 28k "
          "tokens, 16 per prompt, 512 prompts per step, 16 mini-batches, engines of 4 GPUs (gen_tp), trainer ranks "
          "of 4 (sp_size), partial rollouts, against its colocated synchronous trainer on as many GPUs",
          "staleness 1, prompts of 256 tokens, 256 rows an engine; fitted to the 32-GPU runs' step, generation and "
          "training times (sluice plan --predictive-check): answers log-normal with median " +
              std::string(kVerlMedian) + " and spread " + kVerlSpread + ", MFU " + kVerlMfu +
              " for the separate trainer, the colocated trainer " + kVerlSlowdown + "x slower per token",
          {{"hardware", "h20"},
           {"gpus", gpus},
           {"model", "qwen2.5-7b"},
           {"prompt-tokens", "256"},
           {"max-response", "28672"},
           {"median", kVerlMedian},
           {"spread", kVerlSpread},
           {"prompts", "512"},
           {"group", "16"},
           {"staleness", "1"},
           {"rollout-gpus", rollout_gpus},
           {"rollout-tp", "4"},
           {"mini-batches", "16"},
           {"train-mp", "4"},
           {"mfu", kVerlMfu},
           {"colocated-train-slowdown", kVerlSlowdown}},
          Policy::kPartialRollout,
          Policy::kColocatedSync,
          reported,
          reported_text,
          {{"median", "fitted on the 32-GPU runs", {"120", kVerlMedian, "190"}},
           {"spread", "fitted on the 32-GPU runs", {"1.5", kVerlSpread, "2.3"}},
           {"mfu", "fitted on the 32-GPU runs", {"0.6", "0.8", kVerlMfu}},
           {"colocated-train-slowdown", "fitted on the 32-GPU runs", {"1", kVerlSlowdown, "2.4"}},
           {"train-mp", "source (sp_size 4)", {"2", "4", "8"}},
           {"prompt-tokens", "assumed", {"128", "256", "1024"}},
           {"staleness", "assumed", {"1", "2"}}}};
}

// AReaL (blog for v0.3, Table 2) on 16 and 24 nodes of 8 H800. The blog
// gives the hours, not the runs' configuration: that of AReaL's throughput
// benchmark (README and areal_config.yaml at kArealBenchmark) is assumed.
constexpr const char* kArealBenchmark =
    "https://github.com/inclusionAI/AReaL/blob/820ca498b72dca48fbdb14cdbcc14817a1f55624/benchmark/"
    "verl_v0_3_0_post1_76084d3/";
Regime Areal(const char* name, const char* table, const char* model, const char* gpus, const char* rollout_gpus,
             const char* train_mp, const char* reported_text, double reported) {
  return {name,
          "fitted: the baseline's reading (split_sync, not colocated) was chosen after comparing both with the "
          "reported speedup; the answer lengths are assumed, not fitted",
          std::string("AReaL, https://github.com/inclusionAI/AReaL/blob/4aef98d8d818af55b43621aaadba047ae10f4e77/"
                      "blog/AReaL_v0_3.md, Table 2: ") +
              table,
          std::string("the configuration of AReaL's throughput benchmark (") + kArealBenchmark +
              "README.md and areal_config.yaml): 512 prompts x 16 answers, answers up to 31k tokens, "
              "max_head_offpolicyness 4, 4 PPO mini-batches; not published: 3/4 of the GPUs generating, "
              "pipeline-parallel trainer ranks, answers log-normal with median 6000 and spread 0.9, prompts of 512 "
              "tokens, and which synchronous system it ran (read here as AReaL at staleness 0: generation and "
              "training on their own GPUs waiting for each other, split_sync; the colocated row shows the other "
              "reading)",
          {{"hardware", "h800"},
           {"gpus", gpus},
           {"model", model},
           {"prompt-tokens", "512"},
           {"max-response", "31744"},
           {"median", "6000"},
           {"spread", "0.9"},
           {"prompts", "512"},
           {"group", "16"},
           {"staleness", "4"},
           {"rollout-gpus", rollout_gpus},
           {"train-mp", train_mp},
           {"mini-batches", "4"},
           {"mfu", "0.4"}},
          Policy::kPartialRollout,
          Policy::kSplitSync,
          reported,
          reported_text,
          {{"baseline", "fitted (chosen after comparing)", {"split_sync", "colocated_sync"}},
           {"median", "assumed", {"4000", "6000", "9000"}},
           {"spread", "assumed", {"0.7", "0.9", "1.1"}},
           {"mfu", "assumed (Megatron-LM's 41-48% on H100)", {"0.3", "0.4", "0.5"}},
           {"prompt-tokens", "assumed", {"256", "512", "1024"}}}};
}

const std::vector<Regime>& Regimes() {
  static const std::vector<Regime> regimes = {
      {"seed-2k-16k",
       "assumed: no published setting to fit or predict; the figure is a target",
       "the figure this project set out to beat: 3.81x over a synchronous mode at prompt 2k -> response 16k "
       "(no source: its system, model and cluster not identified)",
       "Qwen2.5-7B on 64 H100, answers log-normal with median 4096 and spread 1.0 cut off at 16384, 128 prompts x "
       "16 answers per step, colocated synchronous baseline",
       {{"hardware", "h100"},
        {"gpus", "64"},
        {"model", "qwen2.5-7b"},
        {"prompt-tokens", "2048"},
        {"max-response", "16384"},
        {"median", "4096"},
        {"spread", "1.0"},
        {"prompts", "128"},
        {"group", "16"},
        {"mfu", "0.4"},
        {"switch-s", "5"}},
       Policy::kSluice,
       Policy::kColocatedSync,
       3.81,
       "3.81x",
       {{"median", "assumed", {"3072", "4096", "5120"}},
        {"spread", "assumed", {"0.8", "1.0", "1.2"}},
        {"mfu", "assumed (Megatron-LM's 41-48% on H100)", {"0.3", "0.4", "0.5"}},
        {"switch-s", "assumed", {"0", "5", "20"}}}},
      Areal("areal-1.5b",
            "R1-Distill-Qwen-1.5B, 16 nodes of 8 H800, 1000 PPO steps: synchronous 41.0 h, "
            "asynchronous 14.8 h",
            "r1-distill-qwen-1.5b", "128", "96", "2", "2.77x (41.0 h / 14.8 h)", 41.0 / 14.8),
      Areal("areal-7b",
            "R1-Distill-Qwen-7B, 24 nodes of 8 H800, 1000 PPO steps: synchronous 57.7 h, "
            "asynchronous 25.4 h",
            "qwen2.5-7b", "192", "144", "4", "2.27x (57.7 h / 25.4 h)", 57.7 / 25.4),
      VerlAsync("verl-async-7b-32",
                "fitted: its unknowns were fitted to this row's own step, generation and training times", "32", "16",
                "2.66x (3d17h5m / 1d9h26m, 16:16)", (89.0 * 60 + 5) / (33 * 60 + 26)),
      VerlAsync("verl-async-7b-64",
                "predicted: its unknowns were fitted to the 32-GPU rows of the same table; this row's times were "
                "not used",
                "64", "32", "1.92x (1d17h32m / 21h40m, 32:32)", (41.0 * 60 + 32) / (21 * 60 + 40)),
      VerlAsync("verl-async-7b",
                "predicted: its unknowns were fitted to the 32-GPU rows of the same table; this row's times were "
                "not used",
                "128", "64", "2.35x (1d16h48m / 17h22m, 64:64)", (40.0 * 60 + 48) / (17 * 60 + 22)),
  };
  return regimes;
}

std::string RegimeNames() {
  std::string out;
  for (const Regime& r : Regimes()) out += (out.empty() ? "" : ", ") + std::string(r.name);
  return out;
}

// Median and spread of a log-normal with the mean and longest answer a run's
// metrics report (`n` answers): mean = median e^(s^2/2), longest = median
// e^(s z) with z the n-th answer's normal quantile.
struct LengthFit {
  double median = 0, spread = 0, mean = 0;
  int64_t longest = 0, answers = 0, steps = 0;
};

Result<LengthFit> FitRunLengths(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open (a run's metrics.jsonl)");
  LengthFit fit;
  double tokens = 0;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::InvalidArgument(path + ":" + std::to_string(number) + ": not a JSON object");
    }
    if (!j.contains("response_len_mean")) continue;  // not a step's record
    const auto& mean = j["response_len_mean"];
    const auto& longest = j.value("response_len_max", nlohmann::json());
    const auto& samples = j.value("samples_trained", nlohmann::json());
    if (!mean.is_number() || !longest.is_number_integer() || !samples.is_number_integer() || mean.get<double>() < 0 ||
        longest.get<int64_t>() < 0 || samples.get<int64_t>() < 0) {
      return Status::InvalidArgument(path + ":" + std::to_string(number) +
                                     ": response_len_mean, response_len_max and samples_trained must be numbers >= 0");
    }
    tokens += mean.get<double>() * static_cast<double>(samples.get<int64_t>());
    fit.answers += samples.get<int64_t>();
    fit.longest = std::max(fit.longest, longest.get<int64_t>());
    ++fit.steps;
  }
  if (fit.answers == 0 || fit.longest < 1) {
    return Status::InvalidArgument(path + ": no step with trained answers (response_len_mean, samples_trained)");
  }
  fit.mean = std::max(1.0, tokens / static_cast<double>(fit.answers));
  const double n = static_cast<double>(fit.answers);
  const double z = simulate::NormalQuantile((n - 0.5) / n);
  const double ratio = std::max(1.0, static_cast<double>(fit.longest) / fit.mean);
  const double d = z * z - 2 * std::log(ratio);
  fit.spread = d > 0 ? z - std::sqrt(d) : z;
  fit.median = fit.mean / std::exp(fit.spread * fit.spread / 2);
  return fit;
}

struct Candidate {
  Policy policy = Policy::kSluice;
  int64_t rollout_gpus = 0, trainer_gpus = 0, staleness = 0;
  int32_t rollout_tp = 1;
  int64_t max_rows = 256;
  simulate::SimResult result;
  simulate::SteadyStep steady;
  int64_t kv_tokens = 0;
};

// What one `sluice plan` invocation asked for and, for a plan, found.
struct PlanOutcome {
  bool help = false;
  std::string usage;
  bool sensitivity = false;
  bool predictive_check = false;
  const Regime* regime = nullptr;
  std::vector<Candidate> best;  // per policy
  PlanReport report;
  std::string html;  // where to write the page, if anywhere
};

// What `sluice plan` was asked to simulate: its flags, read and checked.
struct PlanSpec {
  simulate::Accelerator accel;
  simulate::ModelDims dims;
  int64_t gpus = 0, prompt_tokens = 0, max_response = 0, median = 0;
  double spread = 0;
  std::string lengths_note;  // --lengths-from: what the lengths were fitted to
  int64_t prompts = 0, group = 0, steps = 0, staleness = 0, rollout_gpus = 0, rollout_tp = 0, train_mp = 1;
  std::vector<int64_t> row_limits;
  int64_t micro_batch_tokens = 0, mini_batches = 1;
  simulate::Efficiency eff;
  std::vector<Policy> policies;
};

void AddPlanFlags(FlagSet& flags) {
  flags.Add({
      {"regime", "", "a published setting to reproduce (" + RegimeNames() + "); other flags override it"},
      {"hardware", "h100", "the accelerator (h100, h800, h200, h20, a100, 910b)"},
      {"gpus", "64", "accelerators in the cluster"},
      {"model", "qwen2.5-7b", "a known shape (qwen2.5-1.5b ... qwen2.5-72b, llama3.1-8b/70b)"},
      {"model-config", "", "a Hugging Face config.json instead of --model"},
      {"prompt-tokens", "1024", "tokens per prompt"},
      {"max-response", "16384", "the longest answer (longer ones are cut off here)"},
      {"median", "4096", "median answer length in tokens"},
      {"spread", "1.0", "standard deviation of the log answer length (0: every answer the median)"},
      {"lengths-from", "", "fit median and spread to a run's metrics.jsonl instead"},
      {"prompts", "128", "prompts per trainer step"},
      {"group", "16", "answers per prompt"},
      {"steps", "12", "trainer steps simulated (the first third is the pipeline filling)"},
      {"staleness", "0", "the asynchronous policies' bound in versions (0: try 1, 2 and 4)"},
      {"rollout-gpus", "0", "accelerators generating in the split policies (0: try splits from 1/8 to 7/8)"},
      {"rollout-tp", "0", "accelerators per rollout engine (0: the fewest the model fits)"},
      {"train-mp", "1", "accelerators per trainer rank (tensor x pipeline parallel)"},
      {"max-rows", "256", "sequences an engine decodes at once at most (max_num_seqs; 0: try 128, 256, 512)"},
      {"micro-batch-tokens", "0", "tokens per trainer micro-batch (0: prompt + longest answer)"},
      {"mini-batches", "1", "optimizer updates per trainer step (PPO mini-batches), each waiting for its slowest rank"},
      {"policies", "", "policies to compare, comma-separated (default: all)"},
      {"mfu", "0.4", "the trainer's share of bf16 peak (model FLOP utilisation)"},
      {"decode-bandwidth", "0.75", "decode's share of HBM bandwidth"},
      {"switch-s", "5", "colocated: seconds to switch between training and generation, each step"},
      {"colocated-train-slowdown", "1",
       "colocated: the trainer's cost per token against a separate trainer's (offloading, an extra pass)"},
      {"html", "", "also write the comparison as an HTML page"},
      {"sensitivity", "false",
       "with --regime: the simulated speedup as each of the regime's fitted and assumed parameters moves over a "
       "stated range",
       true},
      {"predictive-check", "false",
       "fit verl's unknowns to one cluster size's published runs and predict the other sizes' (about 40 s)", true},
  });
}

Result<PlanSpec> ReadPlanSpec(const FlagSet& flags) {
  PlanSpec p;
  SLUICE_ASSIGN_OR_RETURN(std::string hardware, flags.GetString("hardware"));
  SLUICE_ASSIGN_OR_RETURN(p.accel, simulate::FindAccelerator(hardware));
  SLUICE_ASSIGN_OR_RETURN(std::string model_config, flags.GetString("model-config"));
  if (!model_config.empty()) {
    SLUICE_ASSIGN_OR_RETURN(model::ModelConfig c, model::LoadModelConfig(model_config));
    p.dims = {model_config, c.hidden_size,       c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
              c.head_dim,   c.intermediate_size, c.vocab_size,        c.tie_word_embeddings};
  } else {
    SLUICE_ASSIGN_OR_RETURN(std::string model_name, flags.GetString("model"));
    SLUICE_ASSIGN_OR_RETURN(p.dims, simulate::FindModel(model_name));
  }
  SLUICE_RETURN_IF_ERROR(p.dims.Validate());
  SLUICE_ASSIGN_OR_RETURN(p.gpus, flags.GetInt("gpus", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(p.prompt_tokens, flags.GetInt("prompt-tokens", 1, 1 << 20));
  SLUICE_ASSIGN_OR_RETURN(p.max_response, flags.GetInt("max-response", 1, 1 << 20));
  SLUICE_ASSIGN_OR_RETURN(p.median, flags.GetInt("median", 1, 1 << 20));
  SLUICE_ASSIGN_OR_RETURN(p.spread, flags.GetDouble("spread", 0.0, 5.0));
  SLUICE_ASSIGN_OR_RETURN(std::string lengths_from, flags.GetString("lengths-from"));
  if (!lengths_from.empty()) {
    SLUICE_ASSIGN_OR_RETURN(LengthFit fit, FitRunLengths(lengths_from));
    p.median = std::max<int64_t>(1, std::llround(fit.median));
    p.spread = fit.spread;
    char buf[256];
    std::snprintf(buf, sizeof(buf), "fitted to %s: %lld answers over %lld steps, mean %.0f, longest %lld tokens",
                  lengths_from.c_str(), static_cast<long long>(fit.answers), static_cast<long long>(fit.steps),
                  fit.mean, static_cast<long long>(fit.longest));
    p.lengths_note = buf;
  }
  if (p.median > p.max_response) {
    return Status::InvalidArgument("--median " + std::to_string(p.median) + " is over --max-response " +
                                   std::to_string(p.max_response));
  }
  SLUICE_ASSIGN_OR_RETURN(p.prompts, flags.GetInt("prompts", 1, 1 << 20));
  SLUICE_ASSIGN_OR_RETURN(p.group, flags.GetInt("group", 1, 4096));
  SLUICE_ASSIGN_OR_RETURN(p.steps, flags.GetInt("steps", 3, 1000));
  constexpr int64_t kMostAnswers = 2'000'000;
  if (p.steps * p.prompts * p.group > kMostAnswers) {
    return Status::InvalidArgument("--steps x --prompts x --group = " + std::to_string(p.steps * p.prompts * p.group) +
                                   " answers: plan simulates at most " + std::to_string(kMostAnswers) +
                                   " (fewer --steps give the same steady state)");
  }
  SLUICE_ASSIGN_OR_RETURN(p.staleness, flags.GetInt("staleness", 0, 64));
  SLUICE_ASSIGN_OR_RETURN(p.rollout_gpus, flags.GetInt("rollout-gpus", 0, 100000));
  SLUICE_ASSIGN_OR_RETURN(p.rollout_tp, flags.GetInt("rollout-tp", 0, 64));
  SLUICE_ASSIGN_OR_RETURN(p.train_mp, flags.GetInt("train-mp", 1, 1024));
  SLUICE_ASSIGN_OR_RETURN(const int64_t max_rows, flags.GetInt("max-rows", 0, 1 << 16));
  p.row_limits = max_rows > 0 ? std::vector<int64_t>{max_rows} : std::vector<int64_t>{128, 256, 512};
  SLUICE_ASSIGN_OR_RETURN(p.micro_batch_tokens, flags.GetInt("micro-batch-tokens", 0, 1 << 24));
  SLUICE_ASSIGN_OR_RETURN(p.mini_batches, flags.GetInt("mini-batches", 1, 1 << 16));
  if (p.micro_batch_tokens == 0) p.micro_batch_tokens = p.prompt_tokens + p.max_response;
  if (p.micro_batch_tokens < p.prompt_tokens + p.max_response) {
    return Status::InvalidArgument("--micro-batch-tokens " + std::to_string(p.micro_batch_tokens) +
                                   " cannot hold a prompt and the longest answer (" +
                                   std::to_string(p.prompt_tokens + p.max_response) + " tokens)");
  }
  if (p.rollout_gpus >= p.gpus) {
    return Status::InvalidArgument("--rollout-gpus " + std::to_string(p.rollout_gpus) + " leaves none of --gpus " +
                                   std::to_string(p.gpus) + " to the trainer");
  }
  SLUICE_ASSIGN_OR_RETURN(p.eff.train_compute, flags.GetDouble("mfu", 0.01, 1.0));
  SLUICE_ASSIGN_OR_RETURN(p.eff.decode_memory, flags.GetDouble("decode-bandwidth", 0.01, 1.0));
  SLUICE_ASSIGN_OR_RETURN(p.eff.colocated_switch_s, flags.GetDouble("switch-s", 0.0, 3600.0));
  SLUICE_ASSIGN_OR_RETURN(p.eff.colocated_train_slowdown, flags.GetDouble("colocated-train-slowdown", 1.0, 100.0));
  SLUICE_ASSIGN_OR_RETURN(std::string policy_list, flags.GetString("policies"));
  if (policy_list.empty()) {
    p.policies = simulate::AllPolicies();
  } else {
    for (size_t pos = 0; pos <= policy_list.size();) {
      const size_t comma = std::min(policy_list.find(',', pos), policy_list.size());
      SLUICE_ASSIGN_OR_RETURN(Policy policy, simulate::ParsePolicy(policy_list.substr(pos, comma - pos)));
      p.policies.push_back(policy);
      pos = comma + 1;
    }
  }

  return p;
}

// Rollout engine sizes to try (accelerators per engine).
Result<std::vector<int32_t>> EngineSizes(const PlanSpec& p) {
  // Engine sizes to try: the smallest the model and one whole answer fit,
  // and twice that (more cache per engine, fewer engines), unless given.
  std::vector<int32_t> tps;
  simulate::GpuLayout base;
  base.train_mp = static_cast<int32_t>(p.train_mp);
  base.max_rows = p.row_limits.front();
  if (p.rollout_tp == 0) {
    Status last = Status::Ok();
    for (int32_t tp = 1; tp <= p.accel.per_node && tps.empty(); tp *= 2) {
      base.rollout_tp = tp;
      base.rollout_gpus = tp;
      base.trainer_gpus = p.train_mp;
      auto kv = simulate::KvCapacityTokens(p.accel, p.dims, base, p.eff);
      if (kv.ok() && *kv >= p.prompt_tokens + p.max_response + 1) {
        tps.push_back(tp);
        if (2 * tp <= p.accel.per_node) tps.push_back(2 * tp);
      } else {
        last = kv.ok() ? Status::InvalidArgument(p.dims.name + ": one answer (" +
                                                 std::to_string(p.prompt_tokens + p.max_response) +
                                                 " tokens) does not fit the KV cache of an engine of " +
                                                 std::to_string(tp) + " x " + p.accel.name)
                       : kv.status();
      }
    }
    if (tps.empty()) return last;
  } else {
    tps.push_back(static_cast<int32_t>(p.rollout_tp));
  }

  return tps;
}

// The fastest layout of each policy (split, engine size, staleness, rows),
// and why the policies that cannot run here cannot.
struct PlanSearch {
  std::vector<Candidate> best;  // per policy
  std::vector<std::string> skipped;
};

Result<PlanSearch> SearchLayouts(const PlanSpec& p, const std::vector<int32_t>& tps, const simulate::Workload& w) {
  // Splits to try: the given one, or eighths of the cluster, each side a
  // whole number of engines and trainer ranks.
  auto splits_for = [&](int32_t tp) {
    std::vector<int64_t> splits;
    if (p.rollout_gpus > 0) return std::vector<int64_t>{p.rollout_gpus};
    for (int k = 1; k <= 7; ++k) {
      int64_t r = p.gpus * k / 8;
      r -= r % tp;
      if (r >= tp && (p.gpus - r) % p.train_mp == 0 && p.gpus - r >= p.train_mp &&
          std::find(splits.begin(), splits.end(), r) == splits.end()) {
        splits.push_back(r);
      }
    }
    return splits;
  };
  const std::vector<int64_t> stalenesses =
      p.staleness > 0 ? std::vector<int64_t>{p.staleness} : std::vector<int64_t>{1, 2, 4};
  PlanSearch found;
  std::vector<Candidate>& best = found.best;
  std::vector<std::string>& skipped = found.skipped;
  for (Policy policy : p.policies) {
    const bool colocated = policy == Policy::kColocatedSync;
    const bool asynchronous =
        policy == Policy::kPartialRollout || policy == Policy::kInflight || policy == Policy::kSluice;
    std::optional<Candidate> top;
    std::vector<std::string> why;  // each different reason a layout could not run
    auto note_why = [&why](const Status& st) {
      if (std::find(why.begin(), why.end(), st.message()) == why.end()) why.push_back(st.message());
    };
    for (const int32_t tp : tps) {
      for (int64_t r : colocated ? std::vector<int64_t>{p.gpus / 2} : splits_for(tp)) {
        for (int64_t s : asynchronous ? stalenesses : std::vector<int64_t>{1}) {
          for (const int64_t rows : p.row_limits) {
            simulate::GpuLayout g;
            g.train_mp = static_cast<int32_t>(p.train_mp);
            g.rollout_tp = tp;
            g.max_rows = rows;
            g.rollout_gpus = colocated ? p.gpus - p.gpus / 2 : r;
            g.trainer_gpus = colocated ? p.gpus / 2 : p.gpus - r;
            simulate::PolicyOptions o;
            o.max_staleness = s;
            o.micro_batch_tokens = p.micro_batch_tokens;
            o.mini_batches = p.mini_batches;
            auto setup = simulate::SetUpPolicy(policy, p.accel, p.dims, g, p.eff, o);
            if (!setup.ok()) {
              note_why(setup.status());
              continue;
            }
            setup->layout.max_steps_per_event = 32;
            auto res = simulate::Simulate(w, setup->layout, setup->costs);
            if (!res.ok()) {
              if (res.status().code() != StatusCode::kInvalidArgument) return res.status();
              note_why(res.status());  // an answer the engine\'s cache cannot hold
              continue;
            }
            Candidate c;
            c.rollout_tp = tp;
            c.policy = policy;
            c.rollout_gpus = colocated ? p.gpus : r;
            c.trainer_gpus = colocated ? p.gpus : p.gpus - r;
            c.staleness = asynchronous ? s : policy == Policy::kOneStepOff ? 1 : 0;
            c.steady = simulate::SteadyState(*res);
            c.kv_tokens = setup->kv_tokens_per_engine;
            c.result = std::move(*res);
            c.max_rows = rows;
            if (!top || c.steady.step_s < top->steady.step_s) top = std::move(c);
          }
        }
      }
    }
    if (top) {
      best.push_back(std::move(*top));
    } else {
      std::string reasons;
      for (const std::string& r : why) reasons += (reasons.empty() ? "" : "; ") + r;
      if (reasons.empty()) {  // no split was tried
        std::string engines;
        for (const int32_t tp : tps) engines += (engines.empty() ? "" : " or ") + std::to_string(tp);
        reasons = "no split of " + std::to_string(p.gpus) + " accelerators gives the rollout whole engines (" +
                  engines + " each) and the trainer whole ranks (" + std::to_string(p.train_mp) + " each)";
      }
      skipped.push_back(simulate::PolicyName(policy) + ": " + reasons);
    }
  }
  if (best.empty()) {
    std::string all;
    for (const std::string& s : skipped) all += "\n  " + s;
    return Status::InvalidArgument("no policy can run this cluster:" + all);
  }

  return found;
}

PlanReport BuildPlanReport(const PlanSpec& p, const Regime* regime, const PlanSearch& found,
                           const simulate::Workload& w) {
  const std::vector<Candidate>& best = found.best;
  const std::vector<std::string>& skipped = found.skipped;
  double mean_response = 0;
  int64_t cut = 0;
  for (int32_t n : w.response_tokens) mean_response += n, cut += n == p.max_response ? 1 : 0;
  mean_response /= static_cast<double>(w.response_tokens.size());

  PlanReport report;
  char line[512];
  std::snprintf(line, sizeof(line), "%s (%.1fB parameters) on %lld x %s (%lld per node)", p.dims.name.c_str(),
                p.dims.Parameters() / 1e9, static_cast<long long>(p.gpus), p.accel.name.c_str(),
                static_cast<long long>(p.accel.per_node));
  report.title = line;
  std::snprintf(line, sizeof(line),
                "%lld prompts x %lld answers per step, prompts %lld tokens, answers median %lld (spread %.2f, mean "
                "%.0f), cut off at %lld: %.1f%% of them; %lld steps simulated",
                static_cast<long long>(p.prompts), static_cast<long long>(p.group),
                static_cast<long long>(p.prompt_tokens), static_cast<long long>(p.median), p.spread, mean_response,
                static_cast<long long>(p.max_response),
                100.0 * static_cast<double>(cut) / static_cast<double>(w.response_tokens.size()),
                static_cast<long long>(p.steps));
  report.workload = line;
  if (!p.lengths_note.empty()) report.workload += "; lengths " + p.lengths_note;
  std::snprintf(line, sizeof(line),
                "assumed: decode at %.0f%% of HBM bandwidth and %.0f%% of bf16 peak, prefill %.0f%%, training MFU "
                "%.0f%%, links at %.0f%%; %.1f ms per decode step; colocated switch %.1f s per step, training %.2fx "
                "slower; trainer ranks of %lld",
                100 * p.eff.decode_memory, 100 * p.eff.decode_compute, 100 * p.eff.prefill_compute,
                100 * p.eff.train_compute, 100 * p.eff.network, 1000 * p.eff.decode_step_s, p.eff.colocated_switch_s,
                p.eff.colocated_train_slowdown, static_cast<long long>(p.train_mp));
  report.assumptions = std::string(line) + "; hardware: " + p.accel.description;
  double baseline_step = 0;
  for (const Candidate& c : best) {
    if (c.policy == Policy::kColocatedSync) baseline_step = c.steady.step_s;
  }
  const double samples_per_step = static_cast<double>(p.prompts * p.group);
  for (const Candidate& c : best) {
    PlanRow row;
    row.policy = simulate::PolicyName(c.policy);
    row.split = c.policy == Policy::kColocatedSync
                    ? std::to_string(p.gpus) + " both"
                    : std::to_string(c.rollout_gpus) + ":" + std::to_string(c.trainer_gpus);
    row.step_s = c.steady.step_s;
    row.wait_s = c.steady.wait_s;
    row.train_s = c.steady.train_s;
    row.samples_per_s = samples_per_step / c.steady.step_s;
    row.vs_baseline = baseline_step > 0 ? baseline_step / c.steady.step_s : 0;
    row.rollout_busy = c.result.rollout_busy_s / c.result.wall_s;
    row.trainer_busy = c.result.trainer_busy_s / c.result.wall_s;
    row.occupancy = c.result.occupancy;
    row.staleness_bound = c.staleness;
    row.staleness_mean = c.result.staleness_mean;
    row.preemptions_per_step = static_cast<double>(c.result.preemptions) / static_cast<double>(p.steps);
    row.recomputed_share = static_cast<double>(c.result.recomputed_tokens) /
                           std::max<double>(1.0, static_cast<double>(c.result.generated_tokens));
    row.kv_tokens = c.kv_tokens;
    row.rollout_tp = c.rollout_tp;
    row.max_rows = c.max_rows;
    report.rows.push_back(row);
  }
  for (const std::string& s : skipped) report.notes.push_back("not run: " + s);
  const auto fastest = std::min_element(best.begin(), best.end(), [](const Candidate& a, const Candidate& b) {
    return a.steady.step_s < b.steady.step_s;
  });
  const std::string where = fastest->policy == Policy::kColocatedSync
                                ? "every accelerator on both sides"
                                : std::to_string(fastest->rollout_gpus) +
                                      " generating : " + std::to_string(fastest->trainer_gpus) + " training";
  std::snprintf(line, sizeof(line),
                "fastest: %s at %s, engines of %d accelerator%s decoding up to %lld rows, staleness %lld: %.1f s "
                "per step, %.0f samples/s",
                simulate::PolicyName(fastest->policy).c_str(), where.c_str(), fastest->rollout_tp,
                fastest->rollout_tp == 1 ? "" : "s", static_cast<long long>(fastest->max_rows),
                static_cast<long long>(fastest->staleness), fastest->steady.step_s,
                samples_per_step / fastest->steady.step_s);
  report.recommendation = line;
  if (regime != nullptr) {
    double published = 0, baseline = 0;
    for (const Candidate& c : best) {
      if (c.policy == regime->published) published = c.steady.step_s;
      if (c.policy == regime->baseline) baseline = c.steady.step_s;
    }
    report.regime = std::string(regime->name) + ": " + regime->standing + "\n  source: " + regime->source +
                    "\n  assumed: " + regime->assumed;
    if (published > 0 && baseline > 0) {
      const double simulated = baseline / published;
      std::snprintf(line, sizeof(line), "  %s over %s: reported %s, simulated %.2fx (%+.0f%%)",
                    simulate::PolicyName(regime->published).c_str(), simulate::PolicyName(regime->baseline).c_str(),
                    regime->reported_text, simulated, 100 * (simulated / regime->reported - 1));
      report.regime += std::string("\n") + line;
    }
  }
  return report;
}

// Parses the flags (a regime's first) and, unless --help, --sensitivity or
// --predictive-check, searches every policy's layouts.
Result<PlanOutcome> RunPlan(const std::vector<std::string>& args) {
  PlanOutcome outcome;
  FlagSet flags;
  AddPlanFlags(flags);
  SLUICE_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    outcome.help = true;
    outcome.usage =
        "usage: sluice plan [--regime=NAME [--sensitivity]] [--hardware=h100 --gpus=64 "
        "--model=qwen2.5-7b ...] | --predictive-check\n" +
        flags.Usage();
    return outcome;
  }
  SLUICE_RETURN_IF_ERROR(flags.RejectPositional());
  SLUICE_ASSIGN_OR_RETURN(std::string regime_name, flags.GetString("regime"));
  const Regime* regime = nullptr;
  if (!regime_name.empty()) {
    for (const Regime& r : Regimes()) {
      if (regime_name == r.name) regime = &r;
    }
    if (regime == nullptr) {
      return Status::InvalidArgument("--regime: unknown '" + regime_name + "' (known: " + RegimeNames() + ")");
    }
    // The regime's settings, then the command line's again (it wins).
    std::vector<std::string> merged;
    for (const auto& [k, v] : regime->flags) merged.push_back(std::string("--") + k + "=" + v);
    merged.insert(merged.end(), args.begin(), args.end());
    SLUICE_RETURN_IF_ERROR(flags.Parse(merged));
  }
  outcome.regime = regime;
  SLUICE_ASSIGN_OR_RETURN(outcome.predictive_check, flags.GetBool("predictive-check"));
  SLUICE_ASSIGN_OR_RETURN(outcome.sensitivity, flags.GetBool("sensitivity"));
  if (outcome.predictive_check) return outcome;
  if (outcome.sensitivity) {
    if (regime == nullptr) return Status::InvalidArgument("--sensitivity needs a --regime (" + RegimeNames() + ")");
    return outcome;
  }
  SLUICE_ASSIGN_OR_RETURN(const PlanSpec p, ReadPlanSpec(flags));
  SLUICE_ASSIGN_OR_RETURN(const std::vector<int32_t> tps, EngineSizes(p));
  simulate::Workload w;
  w.steps = p.steps;
  w.prompts_per_step = p.prompts;
  w.group_size = p.group;
  w.prompt_tokens = {static_cast<int32_t>(p.prompt_tokens)};
  w.response_tokens = simulate::CappedLogNormalLengths(p.steps * p.prompts * p.group, static_cast<int32_t>(p.median),
                                                       p.spread, static_cast<int32_t>(p.max_response), /*seed=*/1);
  SLUICE_ASSIGN_OR_RETURN(PlanSearch found, SearchLayouts(p, tps, w));
  outcome.report = BuildPlanReport(p, regime, found, w);
  outcome.best = std::move(found.best);
  SLUICE_ASSIGN_OR_RETURN(outcome.html, flags.GetString("html"));
  return outcome;
}

std::string Percent(double ratio) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%+.0f%%", 100 * (ratio - 1));
  return buf;
}

// The simulated speedup of `published` over `baseline` with the plan `args`
// asks for, and `extra` after them (it wins).
Result<double> SimulatedSpeedup(const std::vector<std::string>& args, std::vector<std::string> extra, Policy published,
                                Policy baseline) {
  std::vector<std::string> all = args;
  extra.push_back("--policies=" + simulate::PolicyName(published) + "," + simulate::PolicyName(baseline));
  all.insert(all.end(), extra.begin(), extra.end());
  SLUICE_ASSIGN_OR_RETURN(PlanOutcome o, RunPlan(all));
  double p = 0, b = 0;
  for (const Candidate& c : o.best) {
    if (c.policy == published) p = c.steady.step_s;
    if (c.policy == baseline) b = c.steady.step_s;
  }
  if (p <= 0 || b <= 0) return Status::InvalidArgument("a policy of the regime could not run");
  return b / p;
}

// `--sensitivity`: each of the regime's parameters over its band, the others
// at the regime's values.
Status Sensitivity(const Regime& regime, const std::vector<std::string>& args) {
  std::vector<std::string> base;
  for (const std::string& a : args) {
    if (a != "--sensitivity" && a.rfind("--sensitivity=", 0) != 0) base.push_back(a);
  }
  std::printf("sensitivity of %s: %s over %s, reported %s\n%s\n", regime.name,
              simulate::PolicyName(regime.published).c_str(), simulate::PolicyName(regime.baseline).c_str(),
              regime.reported_text, regime.standing);
  std::printf(
      "each row moves one parameter over the values shown, the others at the regime's own (marked *); "
      "each cell: value: simulated speedup (against the reported)\n");
  SLUICE_ASSIGN_OR_RETURN(const double own, SimulatedSpeedup(base, {}, regime.published, regime.baseline));
  for (const Band& band : regime.bands) {
    const bool is_baseline = std::string(band.flag) == "baseline";
    std::string regime_value = is_baseline ? simulate::PolicyName(regime.baseline) : "";
    for (const auto& [k, v] : regime.flags) {
      if (k == std::string(band.flag)) regime_value = v;
    }
    std::string cells;
    for (const std::string& value : band.values) {
      double ratio = own;
      if (value != regime_value) {
        if (is_baseline) {
          SLUICE_ASSIGN_OR_RETURN(Policy other, simulate::ParsePolicy(value));
          SLUICE_ASSIGN_OR_RETURN(ratio, SimulatedSpeedup(base, {}, regime.published, other));
        } else {
          SLUICE_ASSIGN_OR_RETURN(ratio, SimulatedSpeedup(base, {"--" + std::string(band.flag) + "=" + value},
                                                          regime.published, regime.baseline));
        }
      }
      char cell[96];
      std::snprintf(cell, sizeof(cell), "  %s%s: %.2fx (%s)", value.c_str(), value == regime_value ? "*" : "", ratio,
                    Percent(ratio / regime.reported).c_str());
      cells += cell;
    }
    std::printf("%-25s %-40s%s\n", band.flag, band.set_by, cells.c_str());
  }
  return Status::Ok();
}

// `--predictive-check`: verl's unknowns fitted to one cluster size's runs,
// then every run of every size simulated with them (the others predicted).
Status PredictiveCheck() {
  const simulate::PublishedSystem& sys = simulate::VerlFullyAsync7b();
  const simulate::RegimeSetting& s = sys.setting;
  const simulate::FitGrid grid = simulate::DefaultFitGrid();
  std::printf("predictive check: %s\nsource: %s\n", sys.name.c_str(), sys.source.c_str());
  std::printf(
      "from the source: %s, %s, %lld prompts x %lld answers a step, answers up to %d tokens, %lld "
      "mini-batches, engines of %d GPUs, trainer ranks of %d; assumed: prompts of %lld tokens, staleness "
      "%lld, %lld rows an engine; one run per row, so each published time is that run's own (no median to "
      "take)\n",
      s.accelerator.name.c_str(), s.model.name.c_str(), static_cast<long long>(s.prompts),
      static_cast<long long>(s.group), s.max_response, static_cast<long long>(s.mini_batches), s.rollout_tp, s.train_mp,
      static_cast<long long>(s.prompt_tokens), static_cast<long long>(s.staleness), static_cast<long long>(s.max_rows));
  std::string medians, spreads;
  for (int32_t m : grid.medians) medians += (medians.empty() ? "" : ", ") + std::to_string(m);
  for (double v : grid.spreads) {
    char b[16];
    std::snprintf(b, sizeof(b), "%.2f", v);
    spreads += (spreads.empty() ? "" : ", ") + std::string(b);
  }
  std::printf(
      "fitted on one cluster size's two runs: answers' median (%s) and spread (%s) from the grid, the "
      "separate trainer's MFU to its train s, the colocated trainer's slowdown to its train s; the other "
      "sizes predicted with no refitting. error: model / published - 1\n",
      medians.c_str(), spreads.c_str());
  for (const auto& fit_point : sys.points) {
    std::vector<simulate::PublishedRun> fit_runs;
    for (size_t i : fit_point) fit_runs.push_back(sys.runs[i]);
    SLUICE_ASSIGN_OR_RETURN(simulate::RegimeFit fit, simulate::FitRegime(s, fit_runs, grid));
    const simulate::Efficiency& e = fit.setting.efficiency;
    std::printf(
        "\nfitted on %s and %s: median %d, spread %.2f, MFU %.2f%s, colocated slowdown %.2fx%s "
        "(objective %.4f)\n",
        fit_runs[0].label.c_str(), fit_runs[1].label.c_str(), fit.setting.median, fit.setting.spread, e.train_compute,
        fit.mfu_at_bound ? " (at its bound)" : "", e.colocated_train_slowdown,
        fit.slowdown_at_bound ? " (at its bound)" : "", fit.objective);
    std::printf("%-18s %-9s  %26s  %26s  %26s\n", "run", "", "step s (published/model)", "gen s (published/model)",
                "train s (published/model)");
    std::vector<double> step_model(sys.runs.size(), 0);
    for (size_t i = 0; i < sys.runs.size(); ++i) {
      const simulate::PublishedRun& r = sys.runs[i];
      const bool fitted = std::find(fit_point.begin(), fit_point.end(), i) != fit_point.end();
      SLUICE_ASSIGN_OR_RETURN(simulate::RunTimes t, simulate::PredictRun(fit.setting, r));
      step_model[i] = t.step_s;
      auto cell = [](double published, double model) {
        char b[64];
        std::snprintf(b, sizeof(b), "%7.1f / %7.1f %5s", published, model, Percent(model / published).c_str());
        return std::string(b);
      };
      std::printf("%-18s %-9s  %26s  %26s  %26s\n", r.label.c_str(), fitted ? "fitted" : "predicted",
                  cell(r.step_s, t.step_s).c_str(), cell(r.generate_s, t.generate_s).c_str(),
                  cell(r.train_s, t.train_s).c_str());
    }
    for (const auto& point : sys.points) {
      const simulate::PublishedRun& c = sys.runs[point[0]];
      const simulate::PublishedRun& a = sys.runs[point[1]];
      const double published = c.step_s / a.step_s, model = step_model[point[0]] / step_model[point[1]];
      std::printf("speedup %s over %s: published %.2fx, model %.2fx (%s)%s\n", a.label.c_str(), c.label.c_str(),
                  published, model, Percent(model / published).c_str(), point == fit_point ? ", fitted" : "");
    }
  }
  return Status::Ok();
}

Status Plan(const std::vector<std::string>& args) {
  SLUICE_ASSIGN_OR_RETURN(PlanOutcome o, RunPlan(args));
  if (o.help) {
    std::printf("%s", o.usage.c_str());
    return Status::Ok();
  }
  if (o.predictive_check) return PredictiveCheck();
  if (o.sensitivity) return Sensitivity(*o.regime, args);
  std::printf("%s", FormatPlanText(o.report).c_str());
  if (!o.html.empty()) {
    SLUICE_RETURN_IF_ERROR(WriteFileAtomically(o.html, FormatPlanHtml(o.report)));
    std::printf("written to %s\n", o.html.c_str());
  }
  return Status::Ok();
}

}  // namespace

int RunPlanCommand(const std::vector<std::string>& args) { return RunCommand(Plan, args); }

}  // namespace sluice::launch
