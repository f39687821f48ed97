#include "decode_kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SLUICE_DECODE_KERNELS_X86 1
#endif

namespace sluice::model {

namespace {
std::atomic<bool> kernels_enabled{true};
}  // namespace

bool DecodeKernelsEnabled() { return kernels_enabled.load(std::memory_order_relaxed); }
void SetDecodeKernelsEnabled(bool enabled) { kernels_enabled.store(enabled, std::memory_order_relaxed); }

#ifdef SLUICE_DECODE_KERNELS_X86

bool DecodeKernelsSupported() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported && DecodeKernelsEnabled();
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

// Weights as float32 lanes, eight at a time: float32 as stored; bfloat16
// (uint16_t holding a float32's upper half) widened exactly by a shift.
SLUICE_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
SLUICE_AVX2 inline __m256 Load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
// The first n (0 < n < 8) weights, the other lanes zero.
SLUICE_AVX2 inline __m256 LoadTail8(const float* p, int64_t n) { return _mm256_maskload_ps(p, TailMask(n)); }
SLUICE_AVX2 inline __m256 LoadTail8(const uint16_t* p, int64_t n) {
  uint16_t padded[8] = {};
  std::copy_n(p, n, padded);
  return Load8(padded);
}

// Whether the fetch ahead runs at element k: once per 64-byte line.
template <typename T>
inline bool LineStart(int64_t k) {
  return (k % static_cast<int64_t>(64 / sizeof(T))) == 0;
}

// R input rows against W output rows: acc[r][o] += x_r . w_o, 8 lanes at a
// time, then a horizontal sum. Every output is summed in the same order, so
// the blocking (R, W) never changes a result. pf: the weight rows of the next
// block, fetched into cache meanwhile (a decode step's weights arrive cold
// from memory; fetching ahead overlaps that with the arithmetic). T: the
// weights' element type (float, or bfloat16 bits as uint16_t).
template <int R, int W, typename T>
SLUICE_AVX2 inline void Block(const float* const* x, const T* const* w, const float* bias, float* const* y, int64_t in,
                              const T* const* pf) {
  __m256 acc[R][W];
  for (int r = 0; r < R; ++r) {
    for (int o = 0; o < W; ++o) acc[r][o] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 8 <= in; k += 8) {
    if (LineStart<T>(k)) {
      for (int o = 0; o < W; ++o) _mm_prefetch(reinterpret_cast<const char*>(pf[o] + k), _MM_HINT_T0);
    }
    __m256 wv[W];
    for (int o = 0; o < W; ++o) wv[o] = Load8(w[o] + k);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x[r] + k);
      for (int o = 0; o < W; ++o) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);
    }
  }
  if (k < in) {
    const __m256i mask = TailMask(in - k);
    __m256 wv[W];
    for (int o = 0; o < W; ++o) wv[o] = LoadTail8(w[o] + k, in - k);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_maskload_ps(x[r] + k, mask);
      for (int o = 0; o < W; ++o) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int o = 0; o < W; ++o) y[r][o] = Sum(acc[r][o]) + (bias != nullptr ? bias[o] : 0.0f);
  }
}

// The weight rows of the block after [o, o + W), clamped to the last row.
template <int W, typename T>
inline void NextRows(const T* w, int64_t in, int64_t outs, int64_t o, const T** wr, const T** pf) {
  for (int j = 0; j < W; ++j) {
    wr[j] = w + (o + j) * in;
    pf[j] = w + std::min(o + W + j, outs - 1) * in;
  }
}

// All rows against W output rows starting at `o`.
template <int W, typename T>
SLUICE_AVX2 void Columns(const float* x, const T* w, const float* bias, float* y, int64_t rows, int64_t in,
                         int64_t outs, int64_t ldy, int64_t o) {
  const T *wr[W], *pf[W];
  NextRows<W>(w, in, outs, o, wr, pf);
  const float* b = bias != nullptr ? bias + o : nullptr;
  int64_t i = 0;
  for (; i + 2 <= rows; i += 2) {
    const float* xr[2] = {x + i * in, x + (i + 1) * in};
    float* yr[2] = {y + i * ldy + o, y + (i + 1) * ldy + o};
    Block<2, W>(xr, wr, b, yr, in, pf);
  }
  if (i < rows) {
    const float* xr[1] = {x + i * in};
    float* yr[1] = {y + i * ldy + o};
    Block<1, W>(xr, wr, b, yr, in, pf);
  }
}

template <typename T>
void LinearAvx2(const float* x, const T* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t outs,
                int64_t ldy) {
  int64_t o = 0;
  for (; o + 4 <= outs; o += 4) Columns<4>(x, w, bias, y, rows, in, outs, ldy, o);
  for (; o < outs; ++o) Columns<1>(x, w, bias, y, rows, in, outs, ldy, o);
}

// The same with 16 lanes where the CPU has AVX-512 (32 vector registers):
// blocks of 4 input rows against 6 output rows, 24 accumulators, so each
// weight vector loaded serves 4 rows. Measured on the 20M model's layers with
// cold weights (Zen 5, one core): 2.7x faster than the AVX2 kernel without
// fetching ahead at 8 rows, and faster than OpenBLAS sgemm up to 256 rows.
#define SLUICE_AVX512 __attribute__((target("avx512f,avx2,fma")))

// GCC 12's AVX-512 intrinsics initialise their "undefined" operands from
// themselves, which -Wuninitialized reports wherever they inline (GCC bug
// 105593); the operands are placeholders the instructions never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The 16 lanes' sum: the halves added, then Sum.
SLUICE_AVX512 inline float Sum16(__m512 v) {
  const __m512 swapped = _mm512_shuffle_f32x4(v, v, 0x4E);
  return Sum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_castps512_ps256(swapped)));
}

SLUICE_AVX512 inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
SLUICE_AVX512 inline __m512 Load16(const uint16_t* p) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
// The first n (0 < n < 16) weights, the other lanes zero.
SLUICE_AVX512 inline __m512 LoadTail16(const float* p, int64_t n) {
  return _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p);
}
SLUICE_AVX512 inline __m512 LoadTail16(const uint16_t* p, int64_t n) {
  uint16_t padded[16] = {};
  std::copy_n(p, n, padded);
  return Load16(padded);
}

// Whole 16-lane chunks in the loop, the tail after it: a tail handled inside
// the loop (a mask per chunk) made GCC keep the bfloat16 kernel's
// accumulators in memory, at half the speed.
template <int R, int W, typename T>
SLUICE_AVX512 inline void Block16(const float* const* x, const T* const* w, const float* bias, float* const* y,
                                  int64_t in, const T* const* pf) {
  __m512 acc[R][W];
  for (int r = 0; r < R; ++r) {
    for (int o = 0; o < W; ++o) acc[r][o] = _mm512_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 16 <= in; k += 16) {
    if (LineStart<T>(k)) {
      for (int o = 0; o < W; ++o) _mm_prefetch(reinterpret_cast<const char*>(pf[o] + k), _MM_HINT_T0);
    }
    __m512 wv[W];
    for (int o = 0; o < W; ++o) wv[o] = Load16(w[o] + k);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x[r] + k);
      for (int o = 0; o < W; ++o) acc[r][o] = _mm512_fmadd_ps(xv, wv[o], acc[r][o]);
    }
  }
  if (k < in) {
    const __mmask16 mask = __mmask16((1u << (in - k)) - 1);
    __m512 wv[W];
    for (int o = 0; o < W; ++o) wv[o] = LoadTail16(w[o] + k, in - k);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x[r] + k);
      for (int o = 0; o < W; ++o) acc[r][o] = _mm512_fmadd_ps(xv, wv[o], acc[r][o]);
    }
  }
  // Unrolled, so acc stays in registers (a loop here would keep it in memory
  // and store all 24 accumulators on every step of the loop above).
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int o = 0; o < W; ++o) y[r][o] = Sum16(acc[r][o]) + (bias != nullptr ? bias[o] : 0.0f);
  }
}

template <int R, int W, typename T>
SLUICE_AVX512 void Rows16(const float* x, const T* const* wr, const float* b, float* y, int64_t i, int64_t in,
                          int64_t ldy, int64_t o, const T* const* pf) {
  const float* xr[R];
  float* yr[R];
  for (int r = 0; r < R; ++r) {
    xr[r] = x + (i + r) * in;
    yr[r] = y + (i + r) * ldy + o;
  }
  Block16<R, W>(xr, wr, b, yr, in, pf);
}

template <int W, typename T>
SLUICE_AVX512 void Columns16(const float* x, const T* w, const float* bias, float* y, int64_t rows, int64_t in,
                             int64_t outs, int64_t ldy, int64_t o) {
  const T *wr[W], *pf[W];
  NextRows<W>(w, in, outs, o, wr, pf);
  const float* b = bias != nullptr ? bias + o : nullptr;
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) Rows16<4, W>(x, wr, b, y, i, in, ldy, o, pf);
  switch (rows - i) {
    case 3:
      Rows16<3, W>(x, wr, b, y, i, in, ldy, o, pf);
      break;
    case 2:
      Rows16<2, W>(x, wr, b, y, i, in, ldy, o, pf);
      break;
    case 1:
      Rows16<1, W>(x, wr, b, y, i, in, ldy, o, pf);
      break;
    default:
      break;
  }
}

template <typename T>
void LinearAvx512(const float* x, const T* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t outs,
                  int64_t ldy) {
  int64_t o = 0;
  for (; o + 6 <= outs; o += 6) Columns16<6>(x, w, bias, y, rows, in, outs, ldy, o);
  for (; o < outs; ++o) Columns16<1>(x, w, bias, y, rows, in, outs, ldy, o);
}

#pragma GCC diagnostic pop

std::atomic<bool> avx512_wanted{true};

}  // namespace

bool SmallLinearAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has && avx512_wanted.load(std::memory_order_relaxed);
}
void SetSmallLinearAvx512(bool enabled) { avx512_wanted.store(enabled, std::memory_order_relaxed); }
int64_t SmallLinearMaxRows() { return SmallLinearAvx512() ? 256 : 8; }

void SmallLinear(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t outs,
                 int64_t ldy) {
  if (SmallLinearAvx512()) {
    LinearAvx512(x, w, bias, y, rows, in, outs, ldy);
  } else {
    LinearAvx2(x, w, bias, y, rows, in, outs, ldy);
  }
}

void SmallLinearBf16(const float* x, const uint16_t* w, const float* bias, float* y, int64_t rows, int64_t in,
                     int64_t outs, int64_t ldy) {
  if (SmallLinearAvx512()) {
    LinearAvx512(x, w, bias, y, rows, in, outs, ldy);
  } else {
    LinearAvx2(x, w, bias, y, rows, in, outs, ldy);
  }
}

namespace {

// e^x for x <= 0 (scores minus their maximum), 8 lanes: x = n ln2 + r with
// |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (relative error
// < 2e-7), 2^n put in the exponent bits. Lanes below -87 give 0.
SLUICE_AVX2 inline __m256 ExpNonPositive(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 split in two for exactness
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

// The sums of a[0..7]'s lanes as one vector (lane j: a[j]'s sum).
SLUICE_AVX2 inline __m256 Sum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  // u0: the sums of a[0..3] over the low lanes 0-3 then over the high lanes 4-7; u1: a[4..7].
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// out[0, 8N) = inv * sum_l p[l] v[l, 0, 8N) over len rows of stride ld: the
// positions outer and N independent accumulators (one per 8 lanes), so the
// multiply-adds pipeline instead of each waiting on the previous one.
template <int N>
SLUICE_AVX2 inline void WeightedRows(const float* p, const float* v, int64_t len, int64_t ld, __m256 inv, float* out) {
  __m256 acc[N];
#pragma GCC unroll 8
  for (int c = 0; c < N; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t l = 0; l < len; ++l) {
    const __m256 pl = _mm256_set1_ps(p[l]);
#pragma GCC unroll 8
    for (int c = 0; c < N; ++c) acc[c] = _mm256_fmadd_ps(pl, _mm256_loadu_ps(v + l * ld + 8 * c), acc[c]);
  }
#pragma GCC unroll 8
  for (int c = 0; c < N; ++c) _mm256_storeu_ps(out + 8 * c, _mm256_mul_ps(acc[c], inv));
}

// WeightedRows<N> by N - 1.
using WeightedRowsFn = void (*)(const float*, const float*, int64_t, int64_t, __m256, float*);
constexpr WeightedRowsFn kWeightedRows[8] = {WeightedRows<1>, WeightedRows<2>, WeightedRows<3>, WeightedRows<4>,
                                             WeightedRows<5>, WeightedRows<6>, WeightedRows<7>, WeightedRows<8>};

// One (row, kv head): its rep query heads against len cached positions.
SLUICE_AVX2 void AttendOneGroup(const float* q, const float* k, const float* v, int64_t len, int64_t rep, int64_t D,
                                float scale, float* scores, float* out) {
  // scores[h][l] = scale * q_h . k_l: 8 positions at a time (8 accumulators,
  // their sums as one vector), the rest one at a time.
  const __m256 scale8 = _mm256_set1_ps(scale);
  int64_t l0 = 0;
  for (; l0 + 8 <= len; l0 += 8) {
    for (int64_t h = 0; h < rep; ++h) {
      const float* qh = q + h * D;
      __m256 acc[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qh + d);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (l0 + j) * D + d), acc[j]);
      }
      _mm256_storeu_ps(scores + h * len + l0, _mm256_mul_ps(Sum8(acc), scale8));
    }
  }
  for (int64_t l = l0; l < len; ++l) {
    const float* kl = k + l * D;
    for (int64_t h = 0; h < rep; ++h) {
      const float* qh = q + h * D;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(kl + d), acc);
      scores[h * len + l] = Sum(acc) * scale;
    }
  }
  // Per head: softmax (subtract the maximum, exponentiate, normalise at the
  // end), then out_h = sum_l p_h[l] v_l in 8-lane chunks of the head.
  for (int64_t h = 0; h < rep; ++h) {
    float* s = scores + h * len;
    const float m = *std::max_element(s, s + len);
    const __m256 mv = _mm256_set1_ps(m);
    __m256 total = _mm256_setzero_ps();
    int64_t l = 0;
    for (; l + 8 <= len; l += 8) {
      const __m256 e = ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(s + l), mv));
      _mm256_storeu_ps(s + l, e);
      total = _mm256_add_ps(total, e);
    }
    if (l < len) {
      const __m256i mask = TailMask(len - l);
      const __m256 e =
          _mm256_and_ps(ExpNonPositive(_mm256_sub_ps(_mm256_maskload_ps(s + l, mask), mv)), _mm256_castsi256_ps(mask));
      _mm256_maskstore_ps(s + l, mask, e);
      total = _mm256_add_ps(total, e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / Sum(total));
    for (int64_t d = 0; d < D; d += 64) {
      const int64_t chunks = std::min<int64_t>(8, (D - d) / 8);
      kWeightedRows[chunks - 1](s, v + d, len, D, inv, out + h * D + d);
    }
  }
}

}  // namespace

void DecodeAttention(const float* q, const float* keys, const float* values, const int64_t* slot, const int64_t* len,
                     float* out, const DecodeAttentionShape& shape, int64_t begin, int64_t end) {
  const int64_t H = shape.heads, KV = shape.kv_heads, D = shape.head_dim, rep = H / KV;
  std::vector<float> scores;
  for (int64_t r = begin; r < end; ++r) {
    scores.resize(static_cast<size_t>(rep * len[r]));
    for (int64_t g = 0; g < KV; ++g) {
      const int64_t cache_offset = (slot[r] * KV + g) * shape.max_len * D;
      const int64_t head_offset = (r * H + g * rep) * D;
      AttendOneGroup(q + head_offset, keys + cache_offset, values + cache_offset, len[r], rep, D, shape.scale,
                     scores.data(), out + head_offset);
    }
  }
}

#else  // not x86: callers use libtorch; plain loops keep the kernels correct

bool DecodeKernelsSupported() { return false; }  // callers use libtorch
bool SmallLinearAvx512() { return false; }
void SetSmallLinearAvx512(bool) {}
int64_t SmallLinearMaxRows() { return 8; }

namespace {
float Widen(float v) { return v; }
float Widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float v;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}

template <typename T>
void LinearLoops(const float* x, const T* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t outs,
                 int64_t ldy) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t o = 0; o < outs; ++o) {
      float sum = 0;
      for (int64_t k = 0; k < in; ++k) sum += x[i * in + k] * Widen(w[o * in + k]);
      y[i * ldy + o] = sum + (bias != nullptr ? bias[o] : 0.0f);
    }
  }
}
}  // namespace

void SmallLinear(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t outs,
                 int64_t ldy) {
  LinearLoops(x, w, bias, y, rows, in, outs, ldy);
}
void SmallLinearBf16(const float* x, const uint16_t* w, const float* bias, float* y, int64_t rows, int64_t in,
                     int64_t outs, int64_t ldy) {
  LinearLoops(x, w, bias, y, rows, in, outs, ldy);
}

void DecodeAttention(const float* q, const float* keys, const float* values, const int64_t* slot, const int64_t* len,
                     float* out, const DecodeAttentionShape& shape, int64_t begin, int64_t end) {
  const int64_t H = shape.heads, KV = shape.kv_heads, D = shape.head_dim, rep = H / KV;
  std::vector<float> p;
  for (int64_t r = begin; r < end; ++r) {
    p.resize(static_cast<size_t>(len[r]));
    for (int64_t h = 0; h < H; ++h) {
      const int64_t cache_offset = (slot[r] * KV + h / rep) * shape.max_len * D;
      const float* qh = q + (r * H + h) * D;
      float m = -INFINITY, total = 0;
      for (int64_t l = 0; l < len[r]; ++l) {
        float s = 0;
        for (int64_t d = 0; d < D; ++d) s += qh[d] * keys[cache_offset + l * D + d];
        p[static_cast<size_t>(l)] = s * shape.scale;
        m = std::max(m, p[static_cast<size_t>(l)]);
      }
      for (float& x : p) total += (x = std::exp(x - m));
      float* oh = out + (r * H + h) * D;
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0;
        for (int64_t l = 0; l < len[r]; ++l) acc += p[static_cast<size_t>(l)] * values[cache_offset + l * D + d];
        oh[d] = acc / total;
      }
    }
  }
}

#endif

void RmsNormRows(const float* x, const float* weight, float eps, float* y, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float sum = 0;
    for (int64_t i = 0; i < dim; ++i) sum += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    float* yr = y + r * dim;
    for (int64_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv);
  }
}

void RopeRows(float* x, const float* cos, const float* sin, int64_t rows, int64_t heads, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + r * head_dim;
    const float* s = sin + r * head_dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
  }
}

void SiluMulInPlace(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace sluice::model
