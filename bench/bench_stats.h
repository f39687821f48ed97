// Summary statistics shared by every benchmark program (torch-free): the
// median and spread of repeated measurements.
#ifndef SLUICE_BENCH_BENCH_STATS_H_
#define SLUICE_BENCH_BENCH_STATS_H_

#include <algorithm>
#include <vector>

namespace sluice::bench {

struct Stats {
  double median = 0, min = 0, max = 0;
};

// Median (upper middle for an even count), min and max; zeros when empty.
inline Stats Summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  return Stats{v[v.size() / 2], v.front(), v.back()};
}

}  // namespace sluice::bench

#endif  // SLUICE_BENCH_BENCH_STATS_H_
