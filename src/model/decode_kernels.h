// CPU kernels for decode steps at small batch, on float32 activations
// (projection weights float32 or bfloat16), without libtorch. The model's
// cached (decode) path uses them when they apply (float32 activations on CPU,
// outside autograd, the CPU has AVX2 and FMA) and libtorch otherwise.
//
// * SmallLinear / SmallLinearBf16: BLAS sgemm copies ("packs") the whole weight matrix into its
//   own layout on every call; at a few rows that copy costs more than the
//   arithmetic (a 256x704 layer: ~40 us for 1 row with OpenBLAS, ~5-15 us
//   read in place). This kernel reads the weight where it lies, four output rows
//   at a time against two input rows (AVX2), or six against four (AVX-512),
//   fetching the next block's weights into cache while it computes.
// * DecodeAttention: the libtorch path attends a block of rows over the
//   block's longest context (shorter rows padded and masked), gathers
//   non-consecutive cache rows and runs ~15 small operations per block and
//   layer. This kernel reads each row's cache slot in place over exactly its
//   own context, so decode rows of any lengths form one pass.
//
// Both sum every output in the same order whatever the other rows, so a row's
// result does not depend on the batch it decodes in.
#pragma once

#include <cstdint>

#include "sluice/model/decode_kernels_switch.h"

namespace sluice::model {

// Rows up to which SmallLinear beats sgemm inside a decode step, where each
// layer's weights arrive cold. With AVX2 (5M model, OpenBLAS 0.3.21): a whole
// step 2.6x faster at 1 row, 2x at 2, ~10% faster at 8, slower at 16; a loop
// over one hot matrix flatters it (even only at ~32). With AVX-512 (the 20M
// model's layers, Zen 5): faster than sgemm at every count measured, 1 to
// 256 rows; above that, sgemm.
int64_t SmallLinearMaxRows();

// Rows up to which SmallLinearBf16 serves bfloat16 weights (256 with either
// kernel). The alternative is widening the whole matrix to float32 for sgemm
// on every call, which moves several times the weight's bytes; with AVX-512 the kernel
// wins at every count measured for float32 already. With AVX2 only, rows 9 to
// 256 are a judgement, not a measurement (no AVX2-only CPU here).
inline constexpr int64_t kSmallLinearBf16MaxRows = 256;

// Whether SmallLinear runs its AVX-512 kernel: where the CPU has AVX-512,
// unless set false (tests run the AVX2 kernel on such CPUs too).
bool SmallLinearAvx512();
void SetSmallLinearAvx512(bool enabled);

// Output rows per unit of work when SmallLinear is split over threads (a
// multiple of both kernels' blocks, 4 and 6).
inline constexpr int64_t kSmallLinearOutputBlock = 12;

// Whether the vector kernels run here: enabled, and this CPU has AVX2 and
// FMA; otherwise use libtorch.
bool DecodeKernelsSupported();

// y[i, o] = sum_k x[i, k] * w[o, k] (+ bias[o]) for i < rows, o < outs.
// x: rows x in, row stride `in`; w: outs x in, row stride `in`; bias: outs
// or null; y: rows x outs, row stride `ldy`.
void SmallLinear(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t outs,
                 int64_t ldy);

// The same with bfloat16 weights (each uint16_t the upper half of a float32,
// as torch stores kBFloat16): every weight widened to float32 exactly as it is
// read, products and sums in float32, so only the weights' bytes halve (a
// decode step at a few rows streams every weight from memory).
void SmallLinearBf16(const float* x, const uint16_t* w, const float* bias, float* y, int64_t rows, int64_t in,
                     int64_t outs, int64_t ldy);

struct DecodeAttentionShape {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t max_len = 0;  // positions per cache slot
  float scale = 1;      // applied to q.k
};

// For rows r in [begin, end), every head h (kv head g = h / (heads / kv_heads)):
//   out[r, h] = sum_l softmax_l(scale * q[r, h] . k[slot[r], g, l]) v[slot[r], g, l]   over l < len[r].
// q, out: rows x heads x head_dim; keys, values: one layer's cache
// [slots, kv_heads, max_len, head_dim]. Requires 1 <= len[r] <= max_len and
// head_dim a multiple of 8 (callers check; see DecodeAttentionApplies).
void DecodeAttention(const float* q, const float* keys, const float* values, const int64_t* slot, const int64_t* len,
                     float* out, const DecodeAttentionShape& shape, int64_t begin, int64_t end);

inline bool DecodeAttentionApplies(int64_t head_dim) { return DecodeKernelsSupported() && head_dim % 8 == 0; }

// Elementwise steps of a decode layer, one call each instead of several
// libtorch operations (at a few rows their dispatch, not their arithmetic,
// is the cost). Plain loops: correct on every CPU.
// y[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps) for rows of `dim`.
void RmsNormRows(const float* x, const float* weight, float eps, float* y, int64_t rows, int64_t dim);
// In place on x [rows, heads, D]: x = x * cos[r] + rotate_half(x) * sin[r]
// (rotate_half(a, b) = (-b, a) over the halves of D); cos, sin: rows x D.
void RopeRows(float* x, const float* cos, const float* sin, int64_t rows, int64_t heads, int64_t head_dim);
// gate = silu(gate) * up, n values, in place.
void SiluMulInPlace(float* gate, const float* up, int64_t n);

}  // namespace sluice::model
