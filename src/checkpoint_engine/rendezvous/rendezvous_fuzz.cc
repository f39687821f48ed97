// libFuzzer entry point for the rendezvous store's framing (see
// rendezvous_fuzz_body.h). Built only with -DSLUICE_BUILD_FUZZERS=ON under
// clang; run by tests/fuzz_smoke.sh. If SLUICE_FUZZ_SEED_DIR is set,
// LLVMFuzzerInitialize writes the valid sample frames there first.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "rendezvous/rendezvous_fuzz_body.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  const char* dir = std::getenv("SLUICE_FUZZ_SEED_DIR");
  if (dir == nullptr || *dir == '\0') return 0;
  int i = 0;
  for (const std::string& frame : sluice::checkpoint_engine::rendezvous::RendezvousSampleFrames()) {
    std::ofstream out(std::string(dir) + "/sample-" + std::to_string(i++), std::ios::binary);
    out.write(frame.data(), static_cast<std::streamsize>(frame.size()));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::checkpoint_engine::rendezvous::FuzzRendezvousFrames(data, size);
  return 0;
}
