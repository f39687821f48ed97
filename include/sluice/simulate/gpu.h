// Cost profiles for GPU clusters from public hardware figures and a model's
// shape (docs/simulator.md, "GPU clusters"): a roofline per part of a run,
// with the efficiencies the kernels reach stated as assumptions, the KV cache
// an engine holds, and the layouts of the training policies people use, so
// `sluice plan` can compare them under the same costs.
//
// Every figure here is a model, not a measurement: the docs say which public
// measurements it was checked against and how far off it was.
//
// Thread safety: plain data and pure functions.
#ifndef SLUICE_SIMULATE_GPU_H_
#define SLUICE_SIMULATE_GPU_H_

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/simulate/cost_profile.h"
#include "sluice/simulate/simulator.h"

namespace sluice::simulate {

// One accelerator's public figures (dense bf16; links per direction).
struct Accelerator {
  std::string name;         // as `--hardware` names it: "h100", "h200", ...
  std::string description;  // the part, and where the figures come from
  double memory_gb = 0;     // HBM, 1e9 bytes
  double memory_tb_s = 0;   // HBM bandwidth, 1e12 bytes/s
  double bf16_tflops = 0;   // dense
  double link_gb_s = 0;     // to another accelerator in its node, one direction
  double network_gb_s = 0;  // to another node, per accelerator, one direction
  int32_t per_node = 8;
};

const std::vector<Accelerator>& KnownAccelerators();
// Errors: NotFound naming the unknown name and listing the known ones.
Result<Accelerator> FindAccelerator(const std::string& name);

// A dense decoder's shape (a Llama / Qwen2 config.json).
struct ModelDims {
  std::string name;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // 0: hidden / heads
  int64_t intermediate = 0;
  int64_t vocab = 0;
  bool tied_embeddings = false;

  int64_t HeadDim() const { return head_dim > 0 ? head_dim : hidden / heads; }
  // Every weight, embeddings included.
  double Parameters() const;
  // The weights a token's forward pass multiplies by (the input embedding is
  // a lookup): 2 x this is its arithmetic.
  double MatmulParameters() const;
  // K and V of one token, every layer, in bf16.
  double KvBytesPerToken() const;
  // InvalidArgument naming the first bad dimension.
  Status Validate() const;
};

// Published shapes, 1.5B to 72B: qwen2.5-{1.5b,7b,14b,32b,72b},
// r1-distill-qwen-1.5b, llama3.1-{8b,70b}.
const std::vector<ModelDims>& KnownModels();
// Errors: NotFound naming the unknown name and listing the known ones.
Result<ModelDims> FindModel(const std::string& name);

// What share of the hardware's peak each kind of work reaches. Assumptions,
// not measurements (docs/simulator.md gives the public figures they lean on).
struct Efficiency {
  double decode_memory = 0.75;          // of HBM bandwidth, streaming weights and KV in a decode step
  double decode_compute = 0.5;          // of bf16 peak, a decode step's matmuls at large batch
  double prefill_compute = 0.6;         // of bf16 peak
  double train_compute = 0.4;           // of bf16 peak: the trainer's MFU
  double network = 0.8;                 // of link and network bandwidth, collectives and broadcasts
  double decode_step_s = 0.002;         // per decode step: scheduling, sampling, launches
  double collective_latency_s = 10e-6;  // per collective call (tensor-parallel all-reduce)
  double memory_utilization = 0.9;      // of HBM the rollout engine may take (weights + KV cache)
  double colocated_switch_s = 5.0;      // colocated: trainer <-> rollout (offload, onload, reshard)
  // Colocated: the trainer's cost per token against a separate trainer's (a
  // stack that offloads weights and optimizer to make room for the engines,
  // or computes the old log-probs in a pass of their own, trains slower).
  double colocated_train_slowdown = 1.0;
  // The trainer's arithmetic per token, in multiples of 2 x the matmul
  // parameters (a forward pass): forward + backward (3), the activations
  // computed again in backward (1), the old and reference log-probs (1).
  double train_passes = 5.0;

  // InvalidArgument naming the first out-of-range field.
  Status Validate() const;
};

// How a cluster's accelerators are used. Rollout engines (replicas) of
// `rollout_tp` accelerators each; trainer ranks of `train_mp` accelerators
// each (model parallel: tensor x pipeline), data parallel across ranks.
struct GpuLayout {
  int64_t rollout_gpus = 8;  // colocated: every accelerator does both
  int64_t trainer_gpus = 8;
  int32_t rollout_tp = 1;
  int32_t train_mp = 1;
  int64_t max_rows = 256;  // per engine (the serving engine's max_num_seqs)
  bool colocated = false;

  Status Validate() const;
};

// What one engine of the layout holds: the KV cache in tokens, after the
// weights, in the memory the engine may take. InvalidArgument when the model
// does not fit (naming the model, the memory and the accelerators).
Result<int64_t> KvCapacityTokens(const Accelerator& a, const ModelDims& m, const GpuLayout& g, const Efficiency& e);

// The cost profile of `m` on `a` laid out as `g`: costs per engine and per
// trainer rank (cores = 0: each on its own hardware). weight_fill_s is the
// broadcast of a version to the rollout (in the background, as the
// pipeline's standby copy); policies that stop decoding to load weights move
// it into weight_switch_s (PolicyLayout). Errors: InvalidArgument for a bad
// field, or a model that does not fit.
Result<CostProfile> GpuCostProfile(const Accelerator& a, const ModelDims& m, const GpuLayout& g, const Efficiency& e);

// The policies people run, under the same costs:
//  colocated_sync: every accelerator generates, then every one trains (verl's
//    hybrid engine); a switch between them each step.
//  split_sync: split, synchronous: each side waits for the other (an
//    asynchronous system run with staleness 0).
//  one_step_off: split; the rollout generates the next step's answers while
//    the trainer trains (staleness 1); weights loaded with decoding stopped.
//  partial_rollout: split, asynchronous (staleness bound at admission); a
//    weight update interrupts every answer, whose cache is computed again
//    under the new weights (AReaL); the trainer takes groups as they complete.
//  inflight: split, asynchronous; decoding pauses for the weights and goes on
//    over the old cache (PipelineRL); groups as they complete.
//  sluice: split, asynchronous; the new version fills a standby copy in the
//    background and engines switch between decode steps over the old cache;
//    the trainer takes prompts in order (this pipeline).
enum class Policy { kColocatedSync, kSplitSync, kOneStepOff, kPartialRollout, kInflight, kSluice };
const std::vector<Policy>& AllPolicies();
std::string PolicyName(Policy p);
// Errors: InvalidArgument listing the known names.
Result<Policy> ParsePolicy(const std::string& name);

struct PolicyOptions {
  int64_t max_staleness = 2;           // the asynchronous policies
  int64_t micro_batch_tokens = 32768;  // per trainer rank's micro-batch, packed
  int64_t mini_batches = 1;            // optimizer updates per step (PPO mini-batches)
};

// The simulator's layout and costs for `policy` on the cluster (colocated
// sync: g with every accelerator on both sides). Errors: as GpuCostProfile.
struct PolicySetup {
  Layout layout;
  CostProfile costs;
  int64_t kv_tokens_per_engine = 0;
};
Result<PolicySetup> SetUpPolicy(Policy policy, const Accelerator& a, const ModelDims& m, const GpuLayout& g,
                                const Efficiency& e, const PolicyOptions& o);

}  // namespace sluice::simulate

#endif  // SLUICE_SIMULATE_GPU_H_
