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

// Opens `path` for reading only if it is a regular file (following symbolic
// links): a FIFO, socket, device or directory is refused without blocking
// (a FIFO given as a model file or config would otherwise block in open
// forever). Returns a blocking, close-on-exec descriptor the caller closes.
// Errors: NotFound (no such file), InvalidArgument ("<path>: not a regular
// file (a FIFO)"), Unavailable (any other open or stat failure).
Result<int> OpenRegularFile(const std::string& path);

// Opens `path` for appending (O_APPEND, created 0644 if missing), refusing
// what is not a regular file as OpenRegularFile does, without blocking on a
// FIFO. A close-on-exec descriptor the caller closes. Errors:
// InvalidArgument ("<path>: not a regular file (...)"), Unavailable.
Result<int> OpenAppendFile(const std::string& path);

// Writes all of `bytes` to `fd` (retrying short writes and EINTR).
// Unavailable naming `what` when a write fails.
Status WriteAll(int fd, std::string_view bytes, const std::string& what);

// Appends `bytes` to `path` in one write of an O_APPEND descriptor (so lines
// appended by several processes never interleave). OpenAppendFile's errors,
// then WriteAll's.
Status AppendToFile(const std::string& path, std::string_view bytes);

// The whole regular file's bytes (OpenRegularFile's refusals, then
// Unavailable for a read error).
Result<std::string> ReadFileToString(const std::string& path);

// Removes `path` and, if it is a directory, everything under it, without
// following symbolic links; a missing path is not an error. (Not
// std::filesystem::remove_all: PyTorch's pip libtorch.so exports a broken copy
// of it that a program linked against that libtorch may bind to; docs/gpu.md.)
// Errors: Unavailable naming the entry that could not be removed.
Status RemoveTree(const std::string& path);

}  // namespace sluice

#endif  // SLUICE_COMMON_FILE_UTIL_H_
