// Moving weights between a Transformer and named host buffers (TensorMap), and
// loading/saving Hugging Face checkpoint directories (config.json +
// model.safetensors or sharded index).
//
// Thread safety: LoadWeights mutates the model and needs exclusive access;
// the other functions only read it.
#ifndef SLUICE_MODEL_WEIGHTS_H_
#define SLUICE_MODEL_WEIGHTS_H_

#include <torch/torch.h>

#include <memory>
#include <string>

#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"
#include "sluice/model/safetensors.h"
#include "sluice/model/transformer.h"

namespace sluice::model {

// Wraps a host buffer as a tensor without copying (the tensor keeps the
// buffer's owner alive). Errors: InvalidArgument for dtypes torch lacks.
Result<torch::Tensor> ToTorch(const HostTensor& host);
// Views a contiguous CPU tensor as a HostTensor (no copy; the HostTensor keeps
// the tensor alive). Other tensors are first made contiguous / copied to CPU.
Result<HostTensor> FromTorch(const torch::Tensor& tensor);

// Exports the model's parameters by Hugging Face name, converted to `dtype`
// (F32, BF16 or F16).
Result<TensorMap> ExportWeights(Transformer& model, DType dtype = DType::kF32);

// Copies `weights` into the model's parameters (converting F32/BF16/F16 to the
// parameter dtype). Every parameter must be present with its exact shape.
// Names the model does not have are errors, except lm_head.weight in a tied
// model and rotary inv_freq buffers, which older exporters write.
// Errors: NotFound (missing tensor), InvalidArgument (shape, dtype, unknown
// name); every tensor is checked before any is copied, so on these errors the
// model is unchanged.
Status LoadWeights(Transformer& model, const TensorMap& weights);

// Reads config.json and the weights in `dir` into a new model on `device`.
Result<std::shared_ptr<Transformer>> LoadPretrained(const std::string& dir, torch::Device device = torch::kCPU);

// DataLoss ("<what>: tensor 'NAME' holds NaN or inf values") for the first
// parameter that is not finite.
Status CheckFiniteWeights(Transformer& model, const std::string& what);

// Writes config.json and the weights (in `dtype`) to `dir`. Errors:
// CheckFiniteWeights's (nothing is written), the writer's.
Status SavePretrained(Transformer& model, const std::string& dir, DType dtype = DType::kF32,
                      const CheckpointWriteOptions& options = {});

// Moves `model` to `device` in `dtype`. bfloat16 on the CPU keeps the
// vectors (norms, biases) and the computation in float32 and stores only the
// matrices (projections, embeddings) in bfloat16: the CPU decode kernels widen
// each weight as they read it, so a decode step streams half the bytes while
// its arithmetic stays float32 (CPU bfloat16 arithmetic in libtorch is slow).
// Elsewhere the whole model takes `dtype`.
void PlaceModel(Transformer& model, torch::Device device, torch::ScalarType dtype);

// A deep copy (same config, same weights), placed as the original was: its
// embedding's device and dtype given to PlaceModel, which reproduces a
// CPU model's bfloat16-matrices layout too.
std::shared_ptr<Transformer> CloneModel(Transformer& model);
// A copy placed by PlaceModel (the rollout's model: bfloat16 on a GPU, or
// bfloat16 matrices on a CPU).
std::shared_ptr<Transformer> CloneModel(Transformer& model, torch::Device device, torch::ScalarType dtype);

}  // namespace sluice::model

#endif  // SLUICE_MODEL_WEIGHTS_H_
