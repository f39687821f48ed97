#include <string_view>

#include "broadcast/broadcast_wire.h"
#include "core/codec_fuzz.h"
#include "sluice/common/check.h"

namespace sluice::checkpoint_engine::bcast {
namespace {

template <typename Decode>
int RoundTrip(std::string_view bytes, Decode decode) {
  auto first = decode(bytes);
  if (!first.ok()) {
    SLUICE_CHECK(!first.status().message().empty()) << "an error without a message";
    return 0;
  }
  const std::string encoded = Encode(*first);
  auto again = decode(encoded);
  SLUICE_CHECK(again.ok()) << "a decoded message re-encodes to one that does not decode: " << again.status().ToString();
  SLUICE_CHECK(Encode(*again) == encoded) << "a message does not re-encode to a fixed point";
  return 1;
}

int DecodeAll(std::string_view bytes) {
  return RoundTrip(bytes, DecodePublisherHello) + RoundTrip(bytes, DecodeSubscriberHello) +
         RoundTrip(bytes, DecodeMembers) + RoundTrip(bytes, DecodeAnnouncement);
}

std::string Preamble(Kind kind) {
  Announcement a;
  a.kind = kind;
  return Encode(a).substr(0, kPreambleBytes);
}

}  // namespace

int FuzzBroadcastMessages(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  int decoded = DecodeAll(bytes);
  if (size >= 1) {
    const auto kind = static_cast<Kind>(1 + data[0] % 6);
    decoded += DecodeAll(Preamble(kind).append(bytes.substr(1)));
  }
  return decoded;
}

std::vector<std::string> BroadcastSampleMessages() {
  PublisherHello hello;
  hello.epoch = 3;
  hello.bucket_bytes = 1 << 20;
  hello.max_in_flight = 2;
  hello.layout = {{"model.embed_tokens.weight", DType::kF32, {64, 16}},
                  {"model.norm.weight", DType::kF32, {16}},
                  {"lm_head.scale", DType::kI32, {}}};
  hello.layout_hash = LayoutHash(hello.layout);
  Announcement version;
  version.generation = 2;
  version.seq = 5;
  version.version = 11;
  version.layout_hash = hello.layout_hash;
  version.total_bytes = 64 * 16 * 4 + 16 * 4 + 4;
  version.checksums = {7, 8, 9};
  Announcement reform;
  reform.kind = Kind::kReform;
  reform.generation = 2;
  reform.seq = 6;
  Announcement shutdown;
  shutdown.kind = Kind::kShutdown;
  shutdown.generation = 3;
  return {Encode(hello),
          Encode(SubscriberHello{hello.layout_hash, 10, "host-1:4"}),
          Encode(Members{4, {3, 1, 2}}),
          Encode(version),
          Encode(reform),
          Encode(shutdown)};
}

}  // namespace sluice::checkpoint_engine::bcast
