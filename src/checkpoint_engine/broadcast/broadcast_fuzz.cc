// libFuzzer entry point of the broadcast codec (see core/codec_fuzz.h). Built
// only with -DSLUICE_BUILD_FUZZERS=ON under clang; run by
// tests/fuzz_smoke.sh, which seeds it through $SLUICE_FUZZ_SEED_DIR.
#include <cstddef>
#include <cstdint>

#include "core/codec_fuzz.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  sluice::checkpoint_engine::WriteFuzzSeeds(sluice::checkpoint_engine::bcast::BroadcastSampleMessages());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::checkpoint_engine::bcast::FuzzBroadcastMessages(data, size);
  return 0;
}
