// A discrete-event model of a training run: rollout engines with continuous
// batching, a reward scorer, a trainer with micro-batch workers (and workers
// lent from the rollout's cores while it idles), weight publish and switch,
// on a virtual clock (docs/simulator.md).
//
// The scheduling decisions are the product's own code, not a second copy:
// the rollout's prompt intake and the staleness admission under it
// (sluice/schedule/intake.h) and the trainer's micro-batch packing
// (sluice/schedule/packing.h). What the simulator models itself, following
// the pipeline's roles: an engine's loop (take prompts, wait for lent
// workers, switch to a newer version, admit waiting requests into free slots
// with their prefill, one decode step), the trainer taking each step's own
// prompts in order, training, publishing, then acking.
//
// Threads that share cores run their work at the speed the profile gives
// for the number working at that moment (CostProfile::Slowdown): a piece of
// work's finish moves whenever another thread starts or stops. A version can
// be switched to once its standby copy is filled (weights.fill_s).
//
// What it leaves out: the hub's own time, evaluation, checkpoints, the CPU
// the standby copy takes.
//
// Thread safety: Simulate is a pure function of its arguments.
#ifndef SLUICE_SIMULATE_SIMULATOR_H_
#define SLUICE_SIMULATE_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/simulate/cost_profile.h"

namespace sluice::simulate {

// The pipeline's streaming modes (a run's options map onto a Layout with
// launch::SimulatedLayout, which parses and names them).
enum class Mode { kSync, kOneStepOff, kAsync };

struct Workload {
  int64_t steps = 1;             // trainer steps
  int64_t prompts_per_step = 1;  // P
  int64_t group_size = 1;        // G
  // Tokens of each prompt, by prompt cursor (steps x P entries), or one entry
  // for all.
  std::vector<int32_t> prompt_tokens = {16};
  // Tokens of each answer, by answer id = cursor x G + g (steps x P x G).
  std::vector<int32_t> response_tokens;

  Status Validate() const;
};

struct Layout {
  Mode mode = Mode::kAsync;
  int64_t max_staleness = 2;  // async only (sync 0, one_step_off 1)
  int64_t sync_interval = 1;  // trainer steps per published version
  int32_t rollout_engines = 1;
  int64_t rollout_slots = 64;   // in total, split across the engines
  int32_t trainer_workers = 1;  // the trainer's own micro-batch workers
  int32_t lent_workers = 0;     // workers on the rollout's cores, only while every engine idles
  int64_t micro_batch_tokens = 8192;
  // Optimizer updates per trainer step: the step's samples in that many
  // consecutive parts, each packed and trained (every micro-batch done)
  // before its update and the next part, as the trainer's mini-batches.
  int64_t mini_batches = 1;

  // What GPU serving and training stacks do, and the pipeline on CPUs does
  // not (sluice/simulate/gpu.h sets them):
  // Tokens of KV cache per engine (0: unlimited). A waiting sequence is
  // admitted only while its prompt (unless its group's is cached) and one
  // token per row fit; when the rows' next tokens do not fit, the newest rows
  // are preempted and computed again when readmitted (vLLM's recompute).
  int64_t kv_capacity_tokens = 0;
  // An in-flight switch interrupts the batch and computes every row's cache
  // again under the new weights (AReaL's partial rollouts), instead of
  // decoding on over the old cache (the pipeline, PipelineRL).
  bool recompute_on_switch = false;
  // The trainer takes the first P groups to complete, in that order, instead
  // of the next P prompts by cursor.
  bool completion_order = false;
  // A micro-batch costs its samples' tokens packed end to end (attention
  // within each sample), not rows x its longest.
  bool unpadded_micro_batches = false;
  // Decode steps an engine takes in one event while nothing inside it can
  // change (no row finishes, the cache has room): new prompts and versions
  // are noticed only between events. 1 is exact; more makes long generations
  // cheap to simulate.
  int32_t max_steps_per_event = 1;

  Status Validate() const;
};

struct StepTiming {
  double start_s = 0;         // the trainer had all the step's groups
  double end_s = 0;           // acked (published before)
  double staleness_mean = 0;  // trainer version - an answer's first token's version
  int64_t staleness_max = 0;
};

struct SimResult {
  double wall_s = 0;          // the last step's ack
  double trainer_wait_s = 0;  // waiting for groups
  double trainer_busy_s = 0;  // training, publishing
  double rollout_busy_s = 0;  // an engine decoding or prefilling, averaged over engines
  double occupancy = 0;       // mean share of an engine's slots decoding per decode step
  double staleness_mean = 0;  // over answers
  int64_t decode_steps = 0;   // over engines
  int64_t generated_tokens = 0;
  int64_t lent_micro_batches = 0;
  int64_t preemptions = 0;        // rows preempted for lack of KV cache
  int64_t recomputed_tokens = 0;  // cache computed again at interrupting switches
  // The work in core-seconds, whatever ran in parallel: the trainer's steps
  // and micro-batches (publish included), the engines' steps.
  double trainer_compute_s = 0;
  double rollout_compute_s = 0;
  std::vector<StepTiming> steps;
};

// Errors: InvalidArgument naming the bad field of the workload, layout or
// profile (a sample longer than micro_batch_tokens, or with its prompt longer
// than kv_capacity_tokens, included); Internal if
// the model stops making progress (a bug, reported rather than looping).
Result<SimResult> Simulate(const Workload& workload, const Layout& layout, const CostProfile& costs);

}  // namespace sluice::simulate

#endif  // SLUICE_SIMULATE_SIMULATOR_H_
