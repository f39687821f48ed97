// The rendezvous store's framing (see rendezvous.h for the format): header
// layouts, op codes and flags, shared by server and client.
//
// Thread safety: pure functions.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_RENDEZVOUS_WIRE_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_RENDEZVOUS_WIRE_H_

#include <array>
#include <cstddef>
#include <cstdint>

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
  int64_t arg = 0;
};

std::array<std::byte, kHeaderBytes> Encode(const RequestHeader& h);
std::array<std::byte, kHeaderBytes> Encode(const ResponseHeader& h);
RequestHeader DecodeRequest(const std::byte* bytes);
ResponseHeader DecodeResponse(const std::byte* bytes);

// OK if `code` is a StatusCode value this build knows.
bool IsKnownStatusCode(uint8_t code);

}  // namespace sluice::checkpoint_engine::rendezvous

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_RENDEZVOUS_WIRE_H_
