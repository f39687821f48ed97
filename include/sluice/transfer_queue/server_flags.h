// Command-line flags of sluice_queue_server, parsed into ServerOptions.
// Every flag is validated here with a message naming it, so the binary
// refuses bad input before binding anything.
//
// Thread safety: pure functions.
#ifndef SLUICE_TRANSFER_QUEUE_SERVER_FLAGS_H_
#define SLUICE_TRANSFER_QUEUE_SERVER_FLAGS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/transfer_queue/server.h"
#include "sluice/transfer_queue/types.h"

namespace sluice::transfer_queue {

struct ServerFlags {
  ServerOptions options;
  bool help = false;  // --help: print `usage` and exit
  std::string usage;
  std::string token_file;  // for the permission warning
};

// Parses the arguments after argv[0]. Errors: InvalidArgument naming the flag.
Result<ServerFlags> ParseServerFlags(const std::vector<std::string>& args);

// "prompt:I64:*,reward:F32:,mask:U8:4x2": name:DTYPE:SHAPE entries separated
// by commas; SHAPE is dimensions joined by 'x', '*' (or -1) for a ragged
// first dimension, empty for a scalar.
Result<std::vector<ColumnSchema>> ParseColumnList(std::string_view text);
// A byte count with an optional K, M, G or T suffix (powers of 1024).
Result<uint64_t> ParseByteSize(std::string_view flag, std::string_view text);
// The token in a file: trailing whitespace stripped; 1..256 bytes. Errors
// name `flag`.
Result<std::string> ReadTokenFile(const std::string& path, const std::string& flag = "--token-file");

}  // namespace sluice::transfer_queue

#endif  // SLUICE_TRANSFER_QUEUE_SERVER_FLAGS_H_
