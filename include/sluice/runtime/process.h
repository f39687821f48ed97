// Process-level settings that decide libtorch CPU performance (see
// docs/design.md, libtorch on CPU): OpenMP must not spin while idle, glibc malloc
// must not map and unmap large buffers every step.
#ifndef SLUICE_RUNTIME_PROCESS_H_
#define SLUICE_RUNTIME_PROCESS_H_

namespace sluice::runtime {

// OpenMP reads OMP_WAIT_POLICY when the runtime loads, before main(). If it
// is unset, sets it to PASSIVE and re-executes this program (same argv) so
// the setting takes effect; returns normally when it is already set (or the
// re-exec fails, after a warning).
void EnsurePassiveOpenMp(char** argv);

// Keeps freed large buffers in the heap instead of returning them to the OS
// (glibc's malloc; a no-op where the program links tcmalloc, SLUICE_MALLOC).
void TuneAllocator();

}  // namespace sluice::runtime

#endif  // SLUICE_RUNTIME_PROCESS_H_
