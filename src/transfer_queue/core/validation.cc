#include "core/validation.h"

#include <algorithm>
#include <string>

namespace sluice::transfer_queue::internal {
namespace {

Status ValidateUserTags(const std::map<std::string, std::string>& user, std::string_view where) {
  if (user.size() > kMaxUserTags) {
    return Status::InvalidArgument(std::string(where) + ": " + std::to_string(user.size()) + " user tags, at most " +
                                   std::to_string(kMaxUserTags) + " allowed");
  }
  for (const auto& [key, value] : user) {
    if (key.empty() || key.size() > kMaxNameBytes) {
      return Status::InvalidArgument(std::string(where) + ": user tag name " + Quoted(key.substr(0, 64)) +
                                     " must be 1.." + std::to_string(kMaxNameBytes) + " bytes");
    }
    if (value.size() > kMaxUserTagBytes) {
      return Status::InvalidArgument(std::string(where) + ": user tag " + Quoted(key) + " has " +
                                     std::to_string(value.size()) + " bytes, at most " +
                                     std::to_string(kMaxUserTagBytes) + " allowed");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateName(std::string_view what, std::string_view name) {
  if (name.empty()) return Status::InvalidArgument(std::string(what) + " name is empty");
  if (name.size() > kMaxNameBytes) {
    return Status::InvalidArgument(std::string(what) + " name " + Quoted(name.substr(0, 64)) + "... has " +
                                   std::to_string(name.size()) + " bytes, at most " + std::to_string(kMaxNameBytes) +
                                   " allowed");
  }
  return Status::Ok();
}

Status ValidateSchema(const ColumnSchema& schema) {
  SLUICE_RETURN_IF_ERROR(ValidateName("column", schema.name));
  for (size_t d = 0; d < schema.shape.size(); ++d) {
    int64_t dim = schema.shape[d];
    if (dim == kRaggedDim && d == 0) continue;
    if (dim < 0) {
      return Status::InvalidArgument("column " + Quoted(schema.name) + ": shape " + ShapeToString(schema.shape) +
                                     " has dimension " + std::to_string(d) + " = " + std::to_string(dim) +
                                     "; only the first dimension may be ragged (-1)");
    }
  }
  std::vector<int64_t> fixed = schema.shape;
  if (!fixed.empty() && fixed[0] == kRaggedDim) fixed[0] = 1;
  Result<uint64_t> numel = CheckedNumel(fixed);
  if (!numel.ok()) return numel.status().WithContext("column " + Quoted(schema.name));
  return Status::Ok();
}

Status ValidateTensorBytes(const TensorMeta& meta, uint64_t max_tensor_bytes, std::string_view where) {
  Result<uint64_t> numel = CheckedNumel(meta.shape);
  if (!numel.ok()) return Status::InvalidArgument(std::string(where) + ": " + numel.status().message());
  const uint64_t elem = DTypeSize(meta.dtype);
  if (*numel > max_tensor_bytes / elem) {
    return Status::OutOfRange(std::string(where) + ": shape " + ShapeToString(meta.shape) + " of " +
                              std::string(DTypeName(meta.dtype)) +
                              " exceeds max_tensor_bytes=" + std::to_string(max_tensor_bytes));
  }
  if (meta.nbytes != *numel * elem) {
    return Status::InvalidArgument(std::string(where) + ": nbytes " + std::to_string(meta.nbytes) +
                                   " does not match shape " + ShapeToString(meta.shape) + " of " +
                                   std::string(DTypeName(meta.dtype)) + " (" + std::to_string(*numel * elem) +
                                   " bytes)");
  }
  return Status::Ok();
}

Status ValidateTensorMeta(const ColumnSchema& schema, const TensorMeta& meta, uint64_t max_tensor_bytes,
                          std::string_view where) {
  if (meta.dtype != schema.dtype) {
    return Status::InvalidArgument(std::string(where) + ": dtype " + std::string(DTypeName(meta.dtype)) + ", column " +
                                   Quoted(schema.name) + " is " + std::string(DTypeName(schema.dtype)));
  }
  bool shape_ok = meta.shape.size() == schema.shape.size();
  for (size_t d = 0; shape_ok && d < meta.shape.size(); ++d) {
    shape_ok = schema.shape[d] == kRaggedDim ? meta.shape[d] >= 0 : meta.shape[d] == schema.shape[d];
  }
  if (!shape_ok) {
    return Status::InvalidArgument(
        std::string(where) + ": shape " + ShapeToString(meta.shape) + ", column " + Quoted(schema.name) + " expects " +
        ShapeToString(schema.shape) +
        (!schema.shape.empty() && schema.shape[0] == kRaggedDim ? " (first dimension ragged)" : ""));
  }
  return ValidateTensorBytes(meta, max_tensor_bytes, where);
}

Status ValidateTags(const RowTags& tags, std::string_view where) {
  if (tags.group_id < kNoGroup) {
    return Status::InvalidArgument(std::string(where) + ": group_id " + std::to_string(tags.group_id) +
                                   " (must be >= 0, or -1 for none)");
  }
  if (tags.policy_version < kNoPolicyVersion) {
    return Status::InvalidArgument(std::string(where) + ": policy_version " + std::to_string(tags.policy_version) +
                                   " (must be >= 0, or -1 for none)");
  }
  if (tags.token_length < 0) {
    return Status::InvalidArgument(std::string(where) + ": negative token_length " + std::to_string(tags.token_length));
  }
  return ValidateUserTags(tags.user, where);
}

Status ValidatePatch(const RowTagPatch& patch, std::string_view where) {
  if (patch.policy_version && *patch.policy_version < kNoPolicyVersion) {
    return Status::InvalidArgument(std::string(where) + ": policy_version " + std::to_string(*patch.policy_version) +
                                   " (must be >= 0, or -1 for none)");
  }
  if (patch.token_length && *patch.token_length < 0) {
    return Status::InvalidArgument(std::string(where) + ": negative token_length " +
                                   std::to_string(*patch.token_length));
  }
  return ValidateUserTags(patch.user, where);
}

Status ValidateTimeout(std::chrono::milliseconds timeout, std::string_view what) {
  if (timeout.count() < 0) {
    return Status::InvalidArgument(std::string(what) + " is negative (" + std::to_string(timeout.count()) + " ms)");
  }
  return Status::Ok();
}

}  // namespace sluice::transfer_queue::internal
