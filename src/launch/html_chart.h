// The pieces of the HTML pages' inline SVG charts (the run report, the
// comparison, `sluice plan --html`), so every page draws alike.
//
// Thread safety: pure functions.
#ifndef SLUICE_LAUNCH_HTML_CHART_H_
#define SLUICE_LAUNCH_HTML_CHART_H_

#include <string>
#include <utility>
#include <vector>

namespace sluice::launch {

// Chart geometry shared by the line and bar charts: a title row, a legend
// row (wrapped when long), then the plot with the y unit written up its left
// side and the x label centred under it.
constexpr double kChartW = 520, kChartH = 250, kPlotL = 58, kPlotR = 12, kPlotB = 34;
constexpr double kLegendChar = 6.6;  // px per character of 11 px sans-serif, generous

// Text escaped for HTML and SVG.
std::string Escape(const std::string& s);
// A number as a chart labels it: no decimals from 1000 or for integers,
// else three significant digits.
std::string Num(double v);
// A number with `digits` decimals.
std::string Fixed(double v, int digits);
// An <svg> of the chart width and `height` with its title; the caller
// closes it.
std::string ChartHead(const std::string& title, double height);
// The y unit, rotated, centred on the plot's left edge, and the x label
// centred under the plot.
std::string AxisLabels(const std::string& y_unit, const std::string& x_label, double top, double height);

// One line of a line chart: (x, value) points.
struct Series {
  std::string key, label, color;
  std::vector<std::pair<double, double>> points;  // (x, value)
  bool dashed = false;                            // a range bound; no legend entry
};

// One line chart (an <svg>) of several series sharing the x axis. Series
// with an empty label get no legend entry.
std::string Chart(const std::string& title, const std::string& y_unit, const std::vector<Series>& series,
                  const std::string& x_label = "RL step");

}  // namespace sluice::launch

#endif  // SLUICE_LAUNCH_HTML_CHART_H_
