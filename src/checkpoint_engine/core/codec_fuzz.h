// The bodies of the CheckpointEngine's two codec fuzzers, each shared by
// its libFuzzer target (rendezvous/rendezvous_fuzz.cc,
// broadcast/broadcast_fuzz.cc, built by tests/fuzz_smoke.sh) and its smoke
// test in the default suite (rendezvous_test.cc, broadcast_wire_test.cc).
// Each returns the number of views of the input that decoded and passed
// every check, and aborts when an invariant of the codec breaks.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_CORE_CODEC_FUZZ_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_CORE_CODEC_FUZZ_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace sluice::checkpoint_engine {

namespace rendezvous {
// Reads `data` as a request frame, as the server does (its header's checks,
// then the key and value, then the op's), and as an answer's header, as the
// client does. Every input must give a Status with a message or pass; a
// header must re-encode to its own bytes (the layout has no slack), and
// whatever passes must satisfy what the server and the client rely on
// (lengths within the limits, a known op and status code).
int FuzzRendezvousFrames(const uint8_t* data, size_t size);
// A valid request of every op and a valid answer of several codes.
std::vector<std::string> RendezvousSampleFrames();
}  // namespace rendezvous

namespace bcast {
// Feeds `data` to the four decoders (publisher hello, subscriber hello,
// members, announcement) as it is, and once more behind a valid preamble of
// the kind its first byte picks, so the fuzzer reaches the bodies. Every
// input must decode or give a Status with a message; whatever decodes must
// re-encode to a fixed point (encode(decode(encode(decode(x)))) ==
// encode(decode(x))).
int FuzzBroadcastMessages(const uint8_t* data, size_t size);
// A valid message of every kind.
std::vector<std::string> BroadcastSampleMessages();
}  // namespace bcast

// For LLVMFuzzerInitialize: writes `samples` as files sample-0, sample-1,
// ... into the folder $SLUICE_FUZZ_SEED_DIR names (nothing when unset), so
// a fuzzer starts from valid messages.
inline void WriteFuzzSeeds(const std::vector<std::string>& samples) {
  const char* dir = std::getenv("SLUICE_FUZZ_SEED_DIR");
  if (dir == nullptr || *dir == '\0') return;
  for (size_t i = 0; i < samples.size(); ++i) {
    std::ofstream out(std::string(dir) + "/sample-" + std::to_string(i), std::ios::binary);
    out.write(samples[i].data(), static_cast<std::streamsize>(samples[i].size()));
  }
}

}  // namespace sluice::checkpoint_engine

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_CORE_CODEC_FUZZ_H_
