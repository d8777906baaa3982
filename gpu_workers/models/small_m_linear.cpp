// Linear layers for 1 to 8 rows on x86 CPUs: y (M, N) = x (M, K) @ W.T * scale + bias.
//
// At M <= 8 a linear reads each weight once and does M multiply-adds per weight, so it is bound
// by memory bandwidth. The weight is laid out once (pack) so that one pass streams it in order:
//
//   pairs (bf16, int8)  (B/4, ceil(K/2), 4, 16, 2): tile t, k pair p, block c, lane j holds
//                       W[16 (4t + c) + j, 2p + {0, 1}]
//   fp32                (B/4, K, 4, 16): tile t, k, block c, lane j holds W[16 (4t + c) + j, k]
//
// B = ceil(N/16) rounded up to a multiple of 4 blocks (a tile); padding is zeros. A tile's 4
// blocks are interleaved so that it is one sequential stream: separate blocks K * 64 bytes apart
// (a multiple of 4 KiB at K = 576 or 1536) were 4 streams on the same cache sets, and ran at
// about 70 % of oneDNN's speed over SmolLM2's layers. A 16-lane block
// of outputs accumulates in one register per row, so no horizontal sums: for bf16 one
// _mm512_dpbf16_ps adds W[n, 2p] x[2p] + W[n, 2p+1] x[2p+1] for 16 outputs n, with x's pair
// broadcast. Every weight load serves all M rows. Threads split the tiles (output channels).
//
// int8 weights (per-output-channel scales) are widened to bf16 in registers (|q| <= 127 is exact
// in bf16) and go through the same dot product: weight-only int8, activations in bf16.
//
// ISAs, chosen at run time from the CPU's flags: avx512bf16 (bf16, int8, fp32 weights) and avx2
// with FMA (bf16 and fp32 weights: bf16 widened to fp32). Neither: isa() is "none" and the caller
// serves through its other path. The file is compiled without -march flags: each kernel carries
// its own target attribute, so the module loads on any x86-64 CPU.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>
#include <cstdint>
#include <cstring>
#include <string>

namespace {

constexpr int64_t kLanes = 16;     // output channels a block
constexpr int64_t kTileBlocks = 4; // blocks are padded to a multiple of this
constexpr int64_t kMaxRows = 8;    // rows a pass; more rows are done in passes of 8

enum class Isa { kNone, kAvx2, kAvx512Bf16 };

Isa detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16")) {
    return Isa::kAvx512Bf16;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return Isa::kAvx2;
  }
  return Isa::kNone;
}

Isa g_isa = detect_isa();  // tests force the avx2 path on an avx512 CPU (set_isa)

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Bf16: return "avx512bf16";
    case Isa::kAvx2: return "avx2";
    default: return "none";
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// float -> bf16 bits, round to nearest even (NaN kept a NaN), and back
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

inline float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

int64_t padded_blocks(int64_t n) { return ceil_div(ceil_div(n, kLanes), kTileBlocks) * kTileBlocks; }

struct Job {
  const void* w;        // the packed weight
  int64_t block_stride; // elements a block: 32 * pairs (pair layouts) or 16 * K (fp32)
  int64_t depth;        // k pairs (pair layouts) or K (fp32)
  const void* x;        // rows: bf16 pairs as int32 (avx512), or float (fp32 weights, avx2)
  int64_t x_stride;     // elements of x's type between rows
  int64_t rows;
  int64_t n;
  const float* scale;   // (N,) or null
  const float* bias;    // (N,) or null
  float* out;           // (rows, N), row stride N (callers round to bf16 where they want it)
};

// Elements from the weight's start to block `block`'s lanes at k pair (or k) `p`; unit is the
// elements of one block at one p (32 for pairs, 16 for fp32).
inline int64_t woff(const Job& j, int64_t block, int64_t p, int64_t unit) {
  return (block / kTileBlocks) * j.block_stride * kTileBlocks + (p * kTileBlocks + block % kTileBlocks) * unit;
}

// ---- avx512bf16 ------------------------------------------------------------------------------

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// 16 output lanes [n0, n0 + 16) of row `row` of out (rows, n): times scale, plus bias (either
// may be null), the lanes past n left alone. Both the bf16 and the VNNI kernels' targets include
// this one's, so it inlines into each.
__attribute__((target("avx512f"))) inline void store_lanes(float* out, int64_t n, const float* scale,
                                                          const float* bias, int64_t row, int64_t n0, __m512 v) {
  const int64_t count = std::min<int64_t>(kLanes, n - n0);
  if (count <= 0) return;
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
  if (scale) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, scale + n0));
  if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias + n0));
  _mm512_mask_storeu_ps(out + row * n + n0, mask, v);
}

AVX512 inline void store16(const Job& j, int64_t row, int64_t n0, __m512 v) {
  store_lanes(j.out, j.n, j.scale, j.bias, row, n0, v);
}

// Widens 32 int8 (16 lanes x a k pair) to 32 bf16 in the same order.
AVX512 inline __m512bh widen_int8(const int8_t* src) {
  __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
  __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16))));
  return _mm512_cvtne2ps_pbh(hi, lo);
}

// Software prefetch distance in a tile's stream: the hardware's stream prefetcher stops at each
// 4 KiB page; reaching ahead across it took SmolLM2's layers from 18 to 20-21.6 GB/s on 4 KiB
// pages and from 19 to 25 GB/s on huge pages (gather_into_huge_pages; docs/BENCHMARKS.md).
constexpr int64_t kPrefetchBytes = 2048;

template <int M, int NB, bool kInt8>
AVX512 void tile_pairs_avx512(const Job& j, int64_t b0) {
  __m512 acc[M][NB];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  const int32_t* x = static_cast<const int32_t*>(j.x);
  for (int64_t p = 0; p < j.depth; ++p) {
    __m512bh wv[NB];
    {  // a tile's k pairs are one stream: NB blocks x 32 weights a pair
      const char* ahead = static_cast<const char*>(j.w) + woff(j, b0, p, 2 * kLanes) * (kInt8 ? 1 : 2) + kPrefetchBytes;
      for (int off = 0; off < NB * (kInt8 ? 32 : 64); off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
    }
    for (int b = 0; b < NB; ++b) {
      const int64_t off = woff(j, b0 + b, p, 2 * kLanes);
      if constexpr (kInt8) {
        wv[b] = widen_int8(static_cast<const int8_t*>(j.w) + off);
      } else {
        wv[b] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(static_cast<const uint16_t*>(j.w) + off));
      }
    }
    for (int m = 0; m < M; ++m) {
      const __m512bh xb = reinterpret_cast<__m512bh>(_mm512_set1_epi32(x[m * j.x_stride + p]));
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], wv[b], xb);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) store16(j, m, (b0 + b) * kLanes, acc[m][b]);
}

template <int M, int NB>
AVX512 void tile_fp32_avx512(const Job& j, int64_t b0) {
  __m512 acc[M][NB];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  const float* x = static_cast<const float*>(j.x);
  const float* w = static_cast<const float*>(j.w);
  for (int64_t k = 0; k < j.depth; ++k) {
    __m512 wv[NB];
    {
      const char* ahead = reinterpret_cast<const char*>(w + woff(j, b0, k, kLanes)) + kPrefetchBytes;
      for (int off = 0; off < NB * 64; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
    }
    for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_ps(w + woff(j, b0 + b, k, kLanes));
    for (int m = 0; m < M; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * j.x_stride + k]);
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_fmadd_ps(wv[b], xb, acc[m][b]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) store16(j, m, (b0 + b) * kLanes, acc[m][b]);
}

// ---- avx2 + fma ------------------------------------------------------------------------------

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 inline void store8(const Job& j, int64_t row, int64_t n0, __m256 v) {
  const int64_t count = std::min<int64_t>(8, j.n - n0);
  if (count <= 0) return;
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  float* out = j.out + row * j.n + n0;
  for (int64_t i = 0; i < count; ++i) {
    float f = buf[i];
    if (j.scale) f *= j.scale[n0 + i];
    if (j.bias) f += j.bias[n0 + i];
    out[i] = f;
  }
}

// bf16 pairs; x is float (rows, 2 * pairs). A 16-lane block is two halves of 8 lanes.
template <int M>
AVX2 void tile_pairs_avx2(const Job& j, int64_t b0) {
  __m256 acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  const float* x = static_cast<const float*>(j.x);
  const uint16_t* w = static_cast<const uint16_t*>(j.w);
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t p = 0; p < j.depth; ++p) {
    __m256 even[2], odd[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + woff(j, b0, p, 2 * kLanes) + h * 16));
      even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      odd[h] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
    }
    for (int m = 0; m < M; ++m) {
      const __m256 x0 = _mm256_set1_ps(x[m * j.x_stride + 2 * p]);
      const __m256 x1 = _mm256_set1_ps(x[m * j.x_stride + 2 * p + 1]);
      for (int h = 0; h < 2; ++h) acc[m][h] = _mm256_fmadd_ps(odd[h], x1, _mm256_fmadd_ps(even[h], x0, acc[m][h]));
    }
  }
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < 2; ++h) store8(j, m, b0 * kLanes + 8 * h, acc[m][h]);
}

template <int M>
AVX2 void tile_fp32_avx2(const Job& j, int64_t b0) {
  __m256 acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  const float* x = static_cast<const float*>(j.x);
  const float* w = static_cast<const float*>(j.w);
  for (int64_t k = 0; k < j.depth; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + woff(j, b0, k, kLanes));
    const __m256 w1 = _mm256_loadu_ps(w + woff(j, b0, k, kLanes) + 8);
    for (int m = 0; m < M; ++m) {
      const __m256 xb = _mm256_set1_ps(x[m * j.x_stride + k]);
      acc[m][0] = _mm256_fmadd_ps(w0, xb, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(w1, xb, acc[m][1]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < 2; ++h) store8(j, m, b0 * kLanes + 8 * h, acc[m][h]);
}

// ---- GGUF blocks: Q8_0, Q4_0, Q4_1 kept as they are ---------------------------------------------
//
// A GGUF file's block-quantized weights, laid out once for streaming: per tile of 64 output
// channels and per group of 32 inputs (one GGUF block a channel), the channels' fp16 scales
// (and Q4_1's fp16 minimums), then their values in VNNI order: a 64-byte line holds 16 channels
// x 4 consecutive inputs, one 32-bit lane a channel.
//
//   q8 group (2176 B): d[64] fp16, then lines (k4 0..7, block 0..3): int8 + 128 as uint8
//   q4 group (1280 B): d[64], m[64] fp16, then lines (k8 0..3, block 0..3): the low nibbles
//                      inputs 8 k8 + 0..3, the high nibbles 8 k8 + 4..7
//
// Q4_0 (d (q - 8)) is served as Q4_1 with m = -8 d (exact in fp16). As llama.cpp does, the rows
// of x are quantized per group of 32 to int8 (a scale dx = max|x| / 127, rounded to nearest)
// and dotted with the weights' integers by AVX512-VNNI (vpdpbusd: uint8 x int8, 4 a lane):
//   q8: sum_k d w_k x_k = d dx (sum_k (w_k + 128) q_k - 128 sum_k q_k)
//   q4: sum_k (d w_k + m) x_k = d dx sum_k w_k q_k + m dx sum_k q_k
// The float accumulators take one group at a time; threads split the tiles.

constexpr int64_t kGroup = 32;
constexpr int64_t kTileLanes = kLanes * kTileBlocks;                       // 64 channels
constexpr int64_t kQ8GroupBytes = kTileLanes * 2 + kTileLanes * kGroup;      // 2176
constexpr int64_t kQ4GroupBytes = kTileLanes * 4 + kTileLanes * kGroup / 2;  // 1280

enum class Quant { kQ8, kQ4 };

bool g_vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
              __builtin_cpu_supports("f16c");

Quant quant_of(const at::Tensor& packed) {
  TORCH_CHECK(packed.dim() == 3 && (packed.size(2) == kQ8GroupBytes || packed.size(2) == kQ4GroupBytes),
              "a GGUF-packed weight is (tiles, groups, ", kQ8GroupBytes, " or ", kQ4GroupBytes, ") uint8");
  return packed.size(2) == kQ8GroupBytes ? Quant::kQ8 : Quant::kQ4;
}

struct QJob {
  const uint8_t* w;
  int64_t groups;
  int64_t group_bytes;
  const int32_t* xq;   // (rows, K / 4): x's int8 values, 4 a lane
  const float* dx;     // (rows, groups)
  const int32_t* xsum; // (rows, groups): sum of x's int8 values (q8)
  const float* xsumf;  // (rows, groups): dx times the sum of x's int8 values (q4)
  int64_t rows;
  int64_t n;
  const float* bias;
  float* out;          // (rows, n)
};

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")))


// One tile's blocks [b0, b0 + NB) (NB 4: the whole tile, or 2: a half) for M rows.
template <int M, int NB, Quant Q>
VNNI void tile_quant(const QJob& j, int64_t tile, int64_t b0) {
  __m512 acc[M][NB];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const uint8_t* base = j.w + tile * j.groups * j.group_bytes;
  const int64_t lanes4 = j.groups * kGroup / 4;  // x's int32 lanes a row
  for (int64_t g = 0; g < j.groups; ++g) {
    const uint8_t* gp = base + g * j.group_bytes;
    const uint8_t* values = gp + (Q == Quant::kQ8 ? 2 : 4) * kTileLanes;
    __m512i iacc[M][NB];
    for (int m = 0; m < M; ++m)
      for (int b = 0; b < NB; ++b) iacc[m][b] = _mm512_setzero_si512();
    constexpr int kLines = Q == Quant::kQ8 ? 8 : 4;  // lines a block in a group
    for (int c = 0; c < kLines; ++c) {
      const uint8_t* line = values + (c * kTileBlocks + b0) * 64;
      for (int b = 0; b < NB; ++b) _mm_prefetch(reinterpret_cast<const char*>(line + b * 64 + kPrefetchBytes), _MM_HINT_T0);
      if constexpr (Q == Quant::kQ8) {
        __m512i w[NB];
        for (int b = 0; b < NB; ++b) w[b] = _mm512_loadu_si512(line + b * 64);
        for (int m = 0; m < M; ++m) {
          const __m512i xb = _mm512_set1_epi32(j.xq[m * lanes4 + g * 8 + c]);
          for (int b = 0; b < NB; ++b) iacc[m][b] = _mm512_dpbusd_epi32(iacc[m][b], w[b], xb);
        }
      } else {
        __m512i lo[NB], hi[NB];
        for (int b = 0; b < NB; ++b) {
          const __m512i w = _mm512_loadu_si512(line + b * 64);
          lo[b] = _mm512_and_si512(w, low4);
          hi[b] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
        }
        for (int m = 0; m < M; ++m) {
          const __m512i xl = _mm512_set1_epi32(j.xq[m * lanes4 + g * 8 + 2 * c]);
          const __m512i xh = _mm512_set1_epi32(j.xq[m * lanes4 + g * 8 + 2 * c + 1]);
          for (int b = 0; b < NB; ++b) iacc[m][b] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(iacc[m][b], lo[b], xl), hi[b], xh);
        }
      }
    }
    for (int b = 0; b < NB; ++b) {
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gp + 2 * kLanes * (b0 + b))));
      __m512 mn = _mm512_setzero_ps();
      if constexpr (Q == Quant::kQ4)
        mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gp + 2 * kTileLanes + 2 * kLanes * (b0 + b))));
      for (int m = 0; m < M; ++m) {
        const int64_t rg = m * j.groups + g;
        __m512i dot = iacc[m][b];
        if constexpr (Q == Quant::kQ8) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * j.xsum[rg]));
        acc[m][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(j.dx[rg])), acc[m][b]);
        if constexpr (Q == Quant::kQ4) acc[m][b] = _mm512_fmadd_ps(mn, _mm512_set1_ps(j.xsumf[rg]), acc[m][b]);
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) store_lanes(j.out, j.n, nullptr, j.bias, m, tile * kTileLanes + (b0 + b) * kLanes, acc[m][b]);
}

using QTileFn = void (*)(const QJob&, int64_t, int64_t);

template <Quant Q>
QTileFn pick_quant(int64_t rows, int64_t* nb) {
  *nb = rows <= 2 ? 4 : 2;  // M x NB int32 and float accumulators in 32 registers
  switch (rows) {
    case 1: return tile_quant<1, 4, Q>;
    case 2: return tile_quant<2, 4, Q>;
    case 3: return tile_quant<3, 2, Q>;
    default: return tile_quant<4, 2, Q>;
  }
}

constexpr int64_t kQuantRows = 4;  // rows a pass

// rows of float x (row stride k) -> out (rows, n) = x @ W.T + bias through a GGUF-packed W
void matvec_quant(const float* x, int64_t rows, int64_t k, const at::Tensor& packed, int64_t n, const float* bias,
                  float* out) {
  TORCH_CHECK(g_vnni, "GGUF blocks need AVX512-VNNI and F16C (this CPU has not both)");
  const Quant q = quant_of(packed);
  const int64_t groups = packed.size(1);
  TORCH_CHECK(k == groups * kGroup, "linear: K mismatch (", k, " against ", groups, " groups of 32)");
  TORCH_CHECK(packed.size(0) * kTileLanes >= n && (packed.size(0) - 1) * kTileLanes < n, "linear: packed for another N");
  thread_local std::vector<int32_t> xq;
  thread_local std::vector<float> dx, xsumf;
  thread_local std::vector<int32_t> xsum;
  xq.resize(rows * k / 4);
  dx.resize(rows * groups);
  xsumf.resize(rows * groups);
  xsum.resize(rows * groups);
  int8_t* q8 = reinterpret_cast<int8_t*>(xq.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* xs = x + r * k + g * kGroup;
      float amax = 0.0f;
      for (int64_t i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(xs[i]));
      const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
      int32_t isum = 0;
      for (int64_t i = 0; i < kGroup; ++i) {
        const int32_t v = static_cast<int32_t>(std::nearbyint(xs[i] * inv));
        q8[r * k + g * kGroup + i] = static_cast<int8_t>(v);
        isum += v;
      }
      dx[r * groups + g] = d;
      xsum[r * groups + g] = isum;
      // the minimum's term takes x as quantized too (d dx isum, as llama.cpp's Q8_1 sum does):
      // then the result is exactly the dequantized W times the quantized x, whose error is
      // sum_k w_k (x_k - x^_k); x's own float sum here left d q_w (x - x^) with the integers'
      // mean of 7.5 biasing every term alike (top-1 agreement with llama.cpp 92.8 %)
      xsumf[r * groups + g] = d * static_cast<float>(isum);
    }
  const int64_t tiles = packed.size(0);
  for (int64_t r0 = 0; r0 < rows; r0 += kQuantRows) {
    QJob j{packed.data_ptr<uint8_t>(), groups, packed.size(2), xq.data() + r0 * k / 4, dx.data() + r0 * groups,
           xsum.data() + r0 * groups, xsumf.data() + r0 * groups, std::min(kQuantRows, rows - r0), n, bias,
           out + r0 * n};
    int64_t nb = 4;
    const QTileFn fn = q == Quant::kQ8 ? pick_quant<Quant::kQ8>(j.rows, &nb) : pick_quant<Quant::kQ4>(j.rows, &nb);
    const int64_t parts = kTileBlocks / nb;  // a tile in 1 or 2 parts
    at::parallel_for(0, tiles * parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) fn(j, t / parts, (t % parts) * nb);
    });
  }
}

// raw (N, K / 32 * block bytes) uint8: a GGUF tensor's rows of blocks ("q8_0": fp16 d, 32 int8;
// "q4_0": fp16 d, 16 bytes of nibbles; "q4_1": fp16 d, fp16 m, 16 bytes; a block's value i < 16
// in byte i's low nibble, 16 + i in its high one) -> the packed layout above. Rows past N are zeros.
at::Tensor pack_gguf(const at::Tensor& raw, const std::string& kind) {
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous(), "pack_gguf: raw (N, bytes) uint8");
  const bool is_q8 = kind == "q8_0", is_q4_0 = kind == "q4_0", is_q4_1 = kind == "q4_1";
  TORCH_CHECK(is_q8 || is_q4_0 || is_q4_1, "pack_gguf: q8_0, q4_0 or q4_1, not ", kind);
  const int64_t block_bytes = is_q8 ? 34 : (is_q4_0 ? 18 : 20);
  const int64_t n = raw.size(0);
  TORCH_CHECK(raw.size(1) % block_bytes == 0, "pack_gguf: rows of whole ", kind, " blocks");
  const int64_t groups = raw.size(1) / block_bytes;
  const int64_t tiles = ceil_div(n, kTileLanes);
  const int64_t gbytes = is_q8 ? kQ8GroupBytes : kQ4GroupBytes;
  at::Tensor out = at::zeros({tiles, groups, gbytes}, raw.options());
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = r / kTileLanes, c = r % kTileLanes, b = c / kLanes, lane = c % kLanes;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* blk = src + r * raw.size(1) + g * block_bytes;
      uint8_t* gp = dst + (t * groups + g) * gbytes;
      std::memcpy(gp + 2 * c, blk, 2);  // d
      if (is_q8) {
        const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
        for (int64_t i = 0; i < kGroup; ++i)
          gp[2 * kTileLanes + ((i / 4) * kTileBlocks + b) * 64 + lane * 4 + i % 4] = static_cast<uint8_t>(qs[i] + 128);
        continue;
      }
      uint16_t d_bits, m_bits;
      std::memcpy(&d_bits, blk, 2);
      if (is_q4_1) {
        std::memcpy(&m_bits, blk + 2, 2);
      } else {  // q4_0: d (q - 8) = d q + (-8 d)
        const float m = -8.0f * static_cast<float>(c10::Half(d_bits, c10::Half::from_bits()));
        m_bits = c10::Half(m).x;
      }
      std::memcpy(gp + 2 * kTileLanes + 2 * c, &m_bits, 2);
      const uint8_t* qs = blk + (is_q4_1 ? 4 : 2);
      for (int64_t i = 0; i < kGroup; ++i) {
        const uint8_t v = i < 16 ? (qs[i] & 0x0F) : (qs[i - 16] >> 4);
        const int64_t k8 = i / 8, within = i % 8;
        gp[4 * kTileLanes + (k8 * kTileBlocks + b) * 64 + lane * 4 + within % 4] |= static_cast<uint8_t>(v << (4 * (within / 4)));
      }
    }
  }
  return out;
}

bool gguf_kernels() { return g_vnni; }

// ---- dispatch --------------------------------------------------------------------------------

enum class Layout { kBf16, kInt8, kFp32 };

using TileFn = void (*)(const Job&, int64_t);

// NB blocks a tile: 4 while M * NB accumulators fit (M <= 4), else 2; avx2 takes one block.
template <int M>
TileFn pick(Isa isa, Layout layout, int64_t* nb) {
  if (isa == Isa::kAvx512Bf16) {
    constexpr int NB = M <= 4 ? 4 : 2;
    *nb = NB;
    switch (layout) {
      case Layout::kBf16: return tile_pairs_avx512<M, NB, false>;
      case Layout::kInt8: return tile_pairs_avx512<M, NB, true>;
      case Layout::kFp32: return tile_fp32_avx512<M, NB>;
    }
  }
  *nb = 1;
  if constexpr (M <= 4) {  // 16 ymm registers: 2 * M accumulators
    switch (layout) {
      case Layout::kBf16: return tile_pairs_avx2<M>;
      case Layout::kFp32: return tile_fp32_avx2<M>;
      default: break;
    }
  }
  return nullptr;
}

TileFn pick_rows(int64_t rows, Isa isa, Layout layout, int64_t* nb) {
  switch (rows) {
    case 1: return pick<1>(isa, layout, nb);
    case 2: return pick<2>(isa, layout, nb);
    case 3: return pick<3>(isa, layout, nb);
    case 4: return pick<4>(isa, layout, nb);
    case 5: return pick<5>(isa, layout, nb);
    case 6: return pick<6>(isa, layout, nb);
    case 7: return pick<7>(isa, layout, nb);
    default: return pick<8>(isa, layout, nb);
  }
}

int64_t max_rows(Isa isa) { return isa == Isa::kAvx512Bf16 ? kMaxRows : 4; }

// ---- ops -------------------------------------------------------------------------------------

std::string isa() { return isa_name(g_isa); }

void set_isa(const std::string& name) {
  const Isa detected = detect_isa();
  if (name == "auto") {
    g_isa = detected;
  } else if (name == "avx2" && detected != Isa::kNone) {
    g_isa = Isa::kAvx2;
  } else if (name == "none") {
    g_isa = Isa::kNone;
  } else if (name == "avx512bf16" && detected == Isa::kAvx512Bf16) {
    g_isa = detected;
  } else {
    TORCH_CHECK(false, "small_m_linear: cannot run ", name, " here (this CPU: ", isa_name(detected), ")");
  }
}

// (N, K) bf16 / int8 / fp32 -> the packed layout (see the top of the file), same dtype.
at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.device().is_cpu(), "pack: a 2-D CPU weight");
  const auto dtype = weight.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kChar || dtype == at::kFloat, "pack: bf16, int8 or fp32");
  const int64_t n = weight.size(0), k = weight.size(1), blocks = padded_blocks(n);
  at::Tensor w = at::zeros({blocks * kLanes, k + (dtype == at::kFloat ? 0 : k % 2)}, weight.options());
  w.narrow(0, 0, n).narrow(1, 0, k).copy_(weight);
  const int64_t tiles = blocks / kTileBlocks;
  if (dtype == at::kFloat) {  // (B*16, K) -> (B/4, K, 4, 16), shaped (B, K, 16)
    return w.view({tiles, kTileBlocks, kLanes, k}).permute({0, 3, 1, 2}).contiguous().view({blocks, k, kLanes});
  }
  const int64_t pairs = w.size(1) / 2;  // (B*16, 2P) -> (B/4, P, 4, 16, 2), shaped (B, P, 16, 2)
  return w.view({tiles, kTileBlocks, kLanes, pairs, 2})
      .permute({0, 3, 1, 2, 4})
      .contiguous()
      .view({blocks, pairs, kLanes, 2});
}

// The kernels over `rows` rows of float activations x (row stride k), into float out (rows, n):
// x @ W.T * scale + bias. bf16 and int8 weights read x rounded to bf16 (exact for rows that are
// bf16 values already); fp32 weights read it as it is.
void matvec(const float* x, int64_t rows, int64_t k, const at::Tensor& packed, int64_t n, const float* scale,
            const float* bias, float* out) {
  if (packed.scalar_type() == at::kByte) {
    TORCH_CHECK(scale == nullptr, "linear: GGUF blocks carry their own scales");
    matvec_quant(x, rows, k, packed, n, bias, out);
    return;
  }
  TORCH_CHECK(g_isa != Isa::kNone, "small_m_linear: no kernel for this CPU");
  const auto wdtype = packed.scalar_type();
  const Layout layout = wdtype == at::kFloat ? Layout::kFp32 : (wdtype == at::kChar ? Layout::kInt8 : Layout::kBf16);
  TORCH_CHECK(layout != Layout::kInt8 || scale != nullptr, "linear: int8 weights need their scales");
  TORCH_CHECK(layout != Layout::kInt8 || g_isa == Isa::kAvx512Bf16, "linear: int8 weights need avx512bf16");
  const int64_t blocks = packed.size(0);
  TORCH_CHECK(blocks == padded_blocks(n), "linear: packed for another N");

  Job j{};
  j.w = packed.data_ptr();
  j.n = n;
  j.scale = scale;
  j.bias = bias;
  // the rows as the kernel reads them: bf16 pairs (as int32) on avx512, else floats; K padded even
  const bool pairs_bf16 = layout != Layout::kFp32 && g_isa == Isa::kAvx512Bf16;
  int64_t width;
  if (layout == Layout::kFp32) {
    TORCH_CHECK(packed.size(1) == k, "linear: K mismatch");
    j.depth = k;
    j.block_stride = k * kLanes;
    width = k;
  } else {
    const int64_t pairs = packed.size(1);
    TORCH_CHECK(pairs == ceil_div(k, 2), "linear: K mismatch");
    j.depth = pairs;
    j.block_stride = pairs * 2 * kLanes;
    width = 2 * pairs;
  }
  thread_local std::vector<uint16_t> xh;
  thread_local std::vector<float> xf;
  if (pairs_bf16) {
    xh.assign(rows * width, 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i) xh[r * width + i] = to_bf16(x[r * k + i]);
    j.x_stride = width / 2;  // int32 pairs a row
  } else {
    xf.assign(rows * width, 0.0f);
    for (int64_t r = 0; r < rows; ++r) std::memcpy(&xf[r * width], x + r * k, k * sizeof(float));
    j.x_stride = width;
  }
  const int64_t step = max_rows(g_isa);
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    Job pass = j;
    pass.rows = std::min(step, rows - r0);
    pass.x = pairs_bf16 ? static_cast<const void*>(xh.data() + r0 * width) : static_cast<const void*>(xf.data() + r0 * width);
    pass.out = out + r0 * n;
    int64_t nb = 1;
    const TileFn fn = pick_rows(pass.rows, g_isa, layout, &nb);
    TORCH_CHECK(fn != nullptr, "small_m_linear: no ", isa_name(g_isa), " kernel for this weight dtype");
    const int64_t tiles = blocks / nb;
    at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) fn(pass, t * nb);
    });
  }
}

const float* opt_float(const std::optional<at::Tensor>& t, int64_t n, const char* what) {
  if (!t) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->numel() == n && t->is_contiguous(), what, ": (N,) float32");
  return t->data_ptr<float>();
}

// x (M, K) -> (M, N). bf16 weights take bf16 x; int8 weights bf16 x (scale required); fp32
// weights fp32 x. scale, bias: float32 (N,) or none. out_float: float32 out, else bf16.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& scale,
                  const std::optional<at::Tensor>& bias, bool out_float) {
  TORCH_CHECK(x.dim() == 2, "linear: x is (M, K)");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({x.size(0), n}, x.options().dtype(at::kFloat));
  matvec(xf.data_ptr<float>(), x.size(0), x.size(1), packed, n, opt_float(scale, n, "scale"),
         opt_float(bias, n, "bias"), out.data_ptr<float>());
  return out_float ? out : out.to(at::kBFloat16);
}

// ---- a decoder layer's two halves at small M (models/llama.py's DecoderLayer) ----------------
//
// The same arithmetic as the layer's eager torch ops, rounded where they round: with bf16
// activations every op's result is rounded to bf16 (round-to-nearest-even, as torch's
// conversions), with float32 ones nothing is. A linear's bias is added in float32 before its one
// rounding, as the kernels' op does. What eager code does in ~20 torch calls a half, each with
// its dispatch, allocation and (for the norms) a parallel region, is one call here.

struct Act {
  bool bf16;
  float operator()(float v) const { return bf16 ? from_bf16(to_bf16(v)) : v; }
};

// A bf16 or float32 tensor's values as floats (read in place: no torch op on the way)
std::vector<float> rows_float(const at::Tensor& t) {
  const at::Tensor c = t.is_contiguous() ? t : t.contiguous();
  const int64_t n = c.numel();
  std::vector<float> v(n);
  if (c.scalar_type() == at::kBFloat16) {
    const uint16_t* p = static_cast<const uint16_t*>(c.data_ptr());
    for (int64_t i = 0; i < n; ++i) v[i] = from_bf16(p[i]);
  } else {
    TORCH_CHECK(c.scalar_type() == at::kFloat, "bf16 or float32 activations and norms");
    std::memcpy(v.data(), c.data_ptr<float>(), n * sizeof(float));
  }
  return v;
}

// floats -> a new tensor of `options`' dtype (bf16: rounded to nearest even, as torch rounds)
at::Tensor to_tensor(const std::vector<float>& v, at::IntArrayRef shape, const at::TensorOptions& options) {
  at::Tensor out = at::empty(shape, options);
  const int64_t n = out.numel();
  if (out.scalar_type() == at::kBFloat16) {
    uint16_t* p = static_cast<uint16_t*>(out.data_ptr());
    for (int64_t i = 0; i < n; ++i) p[i] = to_bf16(v[i]);
  } else {
    std::memcpy(out.data_ptr<float>(), v.data(), n * sizeof(float));
  }
  return out;
}

// RMSNorm as models/llama.py's: x * rsqrt(mean(x^2) + eps), rounded, then times the weight, rounded.
void rms_norm(const float* x, int64_t rows, int64_t h, const float* w, double eps, Act act, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    float ss = 0.0f;
    for (int64_t i = 0; i < h; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(h) + static_cast<float>(eps));
    for (int64_t i = 0; i < h; ++i) out[r * h + i] = act(w[i] * act(xr[i] * inv));
  }
}

struct Linear {
  at::Tensor packed;
  int64_t n;
  const float* scale;
  const float* bias;
};

Linear as_linear(const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& scale,
                 const std::optional<at::Tensor>& bias) {
  return Linear{packed, n, opt_float(scale, n, "scale"), opt_float(bias, n, "bias")};
}

// y = act(x @ W.T * scale + bias), (rows, n)
std::vector<float> apply(const Linear& l, const std::vector<float>& x, int64_t rows, Act act) {
  std::vector<float> y(rows * l.n);
  matvec(x.data(), rows, static_cast<int64_t>(x.size()) / rows, l.packed, l.n, l.scale, l.bias, y.data());
  if (act.bf16)
    for (auto& v : y) v = act(v);
  return y;
}

struct Dims {
  int64_t rows, hidden, heads, kv_heads, head_dim, inter;
  int64_t q_size() const { return heads * head_dim; }
  int64_t kv_size() const { return kv_heads * head_dim; }
};

// x (M, H) -> q (M, Hq, D), k, v (M, Hkv, D): the input norm, q|k|v and RoPE (halves rotated);
// c, s: cos and sin (M, D)
void attn_in_core(const std::vector<float>& x, const float* norm_w, double eps, const Linear& qkv,
                  const std::vector<float>& c, const std::vector<float>& s, const Dims& d, Act act, std::vector<float>& q,
                  std::vector<float>& k, std::vector<float>& v) {
  const int64_t qs = d.q_size(), ks = d.kv_size(), hd = d.head_dim, half = hd / 2;
  std::vector<float> normed(d.rows * d.hidden);
  rms_norm(x.data(), d.rows, d.hidden, norm_w, eps, act, normed.data());
  const std::vector<float> y = apply(qkv, normed, d.rows, act);  // (M, q | k | v)
  q.resize(d.rows * qs);
  k.resize(d.rows * ks);
  v.resize(d.rows * ks);
  for (int64_t r = 0; r < d.rows; ++r) {
    const float* yr = &y[r * qkv.n];
    const float* cr = &c[r * hd];
    const float* sr = &s[r * hd];
    auto rope = [&](const float* src, float* dst, int64_t nh) {
      for (int64_t hh = 0; hh < nh; ++hh) {
        const float* xs = src + hh * hd;
        float* o = dst + hh * hd;
        for (int64_t i = 0; i < hd; ++i) {
          const float rot = i < half ? -xs[i + half] : xs[i - half];
          o[i] = act(act(xs[i] * cr[i]) + act(rot * sr[i]));
        }
      }
    };
    rope(yr, &q[r * qs], d.heads);
    rope(yr + qs, &k[r * ks], d.kv_heads);
    std::memcpy(&v[r * ks], yr + qs + ks, ks * sizeof(float));
  }
}

struct MlpWeights {
  Linear o, gate_up, down;
  const float *post1, *norm, *post2;  // (H,) float32 each; post norms null where the layer has none
};

// x (M, H), the residual stream, updated in place with attention's output a (M, Hq * D): o,
// [post norm], [x mult], the residual add, the MLP's norm, gate|up, SiLU(gate) * up, down,
// [post norm], [x mult], the residual add.
void attn_out_mlp_core(std::vector<float>& x, const std::vector<float>& a, const MlpWeights& w, double mult, double eps,
                       const Dims& d, Act act) {
  const int64_t rows = d.rows, hidden = d.hidden, inter = d.inter;
  const auto finish = [&](std::vector<float>& t, const float* post) {
    if (post != nullptr) {
      std::vector<float> n(t.size());
      rms_norm(t.data(), rows, hidden, post, eps, act, n.data());
      t.swap(n);
    }
    if (mult != 1.0)
      for (auto& e : t) e = act(e * static_cast<float>(mult));
    for (int64_t i = 0; i < rows * hidden; ++i) x[i] = act(x[i] + t[i]);
  };
  std::vector<float> t = apply(w.o, a, rows, act);
  finish(t, w.post1);
  std::vector<float> normed(rows * hidden);
  rms_norm(x.data(), rows, hidden, w.norm, eps, act, normed.data());
  const std::vector<float> gu = apply(w.gate_up, normed, rows, act);  // (M, gate | up)
  std::vector<float> m(rows * inter);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gu[r * 2 * inter + i], u = gu[r * 2 * inter + inter + i];
      m[r * inter + i] = act(act(g / (1.0f + std::exp(-g))) * u);
    }
  t = apply(w.down, m, rows, act);
  finish(t, w.post2);
}

std::vector<float> opt_rows(const std::optional<at::Tensor>& t) { return t ? rows_float(*t) : std::vector<float>{}; }

const float* data_or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

// A norm's weight read in place: float32, contiguous, (H,) (decode_layers' callers convert once)
const float* norm_in_place(const std::optional<at::Tensor>& t, int64_t h) {
  if (!t) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == h,
              "decode_layers: norm weights are (H,) float32, contiguous");
  return t->data_ptr<float>();
}

// h (M, H) -> q (M, Hq, D), k, v (M, Hkv, D): the input norm, q|k|v and RoPE (halves rotated).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attn_in(
    const at::Tensor& h, const at::Tensor& norm_w, double eps, const at::Tensor& qkv, const std::optional<at::Tensor>& qkv_scale,
    const std::optional<at::Tensor>& qkv_bias, const at::Tensor& cos, const at::Tensor& sin, int64_t heads, int64_t kv_heads,
    int64_t head_dim) {
  TORCH_CHECK(h.dim() == 2 && cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(0) == h.size(0) &&
              cos.size(1) == head_dim, "attn_in: h (M, H), cos and sin (M, D)");
  const Act act{h.scalar_type() == at::kBFloat16};
  const Dims d{h.size(0), h.size(1), heads, kv_heads, head_dim, 0};
  std::vector<float> q, k, v;
  const std::vector<float> norm = rows_float(norm_w);
  attn_in_core(rows_float(h), norm.data(), eps, as_linear(qkv, d.q_size() + 2 * d.kv_size(), qkv_scale, qkv_bias),
               rows_float(cos), rows_float(sin), d, act, q, k, v);
  const auto opts = h.options();
  return {to_tensor(q, {d.rows, heads, head_dim}, opts), to_tensor(k, {d.rows, kv_heads, head_dim}, opts),
          to_tensor(v, {d.rows, kv_heads, head_dim}, opts)};
}

// h (M, H), attention's output a (M, Hq * D) -> the layer's output (M, H) (attn_out_mlp_core).
at::Tensor attn_out_mlp(const at::Tensor& h, const at::Tensor& a, const at::Tensor& o, const std::optional<at::Tensor>& o_scale,
                        const std::optional<at::Tensor>& o_bias, const std::optional<at::Tensor>& post1_w, double mult,
                        const at::Tensor& norm_w, double eps, const at::Tensor& gate_up, int64_t inter,
                        const std::optional<at::Tensor>& gate_up_scale, const std::optional<at::Tensor>& gate_up_bias,
                        const at::Tensor& down, const std::optional<at::Tensor>& down_scale,
                        const std::optional<at::Tensor>& down_bias, const std::optional<at::Tensor>& post2_w) {
  TORCH_CHECK(h.dim() == 2 && a.dim() == 2 && a.size(0) == h.size(0), "attn_out_mlp: h (M, H), a (M, Hq * D)");
  const Act act{h.scalar_type() == at::kBFloat16};
  const Dims d{h.size(0), h.size(1), 0, 0, 0, inter};
  const std::vector<float> post1 = opt_rows(post1_w), norm = rows_float(norm_w), post2 = opt_rows(post2_w);
  const MlpWeights w{as_linear(o, d.hidden, o_scale, o_bias), as_linear(gate_up, 2 * inter, gate_up_scale, gate_up_bias),
                     as_linear(down, d.hidden, down_scale, down_bias), data_or_null(post1), norm.data(),
                     data_or_null(post2)};
  std::vector<float> x = rows_float(h);
  attn_out_mlp_core(x, rows_float(a), w, mult, eps, d, act);
  return to_tensor(x, {d.rows, d.hidden}, h.options());
}

// ---- every decoder layer of a decode step in one call -----------------------------------------
//
// attention/cpu_paged.c's paged_decode, called through its address (the caller's ctypes handle
// of that library): it writes each row's K/V into the paged cache at its slot, then attends over
// the row's context through its block table, in place.
using PagedDecode = void (*)(const float* q, const uint16_t* q_bf16, void* k_cache, void* v_cache, int bf16,
                             const int64_t* table, int64_t width, const int64_t* num_cached, const float* k_new,
                             const float* v_new, void* out, int64_t b_count, int64_t h_count, int64_t g_count, int64_t d,
                             int64_t bs, float scale, int threads, const char* k_rows, const char* v_rows,
                             int64_t k_stride, int64_t v_stride, const int64_t* slots, int out_bf16);

constexpr int64_t kPerLayer = 16;  // weights a layer: see decode_layers

// h (M, H) -> the last layer's output (M, H), every layer as attn_in, paged_decode and
// attn_out_mlp. weights: kPerLayer a layer, in order (norms float32): input norm; q|k|v packed, scale, bias;
// o packed, scale, bias; post norm 1; MLP norm; gate|up packed, scale, bias; down packed,
// scale, bias; post norm 2 (absent ones None). k_caches, v_caches: a layer's each, (blocks,
// block size, Hkv, D) in h's dtype. block_table (M, W), context_lens (M,), slots (M,): int64.
at::Tensor decode_layers(const at::Tensor& h, const at::Tensor& cos, const at::Tensor& sin,
                         const c10::List<std::optional<at::Tensor>>& weights, at::TensorList k_caches,
                         at::TensorList v_caches, const at::Tensor& block_table, const at::Tensor& context_lens,
                         const at::Tensor& slots, int64_t attend, double scale, double eps, double mult, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, int64_t inter) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(h.dim() == 2 && cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(0) == h.size(0) &&
              cos.size(1) == head_dim, "decode_layers: h (M, H), cos and sin (M, D)");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * kPerLayer && v_caches.size() == k_caches.size(),
              "decode_layers: ", kPerLayer, " weights and a K and V cache a layer");
  const int64_t rows = h.size(0);
  TORCH_CHECK(block_table.scalar_type() == at::kLong && block_table.dim() == 2 && block_table.size(0) == rows &&
              block_table.is_contiguous() && context_lens.scalar_type() == at::kLong && context_lens.numel() == rows &&
              context_lens.is_contiguous() && slots.scalar_type() == at::kLong && slots.numel() == rows &&
              slots.is_contiguous(), "decode_layers: block_table (M, W), context_lens, slots (M,): contiguous int64");
  TORCH_CHECK(attend != 0 && heads % kv_heads == 0, "decode_layers: the attention entry point, and GQA heads");
  const Act act{h.scalar_type() == at::kBFloat16};
  const Dims d{rows, h.size(1), heads, kv_heads, head_dim, inter};
  const auto fn = reinterpret_cast<PagedDecode>(attend);
  const std::vector<float> c = rows_float(cos), s = rows_float(sin);
  const int64_t qs = d.q_size(), ks = d.kv_size();
  const int threads = at::get_num_threads();
  auto w = [&](int64_t layer, int64_t i) { return weights.get(layer * kPerLayer + i); };
  auto req = [&](int64_t layer, int64_t i) {
    const std::optional<at::Tensor> t = w(layer, i);
    TORCH_CHECK(t.has_value(), "decode_layers: layer ", layer, " lacks weight ", i);
    return *t;
  };

  std::vector<float> x = rows_float(h), q, k, v, a(rows * qs);
  std::vector<uint16_t> q_bf16(act.bf16 ? rows * qs : 0), kv_bf16;
  for (int64_t layer = 0; layer < layers; ++layer) {
    const at::Tensor& kc = k_caches[layer];
    const at::Tensor& vc = v_caches[layer];
    TORCH_CHECK(kc.scalar_type() == h.scalar_type() && vc.scalar_type() == h.scalar_type() && kc.is_contiguous() &&
                vc.is_contiguous() && kc.dim() == 4 && kc.size(2) == kv_heads && kc.size(3) == head_dim &&
                kc.sizes() == vc.sizes(), "decode_layers: K/V caches (blocks, block size, Hkv, D) in h's dtype");
    attn_in_core(x, norm_in_place(req(layer, 0), d.hidden), eps, as_linear(req(layer, 1), qs + 2 * ks, w(layer, 2), w(layer, 3)),
                 c, s, d, act, q, k, v);
    const char* k_rows = reinterpret_cast<const char*>(k.data());
    const char* v_rows = reinterpret_cast<const char*>(v.data());
    int64_t row_bytes = ks * static_cast<int64_t>(sizeof(float));
    if (act.bf16) {  // the cache's dtype: bf16 rows, and q as stored for the kernel's bf16 dot
      for (int64_t i = 0; i < rows * qs; ++i) q_bf16[i] = to_bf16(q[i]);
      kv_bf16.resize(2 * rows * ks);
      for (int64_t i = 0; i < rows * ks; ++i) {
        kv_bf16[i] = to_bf16(k[i]);
        kv_bf16[rows * ks + i] = to_bf16(v[i]);
      }
      k_rows = reinterpret_cast<const char*>(kv_bf16.data());
      v_rows = reinterpret_cast<const char*>(kv_bf16.data() + rows * ks);
      row_bytes = ks * 2;
    }
    fn(q.data(), act.bf16 ? q_bf16.data() : nullptr, kc.data_ptr(), vc.data_ptr(), act.bf16 ? 1 : 0,
       block_table.data_ptr<int64_t>(), block_table.size(1), context_lens.data_ptr<int64_t>(), nullptr, nullptr, a.data(),
       rows, kv_heads, heads / kv_heads, head_dim, kc.size(1), static_cast<float>(scale), threads, k_rows, v_rows,
       row_bytes, row_bytes, slots.data_ptr<int64_t>(), 0);
    if (act.bf16)
      for (auto& e : a) e = act(e);
    const MlpWeights mw{as_linear(req(layer, 4), d.hidden, w(layer, 5), w(layer, 6)),
                        as_linear(req(layer, 9), 2 * inter, w(layer, 10), w(layer, 11)),
                        as_linear(req(layer, 12), d.hidden, w(layer, 13), w(layer, 14)),
                        norm_in_place(w(layer, 7), d.hidden), norm_in_place(req(layer, 8), d.hidden),
                        norm_in_place(w(layer, 15), d.hidden)};
    attn_out_mlp_core(x, a, mw, mult, eps, d, act);
  }
  return to_tensor(x, {rows, d.hidden}, h.options());
}

}  // namespace

TORCH_LIBRARY(omni_small_m, m) {
  m.def("isa() -> str", &isa);
  m.def("set_isa(str name) -> ()", &set_isa);
  m.def("pack(Tensor weight) -> Tensor", &pack);
  m.def("pack_gguf(Tensor raw, str kind) -> Tensor", &pack_gguf);
  m.def("gguf_kernels() -> bool", &gguf_kernels);
  m.def("linear(Tensor x, Tensor packed, int n, Tensor? scale, Tensor? bias, bool out_float) -> Tensor", &linear);
  m.def("attn_in(Tensor h, Tensor norm_w, float eps, Tensor qkv, Tensor? qkv_scale, Tensor? qkv_bias, Tensor cos, "
        "Tensor sin, int heads, int kv_heads, int head_dim) -> (Tensor, Tensor, Tensor)", &attn_in);
  m.def("attn_out_mlp(Tensor h, Tensor a, Tensor o, Tensor? o_scale, Tensor? o_bias, Tensor? post1_w, float mult, "
        "Tensor norm_w, float eps, Tensor gate_up, int inter, Tensor? gate_up_scale, Tensor? gate_up_bias, "
        "Tensor down, Tensor? down_scale, Tensor? down_bias, Tensor? post2_w) -> Tensor", &attn_out_mlp);
  m.def("decode_layers(Tensor h, Tensor cos, Tensor sin, Tensor?[] weights, Tensor[] k_caches, Tensor[] v_caches, "
        "Tensor block_table, Tensor context_lens, Tensor slots, int attend, float scale, float eps, float mult, "
        "int heads, int kv_heads, int head_dim, int inter) -> Tensor", &decode_layers);
}
