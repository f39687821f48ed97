// Data-parallel trainer ranks (docs/benchmarks.md, "Trainer ranks"): trainer
// tokens/s on the same global batch, same model, same steps, in one run:
//
//   one-thread      one process, one intra-op thread (the unit of scaling)
//   threads-N       one process, N single-thread micro-batch workers: N cores,
//                   the best one process does with them (docs/design.md)
//   ranks-N         N processes x 1 thread over loopback (c10d Gloo, FileStore)
//   ranks-N-netns   the same ranks, each in a network namespace of its own
//                   (veth pairs to a bridge): traffic crosses a network stack
//                   as between hosts (root only; skipped otherwise)
//   ...-after       the same ranks summing their gradients in one all-reduce
//                   after the backward passes, where the others send each
//                   bucket as it becomes final (TrainerOptions::
//                   overlap_gradient_sum); --overlap=compare (the default)
//                   runs both
//
// Each configuration runs `--repeat` times, interleaved; medians with min
// and max. Ratios: scaling efficiency = ranks-N / (N x one-thread), and
// ranks-N / threads-N (the same cores). Tokens are every sequence token the
// step trains on (prompt and response). Ranks are this program re-executed
// with --child-rank; each reports its timed seconds and its seconds in
// collectives.
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../bench_util.h"
#include "../checkpoint_engine/bench_cross_host.h"
#include "sluice/runtime/flags.h"
#include "sluice/trainer/data_parallel.h"
#include "sluice/trainer/trainer.h"

namespace sluice::bench {
namespace {

using std::chrono::milliseconds;
using trainer::RolloutSample;

struct Workload {
  std::string preset = "5m";
  int64_t samples = 32, prompt = 32, response = 96, micro_batch_tokens = 2048, steps = 4;
};

// Deterministic sequences: response lengths spread over [response/2,
// 3*response/2], tokens and advantages from the index.
std::vector<RolloutSample> Batch(const Workload& w, int64_t vocab) {
  std::vector<RolloutSample> out;
  for (int64_t i = 0; i < w.samples; ++i) {
    RolloutSample s;
    s.id = static_cast<uint64_t>(i);
    s.group_id = i / 8;
    const int64_t len = w.response / 2 + (i * 37) % (w.response + 1);
    for (int64_t t = 0; t < w.prompt; ++t) s.prompt.push_back(static_cast<int32_t>(1 + (i * 31 + t * 7) % (vocab - 1)));
    for (int64_t t = 0; t < len; ++t) s.response.push_back(static_cast<int32_t>(1 + (i * 13 + t * 5) % (vocab - 1)));
    s.behavior_logprobs.assign(s.response.size(), -5.0f);
    s.versions.assign(s.response.size(), 0);
    s.advantage = (i % 3) - 1.0;
    out.push_back(std::move(s));
  }
  return out;
}

int64_t BatchTokens(const std::vector<RolloutSample>& batch) {
  int64_t n = 0;
  for (const auto& s : batch) n += static_cast<int64_t>(s.prompt.size() + s.response.size());
  return n;
}

struct Timing {
  double seconds = 0;     // the timed steps
  double collective = 0;  // of which in collectives (ranks only)
  // Gradient buckets summed, and how many left during the backward passes.
  int64_t buckets = 0, early = 0;
};

// Trains w.steps steps after one untimed warm-up step.
Result<Timing> TrainSteps(const Workload& w, int32_t workers, std::shared_ptr<trainer::DataParallelGroup> group,
                          bool overlap = true) {
  SLUICE_ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetModelConfig(w.preset));
  config.max_position_embeddings = std::max<int64_t>(config.max_position_embeddings, w.prompt + 2 * w.response);
  auto policy = std::make_shared<model::Transformer>(config, 1);
  trainer::TrainerOptions o;
  o.optimizer.lr = 1e-4;
  o.micro_batch_tokens = w.micro_batch_tokens;
  o.micro_batch_threads = workers;
  o.overlap_gradient_sum = overlap;
  SLUICE_ASSIGN_OR_RETURN(auto t, trainer::Trainer::Create(policy, nullptr, o, group));
  const std::vector<RolloutSample> batch = Batch(w, config.vocab_size);
  SLUICE_RETURN_IF_ERROR(t->RlStep(batch).status());
  const double before = group ? group->collective_seconds() : 0;
  const trainer::Trainer::GradientSums sums_before = t->gradient_sums();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < w.steps; ++i) SLUICE_RETURN_IF_ERROR(t->RlStep(batch).status());
  Timing out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.collective = group ? group->collective_seconds() - before : 0;
  out.buckets = t->gradient_sums().buckets - sums_before.buckets;
  out.early = t->gradient_sums().sent_during_backward - sums_before.sent_during_backward;
  return out;
}

std::vector<std::string> WorkloadArgs(const Workload& w) {
  return {"--preset=" + w.preset,
          "--samples=" + std::to_string(w.samples),
          "--prompt=" + std::to_string(w.prompt),
          "--response=" + std::to_string(w.response),
          "--micro-batch-tokens=" + std::to_string(w.micro_batch_tokens),
          "--steps=" + std::to_string(w.steps)};
}

// A rank (in a child process): joins the group, trains, prints its timing.
Status ChildMain(const runtime::FlagSet& flags, const Workload& w) {
  torch::set_num_threads(1);
  trainer::DataParallelOptions dp;
  SLUICE_ASSIGN_OR_RETURN(dp.rank, flags.GetInt("child-rank", 0, 255));
  SLUICE_ASSIGN_OR_RETURN(dp.world_size, flags.GetInt("world", 1, 256));
  SLUICE_ASSIGN_OR_RETURN(std::string store, flags.GetString("store"));
  SLUICE_RETURN_IF_ERROR(dp.SetStore(store));
  SLUICE_ASSIGN_OR_RETURN(bool serve, flags.GetBool("serve"));
  dp.store_served_by_launcher = !serve;
  SLUICE_ASSIGN_OR_RETURN(dp.bind_address, flags.GetString("bind"));
  dp.timeout = milliseconds(120000);
  SLUICE_ASSIGN_OR_RETURN(bool overlap, flags.GetBool("overlap-child"));
  SLUICE_ASSIGN_OR_RETURN(auto group, trainer::DataParallelGroup::Connect(dp));
  SLUICE_ASSIGN_OR_RETURN(Timing t, TrainSteps(w, 1, std::move(group), overlap));
  std::printf("RESULT %.9f %.9f %lld %lld\n", t.seconds, t.collective, static_cast<long long>(t.buckets),
              static_cast<long long>(t.early));
  return Status::Ok();
}

// Runs `world` ranks (in namespaces when `net` is set) and returns the
// slowest rank's timing (the step ends when the last rank's does).
Result<Timing> RunRanks(const Workload& w, int64_t world, const ce::NetTopology* net, bool overlap) {
  std::string store_at;
  static int runs = 0;
  const std::string store_file =
      "/tmp/dp_bench-" + std::to_string(::getpid()) + "-" + std::to_string(runs++) + ".store";
  struct RemoveFile {
    std::string path;
    ~RemoveFile() { std::remove(path.c_str()); }
  } remove_file{net == nullptr ? store_file : ""};
  if (net == nullptr) {
    std::remove(store_file.c_str());
    store_at = "file:" + store_file;  // one host: a file store, nothing listening
  } else {
    store_at = net->ip(0) + ":29610";  // rank 0 serves it in its own, fresh namespace
  }
  std::vector<ce::Child> children;
  for (int64_t r = 0; r < world; ++r) {
    std::vector<std::string> argv;
    if (net != nullptr) argv = {"ip", "netns", "exec", net->ns(static_cast<int>(r))};
    argv.push_back(ce::SelfExe());
    for (const std::string& a : WorkloadArgs(w)) argv.push_back(a);
    argv.push_back("--child-rank=" + std::to_string(r));
    argv.push_back("--world=" + std::to_string(world));
    argv.push_back("--store=" + store_at);
    argv.push_back(std::string("--serve=") + (net != nullptr && r == 0 ? "true" : "false"));
    argv.push_back("--bind=" + (net != nullptr ? net->ip(static_cast<int>(r)) : std::string("127.0.0.1")));
    argv.push_back(std::string("--overlap-child=") + (overlap ? "true" : "false"));
    SLUICE_ASSIGN_OR_RETURN(ce::Child child, ce::Child::Spawn(argv, /*capture_stdout=*/true, /*signal_pipe=*/false));
    ce::CleanupRegistry::Get().AddChild(child.pid());
    children.push_back(std::move(child));
  }
  Timing slowest;
  Status first = Status::Ok();
  for (ce::Child& c : children) {
    Status s = c.Wait(ce::Clock::now() + std::chrono::minutes(10));
    ce::CleanupRegistry::Get().RemoveChild(c.pid());
    if (!s.ok()) {
      if (first.ok()) first = s.WithContext("a rank");
      continue;
    }
    std::istringstream in(c.output());
    std::string line;
    bool found = false;
    while (std::getline(in, line)) {
      Timing t;
      long long buckets = 0, early = 0;
      if (std::sscanf(line.c_str(), "RESULT %lf %lf %lld %lld", &t.seconds, &t.collective, &buckets, &early) == 4) {
        t.buckets = buckets, t.early = early;
        found = true;
        if (t.seconds > slowest.seconds) slowest = t;
      }
    }
    if (!found && first.ok()) first = Status::Internal("a rank printed no RESULT line: " + c.output());
  }
  SLUICE_RETURN_IF_ERROR(first);
  return slowest;
}

Status Main(int argc, char** argv) {
  runtime::FlagSet flags;
  flags.Add("preset", "5m", "model preset (tiny, 1m, 5m, 20m)");
  flags.Add("samples", "32", "sequences in the global batch");
  flags.Add("prompt", "32", "prompt tokens per sequence");
  flags.Add("response", "96", "median response tokens (spread over [r/2, 3r/2])");
  flags.Add("micro-batch-tokens", "2048", "trainer.micro_batch_tokens");
  flags.Add("steps", "4", "timed RL steps per measurement (after one warm-up step)");
  flags.Add("ranks", "2", "data-parallel ranks (and cores of the threads-N baseline)");
  flags.Add("repeat", "3", "interleaved repetitions of every configuration");
  flags.Add("netns", "auto", "ranks in network namespaces: auto (when root), on, off");
  flags.Add("json", "", "also write the results here");
  flags.Add("child-rank", "-1", "internal: run as this rank");
  flags.Add("world", "1", "internal (--child-rank)");
  flags.Add("store", "", "internal (--child-rank): HOST:PORT of the rendezvous store");
  flags.Add("serve", "false", "internal (--child-rank): serve the store", /*is_bool=*/true);
  flags.Add("bind", "", "internal (--child-rank): the address to bind");
  flags.Add("overlap", "compare",
            "gradient sums of the ranks: compare (both), during (each bucket sent as it becomes final), after (one "
            "all-reduce after the backward passes)");
  flags.Add("overlap-child", "true", "internal (--child-rank): sum during backward", /*is_bool=*/true);
  SLUICE_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(argv + 1, argv + argc)));
  SLUICE_RETURN_IF_ERROR(flags.RejectPositional());
  if (flags.help_requested()) {
    std::printf("usage: dp_bench [flags]\n%s", flags.Usage().c_str());
    return Status::Ok();
  }
  Workload w;
  SLUICE_ASSIGN_OR_RETURN(w.preset, flags.GetString("preset"));
  SLUICE_ASSIGN_OR_RETURN(w.samples, flags.GetInt("samples", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(w.prompt, flags.GetInt("prompt", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(w.response, flags.GetInt("response", 2, 100000));
  SLUICE_ASSIGN_OR_RETURN(w.micro_batch_tokens, flags.GetInt("micro-batch-tokens", 1, 100000000));
  SLUICE_ASSIGN_OR_RETURN(w.steps, flags.GetInt("steps", 1, 100000));
  if (w.micro_batch_tokens < w.prompt + w.response / 2 + w.response) {
    return Status::InvalidArgument("--micro-batch-tokens must hold the longest sequence (" +
                                   std::to_string(w.prompt + w.response / 2 + w.response) + " tokens)");
  }
  SLUICE_ASSIGN_OR_RETURN(int64_t child_rank, flags.GetInt("child-rank", -1, 255));
  if (child_rank >= 0) return ChildMain(flags, w);

  ce::CleanupRegistry::InstallSignalCleanup();  // before any thread starts
  SLUICE_ASSIGN_OR_RETURN(int64_t ranks, flags.GetInt("ranks", 2, 16));
  SLUICE_ASSIGN_OR_RETURN(int64_t repeat, flags.GetInt("repeat", 1, 100));
  SLUICE_ASSIGN_OR_RETURN(std::string netns, flags.GetChoice("netns", {"auto", "on", "off"}));
  SLUICE_ASSIGN_OR_RETURN(std::string json_path, flags.GetString("json"));
  SLUICE_ASSIGN_OR_RETURN(std::string overlap, flags.GetChoice("overlap", {"compare", "during", "after"}));
  std::unique_ptr<ce::NetTopology> net;
  if (netns != "off") {
    Status usable = ce::CheckCanUseNetns();
    if (usable.ok()) {
      ce::SweepStaleNamespaces();
      SLUICE_ASSIGN_OR_RETURN(net, ce::NetTopology::Create(static_cast<int>(ranks)));
    } else if (netns == "on") {
      return usable.WithContext("--netns=on");
    } else {
      std::printf("network namespaces skipped: %s\n", usable.ToString().c_str());
    }
  }

  SLUICE_ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetModelConfig(w.preset));
  const int64_t tokens = BatchTokens(Batch(w, config.vocab_size)) * w.steps;
  std::printf(
      "dp_bench: preset %s, %lld sequences x (%lld prompt + %lld median response) tokens = %lld tokens a "
      "step, micro-batches of %lld tokens, %lld timed steps, %lld ranks, %lld repeats (interleaved)\n",
      w.preset.c_str(), static_cast<long long>(w.samples), static_cast<long long>(w.prompt),
      static_cast<long long>(w.response), static_cast<long long>(tokens / w.steps),
      static_cast<long long>(w.micro_batch_tokens), static_cast<long long>(w.steps), static_cast<long long>(ranks),
      static_cast<long long>(repeat));
  const std::string threads_name = "threads-" + std::to_string(ranks), ranks_name = "ranks-" + std::to_string(ranks),
                    netns_name = ranks_name + "-netns";
  std::vector<std::string> names = {"one-thread", threads_name};
  for (const std::string& base : net ? std::vector<std::string>{ranks_name, netns_name} : std::vector{ranks_name}) {
    if (overlap != "after") names.push_back(base);
    if (overlap != "during") names.push_back(base + "-after");
  }
  std::map<std::string, std::pair<int64_t, int64_t>> buckets;  // (sent during backward, all), over the repeats
  std::map<std::string, std::vector<double>> rate, collective_share;
  for (int64_t rep = 0; rep < repeat; ++rep) {
    for (const std::string& name : names) {
      Timing t;
      if (name == "one-thread" || name == threads_name) {
        torch::set_num_threads(1);
        SLUICE_ASSIGN_OR_RETURN(t, TrainSteps(w, name == "one-thread" ? 1 : static_cast<int32_t>(ranks), nullptr));
      } else {
        const bool after = name.size() > 6 && name.compare(name.size() - 6, 6, "-after") == 0;
        const bool in_netns = name.rfind(netns_name, 0) == 0;
        SLUICE_ASSIGN_OR_RETURN(t, RunRanks(w, ranks, in_netns ? net.get() : nullptr, !after));
        buckets[name].first += t.early;
        buckets[name].second += t.buckets;
      }
      rate[name].push_back(static_cast<double>(tokens) / t.seconds);
      collective_share[name].push_back(t.collective / t.seconds);
      std::printf("  repeat %lld  %-16s %9.0f tokens/s  (%.1f%% in collectives)\n", static_cast<long long>(rep + 1),
                  name.c_str(), rate[name].back(), 100 * collective_share[name].back());
      std::fflush(stdout);
    }
  }
  std::printf("\n%-16s %12s %12s %12s %14s %18s\n", "configuration", "tokens/s", "min", "max", "cores busy",
              "in collectives");
  nlohmann::json out = {{"preset", w.preset}, {"tokens_per_step", tokens / w.steps}, {"ranks", ranks}};
  for (const std::string& name : names) {
    const Stats s = Summarize(rate[name]), c = Summarize(collective_share[name]);
    const int64_t cores = name == "one-thread" ? 1 : ranks;
    std::printf("%-16s %12.0f %12.0f %12.0f %14lld %17.1f%%\n", name.c_str(), s.median, s.min, s.max,
                static_cast<long long>(cores), 100 * c.median);
    out["configurations"][name] = {
        {"tokens_per_s", s.median}, {"min", s.min}, {"max", s.max}, {"cores", cores}, {"collective_share", c.median}};
  }
  const double one = Summarize(rate["one-thread"]).median, threads = Summarize(rate[threads_name]).median;
  for (const std::string& name : names) {
    if (name.rfind(ranks_name, 0) != 0) continue;
    const double r = Summarize(rate[name]).median;
    std::printf("%s: scaling efficiency %.2f (%.2fx one thread on %lld cores); %.2fx %s (the same cores)\n",
                name.c_str(), r / (static_cast<double>(ranks) * one), r / one, static_cast<long long>(ranks),
                r / threads, threads_name.c_str());
    out["ratios"][name] = {{"scaling_efficiency", r / (static_cast<double>(ranks) * one)}, {"vs_threads", r / threads}};
  }
  // The overlap: the same ranks summing during backward against after it.
  for (const std::string& base : {ranks_name, netns_name}) {
    if (rate.count(base) == 0 || rate.count(base + "-after") == 0) continue;
    const double during = Summarize(rate[base]).median, after = Summarize(rate[base + "-after"]).median;
    std::printf(
        "%s: gradient buckets sent during backward %.2fx one sum after it (%lld of %lld buckets sent while a "
        "backward pass still ran; waiting in collectives %.1f%% against %.1f%%, where the overlap's Gloo work "
        "during the passes is not counted)\n",
        base.c_str(), during / after, static_cast<long long>(buckets[base].first),
        static_cast<long long>(buckets[base].second), 100 * Summarize(collective_share[base]).median,
        100 * Summarize(collective_share[base + "-after"]).median);
    out["ratios"][base]["overlap_vs_after"] = during / after;
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) return Status::Unavailable("cannot write " + json_path);
  }
  return Status::Ok();
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) { return sluice::bench::BenchMain(argc, argv, sluice::bench::Main); }
