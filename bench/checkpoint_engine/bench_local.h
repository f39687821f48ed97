// Same-host measurements: the memcpy baseline, the in-process VersionStore
// and the shared-memory store with subscriber processes.
#ifndef SLUICE_BENCH_CHECKPOINT_ENGINE_BENCH_LOCAL_H_
#define SLUICE_BENCH_CHECKPOINT_ENGINE_BENCH_LOCAL_H_

#include <map>
#include <string>

#include "bench_support.h"

namespace sluice::bench::ce {

struct RunConfig {
  size_t bytes = 0;
  int subscribers = 1;
  int repeats = 3;  // measured rounds
  // Rounds before them, timed apart: the first versions fault in fresh
  // memory (a store with reuse_buffers reuses it from the third on).
  int warmups = 2;
  int rounds() const { return warmups + repeats; }
};

// N threads each copy the version's bytes into their own (pre-touched)
// buffer: the physical floor of "N subscribers hold a private copy".
Result<Measurement> MeasureMemcpy(const RunConfig& config);

// Publish into a VersionStore; N subscriber threads wait for the version and
// copy it into their standby buffers.
Result<Measurement> MeasureInProcess(const RunConfig& config);

// Publish into a shared-memory store; N subscriber processes (this binary,
// --role=shm-sub) wait for the version and copy it into their standby
// buffers with ShmVersionHandle::CopyTo (which re-checksums the copy).
// `recycle_segments` as ShmPublisherOptions: false gives every version a
// fresh segment (the "shm-fresh" row).
Result<Measurement> MeasureSharedMemory(const RunConfig& config, bool recycle_segments);

// The shm subscriber process's main. `args` are its --key=value flags.
int ShmSubscriberMain(const std::map<std::string, std::string>& args);

}  // namespace sluice::bench::ce

#endif  // SLUICE_BENCH_CHECKPOINT_ENGINE_BENCH_LOCAL_H_
