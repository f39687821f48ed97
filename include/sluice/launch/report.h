// `sluice report RUN_DIR`: renders a run's metrics.jsonl into one
// self-contained HTML page (inline SVG charts, no scripts, nothing fetched)
// at RUN_DIR/report.html.
#ifndef SLUICE_LAUNCH_REPORT_H_
#define SLUICE_LAUNCH_REPORT_H_

#include <string>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::launch {

// The held-out evaluation of the model RL starts from, as `sluice train`
// writes it into the run directory: {"eval_accuracy": 0.838, "examples": 1000}.
inline constexpr char kEvalBeforeRlFile[] = "eval_before_rl.json";

// Reads run_dir/metrics.jsonl (and run_dir/config.yaml and the evaluation
// before RL, if present) and returns the HTML page. Errors: NotFound (no metrics.jsonl), DataLoss (a
// line that is not a JSON object, named by line number).
Result<std::string> RenderRunReport(const std::string& run_dir);

// RenderRunReport, written atomically to run_dir/report.html; returns its path.
Result<std::string> WriteRunReport(const std::string& run_dir);

// `sluice report --compare`: runs of several configurations (runs sharing a
// label are seeds of one configuration), compared against samples trained.
struct LabeledRun {
  std::string label;
  std::string run_dir;
};
struct Comparison {
  std::string html;  // curves: held-out accuracy and reward vs samples trained, mean and seed range
  // One row per label; the first label is the baseline: each other label's
  // held-out accuracy minus the baseline's with a 95% confidence interval
  // across seeds, and whether that shows parity (every interval includes 0
  // and is within +-2 points), at the last evaluation and at each one. The
  // interval is paired by seed when both labels ran the same seeds (read
  // from each run's config.yaml, run.seed), else Welch's.
  std::string markdown;
};

// The difference of two means (other - base) with the half-width of its 95%
// confidence interval (Welch's t interval, unequal variances). No interval
// (has_interval false) when a side has fewer than two values.
struct MeanDifference {
  double diff = 0, half_width = 0;
  bool has_interval = false;
};
MeanDifference DifferenceOfMeans(const std::vector<double>& base, const std::vector<double>& other);
// The same for matched pairs (base[i] and other[i] ran with the same seed:
// the same prompt order, sampling seeds and held-out set): the mean of the
// differences with its paired t interval, which leaves out the spread the
// seeds share. No interval with fewer than two pairs. Precondition: equal sizes.
MeanDifference PairedDifference(const std::vector<double>& base, const std::vector<double>& other);
// Errors: InvalidArgument (no runs, an empty label), those of RenderRunReport
// for each run directory, NotFound if a run has no evaluations.
Result<Comparison> CompareRuns(const std::vector<LabeledRun>& runs);

}  // namespace sluice::launch

#endif  // SLUICE_LAUNCH_REPORT_H_
