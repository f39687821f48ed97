#include <array>
#include <cstring>
#include <string_view>

#include "core/codec_fuzz.h"
#include "rendezvous/rendezvous_wire.h"
#include "sluice/common/check.h"

namespace sluice::checkpoint_engine::rendezvous {
namespace {

// Small limits keep inputs short; the checks are the same at any size.
constexpr size_t kMaxKeyBytes = 64;
constexpr size_t kMaxValueBytes = 4096;

bool SameBytes(const std::array<std::byte, kHeaderBytes>& encoded, const uint8_t* data) {
  return std::memcmp(encoded.data(), data, kHeaderBytes) == 0;
}

int AsRequest(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const RequestHeader h = DecodeRequest(bytes);
  SLUICE_CHECK(SameBytes(Encode(h), data)) << "a request header does not re-encode to its bytes";
  if (Status bad = CheckRequestHeader(h, kMaxKeyBytes, kMaxValueBytes); !bad.ok()) {
    SLUICE_CHECK(!bad.message().empty()) << "an error without a message";
    return 0;
  }
  SLUICE_CHECK(h.magic == kMagic && h.protocol == kProtocolVersion);
  SLUICE_CHECK(h.key_len >= 1 && h.key_len <= kMaxKeyBytes && h.value_len <= kMaxValueBytes);
  // The server reads exactly the lengths the header announced.
  if (size < kHeaderBytes + h.key_len + h.value_len) return 0;
  const std::string_view key(reinterpret_cast<const char*>(data) + kHeaderBytes, h.key_len);
  if (Status bad = CheckRequest(h, key); !bad.ok()) {
    SLUICE_CHECK(bad.code() == StatusCode::kInvalidArgument && !bad.message().empty()) << bad.ToString();
    return 0;
  }
  SLUICE_CHECK(ValidKey(key));
  const auto op = static_cast<Op>(h.op);
  SLUICE_CHECK(op == Op::kSet || op == Op::kGet || op == Op::kAdd || op == Op::kDelete) << "op " << int{h.op};
  if (op != Op::kSet) SLUICE_CHECK(h.flags == 0 && h.value_len == 0);
  if (op == Op::kGet) SLUICE_CHECK(h.arg >= 0);
  return 1;
}

int AsAnswer(const uint8_t* data) {
  const ResponseHeader h = DecodeResponse(reinterpret_cast<const std::byte*>(data));
  SLUICE_CHECK(SameBytes(Encode(h), data)) << "an answer header does not re-encode to its bytes";
  if (Status bad = CheckResponseHeader(h, kMaxValueBytes); !bad.ok()) {
    SLUICE_CHECK(!bad.message().empty()) << "an error without a message";
    return 0;
  }
  SLUICE_CHECK(IsKnownStatusCode(h.code) && h.reserved == 0 && h.payload_len <= kMaxValueBytes);
  return 1;
}

std::string Frame(Op op, uint8_t flags, std::string_view key, std::string_view value, int64_t arg) {
  RequestHeader h;
  h.op = static_cast<uint8_t>(op);
  h.flags = flags;
  h.key_len = static_cast<uint32_t>(key.size());
  h.value_len = static_cast<uint32_t>(value.size());
  h.arg = arg;
  const auto header = Encode(h);
  std::string out(reinterpret_cast<const char*>(header.data()), header.size());
  return out.append(key).append(value);
}

std::string Answer(StatusCode code, uint8_t flags, std::string_view payload, int64_t arg) {
  ResponseHeader h;
  h.code = static_cast<uint8_t>(code);
  h.flags = flags;
  h.payload_len = static_cast<uint32_t>(payload.size());
  h.arg = arg;
  const auto header = Encode(h);
  return std::string(reinterpret_cast<const char*>(header.data()), header.size()).append(payload);
}

}  // namespace

int FuzzRendezvousFrames(const uint8_t* data, size_t size) {
  if (size < kHeaderBytes) return 0;
  return AsRequest(data, size) + AsAnswer(data);
}

std::vector<std::string> RendezvousSampleFrames() {
  return {Frame(Op::kSet, 0, "group/hello", "value bytes", 0),
          Frame(Op::kSet, kFlagEphemeral | kFlagCreateOnly, "group/e1/sub/3", std::string(40, 'x'), 0),
          Frame(Op::kGet, 0, "group/e1/gen", "", 2500),
          Frame(Op::kAdd, 0, "group/epoch", "", 1),
          Frame(Op::kDelete, 0, "group/e1/g2/broken", "", 0),
          Answer(StatusCode::kOk, 0, "a stored value", 0),
          Answer(StatusCode::kOk, 0, "", 42),
          Answer(StatusCode::kNotFound, 0, "no key 'group/x'", 0),
          Answer(StatusCode::kInvalidArgument, kFlagClosing, "not a rendezvous request", 0)};
}

}  // namespace sluice::checkpoint_engine::rendezvous
