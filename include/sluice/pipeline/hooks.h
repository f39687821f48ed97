// Hooks for tests and benchmarks: not config keys, and not for production
// runs. A hook changes what a run generates or publishes so a test can see
// inside it (which version a token was sampled with, which samples a step
// trained) or a benchmark can fix the workload. TrainingRun::Create takes
// them next to the options; a run without hooks behaves as configured.
#ifndef SLUICE_PIPELINE_HOOKS_H_
#define SLUICE_PIPELINE_HOOKS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "sluice/agent/environment.h"
#include "sluice/common/host_tensor.h"
#include "sluice/trainer/types.h"

namespace sluice::pipeline {

struct RunHooks {
  // Benchmarks: when set, answer g to the prompt at `cursor` is generated to
  // exactly this many tokens (SamplingParams::forced_length), so every mode
  // sees the same long-tail lengths. Agent runs: each of that trajectory's
  // model turns is this long (as far as its token budget allows), ending
  // the turn as its end-of-turn token would.
  std::function<int32_t(uint64_t cursor, int64_t g)> forced_length;
  // Streaming modes: may change the weights the trainer publishes as
  // `version` (e.g. to weights whose output encodes the version).
  std::function<void(int64_t version, TensorMap* weights)> rewrite_published;
  // Streaming modes: sees each step's samples before they are trained.
  std::function<void(int64_t step, const std::vector<trainer::RolloutSample>& samples)> inspect_batch;
  // Streaming modes, fault injection: called each time the trainer has
  // taken the group of the prompt at `cursor` from the hub; returning true
  // makes it drop the group without acking, as a trainer that died holding
  // it would. The hub delivers it again once its lease
  // (pipeline.lease_seconds) runs out.
  std::function<bool(uint64_t cursor)> lose_taken_group;
  // Streaming modes, fault injection: called when every answer of the
  // prompt at `cursor` is in the hub, before its lease is acked; returning
  // true makes the rollout drop that lease unacked and unrenewed, as a
  // replica that died between its last answer and its ack would. The hub
  // hands the prompt out again once pipeline.worker_lease_seconds run out.
  std::function<bool(uint64_t cursor)> lose_prompt_ack;
  // Streaming modes, tests: when it returns true for the prompt at
  // `cursor`, the rollout engine decoding that prompt's answers stops once
  // (after their first tokens, none of its answers waiting for a slot) until
  // its weights change, so a version lands while they decode: under
  // in_flight they span it, under at_boundary they must not. The engine
  // stops only while the trainer can publish without any answer it holds
  // (every prompt it holds is of a step after the ones the trainer's next
  // version needs; rl.dynamic_sampling off), and for at most 30 s.
  std::function<bool(uint64_t cursor)> hold_for_switch;
  // Agent runs (agent.env set), tests and benchmarks: makes each
  // trajectory's environment instead of agent.env's (scripted environments,
  // fault injection, environments that wait), given its id (answer g of the
  // prompt at `cursor`: cursor x group size + g, in every mode). Roles as
  // threads and the direct loop.
  agent::EnvironmentFactory make_environment;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_HOOKS_H_
