#include "wire/wire_fuzz_body.h"

#include <cstring>
#include <string>
#include <vector>

#include "sluice/common/check.h"
#include "wire/wire.h"

namespace sluice::transfer_queue::wire {
namespace {

// Small limits keep each input fast; the checks are the same at any size.
WireLimits FuzzLimits() {
  WireLimits limits;
  limits.max_message_bytes = 1 << 20;
  limits.max_batch_rows = 1024;
  limits.max_tensor_bytes = 1 << 16;
  limits.max_list_entries = 4096;
  return limits;
}

TimePoint FixedNow() { return TimePoint(std::chrono::hours(100)); }

bool SameBytes(const Message& a, const Message& b) {
  return a.size == b.size && (a.size == 0 || std::memcmp(a.data.get(), b.data.get(), a.size) == 0);
}

// Decodes `message` (header already valid) as a request/reply of T and
// checks the re-encoding fixed point. Returns 1 if it decoded.
template <typename T>
int RoundTrip(std::span<const std::byte> message, const Header& h, const WireLimits& limits, bool as_request) {
  T value{};
  std::string token;
  // A real owner, so tensors decode as views where aligned (copies otherwise).
  auto owner = std::make_shared<std::vector<std::byte>>(message.begin(), message.end());
  std::span<const std::byte> owned(owner->data(), owner->size());
  Status s = as_request ? DecodeRequest(owned, h, limits, owner, FixedNow(), &token, &value)
                        : DecodeReply(owned, h, limits, owner, FixedNow(), &value);
  if (!s.ok()) {
    SLUICE_CHECK(!s.message().empty()) << "an error without a message";
    return 0;
  }
  Message first = as_request ? EncodeRequest(h.type, h.target, h.request_id, token, value, FixedNow())
                             : EncodeReply(h.type, h.request_id, value, FixedNow());
  Result<Header> h2 = DecodeHeader(first.bytes(), limits);
  SLUICE_CHECK(h2.ok()) << "re-encoded header does not decode: " << h2.status().ToString();
  T again{};
  std::string token2;
  Status s2 = as_request ? DecodeRequest(first.bytes(), *h2, limits, nullptr, FixedNow(), &token2, &again)
                         : DecodeReply(first.bytes(), *h2, limits, nullptr, FixedNow(), &again);
  SLUICE_CHECK(s2.ok()) << "re-encoded " << Describe(h) << " does not decode: " << s2.ToString();
  Message second = as_request ? EncodeRequest(h.type, h.target, h.request_id, token2, again, FixedNow())
                              : EncodeReply(h.type, h.request_id, again, FixedNow());
  SLUICE_CHECK(SameBytes(first, second)) << Describe(h) << " does not re-encode to a fixed point";
  return 1;
}

int DecodeFrame(std::span<const std::byte> message, const WireLimits& limits) {
  Result<Header> h = DecodeHeader(message, limits);
  if (!h.ok()) {
    SLUICE_CHECK(!h.status().message().empty());
    return 0;
  }
  if (h->is_error()) {
    Status carried = DecodeErrorReply(message, *h, limits);
    SLUICE_CHECK(!carried.ok());
    // Either the carried error or the reason the error body is malformed;
    // both must survive a re-encoding unchanged.
    Message again = EncodeErrorReply(h->type, h->request_id, carried);
    Result<Header> h2 = DecodeHeader(again.bytes(), limits);
    SLUICE_CHECK(h2.ok());
    Status carried2 = DecodeErrorReply(again.bytes(), *h2, limits);
    SLUICE_CHECK(carried2 == carried) << carried.ToString() << " vs " << carried2.ToString();
    return 1;
  }
  const bool request = !h->is_reply();
  switch (h->type) {
#define SLUICE_TQ_FUZZ_CASE_(name, number, req, rep) \
  case MessageType::k##name:                         \
    return request ? RoundTrip<req>(message, *h, limits, true) : RoundTrip<rep>(message, *h, limits, false);
    SLUICE_TQ_WIRE_MESSAGES(SLUICE_TQ_FUZZ_CASE_)
#undef SLUICE_TQ_FUZZ_CASE_
  }
  return 0;
}

constexpr MessageType kTypes[] = {
#define SLUICE_TQ_FUZZ_TYPE_(name, number, req, rep) MessageType::k##name,
    SLUICE_TQ_WIRE_MESSAGES(SLUICE_TQ_FUZZ_TYPE_)
#undef SLUICE_TQ_FUZZ_TYPE_
};

}  // namespace

int FuzzWireDecoders(const uint8_t* data, size_t size) {
  const WireLimits limits = FuzzLimits();
  std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  int decoded = DecodeFrame(input, limits);
  // Second view: a valid header chosen by the first two bytes, the rest as body.
  if (size >= 2) {
    const MessageType type = kTypes[data[0] % std::size(kTypes)];
    const uint16_t flags = (data[1] % 3 == 0) ? 0 : (data[1] % 3 == 1) ? kFlagReply : (kFlagReply | kFlagError);
    WireWriter w;
    w.Reserve(kHeaderBytes + size);
    BeginMessage(w, type, flags, IsStorageMessage(type) ? 1 : 0, 7);
    w.Bytes(data + 2, size - 2);
    Message framed = FinishMessage(w);
    decoded += DecodeFrame(framed.bytes(), limits);
  }
  return decoded;
}

}  // namespace sluice::transfer_queue::wire
