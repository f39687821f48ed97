// The body of the broadcast control messages' fuzzer, shared by the
// libFuzzer target (broadcast_fuzz.cc) and the smoke test in the default
// suite (broadcast_wire_test.cc).
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_FUZZ_BODY_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_FUZZ_BODY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sluice::checkpoint_engine::bcast {

// Feeds `data` to the four decoders (publisher hello, subscriber hello,
// members, announcement) as it is, and once more behind a valid preamble of
// the kind its first byte picks, so the fuzzer reaches the bodies. Every
// input must decode or give a Status with a message; whatever decodes must
// re-encode to a fixed point (encode(decode(encode(decode(x)))) ==
// encode(decode(x))), else it aborts. Returns the number of decodes that
// succeeded.
int FuzzBroadcastMessages(const uint8_t* data, size_t size);

// A valid message of every kind.
std::vector<std::string> BroadcastSampleMessages();

}  // namespace sluice::checkpoint_engine::bcast

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_FUZZ_BODY_H_
