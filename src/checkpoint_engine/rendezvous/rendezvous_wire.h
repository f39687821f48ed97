// The rendezvous store's framing (see rendezvous.h for the format): header
// layouts, op codes and flags, shared by server and client.
//
// Thread safety: pure functions.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_RENDEZVOUS_WIRE_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_RENDEZVOUS_WIRE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sluice/common/status.h"

namespace sluice::checkpoint_engine::rendezvous {

inline constexpr uint32_t kMagic = 0x56524c53;  // "SLRV" in little-endian bytes
// Bumped on any incompatible change of the framing or the ops.
inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kHeaderBytes = 24;

enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kDelete = 4 };
inline constexpr uint8_t kFlagEphemeral = 1;
inline constexpr uint8_t kFlagCreateOnly = 2;
// Response flag: the server hangs up after this answer (a framing error).
inline constexpr uint8_t kFlagClosing = 1;

struct RequestHeader {
  uint32_t magic = kMagic;
  uint16_t protocol = kProtocolVersion;
  uint8_t op = 0;
  uint8_t flags = 0;
  uint32_t key_len = 0;
  uint32_t value_len = 0;
  int64_t arg = 0;
};

struct ResponseHeader {
  uint32_t magic = kMagic;
  uint16_t protocol = kProtocolVersion;
  uint8_t code = 0;  // StatusCode
  uint8_t flags = 0;
  uint32_t payload_len = 0;
  uint32_t reserved = 0;  // 0 (the request's value_len slot)
  int64_t arg = 0;
};

std::array<std::byte, kHeaderBytes> Encode(const RequestHeader& h);
std::array<std::byte, kHeaderBytes> Encode(const ResponseHeader& h);
RequestHeader DecodeRequest(const std::byte* bytes);
ResponseHeader DecodeResponse(const std::byte* bytes);

// OK if `code` is a StatusCode value this build knows.
bool IsKnownStatusCode(uint8_t code);

// A request's header as the server reads it, before the key and value:
// InvalidArgument for another magic, a key length outside
// 1..max_key_bytes or a value longer than max_value_bytes;
// FailedPrecondition for another protocol version.
Status CheckRequestHeader(const RequestHeader& h, size_t max_key_bytes, size_t max_value_bytes);
// A whole request (header checked, `key` its key_len bytes): the key's
// characters, and the op with its flags, value and argument. InvalidArgument.
Status CheckRequest(const RequestHeader& h, std::string_view key);
// OK if every character of `key` is printable ASCII 0x21..0x7e.
bool ValidKey(std::string_view key);
// An answer's header as the client reads it: FailedPrecondition for another
// magic or protocol version, DataLoss for an unknown status code or reserved
// bytes set, ResourceExhausted for a payload longer than max_value_bytes.
Status CheckResponseHeader(const ResponseHeader& h, size_t max_value_bytes);

}  // namespace sluice::checkpoint_engine::rendezvous

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_RENDEZVOUS_WIRE_H_
