#include "sluice/simulate/regime_fit.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "sluice/simulate/lengths.h"

namespace sluice::simulate {

SteadyStep SteadyState(const SimResult& r) {
  const size_t n = r.steps.size(), k = std::max<size_t>(1, n / 3);
  SteadyStep s;
  if (n < 2) {
    s.step_s = s.train_s = r.wall_s;
    return s;
  }
  s.step_s = (r.steps[n - 1].end_s - r.steps[k - 1].end_s) / static_cast<double>(n - k);
  for (size_t i = k; i < n; ++i) {
    s.wait_s += r.steps[i].start_s - r.steps[i - 1].end_s;
    s.train_s += r.steps[i].end_s - r.steps[i].start_s;
  }
  s.wait_s /= static_cast<double>(n - k);
  s.train_s /= static_cast<double>(n - k);
  return s;
}

Status RegimeSetting::Validate() const {
  auto bad = [](const std::string& what) { return Status::InvalidArgument("regime setting: " + what); };
  if (prompts < 1 || group < 1 || prompt_tokens < 1) return bad("prompts, group and prompt_tokens must be >= 1");
  if (median < 1 || median > max_response) return bad("median must be in [1, max_response]");
  if (!std::isfinite(spread) || spread < 0) return bad("spread must be >= 0");
  if (steps < 3) return bad("steps must be >= 3 (the first third fills the pipeline)");
  if (staleness < 1) return bad("staleness must be >= 1");
  if (mini_batches < 1 || rollout_tp < 1 || train_mp < 1 || max_rows < 1) {
    return bad("mini_batches, rollout_tp, train_mp and max_rows must be >= 1");
  }
  SLUICE_RETURN_IF_ERROR(model.Validate());
  return efficiency.Validate();
}

namespace {

bool IsSplit(Policy p) { return p != Policy::kColocatedSync; }

// A run's times, and the part of its training that does not scale with
// the trainer's arithmetic (per-step and per-update costs).
struct Simulated {
  RunTimes times;
  double fixed_train_s = 0;
};

Result<Simulated> SimulateRun(const RegimeSetting& s, const PublishedRun& run) {
  SLUICE_RETURN_IF_ERROR(s.Validate());
  if (run.gpus < 2) return Status::InvalidArgument("run " + run.label + ": gpus must be >= 2");
  if (IsSplit(run.policy) && (run.rollout_gpus < 1 || run.rollout_gpus >= run.gpus)) {
    return Status::InvalidArgument("run " + run.label + ": rollout_gpus must leave both sides accelerators");
  }
  Workload w;
  w.steps = s.steps;
  w.prompts_per_step = s.prompts;
  w.group_size = s.group;
  w.prompt_tokens = {static_cast<int32_t>(s.prompt_tokens)};
  w.response_tokens = CappedLogNormalLengths(s.steps * s.prompts * s.group, s.median, s.spread, s.max_response,
                                             /*seed=*/1);
  GpuLayout g;
  g.rollout_tp = s.rollout_tp;
  g.train_mp = s.train_mp;
  g.max_rows = s.max_rows;
  // Colocated: SetUpPolicy gives both sides every accelerator.
  g.rollout_gpus = IsSplit(run.policy) ? run.rollout_gpus : run.gpus - run.gpus / 2;
  g.trainer_gpus = IsSplit(run.policy) ? run.gpus - run.rollout_gpus : run.gpus / 2;
  const bool asynchronous =
      run.policy == Policy::kPartialRollout || run.policy == Policy::kInflight || run.policy == Policy::kSluice;
  PolicyOptions o;
  o.max_staleness = asynchronous ? s.staleness : 1;
  o.micro_batch_tokens = s.prompt_tokens + s.max_response;
  o.mini_batches = s.mini_batches;
  auto setup = SetUpPolicy(run.policy, s.accelerator, s.model, g, s.efficiency, o);
  if (!setup.ok()) return Status::InvalidArgument("run " + run.label + ": " + setup.status().message());
  setup->layout.max_steps_per_event = 32;  // as `sluice plan`
  SLUICE_ASSIGN_OR_RETURN(SimResult r, Simulate(w, setup->layout, setup->costs));
  const SteadyStep st = SteadyState(r);
  Simulated out;
  out.times = {st.step_s, st.wait_s, st.train_s - setup->costs.publish_s};
  out.fixed_train_s = setup->costs.train_step_s + static_cast<double>(s.mini_batches) * setup->costs.train_update_s;
  return out;
}

// A run's training time as a line in a scale x (1 / MFU, or the colocated
// slowdown): slope x + intercept, against the published `target`.
struct Line {
  double slope = 0, intercept = 0, target = 0;
};

// The x in [lo, hi] that minimises the lines' squared log misses (golden
// section: the sum is unimodal, each line rising in x); `at_bound` says the
// best was an end.
double SolveScale(const std::vector<Line>& lines, double lo, double hi, bool* at_bound) {
  auto miss = [&](double x) {
    double sum = 0;
    for (const Line& l : lines) {
      const double d = std::log(std::max(1e-9, l.slope * x + l.intercept) / l.target);
      sum += d * d;
    }
    return sum;
  };
  const double phi = (std::sqrt(5.0) - 1) / 2;
  double a = lo, b = hi;
  for (int i = 0; i < 100; ++i) {
    const double c = b - phi * (b - a), d = a + phi * (b - a);
    if (miss(c) < miss(d)) {
      b = d;
    } else {
      a = c;
    }
  }
  const double x = (a + b) / 2;
  *at_bound = x - lo < 1e-3 * (hi - lo) || hi - x < 1e-3 * (hi - lo);
  return x;
}

double RoundTo(double v, double step) { return std::round(v / step) * step; }

}  // namespace

Result<RunTimes> PredictRun(const RegimeSetting& s, const PublishedRun& run) {
  SLUICE_ASSIGN_OR_RETURN(Simulated r, SimulateRun(s, run));
  return r.times;
}

Result<RegimeFit> FitRegime(const RegimeSetting& start, const std::vector<PublishedRun>& runs, const FitGrid& grid) {
  if (grid.medians.empty() || grid.spreads.empty()) {
    return Status::InvalidArgument("fit grid: no medians or no spreads to try");
  }
  if (runs.empty()) return Status::InvalidArgument("fit: no published runs to fit");
  for (const PublishedRun& r : runs) {
    if (!(r.step_s > 0)) return Status::InvalidArgument("fit: run " + r.label + " has no published step time");
  }
  std::optional<RegimeFit> best;
  for (const int32_t median : grid.medians) {
    for (const double spread : grid.spreads) {
      RegimeFit fit;
      fit.setting = start;
      fit.setting.median = std::min(median, start.max_response);
      fit.setting.spread = spread;
      Efficiency& e = fit.setting.efficiency;
      // The split trainer's MFU: its step is fixed + arithmetic / MFU.
      std::vector<Line> lines;
      for (const PublishedRun& r : runs) {
        if (!IsSplit(r.policy) || r.train_s <= 0) continue;
        SLUICE_ASSIGN_OR_RETURN(Simulated at, SimulateRun(fit.setting, r));
        lines.push_back({(at.times.train_s - at.fixed_train_s) * e.train_compute, at.fixed_train_s, r.train_s});
      }
      if (!lines.empty()) {
        const double x = SolveScale(lines, 1.0, 1 / 0.05, &fit.mfu_at_bound);
        e.train_compute = std::clamp(RoundTo(1 / x, 0.01), 0.05, 1.0);
      }
      // Then the colocated trainer's slowdown against it.
      lines.clear();
      for (const PublishedRun& r : runs) {
        if (IsSplit(r.policy) || r.train_s <= 0) continue;
        RegimeSetting one = fit.setting;
        one.efficiency.colocated_train_slowdown = 1;
        SLUICE_ASSIGN_OR_RETURN(Simulated at, SimulateRun(one, r));
        lines.push_back({at.times.train_s - at.fixed_train_s, at.fixed_train_s, r.train_s});
      }
      if (!lines.empty()) {
        const double k = SolveScale(lines, 1.0, 10.0, &fit.slowdown_at_bound);
        e.colocated_train_slowdown = std::clamp(RoundTo(k, 0.05), 1.0, 10.0);
      }
      double sum = 0;
      int64_t terms = 0;
      for (const PublishedRun& r : runs) {
        SLUICE_ASSIGN_OR_RETURN(Simulated at, SimulateRun(fit.setting, r));
        fit.fitted.push_back(at.times);
        for (const auto& [published, model] :
             {std::pair{r.step_s, at.times.step_s}, std::pair{r.generate_s, at.times.generate_s},
              std::pair{r.train_s, at.times.train_s}}) {
          if (published < 0) continue;
          const double d = (model - published) / r.step_s;
          sum += d * d;
          ++terms;
        }
      }
      fit.objective = sum / static_cast<double>(terms);
      if (!best || fit.objective < best->objective) best = std::move(fit);
    }
  }
  return std::move(*best);
}

FitGrid DefaultFitGrid() { return {{100, 150, 250, 400, 600, 900, 1300, 2000}, {0.4, 0.7, 1.0, 1.3, 1.6, 1.9}}; }

const PublishedSystem& VerlFullyAsync7b() {
  static const PublishedSystem verl = [] {
    PublishedSystem p;
    p.name = "verl fully_async_policy, Qwen2.5-Math-7B, DAPO, H20";
    p.source =
        "https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/experimental/"
        "fully_async_policy/README.md, \"Asynchronous Training on 7B Model\" (columns step, gen, old_log_prob, "
        "update_actor; one run per row); parallelism from shell/dapo_7b_math_fsdp2_{16_16,32_32,64_64}.sh at the "
        "same commit";
    RegimeSetting& s = p.setting;
    s.accelerator = *FindAccelerator("h20");
    s.model = *FindModel("qwen2.5-7b");  // Qwen2.5-Math-7B has its shape
    s.prompts = 512;                     // train_batch_size
    s.group = 16;                        // rollout.n
    s.max_response = 28672;              // max_response_length 28k
    s.mini_batches = 16;                 // 512 / ppo_mini_batch_size 32
    s.rollout_tp = 4;                    // gen_tp
    s.train_mp = 4;                      // sp_size (Ulysses)
    // Not in the source, assumed: prompts of 256 tokens (max 2048), the
    // asynchronous bound of one version (staleness_threshold 0.5 with
    // trigger_parameter_sync_step 4), 256 rows an engine (vLLM's default).
    s.prompt_tokens = 256;
    s.staleness = 1;
    s.max_rows = 256;
    s.efficiency.colocated_train_slowdown = 1;
    // The training columns: colocated old_log_prob + update_actor; split
    // update_actor (its trainer takes the rollout's log-probs).
    p.runs = {
        {"colocate sync 32", Policy::kColocatedSync, 32, 0, 790.10, 357.41, 107.71 + 269.80},
        {"fully_async 16:16", Policy::kPartialRollout, 32, 16, 294.77, 21.26, 313.81},
        {"colocate sync 64", Policy::kColocatedSync, 64, 0, 365.28, 150.72, 70.26 + 133.41},
        {"fully_async 32:32", Policy::kPartialRollout, 64, 32, 189.26, 28.46, 156.98},
        {"colocate sync 128", Policy::kColocatedSync, 128, 0, 356.30, 177.85, 53.92 + 113.81},
        {"fully_async 64:64", Policy::kPartialRollout, 128, 64, 150.63, 33.14, 113.16},
    };
    p.points = {{0, 1}, {2, 3}, {4, 5}};
    return p;
  }();
  return verl;
}

}  // namespace sluice::simulate
