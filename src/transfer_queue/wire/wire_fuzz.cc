// libFuzzer entry point for the TransferQueue wire decoders (see
// wire_fuzz_body.h). Built only with -DSLUICE_BUILD_FUZZERS=ON under clang;
// run by tests/fuzz_smoke.sh.
//
// If SLUICE_WIRE_FUZZ_SEED_DIR is set, LLVMFuzzerInitialize writes one valid
// request, reply and error reply of every message type there first, so the
// fuzzer starts from real messages.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "wire/wire_fuzz_body.h"
#include "wire/wire_samples.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  const char* dir = std::getenv("SLUICE_WIRE_FUZZ_SEED_DIR");
  if (dir == nullptr || *dir == '\0') return 0;
  int i = 0;
  for (const auto& m : sluice::transfer_queue::wire::testing::SampleMessages()) {
    std::ofstream out(std::string(dir) + "/sample-" + std::to_string(i++), std::ios::binary);
    out.write(reinterpret_cast<const char*>(m.data.get()), static_cast<std::streamsize>(m.size));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::transfer_queue::wire::FuzzWireDecoders(data, size);
  return 0;
}
