// A linear layer for a handful of rows (decode steps at small batch), on
// float32 CPU buffers, without libtorch.
//
// BLAS sgemm copies ("packs") the whole weight matrix into its own layout on
// every call; at a few rows that copy costs more than the arithmetic (a
// 256x704 layer: ~40 us for 1 row with OpenBLAS, ~5 us read in place). This
// kernel reads the weight where it lies, four output rows at a time against
// two input rows, and is used by the model's cached (decode) path when the
// rows are few. Each output is summed in the same order whatever the other
// rows, so a row's result does not depend on the batch it decodes in.
#pragma once

#include <cstdint>

namespace sluice::model {

// Rows up to which the kernel beats sgemm (measured on AVX2/AVX-512 CPUs
// with OpenBLAS 0.3.21: 7x at 1 row, even at ~32).
inline constexpr int64_t kSmallLinearMaxRows = 16;

// Whether this CPU runs the kernel (AVX2 and FMA); otherwise callers use BLAS.
bool SmallLinearSupported();

// y[i, o] = sum_k x[i, k] * w[o, k] (+ bias[o]) for i < rows, o < outs.
// x: rows x in, row stride `in`; w: outs x in, row stride `in`; bias: outs
// or null; y: rows x outs, row stride `ldy`. Requires SmallLinearSupported().
void SmallLinear(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t outs,
                 int64_t ldy);

}  // namespace sluice::model
