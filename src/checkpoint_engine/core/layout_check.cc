#include "core/layout_check.h"

#include <set>

namespace sluice::checkpoint_engine::internal {

Result<std::vector<size_t>> ValidateLayout(const Layout& layout, size_t max_tensor_bytes,
                                           std::string_view options_name) {
  if (layout.empty()) return Status::InvalidArgument(std::string(options_name) + ".layout is empty");
  std::set<std::string_view> names;
  std::vector<size_t> bytes;
  bytes.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    const TensorSpec& spec = layout[i];
    const std::string where = "layout[" + std::to_string(i) + "] " + Quoted(spec.name);
    if (spec.name.empty()) return Status::InvalidArgument("layout[" + std::to_string(i) + "] has an empty name");
    Result<uint64_t> numel = CheckedNumel(spec.shape);
    if (!numel.ok()) return numel.status().WithContext(where + " shape " + ShapeToString(spec.shape));
    const uint64_t n = *numel * DTypeSize(spec.dtype);
    if (n > max_tensor_bytes) {
      return Status::InvalidArgument(where + ": " + std::to_string(n) +
                                     " bytes exceeds max_tensor_bytes=" + std::to_string(max_tensor_bytes));
    }
    if (!names.insert(spec.name).second) {
      return Status::InvalidArgument(where + ": duplicate tensor name in the layout");
    }
    bytes.push_back(static_cast<size_t>(n));
  }
  return bytes;
}

Status CheckTensorMatchesSpec(const std::string& where, const TensorSpec& spec, const HostTensor& tensor,
                              size_t max_tensor_bytes) {
  if (tensor.nbytes > max_tensor_bytes) {
    return Status::ResourceExhausted(where + ": " + std::to_string(tensor.nbytes) +
                                     " bytes exceeds max_tensor_bytes=" + std::to_string(max_tensor_bytes));
  }
  if (tensor.dtype != spec.dtype) {
    return Status::InvalidArgument(where + ": dtype " + std::string(DTypeName(tensor.dtype)) + ", layout expects " +
                                   std::string(DTypeName(spec.dtype)));
  }
  if (tensor.shape != spec.shape) {
    return Status::InvalidArgument(where + ": shape " + ShapeToString(tensor.shape) + ", layout expects " +
                                   ShapeToString(spec.shape));
  }
  // Layouts are validated before use, so this product cannot overflow.
  const size_t expected = CheckedNumel(spec.shape).value() * DTypeSize(spec.dtype);
  if (tensor.nbytes != expected) {
    return Status::InvalidArgument(where + ": nbytes " + std::to_string(tensor.nbytes) + " does not match shape " +
                                   ShapeToString(spec.shape) + " of " + std::string(DTypeName(spec.dtype)) + " (" +
                                   std::to_string(expected) + " bytes)");
  }
  if (tensor.data == nullptr && expected > 0) return Status::InvalidArgument(where + ": data is null");
  return Status::Ok();
}

Status CheckPublishVersion(int64_t version, const std::string& what) {
  if (version < 0 || version > kMaxPublishVersion) {
    return Status::InvalidArgument(what + ": versions are in [0, 2^62]");
  }
  return Status::Ok();
}

}  // namespace sluice::checkpoint_engine::internal
