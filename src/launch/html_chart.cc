#include "html_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace sluice::launch {

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
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

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string ChartHead(const std::string& title, double height) {
  std::ostringstream out;
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << kChartW << "' height='" << height << "' viewBox='0 0 "
      << kChartW << ' ' << height << "'><text x='8' y='16' font-size='13' font-weight='bold'>" << Escape(title)
      << "</text>";
  return out.str();
}

// The y unit, rotated, centred on the plot's left edge, and the x label
// centred under the plot.
std::string AxisLabels(const std::string& y_unit, const std::string& x_label, double top, double height) {
  std::ostringstream out;
  const double mid = (top + height - kPlotB) / 2;
  out << "<text x='14' y='" << mid << "' font-size='10' text-anchor='middle' transform='rotate(-90 14 " << mid << ")'>"
      << Escape(y_unit) << "</text><text x='" << (kPlotL + kChartW - kPlotR) / 2 << "' y='" << height - 6
      << "' font-size='10' text-anchor='middle'>" << Escape(x_label) << "</text>";
  return out.str();
}

// One line chart of several series sharing the x axis (RL step by default).
// Series with an empty label (seed ranges) get no legend entry.
std::string Chart(const std::string& title, const std::string& y_unit, const std::vector<Series>& series,
                  const std::string& x_label) {
  // Legend entries laid out first: they decide where the plot starts.
  std::ostringstream legend;
  double lx = 8, ly = 34;
  for (const Series& s : series) {
    if (s.points.empty() || s.label.empty()) continue;
    const double width = 18 + kLegendChar * static_cast<double>(s.label.size());
    if (lx > 8 && lx + width > kChartW - kPlotR) lx = 8, ly += 15;
    legend << "<line x1='" << lx << "' x2='" << lx + 12 << "' y1='" << ly - 4 << "' y2='" << ly - 4 << "' stroke='"
           << s.color << "' stroke-width='2'" << (s.dashed ? " stroke-dasharray='3,2'" : "") << "/><text x='" << lx + 16
           << "' y='" << ly << "' font-size='11'>" << Escape(s.label) << "</text>";
    lx += width + 10;
  }
  const double T = ly + 12, H = kChartH + (ly - 34), W = kChartW, L = kPlotL, R = kPlotR, B = kPlotB;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series) {
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  std::ostringstream out;
  out << ChartHead(title, H);
  if (x0 > x1) return out.str() + "<text x='60' y='110' font-size='12'>no data</text></svg>";
  out << legend.str() << AxisLabels(y_unit, x_label, T, H);
  if (y0 > 0 && y0 < 0.5 * y1) y0 = 0;  // anchor at zero unless the data sits far from it
  if (y1 == y0) y1 = y0 + 1;
  if (x1 == x0) x1 = x0 + 1;
  // Round numbers on the y axis: a step of 1, 2, 2.5 or 5 x 10^k giving
  // about four intervals, the range widened to whole steps.
  const double raw = (y1 - y0) / 4, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double tick = 10 * magnitude;
  for (double m : {1.0, 2.0, 2.5, 5.0}) {
    if (m * magnitude >= raw) {
      tick = m * magnitude;
      break;
    }
  }
  y0 = std::floor(y0 / tick + 1e-9) * tick;
  y1 = std::ceil(y1 / tick - 1e-9) * tick;
  const int ticks = static_cast<int>(std::lround((y1 - y0) / tick));
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  out << "<rect x='" << L << "' y='" << T << "' width='" << W - L - R << "' height='" << H - T - B
      << "' fill='none' stroke='#bbb'/>";
  for (int i = 0; i <= ticks; ++i) {
    const double y = y0 + tick * i;
    out << "<text x='" << L - 4 << "' y='" << py(y) + 4 << "' font-size='10' text-anchor='end'>" << Num(y) << "</text>";
    out << "<line x1='" << L << "' x2='" << W - R << "' y1='" << py(y) << "' y2='" << py(y) << "' stroke='#eee'/>";
  }
  out << "<text x='" << L << "' y='" << H - B + 13 << "' font-size='10'>" << Num(x0) << "</text><text x='" << W - R
      << "' y='" << H - B + 13 << "' font-size='10' text-anchor='end'>" << Num(x1) << "</text>";
  for (const Series& s : series) {
    if (s.points.empty()) continue;
    out << "<polyline fill='none' stroke='" << s.color << "' stroke-width='" << (s.dashed ? "0.8" : "1.5") << "'"
        << (s.dashed ? " stroke-dasharray='3,3'" : "") << " points='";
    for (auto [x, y] : s.points) out << px(x) << ',' << py(y) << ' ';
    out << "'/>";
    if (!s.dashed && s.points.size() == 1) {
      out << "<circle cx='" << px(s.points[0].first) << "' cy='" << py(s.points[0].second) << "' r='3' fill='"
          << s.color << "'/>";
    }
  }
  return out.str() + "</svg>";
}

}  // namespace sluice::launch
