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

#include <immintrin.h>

#include <algorithm>
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
  void* out;            // (rows, N) float or bf16, row stride N
  bool out_bf16;
};

// Elements from the weight's start to block `block`'s lanes at k pair (or k) `p`; unit is the
// elements of one block at one p (32 for pairs, 16 for fp32).
inline int64_t woff(const Job& j, int64_t block, int64_t p, int64_t unit) {
  return (block / kTileBlocks) * j.block_stride * kTileBlocks + (p * kTileBlocks + block % kTileBlocks) * unit;
}

// ---- avx512bf16 ------------------------------------------------------------------------------

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

AVX512 inline void store16(const Job& j, int64_t row, int64_t n0, __m512 v) {
  const int64_t count = std::min<int64_t>(kLanes, j.n - n0);
  if (count <= 0) return;
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
  if (j.scale) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, j.scale + n0));
  if (j.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, j.bias + n0));
  if (j.out_bf16) {
    __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(j.out) + row * j.n + n0, mask, h);
  } else {
    _mm512_mask_storeu_ps(static_cast<float*>(j.out) + row * j.n + n0, mask, v);
  }
}

// Widens 32 int8 (16 lanes x a k pair) to 32 bf16 in the same order.
AVX512 inline __m512bh widen_int8(const int8_t* src) {
  __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
  __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16))));
  return _mm512_cvtne2ps_pbh(hi, lo);
}

template <int M, int NB, bool kInt8>
AVX512 void tile_pairs_avx512(const Job& j, int64_t b0) {
  __m512 acc[M][NB];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  const int32_t* x = static_cast<const int32_t*>(j.x);
  for (int64_t p = 0; p < j.depth; ++p) {
    __m512bh wv[NB];
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
  float* outf = static_cast<float*>(j.out) + row * j.n + n0;
  uint16_t* outh = static_cast<uint16_t*>(j.out) + row * j.n + n0;
  for (int64_t i = 0; i < count; ++i) {
    float f = buf[i];
    if (j.scale) f *= j.scale[n0 + i];
    if (j.bias) f += j.bias[n0 + i];
    if (j.out_bf16) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even (finite values)
      outh[i] = static_cast<uint16_t>(u >> 16);
    } else {
      outf[i] = f;
    }
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

// x (M, K) -> (M, N). bf16 weights take bf16 x; int8 weights bf16 x (scale required); fp32
// weights fp32 x. scale, bias: float32 (N,) or none. out_float: float32 out, else bf16.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& scale,
                  const std::optional<at::Tensor>& bias, bool out_float) {
  TORCH_CHECK(g_isa != Isa::kNone, "small_m_linear: no kernel for this CPU");
  TORCH_CHECK(x.dim() == 2, "linear: x is (M, K)");
  const auto wdtype = packed.scalar_type();
  const Layout layout = wdtype == at::kFloat ? Layout::kFp32 : (wdtype == at::kChar ? Layout::kInt8 : Layout::kBf16);
  TORCH_CHECK(layout != Layout::kInt8 || scale.has_value(), "linear: int8 weights need their scales");
  TORCH_CHECK(layout != Layout::kInt8 || g_isa == Isa::kAvx512Bf16, "linear: int8 weights need avx512bf16");
  const int64_t rows = x.size(0), k = x.size(1);
  const int64_t blocks = packed.size(0);
  TORCH_CHECK(blocks == padded_blocks(n), "linear: packed for another N");
  if (scale) TORCH_CHECK(scale->scalar_type() == at::kFloat && scale->numel() == n && scale->is_contiguous(), "scale: (N,) float32");
  if (bias) TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == n && bias->is_contiguous(), "bias: (N,) float32");

  Job j{};
  j.w = packed.data_ptr();
  at::Tensor xin;
  if (layout == Layout::kFp32) {
    TORCH_CHECK(packed.size(1) == k, "linear: K mismatch");
    xin = x.to(at::kFloat).contiguous();
    j.depth = k;
    j.block_stride = k * kLanes;
  } else {
    const int64_t pairs = packed.size(1);
    TORCH_CHECK(pairs == ceil_div(k, 2), "linear: K mismatch");
    j.depth = pairs;
    j.block_stride = pairs * 2 * kLanes;
    // avx512 reads bf16 pairs as int32 (K padded to even); avx2 reads floats
    xin = at::zeros({rows, 2 * pairs}, x.options().dtype(g_isa == Isa::kAvx512Bf16 ? at::kBFloat16 : at::kFloat));
    xin.narrow(1, 0, k).copy_(x);
  }
  j.x_stride = g_isa == Isa::kAvx512Bf16 && layout != Layout::kFp32 ? j.depth : xin.size(1);
  j.n = n;
  j.scale = scale ? scale->data_ptr<float>() : nullptr;
  j.bias = bias ? bias->data_ptr<float>() : nullptr;
  j.out_bf16 = !out_float;
  at::Tensor out = at::empty({rows, n}, x.options().dtype(out_float ? at::kFloat : at::kBFloat16));

  const int64_t step = max_rows(g_isa);
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    Job pass = j;
    pass.rows = std::min(step, rows - r0);
    const size_t xsize = layout == Layout::kFp32 || g_isa != Isa::kAvx512Bf16 ? sizeof(float) : sizeof(int32_t);
    pass.x = static_cast<const char*>(xin.data_ptr()) + r0 * j.x_stride * xsize;
    pass.out = static_cast<char*>(out.data_ptr()) + r0 * n * (out_float ? sizeof(float) : sizeof(uint16_t));
    int64_t nb = 1;
    const TileFn fn = pick_rows(pass.rows, g_isa, layout, &nb);
    TORCH_CHECK(fn != nullptr, "small_m_linear: no ", isa_name(g_isa), " kernel for this weight dtype");
    const int64_t tiles = blocks / nb;
    at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) fn(pass, t * nb);
    });
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(omni_small_m, m) {
  m.def("isa() -> str", &isa);
  m.def("set_isa(str name) -> ()", &set_isa);
  m.def("pack(Tensor weight) -> Tensor", &pack);
  m.def("linear(Tensor x, Tensor packed, int n, Tensor? scale, Tensor? bias, bool out_float) -> Tensor", &linear);
}
