// Small file helpers shared by checkpoints, run directories and configs.
#ifndef SLUICE_COMMON_FILE_UTIL_H_
#define SLUICE_COMMON_FILE_UTIL_H_

#include <string>
#include <string_view>

#include "sluice/common/status.h"

namespace sluice {

// Writes `bytes` to a temporary file beside `path` (unique per process and
// call), fsyncs it, then renames it over `path`: a crash leaves either the old
// file or the whole new one. Errors: Unavailable (create, write, flush or
// rename failed); the temporary file is removed.
Status WriteFileAtomically(const std::string& path, std::string_view bytes);

// The whole file's bytes. Errors: NotFound ("<path>: cannot open").
Result<std::string> ReadFileToString(const std::string& path);

// Removes `path` and, if it is a directory, everything under it, without
// following symbolic links; a missing path is not an error. (Not
// std::filesystem::remove_all: PyTorch's pip libtorch.so exports a broken copy
// of it that a program linked against that libtorch may bind to; docs/gpu.md.)
// Errors: Unavailable naming the entry that could not be removed.
Status RemoveTree(const std::string& path);

}  // namespace sluice

#endif  // SLUICE_COMMON_FILE_UTIL_H_
