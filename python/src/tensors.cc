#include "tensors.h"

#include <pybind11/pybind11.h>

#include <memory>

namespace sluice::python {

std::optional<DType> ToDType(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return DType::kF64;
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kLong:
      return DType::kI64;
    case at::kInt:
      return DType::kI32;
    case at::kShort:
      return DType::kI16;
    case at::kChar:
      return DType::kI8;
    case at::kByte:
      return DType::kU8;
    case at::kBool:
      return DType::kBool;
    default:
      return std::nullopt;
  }
}

at::ScalarType ToScalarType(DType t) {
  switch (t) {
    case DType::kF64:
      return at::kDouble;
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kI64:
      return at::kLong;
    case DType::kI32:
      return at::kInt;
    case DType::kI16:
      return at::kShort;
    case DType::kI8:
      return at::kChar;
    case DType::kU8:
      return at::kByte;
    case DType::kBool:
      return at::kBool;
  }
  return at::kByte;  // unreachable: every DType is listed
}

DType ParseDType(const std::string& name) {
  std::optional<DType> d = ParseDTypeName(name);
  if (!d) throw pybind11::value_error("unknown dtype name '" + name + "'");
  return *d;
}

at::Tensor ViewOf(const HostTensor& h) {
  const at::ScalarType st = ToScalarType(h.dtype);
  if (h.nbytes == 0 || h.data == nullptr) return at::empty(h.shape, at::TensorOptions().dtype(st));
  auto* keep = new std::shared_ptr<const void>(h.owner);
  return at::from_blob(
      const_cast<std::byte*>(h.data), h.shape, [keep](void*) { delete keep; }, at::TensorOptions().dtype(st));
}

}  // namespace sluice::python
