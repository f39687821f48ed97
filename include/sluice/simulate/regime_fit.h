// Fitting the unknowns of a published system to some of its published runs,
// and predicting its other runs with them, no refitting (docs/simulator.md,
// "The published regimes"): the predictive check behind
// `sluice plan --predictive-check`.
//
// A publication gives its cluster, its split, its batch and each run's
// seconds per step (and often the phases of a step); it rarely gives its
// answer lengths or how fast its kernels ran. FitRegime sets those unknowns
// (the median and spread of the answer lengths from a grid, the trainer's
// MFU and the colocated trainer's slowdown in closed form) so the model
// reproduces the runs it is given; PredictRun then simulates any other run
// of the same system, its cluster and split changed and nothing else.
//
// Thread safety: pure functions (the published data is immutable).
#ifndef SLUICE_SIMULATE_REGIME_FIT_H_
#define SLUICE_SIMULATE_REGIME_FIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/simulate/gpu.h"
#include "sluice/simulate/simulator.h"

namespace sluice::simulate {

// Seconds per trainer step once the pipeline is full (from the end of the
// first third of the steps to the last), and of them the trainer's wait for
// its samples and its training (publish included).
struct SteadyStep {
  double step_s = 0;
  double wait_s = 0;
  double train_s = 0;
};
SteadyStep SteadyState(const SimResult& r);

// Everything about a system but its cluster and split: what a publication
// gives (hardware, model, batch, parallelism) and what is fitted (the answer
// lengths, efficiency.train_compute, efficiency.colocated_train_slowdown).
struct RegimeSetting {
  Accelerator accelerator;
  ModelDims model;
  Efficiency efficiency;
  int64_t prompts = 512;  // per trainer step
  int64_t group = 16;     // answers per prompt
  int64_t prompt_tokens = 256;
  int32_t max_response = 28672;  // answers are cut off here
  int32_t median = 400;          // answer length, log-normal
  double spread = 1.3;           // standard deviation of the log length
  int64_t steps = 12;            // simulated (the first third fills the pipeline)
  int64_t staleness = 1;         // the asynchronous policies' bound
  int64_t mini_batches = 1;      // optimizer updates per step
  int32_t rollout_tp = 1;        // accelerators per rollout engine
  int32_t train_mp = 1;          // accelerators per trainer rank
  int64_t max_rows = 256;        // per engine

  // InvalidArgument naming the first bad field.
  Status Validate() const;
};

// One published run: its policy on `gpus` accelerators, `rollout_gpus` of
// them generating (split policies; colocated: every one does both), and the
// seconds it reports per step. A phase not published is < 0.
struct PublishedRun {
  std::string label;  // as the publication names the run ("16:16")
  Policy policy = Policy::kColocatedSync;
  int64_t gpus = 0;
  int64_t rollout_gpus = 0;
  double step_s = 0;
  // Colocated: generation; split: the trainer's wait for its samples.
  double generate_s = -1;
  // Training per step, without the publish (colocated: old log-probs and
  // update).
  double train_s = -1;
};

// What the model gives for a run, in the same terms.
struct RunTimes {
  double step_s = 0;
  double generate_s = 0;
  double train_s = 0;
};

// Simulates `run` (its policy, cluster and split) under `s`. Errors:
// InvalidArgument for a bad setting or run, or a layout the model refuses
// (naming why).
Result<RunTimes> PredictRun(const RegimeSetting& s, const PublishedRun& run);

// The values FitRegime tries for the answer lengths.
struct FitGrid {
  std::vector<int32_t> medians;
  std::vector<double> spreads;
};

struct RegimeFit {
  RegimeSetting setting;         // the start, with the fitted values
  std::vector<RunTimes> fitted;  // the model's times for each fit run
  // The objective at the fit: the mean over the fit runs' published times
  // of the squared miss, each over its run's step time.
  double objective = 0;
  bool mfu_at_bound = false;       // the trainer's train_s wanted an MFU outside [0.05, 1]
  bool slowdown_at_bound = false;  // the colocated train_s wanted a slowdown outside [1, 10]
};

// For each (median, spread) of the grid: the MFU that makes the split runs'
// train_s (their mean log miss) right, then the colocated slowdown that makes
// the colocated runs' train_s right (both closed form: the trainer's step is
// affine in 1/MFU and in the slowdown; rounded to 0.01 and 0.05 so a regime
// can state them), then the objective over every published time of the fit
// runs; keeps the best cell. A fit without split runs with train_s keeps the
// start's MFU; without colocated runs with train_s, its slowdown.
// Errors: InvalidArgument for an empty grid or run list, a run without a
// step time, or a setting the model refuses.
Result<RegimeFit> FitRegime(const RegimeSetting& start, const std::vector<PublishedRun>& runs, const FitGrid& grid);

// A system's published runs with where they were published.
struct PublishedSystem {
  std::string name;
  std::string source;     // URL at a commit, the section and table
  RegimeSetting setting;  // what the source gives; the fitted fields at a start value
  std::vector<PublishedRun> runs;
  // Runs that share a cluster size, in `runs` order: each a colocated run
  // and the split run compared with it.
  std::vector<std::vector<size_t>> points;
};

// verl's fully asynchronous trainer against its colocated one, Qwen2.5-Math-7B
// on 32, 64 and 128 H20 (recipe fully_async_policy, "Asynchronous Training
// on 7B Model"), with the parallelism of its scripts.
const PublishedSystem& VerlFullyAsync7b();

// The lengths grid `sluice plan --predictive-check` searches.
FitGrid DefaultFitGrid();

}  // namespace sluice::simulate

#endif  // SLUICE_SIMULATE_REGIME_FIT_H_
