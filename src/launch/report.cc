#include "sluice/launch/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "sluice/common/file_util.h"

namespace sluice::launch {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Series {
  std::string key, label, color;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string Num(double v) {
  char buf[32];
  if (std::fabs(v) >= 1000 || v == std::floor(v)) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  }
  return buf;
}

// One line chart of several series sharing the x axis (RL step).
std::string Chart(const std::string& title, const std::vector<Series>& series) {
  constexpr double W = 520, H = 220, L = 50, R = 10, T = 28, B = 30;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series) {
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  std::ostringstream out;
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' viewBox='0 0 " << W << ' '
      << H << "'><text x='" << L << "' y='16' font-size='13' font-weight='bold'>" << Escape(title) << "</text>";
  if (x0 > x1) return out.str() + "<text x='60' y='110' font-size='12'>no data</text></svg>";
  if (y0 > 0 && y0 < 0.5 * y1) y0 = 0;  // anchor at zero unless the data sits far from it
  if (y1 == y0) y1 = y0 + 1;
  if (x1 == x0) x1 = x0 + 1;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  out << "<rect x='" << L << "' y='" << T << "' width='" << W - L - R << "' height='" << H - T - B
      << "' fill='none' stroke='#bbb'/>";
  for (int i = 0; i <= 4; ++i) {
    const double y = y0 + (y1 - y0) * i / 4;
    out << "<text x='" << L - 4 << "' y='" << py(y) + 4 << "' font-size='10' text-anchor='end'>" << Num(y) << "</text>";
    out << "<line x1='" << L << "' x2='" << W - R << "' y1='" << py(y) << "' y2='" << py(y) << "' stroke='#eee'/>";
  }
  out << "<text x='" << L << "' y='" << H - 8 << "' font-size='10'>step " << Num(x0) << "</text><text x='" << W - R
      << "' y='" << H - 8 << "' font-size='10' text-anchor='end'>" << Num(x1) << "</text>";
  double legend_x = L + 160;
  for (const Series& s : series) {
    if (s.points.empty()) continue;
    out << "<polyline fill='none' stroke='" << s.color << "' stroke-width='1.5' points='";
    for (auto [x, y] : s.points) out << px(x) << ',' << py(y) << ' ';
    out << "'/>";
    if (s.points.size() == 1) {
      out << "<circle cx='" << px(s.points[0].first) << "' cy='" << py(s.points[0].second) << "' r='3' fill='" << s.color
          << "'/>";
    }
    out << "<text x='" << legend_x << "' y='16' font-size='11' fill='" << s.color << "'>" << Escape(s.label) << "</text>";
    legend_x += 7.0 * static_cast<double>(s.label.size()) + 16;
  }
  return out.str() + "</svg>";
}

}  // namespace

Result<std::string> RenderRunReport(const std::string& run_dir) {
  const fs::path metrics_path = fs::path(run_dir) / "metrics.jsonl";
  std::ifstream in(metrics_path);
  if (!in) return Status::NotFound(metrics_path.string() + ": no metrics (is this a run directory?)");
  std::vector<json> rows;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number()) {
      return Status::DataLoss(metrics_path.string() + ":" + std::to_string(n) +
                              ": not a JSON object with a numeric \"step\"");
    }
    rows.push_back(std::move(j));
  }
  auto series = [&](const std::string& key, const std::string& label, const std::string& color) {
    Series s{key, label, color, {}};
    for (const json& r : rows) {
      if (r.contains(key) && r[key].is_number()) s.points.emplace_back(r["step"].get<double>(), r[key].get<double>());
    }
    return s;
  };
  std::ostringstream html;
  html << "<!doctype html><html><head><meta charset='utf-8'><title>Sluice run report</title><style>"
          "body{font-family:sans-serif;margin:24px;color:#222}div.grid{display:flex;flex-wrap:wrap;gap:16px}"
          "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
          "pre{background:#f6f6f6;padding:8px;font-size:12px;max-height:320px;overflow:auto}</style></head><body>";
  html << "<h1>Sluice run report</h1><p>" << Escape(fs::absolute(run_dir).string()) << " &mdash; " << rows.size()
       << " RL steps recorded</p>";
  if (!rows.empty()) {
    const json& last = rows.back();
    html << "<table><tr><th>step</th><th>reward</th><th>held-out accuracy</th><th>elapsed s</th><th>staleness max</th></tr>";
    auto cell = [&](const char* key) {
      return last.contains(key) && last[key].is_number() ? Num(last[key].get<double>()) : std::string("-");
    };
    double best_eval = -1;
    for (const json& r : rows) {
      if (r.contains("eval_accuracy")) best_eval = std::max(best_eval, r["eval_accuracy"].get<double>());
    }
    html << "<tr><td>" << cell("step") << "</td><td>" << cell("reward_mean") << "</td><td>" << cell("eval_accuracy")
         << (best_eval >= 0 ? " (best " + Num(best_eval) + ")" : "") << "</td><td>" << cell("elapsed_seconds")
         << "</td><td>" << cell("staleness_max") << "</td></tr></table>";
  }
  html << "<div class='grid'>";
  html << Chart("Reward and accuracy (training samples)",
                {series("reward_mean", "reward", "#1f77b4"), series("accuracy", "accuracy", "#2ca02c")});
  html << Chart("Held-out accuracy (greedy)", {series("eval_accuracy", "greedy", "#d62728"),
                                               series("eval_sampled_accuracy", "sampled", "#ff7f0e")});
  html << Chart("Response length (tokens)",
                {series("response_len_mean", "mean", "#9467bd"), series("response_len_max", "max", "#8c564b")});
  html << Chart("Staleness (weight versions)",
                {series("staleness_mean", "mean per sample", "#17becf"), series("staleness_max", "max", "#7f7f7f")});
  html << Chart("Trainer time per step (s)",
                {series("train_seconds", "training", "#2ca02c"), series("wait_seconds", "waiting for data", "#d62728")});
  html << Chart("Queue depth (rows ready for the trainer)", {series("queue_ready", "ready rows", "#1f77b4")});
  html << Chart("Optimization", {series("grad_norm", "grad norm", "#e377c2"), series("entropy", "entropy", "#bcbd22"),
                                 series("clip_frac", "clip fraction", "#7f7f7f")});
  html << Chart("Off-policy weights", {series("is_weight_mean", "mean pi_prox/pi_behav", "#1f77b4"),
                                       series("is_capped_frac", "capped fraction", "#d62728")});
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

}  // namespace sluice::launch
