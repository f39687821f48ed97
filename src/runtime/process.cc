#include "sluice/runtime/process.h"

#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "sluice/common/logging.h"

namespace sluice::runtime {

void EnsurePassiveOpenMp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
  ::execv("/proc/self/exe", argv);
  SLUICE_LOG(WARNING) << "could not re-execute with OMP_WAIT_POLICY=PASSIVE (" << std::strerror(errno)
                      << "); set it in the environment for full speed";
}

void TuneAllocator() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 512 * 1024 * 1024);
}

}  // namespace sluice::runtime
