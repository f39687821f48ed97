#include "sluice/launch/plan_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "html_chart.h"

namespace sluice::launch {

namespace {

std::string Percent(double share) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.0f%%", 100 * share);
  return buf;
}

struct Column {
  const char* head;
  std::string (*cell)(const PlanRow&);
};

const std::vector<Column>& Columns() {
  static const std::vector<Column> columns = {
      {"policy", [](const PlanRow& r) { return r.policy; }},
      {"gen:train", [](const PlanRow& r) { return r.split; }},
      {"engine", [](const PlanRow& r) { return std::to_string(r.rollout_tp) + " gpu"; }},
      {"rows", [](const PlanRow& r) { return std::to_string(r.max_rows); }},
      {"s/step", [](const PlanRow& r) { return Fixed(r.step_s, 1); }},
      {"wait s", [](const PlanRow& r) { return Fixed(r.wait_s, 1); }},
      {"train s", [](const PlanRow& r) { return Fixed(r.train_s, 1); }},
      {"samples/s", [](const PlanRow& r) { return Fixed(r.samples_per_s, 1); }},
      {"x colocated", [](const PlanRow& r) { return r.vs_baseline > 0 ? Fixed(r.vs_baseline, 2) + "x" : "-"; }},
      {"rollout busy", [](const PlanRow& r) { return Percent(r.rollout_busy); }},
      {"trainer busy", [](const PlanRow& r) { return Percent(r.trainer_busy); }},
      {"occupancy", [](const PlanRow& r) { return Percent(r.occupancy); }},
      {"staleness",
       [](const PlanRow& r) { return std::to_string(r.staleness_bound) + " (" + Fixed(r.staleness_mean, 2) + ")"; }},
      {"preempt/step", [](const PlanRow& r) { return Fixed(r.preemptions_per_step, 0); }},
      {"recomputed", [](const PlanRow& r) { return Percent(r.recomputed_share); }},
      {"KV tokens", [](const PlanRow& r) { return std::to_string(r.kv_tokens); }},
  };
  return columns;
}

// Horizontal bars, one per policy, labelled with their values.
std::string HorizontalBars(const std::string& title, const std::string& unit, const std::vector<std::string>& labels,
                           const std::vector<double>& values, const std::string& color, bool percent) {
  const double row = 22, top = 30, left = 120, right = 70;
  const double height = top + row * static_cast<double>(labels.size()) + 24;
  std::ostringstream out;
  out << ChartHead(title, height);
  double most = 0;
  for (double v : values) most = std::max(most, v);
  if (most <= 0) most = 1;
  for (size_t i = 0; i < labels.size(); ++i) {
    const double y = top + row * static_cast<double>(i);
    const double w = (kChartW - left - right) * values[i] / most;
    out << "<text x='" << left - 6 << "' y='" << y + 14 << "' font-size='11' text-anchor='end'>" << Escape(labels[i])
        << "</text><rect x='" << left << "' y='" << y + 3 << "' width='" << w << "' height='" << row - 6 << "' fill='"
        << color << "'/><text x='" << left + w + 4 << "' y='" << y + 14 << "' font-size='10'>"
        << (percent ? Percent(values[i]) : Num(values[i])) << "</text>";
  }
  out << "<text x='" << left << "' y='" << height - 6 << "' font-size='10'>" << Escape(unit) << "</text>";
  return out.str() + "</svg>";
}

}  // namespace

std::string FormatPlanText(const PlanReport& report) {
  std::ostringstream out;
  out << "plan: " << report.title << "\n" << report.workload << "\n" << report.assumptions << "\n";
  std::vector<size_t> width;
  for (const Column& c : Columns()) {
    size_t w = std::string(c.head).size();
    for (const PlanRow& r : report.rows) w = std::max(w, c.cell(r).size());
    width.push_back(w);
  }
  for (size_t i = 0; i < Columns().size(); ++i) {
    const std::string head = Columns()[i].head;
    out << (i == 0 ? head + std::string(width[i] - head.size(), ' ')
                   : "  " + std::string(width[i] - head.size(), ' ') + head);
  }
  out << "\n";
  for (const PlanRow& r : report.rows) {
    for (size_t i = 0; i < Columns().size(); ++i) {
      const std::string cell = Columns()[i].cell(r);
      out << (i == 0 ? cell + std::string(width[i] - cell.size(), ' ')
                     : "  " + std::string(width[i] - cell.size(), ' ') + cell);
    }
    out << "\n";
  }
  for (const std::string& n : report.notes) out << n << "\n";
  out << report.recommendation << "\n";
  if (!report.regime.empty()) out << "regime " << report.regime << "\n";
  return out.str();
}

std::string FormatPlanHtml(const PlanReport& report) {
  std::ostringstream html;
  html << "<!doctype html><html><head><meta charset='utf-8'><title>Sluice plan</title><style>"
          "body{font-family:sans-serif;margin:24px;color:#222}div.grid{display:flex;flex-wrap:wrap;gap:16px}"
          "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
          "p{font-size:13px;max-width:1000px}</style></head><body><h1>Sluice plan</h1>";
  html << "<p><b>" << Escape(report.title) << "</b><br>" << Escape(report.workload) << "<br>"
       << Escape(report.assumptions) << "</p><table><tr>";
  for (const Column& c : Columns()) html << "<th>" << Escape(c.head) << "</th>";
  html << "</tr>";
  for (const PlanRow& r : report.rows) {
    html << "<tr>";
    for (const Column& c : Columns()) html << "<td>" << Escape(c.cell(r)) << "</td>";
    html << "</tr>";
  }
  html << "</table>";
  std::vector<std::string> labels;
  std::vector<double> samples, rollout, trainer;
  for (const PlanRow& r : report.rows) {
    labels.push_back(r.policy + " " + r.split);
    samples.push_back(r.samples_per_s);
    rollout.push_back(r.rollout_busy);
    trainer.push_back(r.trainer_busy);
  }
  html << "<div class='grid'>"
       << HorizontalBars("Throughput", "samples/s, steady state", labels, samples, "#1f77b4", false)
       << HorizontalBars("Rollout busy", "share of the run an engine computes", labels, rollout, "#2ca02c", true)
       << HorizontalBars("Trainer busy", "share of the run the trainer trains", labels, trainer, "#d62728", true)
       << "</div><p>";
  for (const std::string& n : report.notes) html << Escape(n) << "<br>";
  html << "<b>" << Escape(report.recommendation) << "</b></p>";
  if (!report.regime.empty()) html << "<pre>" << Escape(report.regime) << "</pre>";
  html << "</body></html>\n";
  return html.str();
}

}  // namespace sluice::launch
