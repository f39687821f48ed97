#include "sluice/rollout/standby_weights.h"

#include <algorithm>
#include <array>
#include <optional>

#include "sluice/common/background_thread.h"
#include "sluice/common/logging.h"
#include "sluice/model/transformer.h"
#include "sluice/model/weights.h"

namespace sluice::rollout {

namespace {

using Clock = std::chrono::steady_clock;
namespace ce = checkpoint_engine;

constexpr auto kPollInterval = std::chrono::milliseconds(50);

}  // namespace

struct StandbyWeights::State {
  explicit State(PolicyVersion serving_version) : slots(serving_version) {}

  std::array<std::shared_ptr<model::Transformer>, 2> buffers;
  ce::WeightReader* source = nullptr;       // outlives the State's filler (Stop joins it)
  StandbySlots slots;                       // which buffer serves, is ready or is handed (torch-free, standby_slots.h)
  BackgroundThread filler{"standby-fill"};  // last: joined before the rest is destroyed

  // The hook: called by the engine between steps.
  std::optional<PolicySnapshot> OnStep(PolicyVersion current) {
    std::optional<StandbySlots::Handed> handed = slots.OnStep(current);
    if (!handed) return std::nullopt;
    return PolicySnapshot{buffers[handed->buffer], handed->version};
  }

  void FillLoop(std::stop_token stop) {
    int64_t newest = slots.serving_version();
    while (!stop.stop_requested()) {
      // Wait for a newer version than anything we hold.
      Result<ce::PinnedWeights> pinned = source->WaitAndPin(newest + 1, kPollInterval);
      if (!pinned.ok()) {
        if (pinned.status().code() != StatusCode::kTimeout) slots.FillFailed(pinned.status().ToString());
        continue;
      }
      if (pinned->version <= newest) continue;
      const auto start = Clock::now();
      slots.Saw(pinned->version);
      // Wait until a buffer is free (the engine switched to the handed one).
      const std::optional<int> target = slots.TakeFreeBuffer(stop, kPollInterval);
      if (!target) return;
      Status loaded = model::LoadWeights(*buffers[*target], pinned->tensors);
      pinned->tensors.clear();   // unpin
      newest = pinned->version;  // a version that does not fit is not retried
      if (!loaded.ok()) {
        const std::string error = "version " + std::to_string(pinned->version) + ": " + loaded.ToString();
        SLUICE_LOG(WARNING) << "standby weights: " << error;
        slots.FillFailed(error);
        continue;
      }
      slots.Filled(*target, pinned->version, std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
};

StandbyWeights::StandbyWeights(std::shared_ptr<State> state) : state_(std::move(state)) {}

StandbyWeights::~StandbyWeights() { Stop(); }

Result<std::unique_ptr<StandbyWeights>> StandbyWeights::Create(std::shared_ptr<model::Transformer> serving,
                                                               PolicyVersion serving_version,
                                                               ce::WeightReader& weights) {
  if (!serving) return Status::InvalidArgument("standby weights: null serving model");
  auto state = std::make_shared<State>(serving_version);
  state->buffers = {serving, model::CloneModel(*serving)};
  state->source = &weights;
  State* raw = state.get();
  SLUICE_RETURN_IF_ERROR(state->filler.Start([raw](std::stop_token stop) { raw->FillLoop(stop); }));
  return std::unique_ptr<StandbyWeights>(new StandbyWeights(std::move(state)));
}

WeightSwapHook StandbyWeights::Hook() {
  std::shared_ptr<State> state = state_;
  return [state](PolicyVersion current) { return state->OnStep(current); };
}

Status StandbyWeights::WaitUntilReady(int64_t v, std::chrono::milliseconds timeout) {
  return state_->slots.WaitUntilReady(v, timeout);
}

StandbyStats StandbyWeights::stats() const { return state_->slots.stats(); }

void StandbyWeights::Stop() { state_->filler.Stop(); }

}  // namespace sluice::rollout
