#include "sluice/rollout/standby_weights.h"

#include <algorithm>
#include <array>
#include <optional>

#include "sluice/common/background_thread.h"
#include "sluice/common/logging.h"
#include "sluice/common/mutex.h"
#include "sluice/model/transformer.h"
#include "sluice/model/weights.h"

namespace sluice::rollout {

namespace {

using Clock = std::chrono::steady_clock;
namespace ce = checkpoint_engine;

constexpr auto kPollInterval = std::chrono::milliseconds(50);

}  // namespace

struct StandbyWeights::State {
  std::array<std::shared_ptr<model::Transformer>, 2> buffers;
  ce::WeightReader* source = nullptr;  // outlives the State's filler (Stop joins it)
  BackgroundThread filler{"standby-fill"};

  mutable Mutex mu;
  CondVar changed;
  int serving SLUICE_GUARDED_BY(mu) = 0;  // buffer the engine reads
  std::array<PolicyVersion, 2> version SLUICE_GUARDED_BY(mu) = {0, 0};
  std::optional<int> handed SLUICE_GUARDED_BY(mu);  // given to the engine, not serving yet
  std::optional<int> ready SLUICE_GUARDED_BY(mu);   // filled, not handed
  StandbyStats stats SLUICE_GUARDED_BY(mu);

  int Other(int b) const { return 1 - b; }

  // The hook: called by the engine between steps.
  std::optional<PolicySnapshot> OnStep(PolicyVersion current) {
    const auto start = Clock::now();
    std::optional<PolicySnapshot> out;
    {
      MutexLock lock(&mu);
      if (handed && version[*handed] == current) {
        // The engine serves the handed buffer now: the old one is free.
        serving = *handed;
        handed.reset();
        changed.NotifyAll();
      }
      if (!handed && ready && version[*ready] > current) {
        handed = *ready;
        ready.reset();
        ++stats.handed;
        stats.ready_version = -1;
        out = PolicySnapshot{buffers[*handed], version[*handed]};
        changed.NotifyAll();
      }
      stats.max_hook_seconds =
          std::max(stats.max_hook_seconds, std::chrono::duration<double>(Clock::now() - start).count());
    }
    return out;
  }

  // The buffer the filler may write: neither serving nor handed.
  std::optional<int> FreeBuffer() const SLUICE_REQUIRES(mu) {
    const int other = Other(serving);
    if (handed && *handed == other) return std::nullopt;
    return other;
  }

  void FillLoop(std::stop_token stop) {
    int64_t newest = 0;
    {
      MutexLock lock(&mu);
      newest = version[serving];
    }
    while (!stop.stop_requested()) {
      // Wait for a newer version than anything we hold.
      Result<ce::PinnedWeights> pinned = source->WaitAndPin(newest + 1, kPollInterval);
      if (!pinned.ok()) {
        if (pinned.status().code() != StatusCode::kTimeout) {
          MutexLock lock(&mu);
          ++stats.fill_errors;
          stats.last_error = pinned.status().ToString();
        }
        continue;
      }
      if (pinned->version <= newest) continue;
      const auto start = Clock::now();
      int target = 0;
      {
        // Wait until a buffer is free (the engine switched to the handed one).
        MutexLock lock(&mu);
        stats.newest_seen = pinned->version;
        while (!FreeBuffer() && !stop.stop_requested())
          changed.WaitFor(&mu, kPollInterval, [&] { return FreeBuffer().has_value(); });
        if (stop.stop_requested()) return;
        target = *FreeBuffer();
        if (ready && *ready == target) {
          ready.reset();  // superseded before it was handed: overwrite it
          stats.ready_version = -1;
        }
      }
      Status loaded = model::LoadWeights(*buffers[target], pinned->tensors);
      pinned->tensors.clear();  // unpin
      MutexLock lock(&mu);
      if (!loaded.ok()) {
        ++stats.fill_errors;
        stats.last_error = "version " + std::to_string(pinned->version) + ": " + loaded.ToString();
        SLUICE_LOG(WARNING) << "standby weights: " << stats.last_error;
        newest = pinned->version;  // do not retry a version that does not fit
        continue;
      }
      version[target] = pinned->version;
      ready = target;
      newest = pinned->version;
      ++stats.fills;
      stats.ready_version = pinned->version;
      stats.last_fill_seconds = std::chrono::duration<double>(Clock::now() - start).count();
      changed.NotifyAll();
    }
  }
};

StandbyWeights::StandbyWeights(std::shared_ptr<State> state) : state_(std::move(state)) {}

StandbyWeights::~StandbyWeights() { Stop(); }

Result<std::unique_ptr<StandbyWeights>> StandbyWeights::Create(std::shared_ptr<model::Transformer> serving,
                                                               PolicyVersion serving_version,
                                                               ce::WeightReader& weights) {
  if (!serving) return Status::InvalidArgument("standby weights: null serving model");
  auto state = std::make_shared<State>();
  state->buffers = {serving, model::CloneModel(*serving)};
  state->source = &weights;
  {
    MutexLock lock(&state->mu);
    state->version = {serving_version, serving_version};
  }
  State* raw = state.get();
  SLUICE_RETURN_IF_ERROR(state->filler.Start([raw](std::stop_token stop) { raw->FillLoop(stop); }));
  return std::unique_ptr<StandbyWeights>(new StandbyWeights(std::move(state)));
}

WeightSwapHook StandbyWeights::Hook() {
  std::shared_ptr<State> state = state_;
  return [state](PolicyVersion current) { return state->OnStep(current); };
}

Status StandbyWeights::WaitUntilReady(int64_t v, std::chrono::milliseconds timeout) {
  State& s = *state_;
  MutexLock lock(&s.mu);
  const bool ok = s.changed.WaitFor(&s.mu, timeout, [&]() SLUICE_REQUIRES(s.mu) {
    return (s.ready && s.version[*s.ready] >= v) || (s.handed && s.version[*s.handed] >= v) ||
           s.version[s.serving] >= v;
  });
  if (ok) return Status::Ok();
  return Status::Timeout("standby weights: version " + std::to_string(v) + " not ready after " +
                         std::to_string(timeout.count()) + " ms (newest seen " + std::to_string(s.stats.newest_seen) +
                         (s.stats.last_error.empty() ? "" : ", last error: " + s.stats.last_error) + ")");
}

StandbyStats StandbyWeights::stats() const {
  MutexLock lock(&state_->mu);
  return state_->stats;
}

void StandbyWeights::Stop() { state_->filler.Stop(); }

std::vector<WeightSwapHook> ShareWeightSwapHook(WeightSwapHook hook, int engines, PolicyVersion start_version) {
  struct Shared {
    Mutex mu;
    WeightSwapHook hook SLUICE_GUARDED_BY(mu);
    std::vector<PolicyVersion> serving SLUICE_GUARDED_BY(mu);  // by engine
    std::optional<PolicySnapshot> newest SLUICE_GUARDED_BY(mu);
  };
  auto shared = std::make_shared<Shared>();
  {
    MutexLock lock(&shared->mu);
    shared->hook = std::move(hook);
    shared->serving.assign(static_cast<size_t>(std::max(engines, 0)), start_version);
  }
  std::vector<WeightSwapHook> hooks;
  for (int i = 0; i < engines; ++i) {
    hooks.push_back([shared, i](PolicyVersion current) -> std::optional<PolicySnapshot> {
      MutexLock lock(&shared->mu);
      shared->serving[static_cast<size_t>(i)] = current;
      const PolicyVersion slowest = *std::min_element(shared->serving.begin(), shared->serving.end());
      if (auto next = shared->hook(slowest)) shared->newest = std::move(next);
      if (shared->newest && shared->newest->version > current) return shared->newest;
      return std::nullopt;
    });
  }
  return hooks;
}

}  // namespace sluice::rollout
