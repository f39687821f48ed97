#include "small_linear.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SLUICE_SMALL_LINEAR_X86 1
#endif

namespace sluice::model {

#ifdef SLUICE_SMALL_LINEAR_X86

bool SmallLinearSupported() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
}

namespace {

#define SLUICE_AVX2 __attribute__((target("avx2,fma")))

SLUICE_AVX2 inline float Sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lanes [0, n) of a tail chunk (0 < n < 8).
SLUICE_AVX2 inline __m256i TailMask(int64_t n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes);
}

// R input rows against W output rows: acc[r][o] += x_r . w_o, 8 lanes at a
// time, then a horizontal sum. Every output is summed in the same order, so
// the blocking (R, W) never changes a result.
template <int R, int W>
SLUICE_AVX2 inline void Block(const float* const* x, const float* const* w, const float* bias, float* const* y,
                              int64_t in) {
  __m256 acc[R][W];
  for (int r = 0; r < R; ++r) {
    for (int o = 0; o < W; ++o) acc[r][o] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 8 <= in; k += 8) {
    __m256 wv[W];
    for (int o = 0; o < W; ++o) wv[o] = _mm256_loadu_ps(w[o] + k);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x[r] + k);
      for (int o = 0; o < W; ++o) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);
    }
  }
  if (k < in) {
    const __m256i mask = TailMask(in - k);
    __m256 wv[W];
    for (int o = 0; o < W; ++o) wv[o] = _mm256_maskload_ps(w[o] + k, mask);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_maskload_ps(x[r] + k, mask);
      for (int o = 0; o < W; ++o) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int o = 0; o < W; ++o) y[r][o] = Sum(acc[r][o]) + (bias != nullptr ? bias[o] : 0.0f);
  }
}

// All rows against W output rows starting at `o`.
template <int W>
SLUICE_AVX2 void Columns(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in,
                         int64_t ldy, int64_t o) {
  const float* wr[W];
  for (int j = 0; j < W; ++j) wr[j] = w + (o + j) * in;
  const float* b = bias != nullptr ? bias + o : nullptr;
  int64_t i = 0;
  for (; i + 2 <= rows; i += 2) {
    const float* xr[2] = {x + i * in, x + (i + 1) * in};
    float* yr[2] = {y + i * ldy + o, y + (i + 1) * ldy + o};
    Block<2, W>(xr, wr, b, yr, in);
  }
  if (i < rows) {
    const float* xr[1] = {x + i * in};
    float* yr[1] = {y + i * ldy + o};
    Block<1, W>(xr, wr, b, yr, in);
  }
}

}  // namespace

void SmallLinear(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t outs,
                 int64_t ldy) {
  int64_t o = 0;
  for (; o + 4 <= outs; o += 4) Columns<4>(x, w, bias, y, rows, in, ldy, o);
  for (; o < outs; ++o) Columns<1>(x, w, bias, y, rows, in, ldy, o);
}

#else  // not x86: callers use BLAS; a plain loop keeps SmallLinear correct

bool SmallLinearSupported() { return false; }

void SmallLinear(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t outs,
                 int64_t ldy) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t o = 0; o < outs; ++o) {
      float sum = 0;
      for (int64_t k = 0; k < in; ++k) sum += x[i * in + k] * w[o * in + k];
      y[i * ldy + o] = sum + (bias != nullptr ? bias[o] : 0.0f);
    }
  }
}

#endif

}  // namespace sluice::model
