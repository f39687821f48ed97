#include "sluice/model/weights.h"

#include <filesystem>
#include <set>

#include "sluice/common/logging.h"

namespace sluice::model {
namespace {

std::optional<torch::Dtype> TorchDtype(DType d) {
  switch (d) {
    case DType::kF64:
      return torch::kFloat64;
    case DType::kF32:
      return torch::kFloat32;
    case DType::kF16:
      return torch::kFloat16;
    case DType::kBF16:
      return torch::kBFloat16;
    case DType::kI64:
      return torch::kInt64;
    case DType::kI32:
      return torch::kInt32;
    case DType::kI16:
      return torch::kInt16;
    case DType::kI8:
      return torch::kInt8;
    case DType::kU8:
      return torch::kUInt8;
    case DType::kBool:
      return torch::kBool;
  }
  return std::nullopt;
}

std::optional<DType> HostDtype(torch::Dtype d) {
  switch (d) {
    case torch::kFloat64:
      return DType::kF64;
    case torch::kFloat32:
      return DType::kF32;
    case torch::kFloat16:
      return DType::kF16;
    case torch::kBFloat16:
      return DType::kBF16;
    case torch::kInt64:
      return DType::kI64;
    case torch::kInt32:
      return DType::kI32;
    case torch::kInt16:
      return DType::kI16;
    case torch::kInt8:
      return DType::kI8;
    case torch::kUInt8:
      return DType::kU8;
    case torch::kBool:
      return DType::kBool;
    default:
      return std::nullopt;
  }
}

std::string ShapeString(c10::IntArrayRef shape) {
  return ShapeToString(std::vector<int64_t>(shape.begin(), shape.end()));
}

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16 || d == DType::kF64; }

}  // namespace

Result<torch::Tensor> ToTorch(const HostTensor& host) {
  auto dtype = TorchDtype(host.dtype);
  if (!dtype)
    return Status::InvalidArgument("dtype " + std::string(DTypeName(host.dtype)) + " has no torch equivalent");
  auto owner = host.owner;
  // from_blob never writes through the pointer here: callers only read or copy.
  return torch::from_blob(
      const_cast<std::byte*>(host.data), host.shape, [owner](void*) {}, torch::TensorOptions().dtype(*dtype));
}

Result<HostTensor> FromTorch(const torch::Tensor& tensor) {
  auto dtype = HostDtype(tensor.scalar_type());
  if (!dtype)
    return Status::InvalidArgument(std::string("torch dtype ") + c10::toString(tensor.scalar_type()) +
                                   " has no safetensors equivalent");
  auto cpu = tensor.detach().to(torch::kCPU).contiguous();
  HostTensor host;
  host.dtype = *dtype;
  host.shape.assign(cpu.sizes().begin(), cpu.sizes().end());
  host.data = static_cast<const std::byte*>(cpu.data_ptr());
  host.nbytes = cpu.numel() * cpu.element_size();
  host.owner = std::make_shared<torch::Tensor>(cpu);
  return host;
}

Result<TensorMap> ExportWeights(Transformer& model, DType dtype) {
  if (!IsFloat(dtype) || dtype == DType::kF64) {
    return Status::InvalidArgument("weights can be exported as F32, BF16 or F16, not " + std::string(DTypeName(dtype)));
  }
  TensorMap out;
  torch::NoGradGuard no_grad;
  for (const auto& p : model.named_parameters()) {
    SLUICE_ASSIGN_OR_RETURN(HostTensor host, FromTorch(p.value().to(*TorchDtype(dtype))));
    out.emplace(p.key(), std::move(host));
  }
  return out;
}

Status LoadWeights(Transformer& model, const TensorMap& weights) {
  auto params = model.named_parameters();
  std::set<std::string> expected;
  for (const auto& p : params) expected.insert(p.key());
  for (const auto& [name, host] : weights) {
    if (expected.count(name)) continue;
    bool tolerated =
        (name == "lm_head.weight" && model.config().tie_word_embeddings) || name.ends_with("rotary_emb.inv_freq");
    if (!tolerated)
      return Status::InvalidArgument("checkpoint tensor '" + name +
                                     "' is not a parameter of this model (wrong architecture or config?)");
  }
  // Validate every tensor before copying any, so a bad checkpoint leaves the model as it was.
  for (auto& p : params) {
    auto it = weights.find(p.key());
    if (it == weights.end()) return Status::NotFound("checkpoint is missing tensor '" + p.key() + "'");
    const HostTensor& host = it->second;
    if (!IsFloat(host.dtype)) {
      return Status::InvalidArgument("tensor '" + p.key() + "' has dtype " + std::string(DTypeName(host.dtype)) +
                                     "; weights must be F32, BF16 or F16");
    }
    if (!std::equal(host.shape.begin(), host.shape.end(), p.value().sizes().begin(), p.value().sizes().end())) {
      return Status::InvalidArgument("tensor '" + p.key() + "' has shape " + ShapeToString(host.shape) +
                                     " but the config implies " + ShapeString(p.value().sizes()));
    }
  }
  torch::NoGradGuard no_grad;
  try {
    for (auto& p : params) {
      SLUICE_ASSIGN_OR_RETURN(torch::Tensor src, ToTorch(weights.at(p.key())));
      p.value().copy_(src);
    }
  } catch (const c10::Error& e) {
    return Status::Internal(std::string("libtorch failed while loading weights: ") + e.what_without_backtrace());
  }
  return Status::Ok();
}

Result<std::shared_ptr<Transformer>> LoadPretrained(const std::string& dir, torch::Device device) {
  SLUICE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig((std::filesystem::path(dir) / "config.json").string()));
  SLUICE_ASSIGN_OR_RETURN(TensorMap weights, LoadCheckpointTensors(dir));
  // The sizes in config.json against the checkpoint, before a model of that
  // size is built: a config that describes far more parameters than the
  // checkpoint holds (a wrong num_hidden_layers, say) is refused here; a
  // near miss is built and refused by LoadWeights, which names the tensor.
  int64_t held = 0;
  for (const auto& [name, t] : weights) {
    SLUICE_ASSIGN_OR_RETURN(const uint64_t n, CheckedNumel(t.shape));
    held += static_cast<int64_t>(n);
  }
  if (config.NumParameters() > 2 * held + (int64_t{1} << 20)) {
    return Status::InvalidArgument(dir + "/config.json describes a model of " + std::to_string(config.NumParameters()) +
                                   " parameters, but the checkpoint holds " + std::to_string(held) +
                                   ": a size in config.json (num_hidden_layers, hidden_size, ...) is wrong");
  }
  auto model = std::make_shared<Transformer>(config, /*seed=*/0);
  SLUICE_RETURN_IF_ERROR(LoadWeights(*model, weights).WithContext(dir));
  SLUICE_RETURN_IF_ERROR(CheckFiniteWeights(*model, dir));
  model->to(device);
  return model;
}

Status CheckFiniteWeights(Transformer& model, const std::string& what) {
  torch::NoGradGuard no_grad;
  for (const auto& p : model.named_parameters()) {
    if (!torch::isfinite(p.value()).all().item<bool>()) {
      return Status::DataLoss(what + ": tensor '" + p.key() + "' holds NaN or inf values");
    }
  }
  return Status::Ok();
}

Status SavePretrained(Transformer& model, const std::string& dir, DType dtype, const CheckpointWriteOptions& options) {
  // Weights a trainer command published as NaN were written out as a final
  // model that this loader then refuses: refused here, before a file is.
  SLUICE_RETURN_IF_ERROR(CheckFiniteWeights(model, "cannot save " + dir));
  SLUICE_ASSIGN_OR_RETURN(TensorMap weights, ExportWeights(model, dtype));
  SLUICE_RETURN_IF_ERROR(SaveCheckpointTensors(dir, weights, options));
  ModelConfig config = model.config();
  config.torch_dtype = dtype == DType::kBF16 ? "bfloat16" : dtype == DType::kF16 ? "float16" : "float32";
  return SaveModelConfig((std::filesystem::path(dir) / "config.json").string(), config);
}

void PlaceModel(Transformer& model, torch::Device device, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  if (!device.is_cpu() || dtype != torch::kBFloat16) {
    model.to(device, dtype);
    return;
  }
  model.to(device, torch::kFloat32);
  for (auto& p : model.parameters()) {
    if (p.dim() == 2) p.set_data(p.to(torch::kBFloat16));
  }
}

std::shared_ptr<Transformer> CloneModel(Transformer& model, torch::Device device, torch::ScalarType dtype) {
  auto copy = std::make_shared<Transformer>(model.config(), /*seed=*/0);
  PlaceModel(*copy, device, dtype);
  torch::NoGradGuard no_grad;
  auto src = model.named_parameters();
  for (auto& p : copy->named_parameters()) p.value().copy_(src[p.key()]);
  return copy;
}

std::shared_ptr<Transformer> CloneModel(Transformer& model) {
  const torch::Tensor embedding = model.named_parameters()["model.embed_tokens.weight"];
  return CloneModel(model, embedding.device(), embedding.scalar_type());
}

}  // namespace sluice::model
