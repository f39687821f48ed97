// Typed host buffers without libtorch: what TransferQueue columns,
// CheckpointEngine weights and safetensors files are made of. The model layer
// wraps them as torch tensors without copying.
//
// Thread safety: a HostTensor is an immutable view; copies share the owner and
// may be read concurrently.
#ifndef SLUICE_COMMON_HOST_TENSOR_H_
#define SLUICE_COMMON_HOST_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/status.h"

namespace sluice {

enum class DType : uint8_t { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// Bytes per element.
size_t DTypeSize(DType dtype);
// The safetensors spelling: "F32", "BF16", ...
std::string_view DTypeName(DType dtype);
// Parses the safetensors spelling; nullopt if unknown.
std::optional<DType> ParseDTypeName(std::string_view name);

// Element count of `shape`, or an error if a dimension is negative or the
// product overflows `limit` elements.
Result<uint64_t> CheckedNumel(const std::vector<int64_t>& shape, uint64_t limit = (uint64_t{1} << 48));

// "[2, 3]": shapes in error messages.
std::string ShapeToString(const std::vector<int64_t>& shape);

struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // Keeps `data` alive (a heap buffer, a mapped file, a shared-memory segment).
  std::shared_ptr<const void> owner;
  const std::byte* data = nullptr;
  size_t nbytes = 0;

  uint64_t numel() const;

  // A tensor that owns a fresh copy of `bytes`. Precondition: bytes.size()
  // matches the shape and dtype (checked; a mismatch is a bug).
  static HostTensor Copy(DType dtype, std::vector<int64_t> shape, const void* bytes, size_t nbytes);
};

// Tensors by name; ordered so serialization is deterministic.
using TensorMap = std::map<std::string, HostTensor>;

}  // namespace sluice

#endif  // SLUICE_COMMON_HOST_TENSOR_H_
