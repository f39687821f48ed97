// libFuzzer entry point for the broadcast's control messages (see
// broadcast_fuzz_body.h). Built only with -DSLUICE_BUILD_FUZZERS=ON under
// clang; run by tests/fuzz_smoke.sh. If SLUICE_FUZZ_SEED_DIR is set,
// LLVMFuzzerInitialize writes a valid message of every kind there first.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "broadcast/broadcast_fuzz_body.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  const char* dir = std::getenv("SLUICE_FUZZ_SEED_DIR");
  if (dir == nullptr || *dir == '\0') return 0;
  int i = 0;
  for (const std::string& message : sluice::checkpoint_engine::bcast::BroadcastSampleMessages()) {
    std::ofstream out(std::string(dir) + "/sample-" + std::to_string(i++), std::ios::binary);
    out.write(message.data(), static_cast<std::streamsize>(message.size()));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::checkpoint_engine::bcast::FuzzBroadcastMessages(data, size);
  return 0;
}
