#include "rendezvous/rendezvous_wire.h"

#include <sstream>
#include <string>

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
  StoreLe<uint32_t>(&out[12], h.reserved);
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
  h.reserved = LoadLe<uint32_t>(b + 12);
  h.arg = LoadLe<int64_t>(b + 16);
  return h;
}

bool IsKnownStatusCode(uint8_t code) { return code <= static_cast<uint8_t>(StatusCode::kInternal); }

bool ValidKey(std::string_view key) {
  for (char c : key) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

Status CheckRequestHeader(const RequestHeader& h, size_t max_key_bytes, size_t max_value_bytes) {
  if (h.magic != kMagic) {
    std::ostringstream msg;
    msg << "not a rendezvous request (magic 0x" << std::hex << h.magic << ", expected 0x" << kMagic << ")";
    return Status::InvalidArgument(msg.str());
  }
  if (h.protocol != kProtocolVersion) {
    return Status::FailedPrecondition("the client speaks rendezvous protocol " + std::to_string(h.protocol) +
                                      "; this server speaks " + std::to_string(kProtocolVersion));
  }
  if (h.key_len == 0 || h.key_len > max_key_bytes) {
    return Status::InvalidArgument("key length " + std::to_string(h.key_len) +
                                   " is outside 1..max_key_bytes=" + std::to_string(max_key_bytes));
  }
  if (h.value_len > max_value_bytes) {
    return Status::InvalidArgument("value length " + std::to_string(h.value_len) +
                                   " exceeds max_value_bytes=" + std::to_string(max_value_bytes));
  }
  return Status::Ok();
}

Status CheckRequest(const RequestHeader& h, std::string_view key) {
  if (!ValidKey(key)) return Status::InvalidArgument("key has a character outside printable ASCII 0x21..0x7e");
  switch (static_cast<Op>(h.op)) {
    case Op::kSet:
      if ((h.flags & ~(kFlagEphemeral | kFlagCreateOnly)) != 0) {
        return Status::InvalidArgument("unknown Set flags " + std::to_string(h.flags));
      }
      return Status::Ok();
    case Op::kGet:
      if (h.flags != 0 || h.value_len != 0 || h.arg < 0) {
        return Status::InvalidArgument("Get takes no flags or value and a wait >= 0 ms");
      }
      return Status::Ok();
    case Op::kAdd:
      if (h.flags != 0 || h.value_len != 0) return Status::InvalidArgument("Add takes no flags or value");
      return Status::Ok();
    case Op::kDelete:
      if (h.flags != 0 || h.value_len != 0) return Status::InvalidArgument("Delete takes no flags or value");
      return Status::Ok();
  }
  return Status::InvalidArgument("unknown op " + std::to_string(h.op));
}

Status CheckResponseHeader(const ResponseHeader& h, size_t max_value_bytes) {
  if (h.magic != kMagic) {
    std::ostringstream msg;
    msg << "not a rendezvous server (answer magic 0x" << std::hex << h.magic << ")";
    return Status::FailedPrecondition(msg.str());
  }
  if (h.protocol != kProtocolVersion) {
    return Status::FailedPrecondition("the server speaks rendezvous protocol " + std::to_string(h.protocol) +
                                      "; this client speaks " + std::to_string(kProtocolVersion));
  }
  if (!IsKnownStatusCode(h.code)) {
    return Status::DataLoss("the server answered with unknown status code " + std::to_string(h.code));
  }
  if (h.reserved != 0) {
    return Status::DataLoss("the server's answer has reserved bytes set (" + std::to_string(h.reserved) + ")");
  }
  if (h.payload_len > max_value_bytes) {
    return Status::ResourceExhausted("the server answered with " + std::to_string(h.payload_len) +
                                     " bytes, more than max_value_bytes=" + std::to_string(max_value_bytes));
  }
  return Status::Ok();
}

}  // namespace sluice::checkpoint_engine::rendezvous
