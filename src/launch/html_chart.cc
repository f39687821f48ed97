#include "html_chart.h"

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

}  // namespace sluice::launch
