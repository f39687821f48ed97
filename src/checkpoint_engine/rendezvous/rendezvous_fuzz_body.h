// The body of the rendezvous store's fuzzer, shared by the libFuzzer target
// (rendezvous_fuzz.cc) and the smoke test in the default suite
// (rendezvous_test.cc).
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_RENDEZVOUS_FUZZ_BODY_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_RENDEZVOUS_FUZZ_BODY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sluice::checkpoint_engine::rendezvous {

// Reads `data` as a request frame, as the server does (its header's checks,
// then the key and value, then the op's), and as an answer's header, as the
// client does. Every input must give a Status with a message or pass; a
// header must re-encode to its own bytes (the layout has no slack), and
// whatever passes must satisfy what the server and the client rely on
// (lengths within the limits, a known op and status code), else it aborts.
// Returns the number of views that passed every check.
int FuzzRendezvousFrames(const uint8_t* data, size_t size);

// A valid request of every op and a valid answer of several codes.
std::vector<std::string> RendezvousSampleFrames();

}  // namespace sluice::checkpoint_engine::rendezvous

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_RENDEZVOUS_FUZZ_BODY_H_
