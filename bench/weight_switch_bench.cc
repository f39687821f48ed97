// Rollout stall per weight switch (docs/checkpoint_engine.md): a rollout
// engine decodes at full occupancy while a publisher commits a new weight
// version into the CheckpointEngine's VersionStore every `interval-ms`. Two
// ways for rollout to take a version, measured in the same run:
//   standby  StandbyWeights copies the version into a standby model in the
//            background; the engine's hook swaps pointers between steps
//            (the stall is the hook call);
//   blocking the engine's thread copies the version into the serving model
//            between steps (what a design without a standby buffer pays).
// Prints the stall per switch (median and max), the copy time, the decode
// step time without a switch, and the ratio blocking/standby.
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/model/transformer.h"
#include "sluice/model/weights.h"
#include "sluice/rollout/engine.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/runtime/flags.h"
#include "sluice/runtime/process.h"

namespace {

using sluice::Result;
using sluice::Status;
namespace ce = sluice::checkpoint_engine;
namespace model = sluice::model;
namespace rollout = sluice::rollout;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

struct Run {
  std::vector<double> stalls;       // per switch, seconds
  std::vector<double> plain_steps;  // decode steps without a switch
  int64_t switches = 0;
  double copy_seconds = 0;  // standby: last background fill; blocking: mean copy
};

// Keeps `slots` sequences decoding; new requests replace finished ones.
void Refill(rollout::RolloutEngine& engine, int32_t slots, int32_t length, uint64_t* next_id) {
  while (engine.num_running() + static_cast<int32_t>(engine.num_waiting()) < slots) {
    rollout::GenerationRequest r;
    r.id = (*next_id)++;
    r.prompt = {1, 2, 3, 4};
    r.sampling.temperature = 1.0f;
    r.sampling.seed = r.id;
    r.sampling.max_new_tokens = length;
    r.sampling.forced_length = length;
    (void)engine.Submit(std::move(r));
  }
}

Result<Run> Measure(bool standby_mode, std::shared_ptr<model::Transformer> serving, ce::VersionStore& store,
                    int64_t first_version, int32_t slots, int32_t length, double seconds, int interval_ms) {
  rollout::EngineOptions eo;
  eo.num_slots = slots;
  eo.eos_token_id = -1;
  SLUICE_ASSIGN_OR_RETURN(auto engine, rollout::RolloutEngine::Create({serving, first_version}, eo));
  std::unique_ptr<rollout::StandbyWeights> standby;
  if (standby_mode) {
    SLUICE_ASSIGN_OR_RETURN(standby, rollout::StandbyWeights::Create(serving, first_version, store));
  }
  std::vector<double> hook_seconds;  // standby: time of each hook call that handed a version
  if (standby_mode) {
    engine->SetWeightSwapHook([hook = standby->Hook(), &hook_seconds](rollout::PolicyVersion current) {
      const auto t0 = Clock::now();
      auto snapshot = hook(current);
      if (snapshot) hook_seconds.push_back(Seconds(Clock::now() - t0));
      return snapshot;
    });
  }
  // The publisher: a new version every interval, same bytes (what is measured is the switch).
  SLUICE_ASSIGN_OR_RETURN(sluice::TensorMap weights, model::ExportWeights(*serving));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> published{first_version};
  std::thread publisher([&] {
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
      if (store.Publish(published.load() + 1, weights).ok()) published.fetch_add(1);
    }
  });
  Run run;
  uint64_t next_id = 0;
  std::vector<double> copies;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  Status status;
  while (Clock::now() < end) {
    Refill(*engine, slots, length, &next_id);
    double stall = 0;
    const int64_t before = engine->policy_version();
    if (!standby_mode && store.latest_version() > before) {
      // Blocking switch: copy the newest version into the serving model now.
      const auto t0 = Clock::now();
      auto handle = store.AcquireLatest();
      if (!handle.ok()) {
        status = handle.status();
        break;
      }
      sluice::TensorMap views;
      for (const auto& spec : store.layout()) views.emplace(spec.name, *handle->tensor(spec.name));
      status = model::LoadWeights(*serving, views);
      if (!status.ok()) break;
      stall = Seconds(Clock::now() - t0);
      copies.push_back(stall);
      engine->SetWeightSwapHook(
          [v = handle->version(), serving](rollout::PolicyVersion current) -> std::optional<rollout::PolicySnapshot> {
            if (current < v) return rollout::PolicySnapshot{serving, v};
            return std::nullopt;
          });
    }
    const auto t0 = Clock::now();
    auto done = engine->Step();
    if (!done.ok()) {
      status = done.status();
      break;
    }
    const double step = Seconds(Clock::now() - t0);
    if (engine->policy_version() != before) {
      ++run.switches;
      if (!standby_mode) run.stalls.push_back(stall);
    } else {
      run.plain_steps.push_back(step);
    }
  }
  stop.store(true);
  publisher.join();
  SLUICE_RETURN_IF_ERROR(status);
  if (standby_mode) {
    run.stalls = hook_seconds;  // the hook call is the whole stall
    run.copy_seconds = standby->stats().last_fill_seconds;
  } else {
    double sum = 0;
    for (double c : copies) sum += c;
    run.copy_seconds = copies.empty() ? 0 : sum / static_cast<double>(copies.size());
  }
  return run;
}

Status Main(int argc, char** argv) {
  sluice::runtime::FlagSet flags;
  flags.Add("preset", "20m", "built-in model: tiny, 1m, 5m, 20m");
  flags.Add("slots", "32", "sequences decoding at once");
  flags.Add("length", "256", "tokens per sequence");
  flags.Add("seconds", "6", "measured seconds per mode");
  flags.Add("interval-ms", "300", "a new version every this many milliseconds");
  flags.Add("threads", "0", "intra-op threads (0: all cores)");
  SLUICE_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(argv + 1, argv + argc)));
  if (flags.help_requested()) {
    std::printf("usage: weight_switch_bench [flags]\n%s", flags.Usage().c_str());
    return Status::Ok();
  }
  SLUICE_ASSIGN_OR_RETURN(std::string preset, flags.GetString("preset"));
  SLUICE_ASSIGN_OR_RETURN(int64_t slots, flags.GetInt("slots", 1, 4096));
  SLUICE_ASSIGN_OR_RETURN(int64_t length, flags.GetInt("length", 1, 100000));
  SLUICE_ASSIGN_OR_RETURN(double seconds, flags.GetDouble("seconds", 0.1, 3600));
  SLUICE_ASSIGN_OR_RETURN(int64_t interval, flags.GetInt("interval-ms", 1, 3600000));
  SLUICE_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", 0, 1024));
  torch::set_num_threads(threads > 0 ? static_cast<int>(threads) : std::max(1u, std::thread::hardware_concurrency()));
  SLUICE_ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetModelConfig(preset));
  if (length + 4 > config.max_position_embeddings)
    return Status::InvalidArgument("--length exceeds the model's context");
  auto serving = std::make_shared<model::Transformer>(config, 0);
  SLUICE_ASSIGN_OR_RETURN(sluice::TensorMap initial, model::ExportWeights(*serving));
  ce::VersionStoreOptions so;
  so.layout = ce::LayoutOf(initial);
  SLUICE_ASSIGN_OR_RETURN(auto store, ce::VersionStore::Create(so));
  SLUICE_RETURN_IF_ERROR(store->Publish(0, initial));
  std::fprintf(stderr, "%s (%.1fM params, %.1f MB of weights): %lld slots x %lld tokens, a version every %lld ms\n",
               preset.c_str(), config.NumParameters() / 1e6, static_cast<double>(store->version_bytes()) / 1e6,
               static_cast<long long>(slots), static_cast<long long>(length), static_cast<long long>(interval));
  SLUICE_ASSIGN_OR_RETURN(Run standby,
                          Measure(true, serving, *store, store->latest_version(), static_cast<int32_t>(slots),
                                  static_cast<int32_t>(length), seconds, static_cast<int>(interval)));
  SLUICE_ASSIGN_OR_RETURN(Run blocking,
                          Measure(false, serving, *store, store->latest_version(), static_cast<int32_t>(slots),
                                  static_cast<int32_t>(length), seconds, static_cast<int>(interval)));
  auto row = [](const char* name, const Run& r) {
    std::printf("%-9s %8lld %14.3f %14.3f %14.2f %16.2f\n", name, static_cast<long long>(r.switches),
                1e3 * Quantile(r.stalls, 0.5),
                1e3 * (r.stalls.empty() ? 0 : *std::max_element(r.stalls.begin(), r.stalls.end())),
                1e3 * r.copy_seconds, 1e3 * Quantile(r.plain_steps, 0.5));
  };
  std::printf("\nrollout stall per weight switch, %s, %d threads\n", preset.c_str(), torch::get_num_threads());
  std::printf("%-9s %8s %14s %14s %14s %16s\n", "mode", "switches", "stall p50 ms", "stall max ms", "copy ms",
              "decode step ms");
  row("standby", standby);
  row("blocking", blocking);
  const double s = standby.stalls.empty() ? 0 : *std::max_element(standby.stalls.begin(), standby.stalls.end());
  std::printf("blocking/standby stall (median blocking over worst standby): %.0fx\n",
              s > 0 ? Quantile(blocking.stalls, 0.5) / s : 0.0);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) { return sluice::bench::BenchMain(argc, argv, Main); }
