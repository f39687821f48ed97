// ShareWeightSwapHook (standby_weights.h), torch-free so that its locking is
// checked by clang's -Wthread-safety (the test command's thread_safety_check).
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "sluice/common/mutex.h"
#include "sluice/rollout/standby_weights.h"

namespace sluice::rollout {

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
