// Checksum64: the per-tensor integrity hash of the CheckpointEngine.
//
// The XXH64 algorithm (Yann Collet's public design), implemented here so the
// core has no extra dependency: four independent 64-bit lanes keep it near
// memory bandwidth, and its avalanche makes any single-bit change flip about
// half the output bits. It detects accidental corruption, not tampering.
// Words are read in host byte order; a cross-host transport must checksum in
// a fixed order (or re-checksum on arrival) before comparing across machines.
//
// Thread safety: a pure function.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_CHECKSUM_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace sluice::checkpoint_engine {

uint64_t Checksum64(const void* data, size_t nbytes, uint64_t seed = 0);

// memcpy(dst, src, nbytes) and Checksum64 of the copy in one pass over
// memory (each block hashed while it is in cache). Same result as copying,
// then calling Checksum64(dst, ...).
uint64_t CopyAndChecksum64(void* dst, const void* src, size_t nbytes, uint64_t seed = 0);

}  // namespace sluice::checkpoint_engine

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_CHECKSUM_H_
