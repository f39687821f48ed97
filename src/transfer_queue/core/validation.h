// Input validation shared by the controller, the storage units and the
// client: every check returns a Status whose message names the bad input.
//
// Thread safety: pure functions.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_VALIDATION_H_
#define SLUICE_SRC_TRANSFER_QUEUE_VALIDATION_H_

#include <chrono>
#include <string>
#include <string_view>

#include "sluice/common/deadline.h"
#include "sluice/common/status.h"
#include "sluice/common/strings.h"
#include "sluice/transfer_queue/types.h"

namespace sluice::transfer_queue::internal {

// `what` is "task", "column", "partition", "key": non-empty, at most
// kMaxNameBytes bytes.
Status ValidateName(std::string_view what, std::string_view name);
Status ValidateSchema(const ColumnSchema& schema);
// The tensor's dtype and shape match the schema (a ragged first dimension
// takes any length) and nbytes matches the shape. `where` prefixes messages.
Status ValidateTensorMeta(const ColumnSchema& schema, const TensorMeta& meta, uint64_t max_tensor_bytes,
                          std::string_view where);
// nbytes agrees with dtype and shape (no schema involved).
Status ValidateTensorBytes(const TensorMeta& meta, uint64_t max_tensor_bytes, std::string_view where);
Status ValidateTags(const RowTags& tags, std::string_view where);

// For the validators above called per row with an empty `where`: on failure
// only, prefixes the message with the context `where()` builds, so a valid
// batch of many rows builds no message at all.
template <typename Where>
Status PrefixWhere(Status status, Where&& where) {
  if (status.ok()) return status;
  return Status(status.code(), where() + status.message());
}
Status ValidatePatch(const RowTagPatch& patch, std::string_view where);
Status ValidateTimeout(std::chrono::milliseconds timeout, std::string_view what);
using ::sluice::DeadlineAfter;  // sluice/common/deadline.h

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_VALIDATION_H_
