#include "rendezvous/rendezvous_wire.h"

#include "core/socket_util.h"

namespace sluice::checkpoint_engine::rendezvous {

using internal::LoadLe;
using internal::StoreLe;

// Both headers: magic @0, protocol @4, op|code @6, flags @7, key_len|payload_len @8,
// value_len @12, arg @16.

std::array<std::byte, kHeaderBytes> Encode(const RequestHeader& h) {
  std::array<std::byte, kHeaderBytes> out{};
  StoreLe<uint32_t>(&out[0], h.magic);
  StoreLe<uint16_t>(&out[4], h.protocol);
  StoreLe<uint8_t>(&out[6], h.op);
  StoreLe<uint8_t>(&out[7], h.flags);
  StoreLe<uint32_t>(&out[8], h.key_len);
  StoreLe<uint32_t>(&out[12], h.value_len);
  StoreLe<int64_t>(&out[16], h.arg);
  return out;
}

std::array<std::byte, kHeaderBytes> Encode(const ResponseHeader& h) {
  std::array<std::byte, kHeaderBytes> out{};
  StoreLe<uint32_t>(&out[0], h.magic);
  StoreLe<uint16_t>(&out[4], h.protocol);
  StoreLe<uint8_t>(&out[6], h.code);
  StoreLe<uint8_t>(&out[7], h.flags);
  StoreLe<uint32_t>(&out[8], h.payload_len);
  StoreLe<int64_t>(&out[16], h.arg);
  return out;
}

RequestHeader DecodeRequest(const std::byte* b) {
  RequestHeader h;
  h.magic = LoadLe<uint32_t>(b);
  h.protocol = LoadLe<uint16_t>(b + 4);
  h.op = LoadLe<uint8_t>(b + 6);
  h.flags = LoadLe<uint8_t>(b + 7);
  h.key_len = LoadLe<uint32_t>(b + 8);
  h.value_len = LoadLe<uint32_t>(b + 12);
  h.arg = LoadLe<int64_t>(b + 16);
  return h;
}

ResponseHeader DecodeResponse(const std::byte* b) {
  ResponseHeader h;
  h.magic = LoadLe<uint32_t>(b);
  h.protocol = LoadLe<uint16_t>(b + 4);
  h.code = LoadLe<uint8_t>(b + 6);
  h.flags = LoadLe<uint8_t>(b + 7);
  h.payload_len = LoadLe<uint32_t>(b + 8);
  h.arg = LoadLe<int64_t>(b + 16);
  return h;
}

bool IsKnownStatusCode(uint8_t code) { return code <= static_cast<uint8_t>(StatusCode::kInternal); }

}  // namespace sluice::checkpoint_engine::rendezvous
