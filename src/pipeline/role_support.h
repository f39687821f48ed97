// What the streaming roles share that needs no libtorch (so a role's own
// file, rollout_role.cc, stays torch-free and clang checks its locking):
// the clock, each answer's sampling seed, the hub's poll, a role's loops on
// threads, the read of rows just leased, and the trace tracks of the roles.
//
// Thread safety: pure functions and values; RunLoops joins its threads.
#ifndef SLUICE_SRC_PIPELINE_ROLE_SUPPORT_H_
#define SLUICE_SRC_PIPELINE_ROLE_SUPPORT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "sluice/common/random.h"
#include "sluice/common/status.h"
#include "sluice/pipeline/roles.h"
#include "sluice/transfer_queue/client.h"

namespace sluice::pipeline {

using Clock = std::chrono::steady_clock;

// The sampling seed of answer g to the prompt at `cursor` (the same in every
// mode, so sync over the hub reproduces the direct loop).
inline uint64_t AnswerSeed(uint64_t seed, int64_t prompts_per_step, int64_t group_size, uint64_t cursor, int64_t g) {
  const uint64_t step = cursor / static_cast<uint64_t>(prompts_per_step);
  const uint64_t k = cursor % static_cast<uint64_t>(prompts_per_step);
  return HashCombine(HashCombine(seed, step), k * static_cast<uint64_t>(group_size) + static_cast<uint64_t>(g));
}

// Sets the intra-op thread count of the calling thread's libtorch/OpenMP
// parallel regions (each role thread sets its own).
void SetIntraOpThreadsHere(int threads);

// The data of rows this process just leased, or nullopt when the lease was
// lost before it read them: a process paused (SIGSTOP, a swapped-out host)
// past its lease finds its rows handed to another process, which may have
// finished them, so the hub freed them and reading them is NotFound. That
// take is dropped, with a warning naming `who` (its rows are the other
// process's now), not the run. Other errors: GetData's and Renew's.
Result<std::optional<transfer_queue::BatchData>> ReadLeasedRows(transfer_queue::TransferQueueClient& client,
                                                                const transfer_queue::BatchMeta& meta,
                                                                std::chrono::seconds lease, const char* who);

// The trace track of a role (one per role, whether roles are threads or
// processes; 0 is the launcher's), and naming the calling thread's.
int32_t TraceTrack(PipelineRole role);
void TraceThisThread(PipelineRole role, const std::string& thread_name);

// How long a role's take from the hub waits for rows before it looks around
// (a stop, the run's end) and asks again.
inline constexpr std::chrono::milliseconds kHubPoll{50};

// Runs loop(0) on the calling thread and loop(1..n-1) on threads of their
// own; a loop that fails sets *failed (the others stop at their next
// check). Returns the first error, after every loop has returned.
Status RunLoops(int n, const std::function<Status(int)>& loop, std::atomic<bool>* failed);

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_ROLE_SUPPORT_H_
