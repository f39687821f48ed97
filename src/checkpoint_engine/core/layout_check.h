// Layout validation shared by every CheckpointEngine transport, so the
// in-process and shared-memory stores accept and reject exactly the same
// layouts and tensors, with the same messages.
//
// Thread safety: pure functions.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_LAYOUT_CHECK_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_LAYOUT_CHECK_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"
#include "sluice/common/strings.h"

namespace sluice::checkpoint_engine::internal {

// Byte size of every layout tensor, in layout order. InvalidArgument naming
// the entry (and `options_name` for an empty layout) if the layout is empty,
// a name is empty or repeated, a shape is malformed, or a tensor exceeds
// max_tensor_bytes.
Result<std::vector<size_t>> ValidateLayout(const Layout& layout, size_t max_tensor_bytes,
                                           std::string_view options_name);

// The versions a publisher accepts: [0, 2^62]. The bound leaves room for
// "the latest + 1" wherever a caller computes the next version: at 2^63 - 1
// that sum overflows, and Python's default next publish failed with a
// binding's type error instead of a word about the limit.
inline constexpr int64_t kMaxPublishVersion = int64_t{1} << 62;

// InvalidArgument ("<what>: versions are in [0, 2^62]") for a version outside
// them.
Status CheckPublishVersion(int64_t version, const std::string& what);

// Checks a tensor offered for `spec` (Put). `where` prefixes every message.
//   ResourceExhausted - tensor.nbytes > max_tensor_bytes
//   InvalidArgument   - dtype or shape differ from the spec; nbytes does not
//                       match the shape; null data for a non-empty tensor
Status CheckTensorMatchesSpec(const std::string& where, const TensorSpec& spec, const HostTensor& tensor,
                              size_t max_tensor_bytes);

}  // namespace sluice::checkpoint_engine::internal

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_LAYOUT_CHECK_H_
