#include "sluice/simulate/gpu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "sluice/common/enum_names.h"

namespace sluice::simulate {

namespace {

constexpr double kGB = 1e9;
constexpr double kBf16 = 2;  // bytes per weight or cache entry
// The trainer's state per weight with mixed precision and Adam, sharded
// over its ranks: bf16 weight 2, fp32 master 4, fp32 gradient 4, Adam's
// moments 8.
constexpr double kTrainStateBytes = 18;
// Memory a rollout engine keeps per accelerator beside weights and cache
// (activations, graphs, the sampler), and the share of a trainer's memory
// its state and activations may take.
constexpr double kEngineReserveGB = 2;
constexpr double kTrainerMemoryShare = 0.9;

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

const std::vector<Accelerator>& KnownAccelerators() {
  // Vendor datasheet figures (dense bf16; NVLink's bidirectional figure
  // halved), with the network a cluster of the part typically has: one
  // 400 Gb/s NIC per GPU (200 Gb/s for A100 and the Ascend part). The
  // Ascend 910B's figures are the commonly cited ones, not a datasheet's.
  static const std::vector<Accelerator> parts = {
      {"h100", "NVIDIA H100 SXM 80GB: 3.35 TB/s HBM3, 989 TFLOP/s bf16, NVLink 900 GB/s both ways", 80, 3.35, 989, 450,
       50, 8},
      {"h800", "NVIDIA H800 SXM 80GB: as H100, NVLink 400 GB/s both ways", 80, 3.35, 989, 200, 50, 8},
      {"h200", "NVIDIA H200 SXM 141GB: 4.8 TB/s HBM3e, 989 TFLOP/s bf16, NVLink 900 GB/s both ways", 141, 4.8, 989, 450,
       50, 8},
      {"h20", "NVIDIA H20 96GB: 4.0 TB/s HBM3, 148 TFLOP/s bf16, NVLink 900 GB/s both ways", 96, 4.0, 148, 450, 50, 8},
      {"a100", "NVIDIA A100 SXM 80GB: 2.039 TB/s HBM2e, 312 TFLOP/s bf16, NVLink 600 GB/s both ways", 80, 2.039, 312,
       300, 25, 8},
      {"910b", "Ascend 910B class: 64 GB HBM2e, 1.6 TB/s, 320 TFLOP/s fp16, HCCS 392 GB/s (commonly cited figures)", 64,
       1.6, 320, 196, 25, 8},
  };
  return parts;
}

Result<Accelerator> FindAccelerator(const std::string& name) {
  std::string known;
  for (const Accelerator& a : KnownAccelerators()) {
    if (a.name == name) return a;
    known += (known.empty() ? "" : ", ") + a.name;
  }
  return Status::NotFound("unknown hardware '" + name + "' (known: " + known + ")");
}

double ModelDims::Parameters() const {
  const double h = static_cast<double>(hidden), hd = static_cast<double>(HeadDim());
  const double attention = h * hd * static_cast<double>(heads) * 2 + h * hd * static_cast<double>(kv_heads) * 2;
  const double mlp = 3 * h * static_cast<double>(intermediate);
  const double norms = 2 * h;
  const double embeddings = static_cast<double>(vocab) * h * (tied_embeddings ? 1 : 2);
  return static_cast<double>(layers) * (attention + mlp + norms) + embeddings + h;
}

double ModelDims::MatmulParameters() const {
  // Everything but the input embedding's lookup; a tied output layer still
  // multiplies by the (shared) embedding matrix.
  return Parameters() - static_cast<double>(vocab) * static_cast<double>(hidden) * (tied_embeddings ? 0 : 1);
}

double ModelDims::KvBytesPerToken() const {
  return 2 * static_cast<double>(layers) * static_cast<double>(kv_heads) * static_cast<double>(HeadDim()) * kBf16;
}

Status ModelDims::Validate() const {
  auto bad = [&](const std::string& what) { return Status::InvalidArgument("model " + name + ": " + what); };
  if (hidden < 1 || layers < 1 || heads < 1 || kv_heads < 1 || intermediate < 1 || vocab < 1) {
    return bad("hidden, layers, heads, kv_heads, intermediate and vocab must be >= 1");
  }
  if (heads % kv_heads != 0) return bad("heads must be a multiple of kv_heads");
  if (head_dim < 0) return bad("head_dim must be >= 0 (0: hidden / heads)");
  if (head_dim == 0 && hidden % heads != 0) return bad("hidden must be a multiple of heads (or give head_dim)");
  return Status::Ok();
}

const std::vector<ModelDims>& KnownModels() {
  // From the models' config.json files. DeepSeek-R1-Distill-Qwen-7B has
  // Qwen2.5-7B's shape; its 1.5B sibling unties Qwen2.5-1.5B's embeddings.
  static const std::vector<ModelDims> models = {
      {"qwen2.5-1.5b", 1536, 28, 12, 2, 0, 8960, 151936, true},
      {"r1-distill-qwen-1.5b", 1536, 28, 12, 2, 0, 8960, 151936, false},
      {"qwen2.5-7b", 3584, 28, 28, 4, 0, 18944, 152064, false},
      {"llama3.1-8b", 4096, 32, 32, 8, 0, 14336, 128256, false},
      {"qwen2.5-14b", 5120, 48, 40, 8, 0, 13824, 152064, false},
      {"qwen2.5-32b", 5120, 64, 40, 8, 0, 27648, 152064, false},
      {"llama3.1-70b", 8192, 80, 64, 8, 0, 28672, 128256, false},
      {"qwen2.5-72b", 8192, 80, 64, 8, 0, 29568, 152064, false},
  };
  return models;
}

Result<ModelDims> FindModel(const std::string& name) {
  std::string known;
  for (const ModelDims& m : KnownModels()) {
    if (m.name == name) return m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  return Status::NotFound("unknown model '" + name + "' (known: " + known + "; or give a config.json)");
}

Status Efficiency::Validate() const {
  for (const auto& [key, v] : {std::pair{"decode_memory", decode_memory}, std::pair{"decode_compute", decode_compute},
                               std::pair{"prefill_compute", prefill_compute}, std::pair{"train_compute", train_compute},
                               std::pair{"network", network}, std::pair{"memory_utilization", memory_utilization}}) {
    if (!std::isfinite(v) || v <= 0 || v > 1) {
      return Status::InvalidArgument(std::string("efficiency ") + key + " must be in (0, 1]");
    }
  }
  for (const auto& [key, v] :
       {std::pair{"decode_step_s", decode_step_s}, std::pair{"collective_latency_s", collective_latency_s},
        std::pair{"colocated_switch_s", colocated_switch_s}}) {
    if (!std::isfinite(v) || v < 0) return Status::InvalidArgument(std::string("efficiency ") + key + " must be >= 0");
  }
  if (!std::isfinite(colocated_train_slowdown) || colocated_train_slowdown < 1) {
    return Status::InvalidArgument("efficiency colocated_train_slowdown must be >= 1");
  }
  if (!std::isfinite(train_passes) || train_passes < 1) {
    return Status::InvalidArgument("efficiency train_passes must be >= 1 (a forward pass)");
  }
  return Status::Ok();
}

Status GpuLayout::Validate() const {
  auto bad = [](const std::string& what) { return Status::InvalidArgument("cluster layout: " + what); };
  if (rollout_tp < 1 || train_mp < 1) return bad("rollout_tp and train_mp must be >= 1");
  if (rollout_gpus < rollout_tp) {
    return bad(std::to_string(rollout_gpus) + " rollout accelerators cannot hold one engine of rollout_tp " +
               std::to_string(rollout_tp));
  }
  if (rollout_gpus % rollout_tp != 0) {
    return bad(std::to_string(rollout_gpus) + " rollout accelerators are not a multiple of rollout_tp " +
               std::to_string(rollout_tp));
  }
  if (trainer_gpus < train_mp) {
    return bad(std::to_string(trainer_gpus) + " trainer accelerators cannot hold one rank of train_mp " +
               std::to_string(train_mp));
  }
  if (trainer_gpus % train_mp != 0) {
    return bad(std::to_string(trainer_gpus) + " trainer accelerators are not a multiple of train_mp " +
               std::to_string(train_mp));
  }
  if (colocated && rollout_gpus != trainer_gpus) {
    return bad("colocated: the rollout and the trainer use the same accelerators (rollout_gpus == trainer_gpus)");
  }
  if (max_rows < 1) return bad("max_rows must be >= 1");
  return Status::Ok();
}

namespace {

// The trainer's state and one micro-batch's activations per accelerator, in
// bytes: the state sharded over every trainer accelerator; activations kept
// at each layer's input (computed again in backward), plus one layer's
// working set, split over the rank's model-parallel accelerators.
double TrainerBytesPerAccelerator(const ModelDims& m, const GpuLayout& g, int64_t micro_batch_tokens) {
  const double tokens = static_cast<double>(micro_batch_tokens), h = static_cast<double>(m.hidden);
  const double state = kTrainStateBytes * m.Parameters() / static_cast<double>(g.trainer_gpus);
  const double checkpoints = static_cast<double>(m.layers) * h * tokens * kBf16;
  const double one_layer = tokens * (16 * h + 2 * static_cast<double>(m.intermediate) * 3) * kBf16;
  const double logits = tokens * static_cast<double>(m.vocab) * 4;  // fp32, for the log-probs
  return state + (checkpoints + one_layer + logits) / static_cast<double>(g.train_mp);
}

// Each engine's share of the cache per token: K and V split over its
// accelerators by KV head (replicated where it has fewer heads than them).
double EngineKvBytesPerToken(const ModelDims& m, int32_t tp) {
  const double replicas = tp > m.kv_heads ? static_cast<double>(tp) / static_cast<double>(m.kv_heads) : 1.0;
  return m.KvBytesPerToken() * replicas;
}

struct EngineMemory {
  double free_bytes = 0;  // for the cache
  double weight_bytes = 0;
};

EngineMemory RolloutMemory(const Accelerator& a, const ModelDims& m, const GpuLayout& g, const Efficiency& e,
                           bool standby_copy) {
  const double tp = g.rollout_tp;
  EngineMemory mem;
  mem.weight_bytes = kBf16 * m.Parameters() * (standby_copy ? 2 : 1);
  double usable = a.memory_gb * kGB * e.memory_utilization * tp - kEngineReserveGB * kGB * tp;
  if (g.colocated) usable -= kTrainStateBytes * m.Parameters() / static_cast<double>(g.trainer_gpus) * tp;
  mem.free_bytes = usable - mem.weight_bytes;
  return mem;
}

Result<int64_t> KvCapacity(const Accelerator& a, const ModelDims& m, const GpuLayout& g, const Efficiency& e,
                           bool standby_copy) {
  SLUICE_RETURN_IF_ERROR(m.Validate());
  SLUICE_RETURN_IF_ERROR(g.Validate());
  SLUICE_RETURN_IF_ERROR(e.Validate());
  const EngineMemory mem = RolloutMemory(a, m, g, e, standby_copy);
  const double per_token = EngineKvBytesPerToken(m, g.rollout_tp);
  // At least a few thousand tokens of cache, or the engine is not worth running.
  if (mem.free_bytes < 4096 * per_token) {
    return Status::InvalidArgument(m.name + " does not fit a rollout engine of " + std::to_string(g.rollout_tp) +
                                   " x " + a.name + " (" + Fixed(a.memory_gb * g.rollout_tp, 0) + " GB, " +
                                   Fixed(100 * e.memory_utilization, 0) +
                                   "% for the engine): " + Fixed(mem.weight_bytes / kGB, 1) + " GB of bf16 weights" +
                                   (standby_copy ? " with a standby copy" : "") +
                                   " leave no room for a KV cache; give the engine more accelerators (rollout_tp)");
  }
  return static_cast<int64_t>(mem.free_bytes / per_token);
}

}  // namespace

Result<int64_t> KvCapacityTokens(const Accelerator& a, const ModelDims& m, const GpuLayout& g, const Efficiency& e) {
  return KvCapacity(a, m, g, e, /*standby_copy=*/false);
}

Result<CostProfile> GpuCostProfile(const Accelerator& a, const ModelDims& m, const GpuLayout& g, const Efficiency& e) {
  SLUICE_RETURN_IF_ERROR(KvCapacity(a, m, g, e, false).status());
  const double tp = g.rollout_tp, mp = g.train_mp;
  const double bandwidth = a.memory_tb_s * 1e12, flops = a.bf16_tflops * 1e12;
  const double link = a.link_gb_s * kGB * e.network, network = a.network_gb_s * kGB * e.network;
  const double matmul = m.MatmulParameters(), weight_bytes = kBf16 * m.Parameters();
  const double attention = static_cast<double>(m.layers * m.heads * m.HeadDim());
  CostProfile p;
  p.model = m.name;
  p.device = a.name;
  p.threads = 1;
  p.cores = 0;
  p.measured_by = "roofline from public figures: " + a.description;
  // A decode step streams the weights and every attended token's K and V
  // once, and multiplies each row by the weights: whichever takes longer.
  p.memory_step_s = kBf16 * matmul / tp / (bandwidth * e.decode_memory);
  p.memory_context_s = EngineKvBytesPerToken(m, g.rollout_tp) / tp / (bandwidth * e.decode_memory);
  p.compute_row_s = 2 * matmul / tp / (flops * e.decode_compute);
  p.compute_context_s = 4 * attention / tp / (flops * e.decode_compute);
  // Tensor parallel: two all-reduces of each row's hidden state per layer.
  const double all_reduces = g.rollout_tp > 1 ? 2.0 * static_cast<double>(m.layers) : 0.0;
  p.decode_step_s = e.decode_step_s + all_reduces * e.collective_latency_s;
  p.decode_row_s = all_reduces * 2 * (tp - 1) / tp * static_cast<double>(m.hidden) * kBf16 / link;
  p.prefill_token_s = 2 * matmul / tp / (flops * e.prefill_compute);
  // Training: train_passes forward passes' arithmetic per token, attention
  // within each packed sample (2 x layers x heads x head_dim x n^2 a forward).
  p.train_token_s = e.train_passes * 2 * matmul / mp / (flops * e.train_compute);
  p.train_token_context_s = e.train_passes * 2 * attention / mp / (flops * e.train_compute);
  // An update (each mini-batch): the optimizer reads and writes its sharded
  // state once; data parallel ranks reduce-scatter gradients and all-gather
  // weights (bf16), over NVLink within a node, else over the network.
  const double ranks = static_cast<double>(g.trainer_gpus) / mp;
  const double optimizer =
      2 * kTrainStateBytes * m.Parameters() / static_cast<double>(g.trainer_gpus) / (bandwidth * e.decode_memory);
  const double dp_link = g.trainer_gpus <= a.per_node ? link : network;
  const double gradients = ranks > 1 ? 2 * kBf16 * m.Parameters() / mp * (ranks - 1) / ranks / dp_link : 0.0;
  p.train_update_s = optimizer + gradients;
  // A version: gathered within the trainer's node (publish), then broadcast
  // to the engines, in parallel from up to a node's worth of senders over
  // the network (or NVLink when the whole cluster is one node).
  const double senders = std::min<double>(a.per_node, static_cast<double>(g.trainer_gpus));
  p.publish_s = weight_bytes / (link * senders);
  const bool one_node = g.colocated ? g.trainer_gpus <= a.per_node : g.trainer_gpus + g.rollout_gpus <= a.per_node;
  p.weight_fill_s = g.colocated ? 0.0 : weight_bytes / ((one_node ? link : network) * senders);
  // Switching: the engine takes the filled copy (a pointer swap here; a copy
  // at HBM speed would be weight_bytes / tp / bandwidth).
  p.weight_switch_s = 0.001;
  if (g.colocated) {
    p.publish_s += e.colocated_switch_s;
    p.train_token_s *= e.colocated_train_slowdown;
    p.train_token_context_s *= e.colocated_train_slowdown;
  }
  return p;
}

const std::vector<Policy>& AllPolicies() {
  static const std::vector<Policy> all = {Policy::kColocatedSync,  Policy::kSplitSync, Policy::kOneStepOff,
                                          Policy::kPartialRollout, Policy::kInflight,  Policy::kSluice};
  return all;
}

std::string PolicyName(Policy p) {
  static constexpr const char* kNames[] = {"colocated_sync",  "split_sync", "one_step_off",
                                           "partial_rollout", "inflight",   "sluice"};
  static_assert(std::size(kNames) == static_cast<size_t>(Policy::kSluice) + 1);
  return EnumName(kNames, p);
}

Result<Policy> ParsePolicy(const std::string& name) {
  std::string known;
  for (Policy p : AllPolicies()) {
    if (PolicyName(p) == name) return p;
    known += (known.empty() ? "" : ", ") + PolicyName(p);
  }
  return Status::InvalidArgument("unknown policy '" + name + "' (known: " + known + ")");
}

Result<PolicySetup> SetUpPolicy(Policy policy, const Accelerator& a, const ModelDims& m, const GpuLayout& given,
                                const Efficiency& e, const PolicyOptions& o) {
  if (o.max_staleness < 1) return Status::InvalidArgument("max_staleness must be >= 1 for the asynchronous policies");
  if (o.micro_batch_tokens < 1) return Status::InvalidArgument("micro_batch_tokens must be >= 1");
  if (o.mini_batches < 1) return Status::InvalidArgument("mini_batches must be >= 1");
  GpuLayout g = given;
  g.colocated = policy == Policy::kColocatedSync;
  if (g.colocated) g.rollout_gpus = g.trainer_gpus = given.rollout_gpus + given.trainer_gpus;
  SLUICE_RETURN_IF_ERROR(g.Validate());
  const double trainer_bytes = TrainerBytesPerAccelerator(m, g, o.micro_batch_tokens);
  const double trainer_room = a.memory_gb * kGB * kTrainerMemoryShare;
  if (trainer_bytes > trainer_room) {
    return Status::InvalidArgument(
        m.name + " does not train on " + std::to_string(g.trainer_gpus) + " x " + a.name + " with micro-batches of " +
        std::to_string(o.micro_batch_tokens) + " tokens and train_mp " + std::to_string(g.train_mp) + ": " +
        Fixed(trainer_bytes / kGB, 1) + " GB per accelerator (weights, gradients, Adam, activations) against " +
        Fixed(trainer_room / kGB, 1) +
        " GB; give the trainer more accelerators, a larger train_mp or smaller "
        "micro-batches");
  }
  PolicySetup s;
  SLUICE_ASSIGN_OR_RETURN(s.costs, GpuCostProfile(a, m, g, e));
  SLUICE_ASSIGN_OR_RETURN(s.kv_tokens_per_engine, KvCapacity(a, m, g, e, policy == Policy::kSluice));
  Layout& l = s.layout;
  l.rollout_engines = static_cast<int32_t>(g.rollout_gpus / g.rollout_tp);
  l.rollout_slots = g.max_rows * l.rollout_engines;
  l.trainer_workers = static_cast<int32_t>(g.trainer_gpus / g.train_mp);
  l.lent_workers = 0;
  l.micro_batch_tokens = o.micro_batch_tokens;
  l.mini_batches = o.mini_batches;
  l.kv_capacity_tokens = s.kv_tokens_per_engine;
  l.unpadded_micro_batches = true;
  l.max_staleness = o.max_staleness;
  const double transfer = s.costs.weight_fill_s;
  switch (policy) {
    case Policy::kColocatedSync:
      l.mode = Mode::kSync;
      break;
    case Policy::kSplitSync:
      l.mode = Mode::kSync;
      s.costs.weight_switch_s += transfer;
      s.costs.weight_fill_s = 0;
      break;
    case Policy::kOneStepOff:
      l.mode = Mode::kOneStepOff;
      // The engines stop decoding while the version arrives and loads.
      s.costs.weight_switch_s += transfer;
      s.costs.weight_fill_s = 0;
      break;
    case Policy::kPartialRollout:
      l.mode = Mode::kAsync;
      l.recompute_on_switch = true;
      l.completion_order = true;
      s.costs.weight_switch_s += transfer;
      s.costs.weight_fill_s = 0;
      break;
    case Policy::kInflight:
      l.mode = Mode::kAsync;
      l.completion_order = true;
      s.costs.weight_switch_s += transfer;
      s.costs.weight_fill_s = 0;
      break;
    case Policy::kSluice:
      l.mode = Mode::kAsync;
      break;
  }
  return s;
}

}  // namespace sluice::simulate
