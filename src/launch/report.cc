#include "sluice/launch/report.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "html_chart.h"
#include "sluice/common/file_util.h"

namespace sluice::launch {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A bar chart of counts by integer category (e.g. staleness 0, 1, 2, ...).
std::string Bars(const std::string& title, const std::string& y_unit, const std::string& x_label,
                 const std::vector<int64_t>& counts) {
  const double W = kChartW, H = kChartH, L = kPlotL, R = kPlotR, T = 34, B = kPlotB;
  std::ostringstream out;
  out << ChartHead(title, H);
  int64_t total = 0, top = 0;
  for (int64_t c : counts) total += c, top = std::max(top, c);
  if (total == 0) return out.str() + "<text x='60' y='110' font-size='12'>no data</text></svg>";
  out << AxisLabels(y_unit, x_label, T, H);
  const double slot = (W - L - R) / static_cast<double>(counts.size());
  for (size_t k = 0; k < counts.size(); ++k) {
    const double h = (H - T - B - 14) * static_cast<double>(counts[k]) / static_cast<double>(top);
    const double x = L + slot * static_cast<double>(k);
    out << "<rect x='" << x + slot * 0.15 << "' y='" << H - B - h << "' width='" << slot * 0.7 << "' height='" << h
        << "' fill='#17becf'/><text x='" << x + slot / 2 << "' y='" << H - B + 13
        << "' font-size='10' text-anchor='middle'>" << k << "</text><text x='" << x + slot / 2 << "' y='"
        << H - B - h - 3 << "' font-size='10' text-anchor='middle'>"
        << Num(100.0 * static_cast<double>(counts[k]) / static_cast<double>(total)) << "%</text>";
  }
  return out.str() + "</svg>";
}

}  // namespace

namespace {
// Every line of run_dir/metrics.jsonl (NotFound / DataLoss naming the line).
// A last line without its newline that does not parse is a write the run
// did not finish (a full disk, a kill): skipped with a warning.
Result<std::vector<json>> LoadMetrics(const std::string& run_dir) {
  const fs::path metrics_path = fs::path(run_dir) / "metrics.jsonl";
  std::ifstream in(metrics_path);
  if (!in) return Status::NotFound(metrics_path.string() + ": no metrics (is this a run directory?)");
  std::vector<json> rows;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number()) {
      const bool torn_last_line = in.eof();  // getline hit the end before a newline
      if (torn_last_line) {
        std::fprintf(stderr, "warning: %s:%lld: skipped a torn last line (a write the run did not finish)\n",
                     metrics_path.c_str(), static_cast<long long>(n));
        break;
      }
      return Status::DataLoss(metrics_path.string() + ":" + std::to_string(n) +
                              ": not a JSON object with a numeric \"step\"");
    }
    rows.push_back(std::move(j));
  }
  return rows;
}

// The held-out `key` (eval_accuracy; eval_tool_use, agent runs) of the
// model RL started from, if the run recorded it.
std::optional<double> EvalBeforeRl(const std::string& run_dir, const char* key = "eval_accuracy") {
  std::ifstream in(fs::path(run_dir) / kEvalBeforeRlFile);
  if (!in) return std::nullopt;
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && !j.contains(key) && std::string(key) != "eval_accuracy") return std::nullopt;
  if (j.is_discarded() || !j.is_object() || !j.contains(key) || !j[key].is_number()) {
    std::fprintf(stderr, "warning: %s: not a JSON object with a numeric \"%s\"; left out\n",
                 (fs::path(run_dir) / kEvalBeforeRlFile).c_str(), key);
    return std::nullopt;
  }
  return j[key].get<double>();
}
}  // namespace

Result<std::string> RenderRunReport(const std::string& run_dir) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<json> rows, LoadMetrics(run_dir));
  auto series = [&](const std::string& key, const std::string& label, const std::string& color) {
    Series s{key, label, color, {}};
    for (const json& r : rows) {
      if (r.contains(key) && r[key].is_number()) s.points.emplace_back(r["step"].get<double>(), r[key].get<double>());
    }
    return s;
  };
  auto percent = [](Series s) {
    for (auto& point : s.points) point.second *= 100;
    return s;
  };
  const std::optional<double> before = EvalBeforeRl(run_dir);
  std::ostringstream html;
  html << "<!doctype html><html><head><meta charset='utf-8'><title>Sluice run report</title><style>"
          "body{font-family:sans-serif;margin:24px;color:#222}div.grid{display:flex;flex-wrap:wrap;gap:16px}"
          "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
          "pre{background:#f6f6f6;padding:8px;font-size:12px;max-height:320px;overflow:auto}</style></head><body>";
  html << "<h1>Sluice run report</h1><p>" << Escape(fs::absolute(run_dir).string()) << " &mdash; " << rows.size()
       << " RL steps recorded</p>";
  if (!rows.empty()) {
    const json& last = rows.back();
    html << "<table><tr><th>step</th><th>reward</th><th>held-out accuracy before RL</th><th>held-out accuracy "
            "now</th><th>elapsed s</th><th>staleness max</th></tr>";
    auto cell = [&](const char* key, double scale = 1) {
      return last.contains(key) && last[key].is_number() ? Num(scale * last[key].get<double>()) : std::string("-");
    };
    double best_eval = -1;
    for (const json& r : rows) {
      if (r.contains("eval_accuracy") && r["eval_accuracy"].is_number()) {
        best_eval = std::max(best_eval, r["eval_accuracy"].get<double>());
      }
    }
    const std::string now = cell("eval_accuracy", 100);
    html << "<tr><td>" << cell("step") << "</td><td>" << cell("reward_mean") << "</td><td>"
         << (before ? Num(100 * *before) + "%" : std::string("-")) << "</td><td>" << (now == "-" ? now : now + "%")
         << (best_eval >= 0 ? " (best " + Num(100 * best_eval) + "%)" : "") << "</td><td>" << cell("elapsed_seconds")
         << "</td><td>" << cell("staleness_max") << "</td></tr></table>";
  }
  // Held-out accuracy starts at step 0 with the model RL started from, and
  // that level runs across the chart as the line to beat.
  Series greedy = percent(series("eval_accuracy", "greedy", "#d62728"));
  Series baseline{"", "before RL", "#7f7f7f", {}, true};
  if (before) {
    greedy.points.insert(greedy.points.begin(), {0.0, 100 * *before});
    baseline.points = {{0.0, 100 * *before}, {std::max(1.0, greedy.points.back().first), 100 * *before}};
  }
  html << "<div class='grid'>";
  html << Chart("Training samples: reward and accuracy", "reward (0..1) / share correct",
                {series("reward_mean", "mean reward", "#1f77b4"), series("accuracy", "share correct", "#2ca02c")});
  html << Chart("Held-out accuracy", "% correct",
                {greedy, percent(series("eval_sampled_accuracy", "sampled", "#ff7f0e")), baseline});
  // Agent runs: how often the model calls a tool, held out (greedy) and in
  // the trajectories trained.
  Series tool_eval = percent(series("eval_tool_use", "held-out answers (greedy)", "#d62728"));
  if (!tool_eval.points.empty()) {
    if (const std::optional<double> tools_before = EvalBeforeRl(run_dir, "eval_tool_use")) {
      tool_eval.points.insert(tool_eval.points.begin(), {0.0, 100 * *tools_before});
    }
    html << Chart("Tool use", "% of answers calling a tool",
                  {tool_eval, percent(series("agent_tool_use", "trajectories trained", "#1f77b4"))});
  }
  html << Chart("Response length", "tokens",
                {series("response_len_mean", "mean", "#9467bd"), series("response_len_max", "longest", "#8c564b")});
  html << Chart("Staleness of trained samples", "weight versions behind",
                {series("staleness_mean", "mean", "#17becf"), series("staleness_max", "max", "#7f7f7f")});
  html << Chart(
      "Trainer time per step", "seconds",
      {series("train_seconds", "training", "#2ca02c"), series("wait_seconds", "waiting for data", "#d62728")});
  html << Chart("Queue depth", "rows ready for the trainer", {series("queue_ready", "ready rows", "#1f77b4")});
  html << Chart("Role timeline", "busy share of the step (0..1)",
                {series("rollout_busy", "rollout", "#1f77b4"), series("trainer_busy", "trainer", "#2ca02c")});
  {
    Series rollout_rate{"", "rollout (over the step's wall time)", "#1f77b4", {}};
    Series train_rate{"", "trainer (while training)", "#2ca02c", {}};
    std::vector<int64_t> hist;
    for (const json& r : rows) {
      const double step = r["step"].get<double>();
      auto num = [&](const char* key) { return r.contains(key) && r[key].is_number() ? r[key].get<double>() : 0.0; };
      if (num("gen_seconds") > 0 && r.contains("rollout_tokens")) {
        rollout_rate.points.emplace_back(step, num("rollout_tokens") / num("gen_seconds"));
      }
      if (num("train_seconds") > 0) train_rate.points.emplace_back(step, num("train_tokens") / num("train_seconds"));
      if (r.contains("staleness_hist") && r["staleness_hist"].is_array()) {
        const json& h = r["staleness_hist"];
        if (hist.size() < h.size()) hist.resize(std::min<size_t>(h.size(), 64), 0);
        for (size_t k = 0; k < hist.size() && k < h.size(); ++k) {
          if (h[k].is_number_integer()) hist[k] += h[k].get<int64_t>();
        }
      }
    }
    html << Chart("Stage rates", "tokens per second", {rollout_rate, train_rate});
    // pipeline.trainer_ranks > 1: each rank's share of the update, and of
    // that its time in collectives (mostly waiting for the slowest rank).
    std::vector<Series> ranks;
    static const char* kRankColors[] = {"#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"};
    for (const json& r : rows) {
      if (!r.contains("rank_train_seconds") || !r["rank_train_seconds"].is_array() ||
          !r.contains("rank_collective_seconds") || !r["rank_collective_seconds"].is_array()) {
        continue;
      }
      const json &train = r["rank_train_seconds"], &collective = r["rank_collective_seconds"];
      for (size_t k = 0; k < train.size() && k < collective.size() && k < 6; ++k) {
        if (!train[k].is_number() || !collective[k].is_number()) continue;
        if (ranks.size() < 2 * (k + 1)) {
          ranks.resize(2 * (k + 1));
          const std::string color = kRankColors[k];
          ranks[2 * k] = Series{"", "rank " + std::to_string(k), color, {}};
          ranks[2 * k + 1] = Series{"", "", color, {}, /*dashed=*/true};
        }
        ranks[2 * k].points.emplace_back(r["step"].get<double>(), train[k].get<double>());
        ranks[2 * k + 1].points.emplace_back(r["step"].get<double>(), collective[k].get<double>());
      }
    }
    if (!ranks.empty()) {
      html << Chart("Trainer ranks: update seconds (dashed: in collectives)", "seconds", ranks);
    }
    // pipeline.rollout_replicas > 1: what each replica generated per step.
    std::vector<Series> replicas;
    for (const json& r : rows) {
      if (!r.contains("replica_tokens") || !r["replica_tokens"].is_array()) continue;
      const json& tokens = r["replica_tokens"];
      for (size_t k = 0; k < tokens.size() && k < 6; ++k) {
        if (!tokens[k].is_number()) continue;
        if (replicas.size() < k + 1) {
          replicas.resize(k + 1);
          replicas[k] = Series{"", "replica " + std::to_string(k), kRankColors[k], {}};
        }
        replicas[k].points.emplace_back(r["step"].get<double>(), tokens[k].get<double>());
      }
    }
    if (!replicas.empty()) html << Chart("Rollout replicas: tokens generated per step", "tokens", replicas);
    html << Bars("Staleness histogram (all steps)", "share of trained samples", "weight versions behind the trainer",
                 hist);
  }
  html << Chart("Optimization", "value",
                {series("grad_norm", "grad norm", "#e377c2"), series("entropy", "entropy (nats/token)", "#bcbd22"),
                 series("clip_frac", "clip fraction", "#7f7f7f")});
  html << Chart("Off-policy weights", "ratio / share",
                {series("is_weight_mean", "mean pi_prox/pi_behav", "#1f77b4"),
                 series("is_capped_frac", "capped fraction", "#d62728"),
                 series("rollout_logprob_gap_mean", "mean |log pi_prox - log pi_behav|", "#2ca02c")});
  html << "</div>";
  std::ifstream config(fs::path(run_dir) / "config.yaml");
  if (config) {
    std::stringstream text;
    text << config.rdbuf();
    html << "<h2>Config</h2><pre>" << Escape(text.str()) << "</pre>";
  }
  html << "</body></html>\n";
  return html.str();
}

Result<std::string> WriteRunReport(const std::string& run_dir) {
  SLUICE_ASSIGN_OR_RETURN(std::string html, RenderRunReport(run_dir));
  const std::string path = (fs::path(run_dir) / "report.html").string();
  SLUICE_RETURN_IF_ERROR(WriteFileAtomically(path, html));
  return path;
}

namespace {

double Number(const json& row, const char* key) {
  return row.contains(key) && row[key].is_number() ? row[key].get<double>() : 0.0;
}

// One run reduced to what the comparison needs.
struct RunCurves {
  std::vector<std::pair<double, double>> eval;    // (samples trained, held-out accuracy)
  std::vector<std::pair<double, double>> reward;  // (samples trained, reward, mean of the last 10 steps)
  double final_eval = 0, final_reward = 0, samples = 0, wall_seconds = 0, staleness = 0;
  std::optional<uint64_t> seed;  // run.seed from the run's config.yaml, when readable
};

// run.seed from RUN_DIR/config.yaml (as `sluice train` writes it), if there.
std::optional<uint64_t> RunSeed(const std::string& run_dir) {
  try {
    const YAML::Node config = YAML::LoadFile((fs::path(run_dir) / "config.yaml").string());
    const YAML::Node seed = config["run"]["seed"];
    if (seed && seed.IsScalar()) return seed.as<uint64_t>();
  } catch (const YAML::Exception&) {
    // No readable seed: the comparison falls back to unpaired intervals.
  }
  return std::nullopt;
}

Result<RunCurves> Curves(const LabeledRun& run) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<json> rows, LoadMetrics(run.run_dir));
  RunCurves c;
  double samples = 0, staleness_sum = 0;
  std::vector<double> window;
  for (const json& r : rows) {
    samples += Number(r, "samples_trained");
    window.push_back(Number(r, "reward_mean"));
    if (window.size() > 10) window.erase(window.begin());
    double mean = 0;
    for (double w : window) mean += w;
    mean /= static_cast<double>(window.size());
    c.reward.emplace_back(samples, mean);
    if (r.contains("eval_accuracy") && r["eval_accuracy"].is_number()) {
      c.eval.emplace_back(samples, r["eval_accuracy"].get<double>());
    }
    staleness_sum += Number(r, "staleness_mean");
    c.wall_seconds = Number(r, "elapsed_seconds");
  }
  if (c.eval.empty()) {
    return Status::NotFound(run.run_dir +
                            "/metrics.jsonl has no held-out evaluation (eval_accuracy); set eval.interval");
  }
  c.final_eval = c.eval.back().second;
  c.final_reward = c.reward.back().second;
  c.samples = samples;
  c.staleness = rows.empty() ? 0 : staleness_sum / static_cast<double>(rows.size());
  c.seed = RunSeed(run.run_dir);
  return c;
}

struct Band {
  std::vector<double> x, mean, lo, hi;
  std::vector<std::vector<double>> values;  // per point, one value per seed
};

// The two-sided 95% quantile of Student's t with `df` degrees of freedom,
// df rounded down (a wider, conservative interval); 1.96 in the limit.
double StudentT975(double df) {
  static const double kTable[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                  2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                  2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  df += 1e-9;  // 2 computed as 1.999...: still 2
  if (!(df >= 1)) return kTable[0];
  if (df < 30) return kTable[static_cast<int>(df) - 1];
  return df < 60 ? 2.000 : (df < 120 ? 1.980 : 1.960);
}

void MeanAndVariance(const std::vector<double>& v, double* mean, double* var) {
  *mean = 0;
  for (double x : v) *mean += x;
  *mean /= static_cast<double>(v.size());
  *var = 0;
  for (double x : v) *var += (x - *mean) * (x - *mean);
  *var = v.size() > 1 ? *var / static_cast<double>(v.size() - 1) : 0;
}

}  // namespace

MeanDifference DifferenceOfMeans(const std::vector<double>& base, const std::vector<double>& other) {
  MeanDifference d;
  if (base.empty() || other.empty()) return d;
  double ma = 0, va = 0, mb = 0, vb = 0;
  MeanAndVariance(base, &ma, &va);
  MeanAndVariance(other, &mb, &vb);
  d.diff = mb - ma;
  if (base.size() < 2 || other.size() < 2) return d;  // no spread to estimate: no interval
  const double na = static_cast<double>(base.size()), nb = static_cast<double>(other.size());
  const double sa = va / na, sb = vb / nb, se2 = sa + sb;
  // Welch-Satterthwaite degrees of freedom (unequal variances).
  const double df = se2 > 0 ? se2 * se2 / (sa * sa / (na - 1) + sb * sb / (nb - 1)) : na + nb - 2;
  d.half_width = StudentT975(df) * std::sqrt(se2);
  d.has_interval = true;
  return d;
}

MeanDifference PairedDifference(const std::vector<double>& base, const std::vector<double>& other) {
  MeanDifference d;
  if (base.empty() || base.size() != other.size()) return d;
  std::vector<double> diffs;
  for (size_t i = 0; i < base.size(); ++i) diffs.push_back(other[i] - base[i]);
  double mean = 0, var = 0;
  MeanAndVariance(diffs, &mean, &var);
  d.diff = mean;
  if (diffs.size() < 2) return d;
  const double n = static_cast<double>(diffs.size());
  d.half_width = StudentT975(n - 1) * std::sqrt(var / n);
  d.has_interval = true;
  return d;
}

namespace {

// The order that pairs `other`'s runs with `base`'s by seed (pairs[i]: the
// index in `other` of the run with base[i]'s seed), or nothing if the two
// did not run exactly the same seeds, once each.
std::optional<std::vector<size_t>> PairBySeed(const std::vector<RunCurves>& base, const std::vector<RunCurves>& other) {
  if (base.size() != other.size() || base.size() < 2) return std::nullopt;
  std::map<uint64_t, size_t> other_by_seed;
  for (size_t i = 0; i < other.size(); ++i) {
    if (!other[i].seed || !other_by_seed.emplace(*other[i].seed, i).second) return std::nullopt;
  }
  std::vector<size_t> pairs;
  std::set<uint64_t> seen;
  for (const RunCurves& b : base) {
    if (!b.seed || !seen.insert(*b.seed).second) return std::nullopt;
    auto it = other_by_seed.find(*b.seed);
    if (it == other_by_seed.end()) return std::nullopt;
    pairs.push_back(it->second);
  }
  return pairs;
}

// Point i of every seed's curve (curves are cut to the shortest), averaged.
Band Aggregate(const std::vector<std::vector<std::pair<double, double>>>& curves) {
  Band b;
  size_t n = curves.front().size();
  for (const auto& c : curves) n = std::min(n, c.size());
  for (size_t i = 0; i < n; ++i) {
    double x = 0, sum = 0, lo = 1e300, hi = -1e300;
    for (const auto& c : curves) {
      x += c[i].first, sum += c[i].second;
      lo = std::min(lo, c[i].second), hi = std::max(hi, c[i].second);
    }
    const double k = static_cast<double>(curves.size());
    b.x.push_back(x / k), b.mean.push_back(sum / k), b.lo.push_back(lo), b.hi.push_back(hi);
    b.values.emplace_back();
    for (const auto& c : curves) b.values.back().push_back(c[i].second);
  }
  return b;
}

std::vector<Series> BandSeries(const std::string& label, const std::string& color, const Band& b) {
  Series mean{"", label, color, {}}, lo{"", "", color, {}, true}, hi{"", "", color, {}, true};
  for (size_t i = 0; i < b.x.size(); ++i) {
    mean.points.emplace_back(b.x[i], b.mean[i]);
    lo.points.emplace_back(b.x[i], b.lo[i]);
    hi.points.emplace_back(b.x[i], b.hi[i]);
  }
  return {mean, lo, hi};
}

}  // namespace

Result<Comparison> CompareRuns(const std::vector<LabeledRun>& runs) {
  if (runs.empty()) return Status::InvalidArgument("compare: no runs given");
  std::vector<std::string> labels;
  std::map<std::string, std::vector<RunCurves>> by_label;
  for (const LabeledRun& run : runs) {
    if (run.label.empty()) return Status::InvalidArgument("compare: run " + run.run_dir + " has an empty label");
    SLUICE_ASSIGN_OR_RETURN(RunCurves c, Curves(run));
    if (by_label.find(run.label) == by_label.end()) labels.push_back(run.label);
    by_label[run.label].push_back(std::move(c));
  }
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"};
  std::vector<Series> eval_series, reward_series;
  std::map<std::string, Band> eval_bands;
  for (size_t i = 0; i < labels.size(); ++i) {
    const auto& group = by_label[labels[i]];
    std::vector<std::vector<std::pair<double, double>>> evals, rewards;
    for (const RunCurves& c : group) evals.push_back(c.eval), rewards.push_back(c.reward);
    const std::string color = kColors[i % 7];
    eval_bands[labels[i]] = Aggregate(evals);
    for (Series& s : BandSeries(labels[i], color, eval_bands[labels[i]])) eval_series.push_back(std::move(s));
    for (Series& s : BandSeries(labels[i], color, Aggregate(rewards))) reward_series.push_back(std::move(s));
  }

  // Table: per label, means over seeds (min..max); parity against the first
  // label: the difference of the mean held-out accuracies with a 95%
  // confidence interval across seeds (Welch), at the last evaluation and at
  // every one. Parity: every interval includes 0 and is at most
  // kParityPoints wide on each side.
  constexpr double kParityPoints = 0.02;
  const Band& base = eval_bands[labels.front()];
  auto points_str = [](double v) {
    const std::string p = Fixed(100 * v, 1);
    return p == "-0.0" ? std::string("+0.0") : (v >= 0 ? "+" : "") + p;
  };
  auto interval_str = [&](const MeanDifference& d) {
    return points_str(d.diff) + (d.has_interval ? " ± " + Fixed(100 * d.half_width, 1) : "");
  };
  std::ostringstream md, per_point;
  md << "| config | seeds | final held-out acc (min..max) | final acc - " << labels.front()
     << " (95% CI) | parity with " << labels.front() << " | reward, last 10 steps | samples trained | mean staleness | "
     << "wall s | samples/s |\n"
     << "|---|---|---|---|---|---|---|---|---|---|\n";
  per_point << "\nHeld-out accuracy minus " << labels.front()
            << "'s, in points, with the 95% confidence interval across seeds, at each evaluation (samples trained):\n\n"
            << "| config |";
  for (double x : base.x) per_point << " " << Fixed(x, 0) << " |";
  per_point << "\n|---|";
  for (size_t i = 0; i < base.x.size(); ++i) per_point << "---|";
  per_point << "\n";
  bool paired_any = false, unpaired_any = false;
  for (const std::string& label : labels) {
    const auto& group = by_label[label];
    double acc = 0, acc_lo = 1e300, acc_hi = -1e300, reward = 0, samples = 0, stale = 0, wall = 0;
    for (const RunCurves& c : group) {
      acc += c.final_eval, reward += c.final_reward, samples += c.samples, stale += c.staleness, wall += c.wall_seconds;
      acc_lo = std::min(acc_lo, c.final_eval), acc_hi = std::max(acc_hi, c.final_eval);
    }
    const double k = static_cast<double>(group.size());
    const Band& b = eval_bands[label];
    std::string final_diff = "(baseline)", verdict = "(baseline)";
    if (label != labels.front()) {
      const size_t points = std::min(b.values.size(), base.values.size());
      // Paired by seed when both ran the same seeds, else Welch's interval.
      const auto pairs = PairBySeed(by_label[labels.front()], group);
      auto difference = [&](const std::vector<double>& base_values, const std::vector<double>& values) {
        if (!pairs) return DifferenceOfMeans(base_values, values);
        std::vector<double> matched;
        for (size_t j : *pairs) matched.push_back(values[j]);
        return PairedDifference(base_values, matched);
      };
      paired_any = paired_any || pairs.has_value();
      unpaired_any = unpaired_any || !pairs.has_value();
      bool all_zero = points > 0, worse = false, better = false, defined = points > 0;
      double widest = 0;
      per_point << "| " << label << " |";
      for (size_t i = 0; i < points; ++i) {
        const MeanDifference d = difference(base.values[i], b.values[i]);
        defined = defined && d.has_interval;
        widest = std::max(widest, d.half_width);
        all_zero = all_zero && d.diff - d.half_width <= 0 && d.diff + d.half_width >= 0;
        worse = worse || (d.has_interval && d.diff + d.half_width < 0);
        better = better || (d.has_interval && d.diff - d.half_width > 0);
        per_point << " " << interval_str(d) << " |";
      }
      per_point << "\n";
      std::vector<double> base_final, final;
      for (const RunCurves& c : by_label[labels.front()]) base_final.push_back(c.final_eval);
      for (const RunCurves& c : group) final.push_back(c.final_eval);
      const MeanDifference fd = difference(base_final, final);
      final_diff = interval_str(fd) + " points";
      if (!defined) {
        verdict = "unknown: needs 2+ seeds of each";
      } else if (worse) {
        verdict = "no: worse at some evaluation";
      } else if (all_zero && widest <= kParityPoints) {
        verdict = "yes";
      } else if (better) {
        verdict = "no: better at some evaluation";
      } else {
        verdict = "not shown: interval up to ±" + Fixed(100 * widest, 1) + " points (parity needs ±" +
                  Fixed(100 * kParityPoints, 0) + ")";
      }
    }
    md << "| " << label << " | " << group.size() << " | " << Fixed(100 * acc / k, 1) << "% (" << Fixed(100 * acc_lo, 1)
       << ".." << Fixed(100 * acc_hi, 1) << ") | " << final_diff << " | " << verdict << " | " << Fixed(reward / k, 3)
       << " | " << Fixed(samples / k, 0) << " | " << Fixed(stale / k, 2) << " | " << Fixed(wall / k, 0) << " | "
       << Fixed(wall > 0 ? samples / wall : 0, 1) << " |\n";
  }
  if (labels.size() > 1) {
    if (paired_any) {
      md << "\nIntervals " << (unpaired_any ? "of configurations that ran the baseline's seeds " : "")
         << "are paired by seed (a seed fixes the prompt order, the sampling seeds and the held-out set, so the "
            "spread the seeds share is left out)"
         << (unpaired_any ? "; the others are Welch's (unpaired)" : "") << ".\n";
    } else {
      md << "\nIntervals are Welch's (unpaired: the configurations did not run the same seeds).\n";
    }
    md << per_point.str();
  }

  std::ostringstream html;
  html << "<!doctype html><html><head><meta charset='utf-8'><title>Sluice comparison</title><style>"
          "body{font-family:sans-serif;margin:24px;color:#222}div.grid{display:flex;flex-wrap:wrap;gap:16px}"
          "pre{background:#f6f6f6;padding:8px;font-size:12px}</style></head><body><h1>Sluice comparison</h1>"
          "<p>Solid: mean over seeds; dashed: the seeds' range.</p><div class='grid'>";
  html << Chart("Held-out accuracy (greedy) by samples trained", "share correct (0..1)", eval_series,
                "samples trained");
  html << Chart("Reward by samples trained", "mean of the last 10 steps (0..1)", reward_series, "samples trained");
  html << "</div><h2>Table</h2><pre>" << Escape(md.str()) << "</pre><h2>Runs</h2><pre>";
  for (const LabeledRun& run : runs) html << Escape(run.label + "  " + run.run_dir) << "\n";
  html << "</pre></body></html>\n";
  return Comparison{html.str(), md.str()};
}

}  // namespace sluice::launch
