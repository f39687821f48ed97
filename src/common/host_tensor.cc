#include "sluice/common/host_tensor.h"

#include <cstring>
#include <iterator>

#include "sluice/common/check.h"
#include "sluice/common/enum_names.h"

namespace sluice {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

namespace {
constexpr const char* kDTypeNames[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"};
static_assert(std::size(kDTypeNames) == static_cast<size_t>(DType::kBool) + 1);
}  // namespace

std::string_view DTypeName(DType dtype) { return EnumName(kDTypeNames, dtype); }

std::optional<DType> ParseDTypeName(std::string_view name) { return EnumNamed<DType>(kDTypeNames, name); }

Result<uint64_t> CheckedNumel(const std::vector<int64_t>& shape, uint64_t limit) {
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return Status::InvalidArgument("negative dimension " + std::to_string(d) + " in shape");
    empty = empty || d == 0;
  }
  // A zero anywhere makes the product 0, however large the other dimensions.
  if (empty) return uint64_t{0};
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (n > limit / static_cast<uint64_t>(d)) {
      return Status::OutOfRange("shape has more than " + std::to_string(limit) + " elements");
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

uint64_t HostTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

HostTensor HostTensor::Copy(DType dtype, std::vector<int64_t> shape, const void* bytes, size_t nbytes) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  // CheckedNumel, not numel(): a negative or huge dimension must not wrap
  // around to a product that happens to match nbytes.
  Result<uint64_t> numel = CheckedNumel(t.shape);
  SLUICE_CHECK(numel.ok()) << numel.status().ToString();
  SLUICE_CHECK_EQ(*numel * DTypeSize(dtype), nbytes);
  auto buffer = std::shared_ptr<std::byte[]>(new std::byte[nbytes > 0 ? nbytes : 1]);
  if (nbytes > 0) std::memcpy(buffer.get(), bytes, nbytes);
  t.data = buffer.get();
  t.nbytes = nbytes;
  t.owner = std::move(buffer);
  return t;
}

}  // namespace sluice
