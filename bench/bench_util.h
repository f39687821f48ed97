// Helpers shared by the benchmark programs: the long-tail length workload
// and summary statistics.
#ifndef SLUICE_BENCH_BENCH_UTIL_H_
#define SLUICE_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_stats.h"
#include "sluice/common/logging.h"
#include "sluice/common/status.h"
#include "sluice/runtime/process.h"
#include "sluice/simulate/lengths.h"

namespace sluice::bench {

// The long-tail workload lives with the simulator, which replays it.
using simulate::LongTailLengths;
using simulate::NormalQuantile;

// "a,b,,c" -> {a, b, c}: a comma-separated flag's items, empty ones dropped.
inline std::vector<std::string> SplitCommas(const std::string& list) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    if (comma > pos) out.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

// The main() of every benchmark: passive OpenMP waiting and the allocator
// settings of docs/design.md (libtorch on CPU), then `body`; an error is printed and
// exits with 2.
template <typename Body>
int BenchMain(int argc, char** argv, Body body) {
  sluice::runtime::EnsurePassiveOpenMp(argv);
  sluice::runtime::TuneAllocator();
  InstallCrashBacktrace();
  Status s = body(argc, argv);
  std::fflush(stdout);  // the results are out even if something fails at exit
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 2;
  }
  return 0;
}

}  // namespace sluice::bench

#endif  // SLUICE_BENCH_BENCH_UTIL_H_
