// Reading and writing the safetensors format (https://huggingface.co/docs/safetensors)
// and the Hugging Face checkpoint layout around it: a single
// `model.safetensors`, or shards listed in `model.safetensors.index.json`.
//
// File layout: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value"}}, then the byte buffer the offsets index.
//
// Every byte of a file is validated before use: header length against the
// file size and kMaxHeaderBytes, JSON syntax, known dtypes, shapes, offsets in
// range, sizes matching shape x dtype, no overlapping tensors and no holes.
// Each failure is a Status naming the file, the tensor and the problem.
//
// Thread safety: the functions are reentrant; a loaded TensorMap is immutable.
#ifndef SLUICE_MODEL_SAFETENSORS_H_
#define SLUICE_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"

namespace sluice::model {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;  // as the reference library

struct SafetensorsContents {
  TensorMap tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Parses a whole file image. The returned tensors point into `bytes` and
// hold `owner` to keep it alive. `origin` names the source in errors.
Result<SafetensorsContents> ParseSafetensors(std::span<const std::byte> bytes, std::shared_ptr<const void> owner,
                                             const std::string& origin);

// Maps `path` read-only and parses it (no copy of tensor bytes).
// Errors: NotFound, DataLoss (truncated/corrupt), InvalidArgument.
Result<SafetensorsContents> ReadSafetensorsFile(const std::string& path);

// Serializes `tensors` (sorted by name) with `metadata`. Header is padded with
// spaces to a multiple of 8 bytes so the data is aligned. Preconditions
// (checked; a violation is a bug): no tensor is named "__metadata__", and each
// tensor's nbytes matches its shape x dtype.
std::string SerializeSafetensors(const TensorMap& tensors, const std::map<std::string, std::string>& metadata);

// Writes atomically (temporary file, then rename). Errors: Unavailable on I/O.
Status WriteSafetensorsFile(const std::string& path, const TensorMap& tensors,
                            const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

struct CheckpointWriteOptions {
  // Shard when the total exceeds this many bytes (0: never shard). Shards are
  // named model-00001-of-0000N.safetensors with model.safetensors.index.json.
  uint64_t max_shard_bytes = 0;
};

// Loads the tensors of a Hugging Face checkpoint directory: model.safetensors,
// or every shard named by model.safetensors.index.json (each name must be in
// the shard the index says, and every indexed name must be present).
Result<TensorMap> LoadCheckpointTensors(const std::string& dir);

// Writes `tensors` into `dir` (created if missing) in the same layout.
Status SaveCheckpointTensors(const std::string& dir, const TensorMap& tensors,
                             const CheckpointWriteOptions& options = {});

}  // namespace sluice::model

#endif  // SLUICE_MODEL_SAFETENSORS_H_
