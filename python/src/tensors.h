// Conversions between torch tensors and Sluice's HostTensor shared by the
// extension's components: dtypes both ways, and torch views of HostTensor
// bytes that keep the HostTensor's owner alive.
//
// Thread safety: pure functions; ViewOf's deleter runs wherever torch frees
// the tensor and touches no Python object.
#ifndef SLUICE_PYTHON_SRC_TENSORS_H_
#define SLUICE_PYTHON_SRC_TENSORS_H_

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "sluice/common/host_tensor.h"

namespace sluice::python {

// The DType of a torch scalar type; nullopt for types Sluice does not store
// (complex, quantized, unsigned wider than 8 bits, ...).
std::optional<DType> ToDType(at::ScalarType t);
at::ScalarType ToScalarType(DType t);

// Parses a DType name ("F32", "BF16", ...); ValueError if unknown.
DType ParseDType(const std::string& name);

// A torch tensor viewing h's bytes, without a copy; it holds h.owner until
// torch frees it. An empty tensor (no bytes) is a fresh tensor of h's shape.
at::Tensor ViewOf(const HostTensor& h);

}  // namespace sluice::python

#endif  // SLUICE_PYTHON_SRC_TENSORS_H_
