#include "sluice/simulate/fit.h"

#include <cmath>
#include <string>

namespace sluice::simulate {

namespace {

// Solves the weighted normal equations on the columns in `use`; columns
// that carry no information (a singular pivot) come out 0.
std::vector<double> SolveOn(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                            const std::vector<double>& w, const std::vector<bool>& use) {
  const size_t k = use.size();
  std::vector<size_t> cols;
  for (size_t j = 0; j < k; ++j) {
    if (use[j]) cols.push_back(j);
  }
  const size_t m = cols.size();
  std::vector<std::vector<double>> a(m, std::vector<double>(m + 1, 0.0));
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t r = 0; r < m; ++r) {
      const double xr = x[i][cols[r]] * w[i];
      for (size_t c = 0; c < m; ++c) a[r][c] += xr * x[i][cols[c]];
      a[r][m] += xr * y[i];
    }
  }
  // Gaussian elimination with partial pivoting.
  std::vector<double> sol(m, 0.0);
  std::vector<bool> dead(m, false);
  for (size_t p = 0; p < m; ++p) {
    size_t best = p;
    for (size_t r = p + 1; r < m; ++r) {
      if (std::fabs(a[r][p]) > std::fabs(a[best][p])) best = r;
    }
    std::swap(a[p], a[best]);
    if (std::fabs(a[p][p]) < 1e-300) {
      dead[p] = true;
      continue;
    }
    for (size_t r = 0; r < m; ++r) {
      if (r == p) continue;
      const double f = a[r][p] / a[p][p];
      for (size_t c = p; c <= m; ++c) a[r][c] -= f * a[p][c];
    }
  }
  for (size_t p = 0; p < m; ++p) sol[p] = dead[p] ? 0.0 : a[p][m] / a[p][p];
  std::vector<double> out(k, 0.0);
  for (size_t r = 0; r < m; ++r) out[cols[r]] = sol[r];
  return out;
}

}  // namespace

Result<std::vector<double>> FitNonNegative(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                                           const std::vector<double>& weight) {
  if (x.empty() || x[0].empty()) return Status::InvalidArgument("fit: no measurements");
  if (y.size() != x.size() || weight.size() != x.size()) {
    return Status::InvalidArgument("fit: " + std::to_string(x.size()) + " rows, " + std::to_string(y.size()) +
                                   " values, " + std::to_string(weight.size()) + " weights");
  }
  const size_t k = x[0].size();
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].size() != k) return Status::InvalidArgument("fit: row " + std::to_string(i) + " has another width");
    for (double v : x[i]) {
      if (!std::isfinite(v)) return Status::InvalidArgument("fit: a non-finite feature in row " + std::to_string(i));
    }
    if (!std::isfinite(y[i]) || !std::isfinite(weight[i]) || weight[i] <= 0) {
      return Status::InvalidArgument("fit: a non-finite value or a weight <= 0 in row " + std::to_string(i));
    }
  }
  std::vector<bool> use(k, true);
  for (size_t round = 0; round < k; ++round) {
    std::vector<double> c = SolveOn(x, y, weight, use);
    size_t worst = k;
    for (size_t j = 0; j < k; ++j) {
      if (use[j] && c[j] < 0 && (worst == k || c[j] < c[worst])) worst = j;
    }
    if (worst == k) return c;
    use[worst] = false;
  }
  return std::vector<double>(k, 0.0);
}

}  // namespace sluice::simulate
