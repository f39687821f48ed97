// The body of the wire-format fuzzer, shared by the libFuzzer target
// (wire_fuzz.cc) and the deterministic smoke test (wire_fuzz_test.cc).
#ifndef SLUICE_SRC_TRANSFER_QUEUE_WIRE_FUZZ_BODY_H_
#define SLUICE_SRC_TRANSFER_QUEUE_WIRE_FUZZ_BODY_H_

#include <cstddef>
#include <cstdint>

namespace sluice::transfer_queue::wire {

// Feeds `data` to the decoders twice: as a whole frame (header checked, then
// the body of whatever it claims to be), and as the body of the message
// type/direction chosen by its first two bytes behind a valid header. Every
// input must decode to a Status without crashing or allocating beyond the
// limits; whatever decodes must re-encode to a fixed point
// (encode(decode(encode(decode(x)))) == encode(decode(x))), else it aborts.
// Returns the number of decodes that succeeded (for the smoke test's
// coverage sanity checks).
int FuzzWireDecoders(const uint8_t* data, size_t size);

}  // namespace sluice::transfer_queue::wire

#endif  // SLUICE_SRC_TRANSFER_QUEUE_WIRE_FUZZ_BODY_H_
