/* The paged CPU attention kernel: decode rows and continuing prefill chunks read the paged KV
   cache in place. Built at first use by cpu_paged.py (its docstring says how and why), which
   calls the two exported functions, paged_decode and paged_prefill, through ctypes. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Eight floats: one AVX register, as GCC / clang vector extensions (no intrinsics). */
typedef float v8 __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
#define INLINE static inline __attribute__((always_inline))
#define MAX_CHUNKS 32 /* head dims up to 256 */

INLINE v8 load(const float *p) { v8 x; memcpy(&x, p, sizeof x); return x; }
INLINE void store(float *p, v8 x) { memcpy(p, &x, sizeof x); }
INLINE v8 load_bf16(const uint16_t *p) {
    v8h h;
    memcpy(&h, p, sizeof h);
    return (v8)(__builtin_convertvector(h, v8u) << 16);
}

/* n (a multiple of 8) bf16 values to fp32: 16 at a time where n allows */
INLINE void widen(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v16h h;
        memcpy(&h, src + i, sizeof h);
        v16 f = (v16)(__builtin_convertvector(h, v16u) << 16);
        memcpy(dst + i, &f, sizeof f);
    }
    for (; i < n; i += 8) store(dst + i, load_bf16(src + i));
}

/* Lane i of the result: the sum of p[i]'s lanes (a transpose-and-add tree). */
INLINE v8 hsum8(const v8 *p) {
    v8 a[4], b[2];
    for (int i = 0; i < 4; i++)
        a[i] = __builtin_shufflevector(p[2 * i], p[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14)
             + __builtin_shufflevector(p[2 * i], p[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int i = 0; i < 2; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13)
             + __builtin_shufflevector(a[2 * i], a[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return __builtin_shufflevector(b[0], b[1], 0, 1, 2, 3, 8, 9, 10, 11)
         + __builtin_shufflevector(b[0], b[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

/* exp(x) for x <= 0 (a score minus its running max): Cody-Waite reduction, degree-6 Taylor
   (relative error ~2e-7), 0 below -87; written so that `omp simd` vectorizes it. */
INLINE float exp_neg(float x) {
    float y = x < -87.0f ? -87.0f : x;
    float n = rintf(y * 1.44269504088896341f);
    float r = y - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)((int32_t)n + 127) << 23;
    return x < -87.0f ? 0.0f : p * c.f;
}

/* Per-task state: scores s (G x stride), running max m and sum l, accumulators acc (G x D). */
typedef struct { float *s, *m, *l, *acc; int64_t stride; } State;

/* The scaled scores of cnt keys (rows k + t * ks) against the g_count rows of q (each D), into
   st.s. Two rows at a time share each key's loads; per group of 8 keys the 16 dot products are
   16 independent FMA chains over D (enough to hide the FMA latency), each group's 8 sums of a row
   then added together (a transpose-and-add tree). DOT(acc, q, k) is acc + q . k over one load: 8
   floats (fp32), or 16 bf16 pairs by the CPU's bf16 dot product (exact products, fp32 sums). */
#define SCORE_ROWS(NAME, T, STEP, LOADQ, LOADK, DOT)                                                            \
    INLINE void NAME(State st, const T *q, const T *k, int64_t ks, int64_t cnt, int64_t g_count, int64_t d,     \
                     float scale) {                                                                             \
        for (int64_t g0 = 0; g0 < g_count; g0 += 2) {                                                           \
            const int two = g0 + 1 < g_count;                                                                   \
            const T *q0 = q + g0 * d, *q1 = two ? q0 + d : q0;                                                  \
            for (int64_t t0 = 0; t0 < cnt; t0 += 8) {                                                           \
                v8 p0[8], p1[8];                                                                                \
                for (int j = 0; j < 8; j++) p0[j] = (v8){0}, p1[j] = (v8){0};                                   \
                const int64_t n = cnt - t0 < 8 ? cnt - t0 : 8;                                                  \
                if (n == 8) {                                                                                   \
                    for (int64_t c = 0; c < d / STEP; c++) {                                                    \
                        LOADQ(a, q0 + STEP * c);                                                                \
                        LOADQ(b, q1 + STEP * c);                                                                \
                        for (int j = 0; j < 8; j++) {                                                           \
                            LOADK(x, k + (t0 + j) * ks + STEP * c);                                             \
                            p0[j] = DOT(p0[j], a, x), p1[j] = DOT(p1[j], b, x);                                 \
                        }                                                                                       \
                    }                                                                                           \
                } else {                                                                                        \
                    for (int64_t j = 0; j < n; j++)                                                             \
                        for (int64_t c = 0; c < d / STEP; c++) {                                                \
                            LOADQ(a, q0 + STEP * c);                                                            \
                            LOADQ(b, q1 + STEP * c);                                                            \
                            LOADK(x, k + (t0 + j) * ks + STEP * c);                                             \
                            p0[j] = DOT(p0[j], a, x), p1[j] = DOT(p1[j], b, x);                                 \
                        }                                                                                       \
                }                                                                                               \
                store(st.s + g0 * st.stride + t0, hsum8(p0) * scale);                                           \
                if (two) store(st.s + (g0 + 1) * st.stride + t0, hsum8(p1) * scale);                            \
            }                                                                                                   \
        }                                                                                                       \
    }

#define LOAD_F32(name, p) v8 name = load(p)
#define DOT_F32(acc, a, x) ((acc) + (a) * (x))
SCORE_ROWS(score_rows, float, 8, LOAD_F32, LOAD_F32, DOT_F32)

#ifdef __AVX512BF16__
#include <immintrin.h>
#define HAVE_DPBF16 1
#define LOAD_BF16(name, p) __m256bh name = (__m256bh)_mm256_loadu_si256((const __m256i *)(p))
#define DOT_BF16(acc, a, x) ((v8)_mm256_dpbf16_ps((__m256)(acc), a, x))
/* bf16 keys against bf16 queries, without widening the keys; d a multiple of 16 */
SCORE_ROWS(score_rows_bf16, uint16_t, 16, LOAD_BF16, LOAD_BF16, DOT_BF16)
#else
#define HAVE_DPBF16 0
#define score_rows_bf16(...) abort()
#endif

/* Row g's online-softmax step over the cnt scores in st.s: they become their exponentials (less
   the new running max), its max and sum are updated; returns the factor its accumulator takes. */
INLINE float softmax_step(State st, int64_t g, int64_t cnt) {
    float *s = st.s + g * st.stride, peak = st.m[g], sum = 0.0f;
    for (int64_t t = 0; t < cnt; t++) peak = s[t] > peak ? s[t] : peak;
    float corr = exp_neg(st.m[g] - peak); /* 0 while nothing was seen (m = -inf) */
    st.m[g] = peak;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < cnt; t++) {
        s[t] = exp_neg(s[t] - peak);
        sum += s[t];
    }
    st.l[g] = st.l[g] * corr + sum;
    return corr;
}

/* Fold the cnt scores in st.s and their fp32 values (rows v + t * vs) into the online softmax.
   With pairs (a prefill tile's many rows) two rows at a time share each value's loads; without
   (a decode row's G), one at a time, which measured 3-9 % faster there (bound by memory, not by
   loads). pairs is a constant at each call, so the decode kernel is compiled without that path. */
INLINE void accumulate(State st, const float *v, int64_t vs, int64_t cnt, int64_t g_count, int64_t d, int pairs) {
    int64_t g = 0;
    if (pairs)
        for (; g + 1 < g_count; g += 2) {
            float c0 = softmax_step(st, g, cnt), c1 = softmax_step(st, g + 1, cnt);
            float *acc0 = st.acc + g * d, *acc1 = acc0 + d, *s0 = st.s + g * st.stride, *s1 = s0 + st.stride;
            v8 a0[MAX_CHUNKS], a1[MAX_CHUNKS];
            for (int64_t c = 0; c < d / 8; c++) a0[c] = load(acc0 + 8 * c) * c0, a1[c] = load(acc1 + 8 * c) * c1;
            for (int64_t t = 0; t < cnt; t++) {
                v8 p0 = (v8){0} + s0[t], p1 = (v8){0} + s1[t];
                for (int64_t c = 0; c < d / 8; c++) {
                    v8 x = load(v + t * vs + 8 * c);
                    a0[c] += p0 * x, a1[c] += p1 * x;
                }
            }
            for (int64_t c = 0; c < d / 8; c++) store(acc0 + 8 * c, a0[c]), store(acc1 + 8 * c, a1[c]);
        }
    for (; g < g_count; g++) {
        float corr = softmax_step(st, g, cnt), *s = st.s + g * st.stride;
        v8 a[MAX_CHUNKS];
        for (int64_t c = 0; c < d / 8; c++) a[c] = load(st.acc + g * d + 8 * c) * corr;
        for (int64_t t = 0; t < cnt; t++) {
            v8 p = (v8){0} + s[t];
            for (int64_t c = 0; c < d / 8; c++) a[c] += p * load(v + t * vs + 8 * c);
        }
        for (int64_t c = 0; c < d / 8; c++) store(st.acc + g * d + 8 * c, a[c]);
    }
}

/* Ask for rows [0, cnt) of a block (stride bytes apart, row_bytes each) ahead of their use. */
INLINE void prefetch_rows(const char *p, int64_t cnt, int64_t stride, int64_t row_bytes) {
    for (int64_t t = 0; t < cnt; t++)
        for (int64_t i = 0; i < row_bytes; i += 64) __builtin_prefetch(p + t * stride + i);
}

/* Stream the cached blocks of KV head h through row_table for n_tok query tokens of one
   sequence, each with G query heads: rows r = j * G + g of st and q (q: rows x D fp32, qh the same
   in bf16 or NULL). Token j sees the first base + j + 1 cached tokens, so a decode row is n_tok 1,
   base n - 1, and a continuing chunk's tile of tokens is causal within itself. Each block is read
   once for all the rows, which score it while it sits in L1; rows a block is not visible to skip
   it (a suffix of the rows sees it), and the keys past a row's end are masked out of its scores. */
INLINE void stream_blocks(State st, const float *q, const uint16_t *qh, const void *k_cache,
                          const void *v_cache, int bf16, const int64_t *row_table, int64_t base, int64_t n_tok,
                          float *kbuf, float *vbuf, int64_t h, int64_t h_count, int64_t g_count, int64_t d,
                          int64_t bs, float scale, int pairs) {
    const int64_t elem = bf16 ? 2 : 4, row_stride = h_count * d; /* tokens of one head: row_stride apart */
    const int64_t end = base + n_tok, rows = n_tok * g_count;
    for (int64_t r = 0; r < rows; r++) st.m[r] = -INFINITY, st.l[r] = 0.0f;
    memset(st.acc, 0, sizeof(float) * rows * d);
    for (int64_t start = 0; start < end; start += bs) {
        int64_t first = (row_table[start / bs] * bs * h_count + h) * d, cnt = end - start < bs ? end - start : bs;
        /* The next block's rows of head h are asked for ahead (the blocks are scattered: no hardware
           prefetcher guesses them), its keys now and its values after this block's scores, so
           that not all of them wait at once for the few misses a core keeps in flight. */
        const char *next_k = NULL, *next_v = NULL;
        if (start + bs < end) {
            int64_t next = (row_table[start / bs + 1] * bs * h_count + h) * d * elem;
            next_k = (const char *)k_cache + next, next_v = (const char *)v_cache + next;
            prefetch_rows(next_k, bs, row_stride * elem, d * elem);
        }
        /* the rows that see this block: tokens j >= start - base */
        int64_t j0 = start - base > 0 ? start - base : 0, r0 = j0 * g_count, live = rows - r0;
        State sub = {st.s + r0 * st.stride, st.m + r0, st.l + r0, st.acc + r0 * d, st.stride};
        const float *qr = q ? q + r0 * d : NULL;
        const uint16_t *qhr = qh ? qh + r0 * d : NULL;
        const float *v32 = NULL;
        int64_t vs = d;
        if (bf16) {
            const uint16_t *k = (const uint16_t *)k_cache + first, *v = (const uint16_t *)v_cache + first;
            if (qhr) {
                score_rows_bf16(sub, qhr, k, row_stride, cnt, live, d, scale);
            } else {
                for (int64_t t = 0; t < cnt; t++) widen(kbuf + t * d, k + t * row_stride, d);
                score_rows(sub, qr, kbuf, d, cnt, live, d, scale);
            }
            if (next_v) prefetch_rows(next_v, bs, row_stride * elem, d * elem);
            for (int64_t t = 0; t < cnt; t++) widen(vbuf + t * d, v + t * row_stride, d);
            v32 = vbuf;
        } else {
            score_rows(sub, qr, (const float *)k_cache + first, row_stride, cnt, live, d, scale);
            if (next_v) prefetch_rows(next_v, bs, row_stride * elem, d * elem);
            v32 = (const float *)v_cache + first, vs = row_stride;
        }
        for (int64_t j = j0; j < n_tok; j++) { /* causal within the tile: token j sees keys < base + j + 1 */
            int64_t seen = base + j + 1 - start;
            if (seen >= cnt) break;
            for (int64_t g = 0; g < g_count; g++)
                for (int64_t t = seen; t < cnt; t++) st.s[(j * g_count + g) * st.stride + t] = -INFINITY;
        }
        accumulate(sub, v32, vs, cnt, live, d, pairs);
    }
}

/* out = acc / l for rows rows (zeros where nothing was visible) */
INLINE void finish(State st, float *out, int64_t rows, int64_t d) {
    for (int64_t r = 0; r < rows; r++) {
        float inv = st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f;
        for (int64_t i = 0; i < d; i++) out[r * d + i] = st.acc[r * d + i] * inv;
    }
}

/* The same into bf16, rounded to nearest even (what torch's conversion does) */
INLINE void finish_bf16(State st, uint16_t *out, int64_t rows, int64_t d) {
    for (int64_t r = 0; r < rows; r++) {
        float inv = st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f;
        for (int64_t i = 0; i < d; i++) {
            union { float f; uint32_t u; } x = {st.acc[r * d + i] * inv};
            int nan = (x.u & 0x7fffffffu) > 0x7f800000u; /* stays a (quiet) NaN, as in torch */
            out[r * d + i] = (uint16_t)(nan ? (x.u >> 16) | 0x40u : (x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
        }
    }
}

/* Whether a bf16 q of head dim d is dotted with bf16 keys as stored (then the fp32 q is not read
   unless an own token is merged) */
int paged_bf16_dot(int64_t d) { return HAVE_DPBF16 && d % 16 == 0; }

/* Per-thread scratch for tasks of up to `rows` query rows: State, and two widened blocks. */
typedef struct { State st; float *kbuf, *vbuf, *qbuf; uint16_t *qhbuf; } Scratch;

static Scratch scratch(int64_t rows, int64_t d, int64_t bs) {
    int64_t stride = (bs + 7) / 8 * 8;
    float *s = malloc(sizeof(float) * (rows * (stride + 2 * d + 2) + 2 * bs * d) + sizeof(uint16_t) * rows * d);
    Scratch x;
    x.st = (State){s, s + rows * stride, s + rows * (stride + 1), s + rows * (stride + 2), stride};
    x.kbuf = x.st.acc + rows * d, x.vbuf = x.kbuf + bs * d, x.qbuf = x.vbuf + bs * d;
    x.qhbuf = (uint16_t *)(x.qbuf + rows * d);
    return x;
}

/* q, out: (B, H, G, D) fp32 (q NULL where q_bf16 serves alone: paged_bf16_dot and no k_new; out
   bf16 with out_bf16); q_bf16: q in bf16 when it is exactly that (or NULL); k_cache,
   v_cache: (blocks, bs, H, D) fp32 or bf16; table (B, width); num_cached (B,): visible cached
   tokens of each row; k_new, v_new (B, H, D) fp32 or NULL: each row's own token, merged as one
   more key. k_rows, v_rows (or NULL): the rows' own K/V in the cache's dtype, each H x D
   contiguous, rows k_stride / v_stride bytes apart, written first to cache slots `slots` (the
   eager step's cache write, without two more torch ops a layer). D a multiple of 8, at most
   256. Tasks: (row, KV head). */
void paged_decode(const float *q, const uint16_t *q_bf16, void *k_cache, void *v_cache, int bf16,
                  const int64_t *table, int64_t width, const int64_t *num_cached, const float *k_new,
                  const float *v_new, void *out, int64_t b_count, int64_t h_count, int64_t g_count, int64_t d,
                  int64_t bs, float scale, int threads, const char *k_rows, const char *v_rows, int64_t k_stride,
                  int64_t v_stride, const int64_t *slots, int out_bf16) {
    if (!(HAVE_DPBF16 && bf16 && d % 16 == 0)) q_bf16 = NULL;
    if (k_rows) {
        const int64_t row_bytes = h_count * d * (bf16 ? 2 : 4);
        for (int64_t b = 0; b < b_count; b++) {
            memcpy((char *)k_cache + slots[b] * row_bytes, k_rows + b * k_stride, row_bytes);
            memcpy((char *)v_cache + slots[b] * row_bytes, v_rows + b * v_stride, row_bytes);
        }
    }
#pragma omp parallel num_threads(threads)
    {
        Scratch x = scratch(g_count, d, bs);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < b_count * h_count; task++) {
            int64_t b = task / h_count, h = task % h_count;
            const float *qt = q ? q + task * g_count * d : NULL;
            const uint16_t *qh = q_bf16 ? q_bf16 + task * g_count * d : NULL;
#define STREAM(D) stream_blocks(x.st, qt, qh, k_cache, v_cache, bf16, table + b * width, num_cached[b] - 1, 1, \
                                x.kbuf, x.vbuf, h, h_count, g_count, D, bs, scale, 0)
            switch (d) { /* the head dims models use, unrolled; any other one generic */
            case 64: STREAM(64); break;
            case 128: STREAM(128); break;
            case 32: STREAM(32); break;
            case 16: STREAM(16); break;
            default: STREAM(d);
            }
#undef STREAM
            if (k_new) {
                score_rows(x.st, qt, k_new + task * d, d, 1, g_count, d, scale);
                accumulate(x.st, v_new + task * d, d, 1, g_count, d, 0);
            }
            if (out_bf16)
                finish_bf16(x.st, (uint16_t *)out + task * g_count * d, g_count, d);
            else
                finish(x.st, (float *)out + task * g_count * d, g_count, d);
        }
        free(x.st.s);
    }
}

/* Continuing prefill chunks, which read the cache in place as decode rows do. Chunk c's q_len[c]
   tokens are the packed rows [q_start[c], q_start[c] + q_len[c]) of q and out (T, H, G, D) fp32
   (q_bf16: q in bf16 when exact, or NULL), at positions [ctx_len[c] - q_len[c], ctx_len[c]): token
   i sees the first ctx_len[c] - q_len[c] + i + 1 cached tokens (its own K/V are written already),
   through table row c (C, width). Tasks: (chunk, KV head, tile of up to TILE_ROWS / G tokens),
   the latest tiles (the most keys) first; a tile reads each block once for all its rows. Each
   tile reads its head's context again, so tiles are large: 128 rows (32 KB of accumulators)
   measured 1.0-1.2x faster than 32 on contexts of 512-2048 (bench/paged_attention_bench.py
   --chunks), and 256 no better. */
#define TILE_ROWS 128
void paged_prefill(const float *q, const uint16_t *q_bf16, const void *k_cache, const void *v_cache, int bf16,
                   const int64_t *table, int64_t width, const int64_t *q_start, const int64_t *q_len,
                   const int64_t *ctx_len, float *out, int64_t c_count, int64_t h_count, int64_t g_count,
                   int64_t d, int64_t bs, float scale, int threads) {
    if (!(HAVE_DPBF16 && bf16 && d % 16 == 0)) q_bf16 = NULL;
    const int64_t tile = TILE_ROWS / g_count > 0 ? TILE_ROWS / g_count : 1, hgd = h_count * g_count * d;
    int64_t *first_task = malloc(sizeof(int64_t) * (c_count + 1));
    first_task[0] = 0;
    for (int64_t c = 0; c < c_count; c++) first_task[c + 1] = first_task[c] + h_count * ((q_len[c] + tile - 1) / tile);
#pragma omp parallel num_threads(threads)
    {
        Scratch x = scratch(tile * g_count, d, bs);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < first_task[c_count]; task++) {
            int64_t c = 0;
            while (first_task[c + 1] <= task) c++;
            int64_t tiles = (q_len[c] + tile - 1) / tile, local = task - first_task[c];
            int64_t h = local % h_count, i0 = (tiles - 1 - local / h_count) * tile;
            int64_t n_tok = q_len[c] - i0 < tile ? q_len[c] - i0 : tile, gd = g_count * d;
            for (int64_t j = 0; j < n_tok; j++) { /* the tile's rows of head h, gathered */
                int64_t at = (q_start[c] + i0 + j) * hgd + h * gd;
                memcpy(x.qbuf + j * gd, q + at, sizeof(float) * gd);
                if (q_bf16) memcpy(x.qhbuf + j * gd, q_bf16 + at, sizeof(uint16_t) * gd);
            }
            int64_t base = ctx_len[c] - q_len[c] + i0;
            const uint16_t *qh = q_bf16 ? x.qhbuf : NULL;
#define STREAM(D) stream_blocks(x.st, x.qbuf, qh, k_cache, v_cache, bf16, table + c * width, base, n_tok, \
                                x.kbuf, x.vbuf, h, h_count, g_count, D, bs, scale, 1)
            switch (d) {
            case 64: STREAM(64); break;
            case 128: STREAM(128); break;
            default: STREAM(d);
            }
#undef STREAM
            for (int64_t j = 0; j < n_tok; j++) /* scattered back: row j of the tile is token i0 + j */
                finish((State){x.st.s, x.st.m + j * g_count, x.st.l + j * g_count, x.st.acc + j * gd, x.st.stride},
                       out + (q_start[c] + i0 + j) * hgd + h * gd, g_count, d);
        }
        free(x.st.s);
    }
    free(first_task);
}
