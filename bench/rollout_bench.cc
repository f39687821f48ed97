// Rollout decode throughput on a long-tail length workload
// (docs/design.md, how performance is measured): continuous batching vs static batching vs a plain
// lockstep decode loop at full batch (the bound), each with the rollout's
// weights in float32 and in bfloat16, measured in the same run, interleaved
// and repeated; prints medians, spreads and ratios.
//
// Workload: `requests` prompts of `prompt-len` random tokens; response lengths
// are log-normal with the given median, spread so the longest is exactly
// `tail` x the median (stratified quantiles, shuffled with the seed). Lengths
// are fixed up front with forced_length: the model samples every token, only
// the stop position is chosen. The lockstep bound decodes `slots` sequences
// for S steps, S chosen so its mean attended context equals the workload's.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sluice/model/device.h"
#include "sluice/model/transformer.h"
#include "sluice/model/weights.h"
#include "sluice/rollout/engine.h"
#include "sluice/runtime/flags.h"
#include "sluice/runtime/process.h"

namespace {

using sluice::bench::LongTailLengths;
using sluice::bench::SplitCommas;
using sluice::bench::Stats;
using sluice::bench::Summarize;

using sluice::Result;
using sluice::Status;
namespace rollout = sluice::rollout;
namespace model = sluice::model;

struct Workload {
  std::vector<rollout::GenerationRequest> requests;
  int64_t tokens = 0;
  int32_t lockstep_steps = 0;
};

Workload MakeWorkload(int n, int prompt_len, int median, double tail, int64_t vocab, uint64_t seed) {
  Workload w;
  std::mt19937_64 rng(seed);
  auto lengths = LongTailLengths(n, median, tail, seed);
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    rollout::GenerationRequest r;
    r.id = i;
    for (int t = 0; t < prompt_len; ++t)
      r.prompt.push_back(static_cast<rollout::TokenId>(rng() % std::min<int64_t>(vocab, 256)));
    r.sampling.seed = seed + i;
    r.sampling.forced_length = lengths[i];
    r.sampling.max_new_tokens = lengths[i];
    w.tokens += lengths[i];
    sum += lengths[i];
    sum_sq += static_cast<double>(lengths[i]) * lengths[i];
    w.requests.push_back(std::move(r));
  }
  // A token at response index j attends ~prompt + j keys; over the workload
  // the mean j is sum(L^2)/(2 sum L), which a lockstep run of S steps matches
  // with S = sum(L^2)/sum(L).
  w.lockstep_steps = static_cast<int32_t>(std::lround(sum_sq / sum));
  return w;
}

const char* DtypeName(torch::ScalarType dtype) { return dtype == torch::kBFloat16 ? "bfloat16" : "float32"; }

struct Sample {
  double tokens_per_s;
  double occupancy;
};

Result<Sample> RunEngine(const rollout::PolicySnapshot& policy, const Workload& w, int32_t slots,
                         rollout::Scheduling scheduling, int32_t max_seq_len) {
  rollout::EngineOptions o;
  o.num_slots = slots;
  o.scheduling = scheduling;
  o.max_seq_len = max_seq_len;
  SLUICE_ASSIGN_OR_RETURN(auto engine, rollout::RolloutEngine::Create(policy, o));
  for (const auto& r : w.requests) SLUICE_RETURN_IF_ERROR(engine->Submit(r));
  auto start = std::chrono::steady_clock::now();
  SLUICE_ASSIGN_OR_RETURN(auto results, engine->RunUntilIdle());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (engine->stats().generated_tokens != w.tokens || results.size() != w.requests.size()) {
    return Status::Internal("engine generated " + std::to_string(engine->stats().generated_tokens) +
                            " tokens, the workload has " + std::to_string(w.tokens));
  }
  return Sample{w.tokens / secs, engine->stats().occupancy(slots)};
}

Result<Sample> RunLockstep(const rollout::PolicySnapshot& policy, const Workload& w, int32_t slots,
                           int32_t prompt_len) {
  auto start = std::chrono::steady_clock::now();
  SLUICE_ASSIGN_OR_RETURN(int64_t tokens, rollout::RunLockstepDecode(policy, slots, prompt_len, w.lockstep_steps, 1));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Sample{tokens / secs, 1.0};
}

Status Main(int argc, char** argv) {
  sluice::runtime::FlagSet flags;
  flags.Add("presets", "1m,20m", "comma-separated model presets");
  flags.Add("requests", "256", "requests in the workload");
  flags.Add("slots", "16", "engine slots = lockstep batch");
  flags.Add("prompt-len", "16", "prompt tokens per request");
  flags.Add("median", "24", "median response length");
  flags.Add("tail", "16", "longest response / median");
  flags.Add("repeats", "3", "interleaved repetitions");
  flags.Add("threads", "0", "intra-op threads (0 = all cores)");
  flags.Add("dtypes", "float32,bfloat16",
            "comma-separated rollout weight dtypes, each measured in the same run (bfloat16 on a CPU: bfloat16 "
            "matrices, float32 arithmetic)");
  flags.Add("seed", "1", "workload and sampling seed");
  flags.Add("json", "", "also write results as JSON to this path");
  SLUICE_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(argv + 1, argv + argc)));
  if (flags.help_requested()) {
    std::printf("usage: rollout_bench [flags]\n%s", flags.Usage().c_str());
    return Status::Ok();
  }
  SLUICE_ASSIGN_OR_RETURN(std::string presets, flags.GetString("presets"));
  SLUICE_ASSIGN_OR_RETURN(int64_t n, flags.GetInt("requests", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(int64_t slots, flags.GetInt("slots", 1, 4096));
  SLUICE_ASSIGN_OR_RETURN(int64_t prompt_len, flags.GetInt("prompt-len", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(int64_t median, flags.GetInt("median", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(double tail, flags.GetDouble("tail", 1.0, 1000.0));
  SLUICE_ASSIGN_OR_RETURN(int64_t repeats, flags.GetInt("repeats", 1, 100));
  SLUICE_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", 0, 1024));
  SLUICE_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("seed", 0, INT64_MAX));
  SLUICE_ASSIGN_OR_RETURN(std::string json_path, flags.GetString("json"));
  SLUICE_ASSIGN_OR_RETURN(std::string dtype_list, flags.GetString("dtypes"));
  torch::set_num_threads(threads > 0 ? static_cast<int>(threads) : std::max(1u, std::thread::hardware_concurrency()));
  torch::Device device = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  std::vector<torch::ScalarType> dtypes;
  for (const std::string& d : SplitCommas(dtype_list)) {
    if (d == "auto") return Status::InvalidArgument("--dtypes: name float32 or bfloat16, not auto");
    SLUICE_ASSIGN_OR_RETURN(torch::ScalarType dtype, model::ResolveDtype(d, device));
    dtypes.push_back(dtype);
  }
  if (dtypes.empty()) return Status::InvalidArgument("--dtypes: at least one dtype");

  std::string table, json = "[";
  char line[512];
  std::snprintf(line, sizeof(line), "%-6s %-9s %-11s %14s %18s %10s\n", "model", "dtype", "mode", "tokens/s",
                "(min..max)", "occupancy");
  table += line;
  const std::vector<std::string> names = SplitCommas(presets);
  std::string ratios;
  for (const std::string& name : names) {
    SLUICE_ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetModelConfig(name));
    Workload w = MakeWorkload(static_cast<int>(n), static_cast<int>(prompt_len), static_cast<int>(median), tail,
                              config.vocab_size, static_cast<uint64_t>(seed));
    int32_t longest = 0;
    for (const auto& r : w.requests) longest = std::max(longest, r.sampling.forced_length);
    const int32_t max_seq_len = static_cast<int32_t>(prompt_len) + std::max(longest, w.lockstep_steps);
    if (max_seq_len > config.max_position_embeddings) {
      return Status::InvalidArgument("prompt-len + longest response exceeds the model's context of " +
                                     std::to_string(config.max_position_embeddings));
    }
    // One model per dtype, the same weights (bfloat16: rounded from the float32 model's).
    std::vector<rollout::PolicySnapshot> policies;
    auto base = std::make_shared<model::Transformer>(config, 0);
    for (torch::ScalarType dtype : dtypes) policies.push_back({model::CloneModel(*base, device, dtype), 0});
    std::fprintf(stderr, "%s (%.1fM params): %lld requests, %lld tokens, longest %d, median %lld, lockstep %d steps\n",
                 name.c_str(), config.NumParameters() / 1e6, static_cast<long long>(n),
                 static_cast<long long>(w.tokens), longest, static_cast<long long>(median), w.lockstep_steps);
    struct Series {
      std::vector<double> cont, stat, lock, cont_occ, stat_occ;
    };
    std::vector<Series> series(dtypes.size());
    for (int64_t rep = 0; rep < repeats; ++rep) {
      for (size_t d = 0; d < dtypes.size(); ++d) {  // interleaved: every repetition runs every dtype and mode
        const rollout::PolicySnapshot& policy = policies[d];
        SLUICE_ASSIGN_OR_RETURN(
            Sample c, RunEngine(policy, w, static_cast<int32_t>(slots), rollout::Scheduling::kContinuous, max_seq_len));
        SLUICE_ASSIGN_OR_RETURN(
            Sample s, RunEngine(policy, w, static_cast<int32_t>(slots), rollout::Scheduling::kStatic, max_seq_len));
        SLUICE_ASSIGN_OR_RETURN(Sample l,
                                RunLockstep(policy, w, static_cast<int32_t>(slots), static_cast<int32_t>(prompt_len)));
        Series& sr = series[d];
        sr.cont.push_back(c.tokens_per_s);
        sr.stat.push_back(s.tokens_per_s);
        sr.lock.push_back(l.tokens_per_s);
        sr.cont_occ.push_back(c.occupancy);
        sr.stat_occ.push_back(s.occupancy);
        std::fprintf(stderr, "  rep %lld %s: continuous %.0f, static %.0f, lockstep %.0f tokens/s\n",
                     static_cast<long long>(rep), DtypeName(dtypes[d]), c.tokens_per_s, s.tokens_per_s, l.tokens_per_s);
      }
    }
    for (size_t d = 0; d < dtypes.size(); ++d) {
      Series& sr = series[d];
      const char* dtype = DtypeName(dtypes[d]);
      struct Row {
        const char* mode;
        std::vector<double>* v;
        double occ;
      } rows[] = {{"continuous", &sr.cont, Summarize(sr.cont_occ).median},
                  {"static", &sr.stat, Summarize(sr.stat_occ).median},
                  {"lockstep", &sr.lock, 1.0}};
      for (const Row& r : rows) {
        Stats st = Summarize(*r.v);
        std::snprintf(line, sizeof(line), "%-6s %-9s %-11s %14.0f %8.0f..%-8.0f %9.0f%%\n", name.c_str(), dtype, r.mode,
                      st.median, st.min, st.max, 100 * r.occ);
        table += line;
        json += std::string(json.size() > 1 ? "," : "") + "{\"model\":\"" + name + "\",\"dtype\":\"" + dtype +
                "\",\"mode\":\"" + r.mode + "\",\"tokens_per_s\":" + std::to_string(st.median) +
                ",\"min\":" + std::to_string(st.min) + ",\"max\":" + std::to_string(st.max) +
                ",\"occupancy\":" + std::to_string(r.occ) + "}";
      }
      // Ratios per repetition (same-run pairs), then their median.
      std::vector<double> cs, cl, sl;
      for (size_t i = 0; i < sr.cont.size(); ++i) {
        cs.push_back(sr.cont[i] / sr.stat[i]);
        cl.push_back(sr.cont[i] / sr.lock[i]);
        sl.push_back(sr.stat[i] / sr.lock[i]);
      }
      Stats a = Summarize(cs), b = Summarize(cl), c = Summarize(sl);
      std::snprintf(line, sizeof(line),
                    "%-6s %-9s continuous/static %.2fx (%.2f..%.2f)   continuous/bound %.0f%% (%.0f..%.0f)   "
                    "static/bound %.0f%%\n",
                    name.c_str(), dtype, a.median, a.min, a.max, 100 * b.median, 100 * b.min, 100 * b.max,
                    100 * c.median);
      ratios += line;
      if (d == 0) continue;
      // Against the first dtype, per repetition.
      std::vector<double> rc, rl;
      for (size_t i = 0; i < sr.cont.size(); ++i) {
        rc.push_back(sr.cont[i] / series[0].cont[i]);
        rl.push_back(sr.lock[i] / series[0].lock[i]);
      }
      Stats x = Summarize(rc), y = Summarize(rl);
      std::snprintf(line, sizeof(line), "%-6s %s/%s: continuous %.2fx (%.2f..%.2f)   lockstep %.2fx (%.2f..%.2f)\n",
                    name.c_str(), dtype, DtypeName(dtypes[0]), x.median, x.min, x.max, y.median, y.min, y.max);
      ratios += line;
    }
  }
  json += "]\n";
  std::printf(
      "\nlong-tail workload: %lld requests, median %lld tokens, longest %.0fx median, %lld slots, %s, %d "
      "threads\n%s\n%s",
      static_cast<long long>(n), static_cast<long long>(median), tail, static_cast<long long>(slots),
      device.str().c_str(), torch::get_num_threads(), table.c_str(), ratios.c_str());
  if (!json_path.empty()) {
    std::ofstream(json_path) << json;
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) { return sluice::bench::BenchMain(argc, argv, Main); }
