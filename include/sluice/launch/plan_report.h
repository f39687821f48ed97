// What `sluice plan` prints and draws (docs/simulator.md): the policies
// compared on one cluster, as a text table and as an HTML page with charts
// in the run report's style. Torch-free.
//
// Thread safety: plain data and pure functions.
#ifndef SLUICE_LAUNCH_PLAN_REPORT_H_
#define SLUICE_LAUNCH_PLAN_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace sluice::launch {

// One policy at its best split and staleness.
struct PlanRow {
  std::string policy;
  std::string split;   // "48:16" (generating:training), or "64 both"
  double step_s = 0;   // steady-state seconds per trainer step
  double wait_s = 0;   // of which the trainer waits for its samples (sync: generation)
  double train_s = 0;  // of which it trains and publishes
  double samples_per_s = 0;
  double vs_baseline = 0;   // colocated sync's seconds per step / this one's (0: not run)
  double rollout_busy = 0;  // share of the run an engine computes, averaged over engines
  double trainer_busy = 0;  // share of the run the trainer trains or publishes
  double occupancy = 0;     // of an engine's rows, per decode step
  int64_t staleness_bound = 0;
  double staleness_mean = 0;
  double preemptions_per_step = 0;
  double recomputed_share = 0;  // cache tokens computed again at interrupting switches / tokens generated
  int64_t kv_tokens = 0;        // an engine's KV cache
  int32_t rollout_tp = 1;       // accelerators per engine
  int64_t max_rows = 0;         // rows an engine decodes at most
};

struct PlanReport {
  std::string title;        // model and cluster
  std::string workload;     // batch and lengths
  std::string assumptions;  // the efficiencies and hardware figures
  std::vector<PlanRow> rows;
  std::string recommendation;
  std::string regime;  // a published setting and the comparison with it ("" for none)
  std::vector<std::string> notes;
};

std::string FormatPlanText(const PlanReport& report);
// A self-contained page: the table, then bars of samples/s and of each
// side's busy share per policy.
std::string FormatPlanHtml(const PlanReport& report);

}  // namespace sluice::launch

#endif  // SLUICE_LAUNCH_PLAN_REPORT_H_
