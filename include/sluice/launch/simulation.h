// What the simulator needs from a real run (docs/simulator.md): the
// measurements of `sluice calibrate` (what each part of a run costs on this
// machine for one model, fitted into a cost profile,
// sluice/simulate/cost_profile.h), and a run's options as the simulator's
// layout. Every figure comes
// from the product's own components, really run: the rollout engine's steps,
// the trainer's RL steps, a version store's publish and a standby buffer's
// switch, the task's scorer.
//
// Thread safety: Calibrate sets libtorch's intra-op threads for its
// duration; run it alone.
#ifndef SLUICE_LAUNCH_SIMULATION_H_
#define SLUICE_LAUNCH_SIMULATION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "sluice/common/status.h"
#include "sluice/model/config.h"
#include "sluice/simulate/cost_profile.h"
#include "sluice/simulate/simulator.h"
#include "sluice/trainer/types.h"

namespace sluice::model {
class Transformer;
}
namespace sluice::reward {
class Task;
}
namespace sluice::pipeline {
struct RunOptions;
}

namespace sluice::launch {

// The model's shape as a profile names it: a profile is refused for a model
// of another shape.
std::string ModelShape(const model::ModelConfig& config);

struct CalibrationOptions {
  int32_t threads = 1;              // intra-op threads per role (the profile's `threads`)
  int32_t cores = 2;                // the machine's cores the roles share (the profile's cpu.cores)
  int64_t max_rows = 64;            // the largest decode batch measured (the run's slots)
  int64_t max_context = 384;        // prompt + response tokens measured up to (capped by the model)
  bool quick = false;               // fewer points (tests)
  trainer::TrainerOptions trainer;  // the run's trainer options (micro_batch_threads is set to 1)
  // The run's own step: its samples (prompts x group) with long-tail answer
  // lengths (median, longest = median x tail) after prompts of
  // `prompt_tokens`, measured as one more trainer batch so the fit
  // interpolates at the run's shape. samples 0: none.
  struct StepShape {
    int64_t samples = 0;
    int32_t median = 16;
    double tail = 1;
    int32_t prompt_tokens = 16;
  };
  StepShape step;
  uint64_t seed = 0;
  std::string measured_by;
};

// How a mode gets `threads` cores when modes are compared (pipeline_bench,
// sluice simulate): sync (roles alternate) gives each role all of them, as
// `threads` single-threaded engines and micro-batch workers (or, without
// `data_parallel_sync`, intra-op threads); one_step_off and async give the
// rollout `rollout_threads` and the trainer the rest (lending as configured).
void ShareCores(pipeline::RunOptions* options, int32_t threads, int32_t rollout_threads, bool data_parallel_sync);

// The simulator's layout for a run's options with `process_threads`
// (RunOptions::Threads). InvalidArgument for pipeline.mode direct, and for an
// engine or trainer worker with more than one thread (the profile times one).
Result<simulate::Layout> SimulatedLayout(const pipeline::RunOptions& options, int32_t process_threads);

// Errors: InvalidArgument for bad options; what the measured components
// return (Internal for a libtorch failure).
Result<simulate::CostProfile> Calibrate(std::shared_ptr<model::Transformer> model, const reward::Task& task,
                                        const CalibrationOptions& options);

}  // namespace sluice::launch

#endif  // SLUICE_LAUNCH_SIMULATION_H_
