// Response lengths for workloads: the long-tail distribution the benchmarks
// and `sluice simulate` share, so a simulated workload is the benchmarked one.
//
// Thread safety: pure functions.
#ifndef SLUICE_SIMULATE_LENGTHS_H_
#define SLUICE_SIMULATE_LENGTHS_H_

#include <cstdint>
#include <vector>

namespace sluice::simulate {

// Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9), p in (0, 1).
double NormalQuantile(double p);

// n response lengths, log-normal with the given median, spread so the longest
// is exactly `tail` x the median (stratified quantiles, shuffled with `seed`);
// tail 1: every length is the median. Preconditions: n >= 1, median >= 1,
// tail >= 1.
std::vector<int32_t> LongTailLengths(int n, int median, double tail, uint64_t seed);

// n response lengths, log-normal with the given median and spread (the
// standard deviation of the log length), cut off at `cap` as a run's
// max_new_tokens cuts answers off (stratified quantiles, shuffled with
// `seed`). Preconditions: n >= 1, 1 <= median <= cap, sigma >= 0.
std::vector<int32_t> CappedLogNormalLengths(int64_t n, int32_t median, double sigma, int32_t cap, uint64_t seed);

}  // namespace sluice::simulate

#endif  // SLUICE_SIMULATE_LENGTHS_H_
