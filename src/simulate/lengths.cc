#include "sluice/simulate/lengths.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace sluice::simulate {

// Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9).
double NormalQuantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double lo = 0.02425;
  if (p < lo) {
    double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - lo) return -NormalQuantile(1 - p);
  double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

// n response lengths, log-normal with the given median, spread so the longest
// is exactly `tail` x the median (stratified quantiles, shuffled with `seed`).
std::vector<int32_t> LongTailLengths(int n, int median, double tail, uint64_t seed) {
  const double z_max = NormalQuantile((n - 0.5) / n);
  const double sigma = std::log(tail) / z_max;
  std::vector<int32_t> lengths;
  for (int i = 0; i < n; ++i) {
    double z = NormalQuantile((i + 0.5) / n);
    lengths.push_back(std::max(1, static_cast<int32_t>(std::lround(median * std::exp(sigma * z)))));
  }
  std::shuffle(lengths.begin(), lengths.end(), std::mt19937_64(seed));
  return lengths;
}

std::vector<int32_t> CappedLogNormalLengths(int64_t n, int32_t median, double sigma, int32_t cap, uint64_t seed) {
  std::vector<int32_t> lengths;
  lengths.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double z = NormalQuantile((static_cast<double>(i) + 0.5) / static_cast<double>(n));
    const double v = std::min(static_cast<double>(cap), median * std::exp(sigma * z));
    lengths.push_back(std::max(1, static_cast<int32_t>(std::lround(v))));
  }
  std::shuffle(lengths.begin(), lengths.end(), std::mt19937_64(seed));
  return lengths;
}

}  // namespace sluice::simulate
