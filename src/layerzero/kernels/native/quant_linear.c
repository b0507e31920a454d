/* Weight-only quantized linears on the CPU in float32: out = x @ W.T (+ bias), for three stored forms and float32.
 *
 * 4-bit groups: W[n, k] = q * scale + zero8 (one float32 fma) for the stored nibble q in [0, 15], with scale and
 * zero8 = zero - 8 * scale per (row, group), made at conversion. qweight [N, K/2] holds column 2j in the low nibble
 * of byte j and 2j+1 in the high one, so a 32-column chunk is 16 bytes whose low nibbles are its even columns and
 * high nibbles its odd ones. x is permuted once per call into that order (per chunk: 16 even columns, then 16
 * odd), and no weight is ever re-laid out.
 *
 * 8-bit blocks (GGUF Q8_0, or any int8 weight with one scale per row and block of columns): W[n, k] = q[n, k] *
 * scale[n, k / block]; each block's sum of q * x is taken, then scaled.
 *
 * bfloat16 (a bf16 checkpoint's weights, `--dtype bfloat16` on the CPU): W[n, k] is the float32 whose high half is the
 * stored 16 bits (exact); x stays float32, so the products are float32 products of the bf16 weights.
 *
 * float32 (a float32 model's decode): the bf16 loop over the weights as they are.
 *
 * Work items are blocks of output rows, taken two at a time against up to four rows of x, so each chunk is
 * converted once per four rows of x, in registers. Each dot product runs over the chunks in order into two
 * 16-lane accumulators and ends with one fixed-order horizontal sum: a row of x gets the same bits whatever else
 * shares the call, so a request decodes the same tokens alone or in a batch. Compiled without -ffast-math (no
 * reassociation). Three forms by what the CPU has: AVX-512, AVX2 + FMA (8-lane accumulators, below), plain C.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "gated.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define CHUNK 32   /* columns per 16-byte chunk */
#define HALF 16    /* lanes: one half-chunk */
#define TILE 4     /* rows of x sharing each dequantized chunk */
#define BLOCK 16   /* output rows per work item: their bytes stay in L1 across tiles of x */
#ifndef PREFETCH
#define PREFETCH 2048  /* bytes of the 4-bit stream fetched ahead (the hardware prefetcher alone falls behind) */
#endif
#ifndef PREFETCH8
#define PREFETCH8 2048  /* bytes of the 8-bit stream fetched ahead: a 49152 x 576 head 2.27 -> 1.23 ms (warm) */
#endif

/* x [m, k] -> xp [m, k], each 32-column chunk as (its 16 even columns, its 16 odd columns). */
static void permute_x(const float *x, int64_t m, int64_t k, float *xp) {
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < k; c += CHUNK)
            for (int i = 0; i < HALF; i++) {
                xp[r * k + c + i] = x[r * k + c + 2 * i];
                xp[r * k + c + HALF + i] = x[r * k + c + 2 * i + 1];
            }
}

/* One output row's quantized data. */
typedef struct {
    const uint8_t *q;     /* [K/2] nibbles, or [K] int8 */
    const float *scale;   /* [K/group] */
    const float *zero8;   /* [K/group] (4-bit only) */
    const uint8_t *next;  /* dense rows: a row to fetch into L2 beside this one's columns, or NULL */
} Row;

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/* The dense tiles' fetch at byte `at` of rows a and b: the same line of the rows after them into L2 where given
 * (Row.next), else the line PREFETCH8 bytes ahead in the rows themselves into L1. */
static inline __attribute__((always_inline)) void dense_fetch(Row a, Row b, int64_t at) {
    if (a.next != NULL) {
        _mm_prefetch((const char *)a.next + at, _MM_HINT_T1);
        _mm_prefetch((const char *)b.next + at, _MM_HINT_T1);
    } else if (PREFETCH8 > 0) {
        _mm_prefetch((const char *)a.q + at + PREFETCH8, _MM_HINT_T0);
        _mm_prefetch((const char *)b.q + at + PREFETCH8, _MM_HINT_T0);
    }
}
#endif

/* sums[0][r], sums[1][r] = (W_a . x_r, W_b . x_r) for the R (a constant) rows of x at xp. */
typedef void (*TileFn)(Row a, Row b, const float *xp, int64_t k, int64_t group, int R, float sums[2][TILE]);

#if defined(__AVX512F__)
/* The 4-bit tile: two output rows at once, so four accumulator chains run even at one row of x. A group's 16
 * possible weights are made once (q * scale + zero8, q = 0..15) and each nibble indexes them: permutexvar reads only
 * the low 4 bits of each 32-bit index, so the low nibbles need no mask and the high ones one shift. */
static inline __attribute__((always_inline)) void int4_tile(Row a, Row b, const float *xp, int64_t k,
                                                           int64_t group, const int R, float sums[2][TILE]) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 ea[TILE], oa[TILE], eb[TILE], ob[TILE];
    for (int r = 0; r < R; r++) ea[r] = oa[r] = eb[r] = ob[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < k / group; g++) {
        __m512 va = _mm512_fmadd_ps(iota, _mm512_set1_ps(a.scale[g]), _mm512_set1_ps(a.zero8[g]));
        __m512 vb = _mm512_fmadd_ps(iota, _mm512_set1_ps(b.scale[g]), _mm512_set1_ps(b.zero8[g]));
        for (int64_t c = g * group; c < (g + 1) * group; c += CHUNK) {
#if PREFETCH > 0
            _mm_prefetch((const char *)(a.q + c / 2 + PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char *)(b.q + c / 2 + PREFETCH), _MM_HINT_T0);
#endif
            __m512i qa = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(a.q + c / 2)));
            __m512i qb = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b.q + c / 2)));
            __m512 wea = _mm512_permutexvar_ps(qa, va), woa = _mm512_permutexvar_ps(_mm512_srli_epi32(qa, 4), va);
            __m512 web = _mm512_permutexvar_ps(qb, vb), wob = _mm512_permutexvar_ps(_mm512_srli_epi32(qb, 4), vb);
            for (int r = 0; r < R; r++) {
                __m512 xe = _mm512_loadu_ps(xp + r * k + c), xo = _mm512_loadu_ps(xp + r * k + c + HALF);
                ea[r] = _mm512_fmadd_ps(wea, xe, ea[r]);
                oa[r] = _mm512_fmadd_ps(woa, xo, oa[r]);
                eb[r] = _mm512_fmadd_ps(web, xe, eb[r]);
                ob[r] = _mm512_fmadd_ps(wob, xo, ob[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        sums[0][r] = _mm512_reduce_add_ps(_mm512_add_ps(ea[r], oa[r]));
        sums[1][r] = _mm512_reduce_add_ps(_mm512_add_ps(eb[r], ob[r]));
    }
}
/* The 8-bit tile: per 32-column chunk the int8 values widen to float32 (exact), each block's products are summed
 * into a fresh partial, and the partial is scaled into the accumulator once per block. */
static inline __attribute__((always_inline)) void int8_tile(Row a, Row b, const float *x, int64_t k, int64_t block,
                                                           const int R, float sums[2][TILE]) {
    __m512 acc_a[TILE], acc_b[TILE];
    for (int r = 0; r < R; r++) acc_a[r] = acc_b[r] = _mm512_setzero_ps();
    const int8_t *qa = (const int8_t *)a.q, *qb = (const int8_t *)b.q;
    for (int64_t g = 0; g < k / block; g++) {
        __m512 part_a[TILE], part_b[TILE];
        for (int r = 0; r < R; r++) part_a[r] = part_b[r] = _mm512_setzero_ps();
        for (int64_t c = g * block; c < (g + 1) * block; c += HALF) {
#if PREFETCH8 > 0
            if ((c & 63) == 0) {  /* one line of each row's stream a 64 columns */
                _mm_prefetch((const char *)(qa + c + PREFETCH8), _MM_HINT_T0);
                _mm_prefetch((const char *)(qb + c + PREFETCH8), _MM_HINT_T0);
            }
#endif
            __m512 wa = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qa + c))));
            __m512 wb = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qb + c))));
            for (int r = 0; r < R; r++) {
                __m512 xv = _mm512_loadu_ps(x + r * k + c);
                part_a[r] = _mm512_fmadd_ps(wa, xv, part_a[r]);
                part_b[r] = _mm512_fmadd_ps(wb, xv, part_b[r]);
            }
        }
        __m512 sa = _mm512_set1_ps(a.scale[g]), sb = _mm512_set1_ps(b.scale[g]);
        for (int r = 0; r < R; r++) {
            acc_a[r] = _mm512_fmadd_ps(sa, part_a[r], acc_a[r]);
            acc_b[r] = _mm512_fmadd_ps(sb, part_b[r], acc_b[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        sums[0][r] = _mm512_reduce_add_ps(acc_a[r]);
        sums[1][r] = _mm512_reduce_add_ps(acc_b[r]);
    }
}
/* 16 weights of a dense row as float32 lanes: bf16 widened by a shift into the high half (exact), float32 as stored. */
static inline __attribute__((always_inline)) __m512 dense16(const uint8_t *row, int64_t c, const int f32) {
    return f32 ? _mm512_loadu_ps((const float *)row + c) : bf16_widen16((const uint16_t *)row + c);
}

/* The dense tiles (bfloat16 or float32 weights, f32 a constant): one fma per weight and row of x. */
static inline __attribute__((always_inline)) void dense_tile(Row a, Row b, const float *x, int64_t k, const int R,
                                                            const int f32, float sums[2][TILE]) {
    const int bytes = f32 ? 4 : 2;
    __m512 acc_a[TILE], acc_b[TILE];
    for (int r = 0; r < R; r++) acc_a[r] = acc_b[r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += HALF) {
        if (((c * bytes) & 63) == 0) dense_fetch(a, b, c * bytes);  /* one line of each row's stream a 64 bytes */
        __m512 wa = dense16(a.q, c, f32), wb = dense16(b.q, c, f32);
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * k + c);
            acc_a[r] = _mm512_fmadd_ps(wa, xv, acc_a[r]);
            acc_b[r] = _mm512_fmadd_ps(wb, xv, acc_b[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        sums[0][r] = _mm512_reduce_add_ps(acc_a[r]);
        sums[1][r] = _mm512_reduce_add_ps(acc_b[r]);
    }
}
/* Four output rows against one row of x (dense_quads): each row's chain is dense_tile's at R = 1, so the same bits. */
static inline __attribute__((always_inline)) void dense_quad(const uint8_t *q, int64_t row_bytes, const float *x,
                                                             int64_t k, const int f32, float sums[4],
                                                             const uint8_t *ahead) {
    const int bytes = f32 ? 4 : 2;
    __m512 acc[4];
    for (int i = 0; i < 4; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += HALF) {
        __m512 xv = _mm512_loadu_ps(x + c);
        for (int i = 0; i < 4; i++) {
            if (ahead != NULL && ((c * bytes) & 63) == 0)
                _mm_prefetch((const char *)ahead + i * row_bytes + c * bytes, _MM_HINT_T1);
            acc[i] = _mm512_fmadd_ps(dense16(q + i * row_bytes, c, f32), xv, acc[i]);
        }
    }
    for (int i = 0; i < 4; i++) sums[i] = _mm512_reduce_add_ps(acc[i]);
}
#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 (AMD Zen 2/3, Intel before AVX-512): 8-lane vectors and 16 registers. In the 4-bit and 8-bit tiles each (output
 * row, row of x) keeps two accumulator chains (the even and odd 8-column groups of a chunk, or of a block). Up to 2
 * rows of x the 4-bit tile runs its two output rows together (at one row of x, four chains keep the FMA units busy:
 * ~1.2x); with more, and always in the 8-bit tile (measured slower together), one output row after the other, so the
 * accumulators fit the registers. The dense tile has its own layout (below). Either way each accumulator sums the same
 * products in the same order, so a row of x gets the same bits whatever R is. */
#define JOINT(R) ((R) <= 2 ? 2 : 1)  /* output rows run together */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
/* Nibbles of 8 bytes as two 8-lane vectors: the low nibbles (even columns) and the high ones (odd columns). */
static inline __attribute__((always_inline)) void nibbles8(const uint8_t *q, __m256 *even, __m256 *odd) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    *even = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    *odd = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
}
/* The 4-bit tile over W output rows (rows[0 .. W)): weights q * scale + zero8 by one fma per 8 (the values the
 * AVX-512 form looks up). */
static inline __attribute__((always_inline)) void int4_part(const Row *rows, const int W, const float *xp, int64_t k,
                                                           int64_t group, const int R, float sums[][TILE]) {
    __m256 acc_e[2][TILE], acc_o[2][TILE];
    for (int w = 0; w < W; w++)
        for (int r = 0; r < R; r++) acc_e[w][r] = acc_o[w][r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < k / group; g++)
        for (int64_t c = g * group; c < (g + 1) * group; c += CHUNK)
            for (int w = 0; w < W; w++) {
                const uint8_t *q = rows[w].q + c / 2;
#if PREFETCH > 0
                _mm_prefetch((const char *)(q + PREFETCH), _MM_HINT_T0);
#endif
                __m256 scale = _mm256_set1_ps(rows[w].scale[g]), zero8 = _mm256_set1_ps(rows[w].zero8[g]);
                __m256 e0, o0, e1, o1;
                nibbles8(q, &e0, &o0);
                nibbles8(q + 8, &e1, &o1);
                e0 = _mm256_fmadd_ps(e0, scale, zero8), e1 = _mm256_fmadd_ps(e1, scale, zero8);
                o0 = _mm256_fmadd_ps(o0, scale, zero8), o1 = _mm256_fmadd_ps(o1, scale, zero8);
                for (int r = 0; r < R; r++) {
                    const float *x = xp + r * k + c;  /* 16 even columns, then 16 odd */
                    acc_e[w][r] = _mm256_fmadd_ps(e0, _mm256_loadu_ps(x), acc_e[w][r]);
                    acc_o[w][r] = _mm256_fmadd_ps(o0, _mm256_loadu_ps(x + HALF), acc_o[w][r]);
                    acc_e[w][r] = _mm256_fmadd_ps(e1, _mm256_loadu_ps(x + 8), acc_e[w][r]);
                    acc_o[w][r] = _mm256_fmadd_ps(o1, _mm256_loadu_ps(x + HALF + 8), acc_o[w][r]);
                }
            }
    for (int w = 0; w < W; w++)
        for (int r = 0; r < R; r++) sums[w][r] = hsum8(_mm256_add_ps(acc_e[w][r], acc_o[w][r]));
}
/* The 8-bit part: per block a fresh partial per row (two chains), scaled into the accumulator once. */
static inline __attribute__((always_inline)) void int8_part(const Row *rows, const int W, const float *x, int64_t k,
                                                           int64_t block, const int R, float sums[][TILE]) {
    __m256 acc[2][TILE];
    for (int w = 0; w < W; w++)
        for (int r = 0; r < R; r++) acc[w][r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < k / block; g++) {
        __m256 p0[2][TILE], p1[2][TILE];
        for (int w = 0; w < W; w++)
            for (int r = 0; r < R; r++) p0[w][r] = p1[w][r] = _mm256_setzero_ps();
        for (int64_t c = g * block; c < (g + 1) * block; c += HALF)
            for (int w = 0; w < W; w++) {
                const int8_t *q = (const int8_t *)rows[w].q + c;
#if PREFETCH8 > 0
                if ((c & 63) == 0) _mm_prefetch((const char *)(q + PREFETCH8), _MM_HINT_T0);
#endif
                __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
                __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8))));
                for (int r = 0; r < R; r++) {
                    p0[w][r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k + c), p0[w][r]);
                    p1[w][r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * k + c + 8), p1[w][r]);
                }
            }
        for (int w = 0; w < W; w++) {
            __m256 scale = _mm256_set1_ps(rows[w].scale[g]);
            for (int r = 0; r < R; r++)
                acc[w][r] = _mm256_fmadd_ps(scale, _mm256_add_ps(p0[w][r], p1[w][r]), acc[w][r]);
        }
    }
    for (int w = 0; w < W; w++)
        for (int r = 0; r < R; r++) sums[w][r] = hsum8(acc[w][r]);
}
/* 8 weights of a dense row as float32 lanes: bf16 widened by a shift into the high half (exact), float32 as stored. */
static inline __attribute__((always_inline)) __m256 dense8(const uint8_t *row, int64_t c, const int f32) {
    if (f32) return _mm256_loadu_ps((const float *)row + c);
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + c)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
/* The dense tile (bfloat16 or float32 weights, f32 a constant): both output rows with every row of x together, one
 * accumulator chain per (output row, row of x) over 8-column vectors: up to 8 chains keep the FMA units busy, and each
 * product of a weight vector is shared by R rows of x (float32 at 16 rows of x: 0.75 loads an FMA, where one output
 * row at a time with two chains each took 1.25). A chain sums the same products in the same order whatever R is. */
static inline __attribute__((always_inline)) void dense_tile(Row a, Row b, const float *x, int64_t k, const int R,
                                                            const int f32, float sums[2][TILE]) {
    const int bytes = f32 ? 4 : 2;
    __m256 acc_a[TILE], acc_b[TILE];
    for (int r = 0; r < R; r++) acc_a[r] = acc_b[r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; c += 8) {
        if (((c * bytes) & 63) == 0) dense_fetch(a, b, c * bytes);
        __m256 wa = dense8(a.q, c, f32), wb = dense8(b.q, c, f32);
        for (int r = 0; r < R; r++) {
            __m256 xr = _mm256_loadu_ps(x + r * k + c);
            acc_a[r] = _mm256_fmadd_ps(wa, xr, acc_a[r]);
            acc_b[r] = _mm256_fmadd_ps(wb, xr, acc_b[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        sums[0][r] = hsum8(acc_a[r]);
        sums[1][r] = hsum8(acc_b[r]);
    }
}
/* Four output rows against one row of x (dense_quads): each row's chain is dense_tile's at R = 1, so the same bits. */
static inline __attribute__((always_inline)) void dense_quad(const uint8_t *q, int64_t row_bytes, const float *x,
                                                             int64_t k, const int f32, float sums[4],
                                                             const uint8_t *ahead) {
    const int bytes = f32 ? 4 : 2;
    __m256 acc[4];
    for (int i = 0; i < 4; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; c += 8) {
        __m256 xv = _mm256_loadu_ps(x + c);
        for (int i = 0; i < 4; i++) {
            if (ahead != NULL && ((c * bytes) & 63) == 0)
                _mm_prefetch((const char *)ahead + i * row_bytes + c * bytes, _MM_HINT_T1);
            acc[i] = _mm256_fmadd_ps(dense8(q + i * row_bytes, c, f32), xv, acc[i]);
        }
    }
    for (int i = 0; i < 4; i++) sums[i] = hsum8(acc[i]);
}
static inline __attribute__((always_inline)) void int4_tile(Row a, Row b, const float *xp, int64_t k,
                                                           int64_t group, const int R, float sums[2][TILE]) {
    const Row rows[2] = {a, b};
    for (int w = 0; w < 2; w += JOINT(R)) int4_part(rows + w, JOINT(R), xp, k, group, R, sums + w);
}
static inline __attribute__((always_inline)) void int8_tile(Row a, Row b, const float *x, int64_t k, int64_t block,
                                                           const int R, float sums[2][TILE]) {
    const Row rows[2] = {a, b};
    for (int w = 0; w < 2; w++) int8_part(rows + w, 1, x, k, block, R, sums + w);
}
#else
/* Portable form of the same sums (lane l of the vector form is element l of each half-chunk). */
static inline void int4_tile(Row a, Row b, const float *xp, int64_t k, int64_t group, const int R,
                             float sums[2][TILE]) {
    const Row rows[2] = {a, b};
    for (int w = 0; w < 2; w++)
        for (int r = 0; r < R; r++) {
            float even[HALF] = {0}, odd[HALF] = {0}, total = 0.0f;
            for (int64_t g = 0; g < k / group; g++) {
                float values[16];
                for (int q = 0; q < 16; q++) values[q] = (float)q * rows[w].scale[g] + rows[w].zero8[g];
                for (int64_t c = g * group; c < (g + 1) * group; c += CHUNK)
                    for (int i = 0; i < HALF; i++) {
                        uint8_t byte = rows[w].q[c / 2 + i];
                        even[i] += values[byte & 0x0F] * xp[r * k + c + i];
                        odd[i] += values[byte >> 4] * xp[r * k + c + HALF + i];
                    }
            }
            for (int i = 0; i < HALF; i++) total += even[i] + odd[i];
            sums[w][r] = total;
        }
}
static inline void int8_tile(Row a, Row b, const float *x, int64_t k, int64_t block, const int R,
                             float sums[2][TILE]) {
    const Row rows[2] = {a, b};
    for (int w = 0; w < 2; w++)
        for (int r = 0; r < R; r++) {
            float acc[HALF] = {0}, total = 0.0f;
            const int8_t *q = (const int8_t *)rows[w].q;
            for (int64_t g = 0; g < k / block; g++) {
                float part[HALF] = {0};
                for (int64_t c = g * block; c < (g + 1) * block; c += HALF)
                    for (int i = 0; i < HALF; i++) part[i] += (float)q[c + i] * x[r * k + c + i];
                for (int i = 0; i < HALF; i++) acc[i] += rows[w].scale[g] * part[i];
            }
            for (int i = 0; i < HALF; i++) total += acc[i];
            sums[w][r] = total;
        }
}
static inline float dense_value(const uint8_t *row, int64_t i, const int f32) {
    if (f32) return ((const float *)row)[i];
    union { uint32_t u; float f; } v = {(uint32_t)((const uint16_t *)row)[i] << 16};
    return v.f;
}
static inline void dense_tile(Row a, Row b, const float *x, int64_t k, const int R, const int f32,
                              float sums[2][TILE]) {
    const Row rows[2] = {a, b};
    for (int w = 0; w < 2; w++)
        for (int r = 0; r < R; r++) {
            float acc[HALF] = {0}, total = 0.0f;
            for (int64_t c = 0; c < k; c += HALF)
                for (int i = 0; i < HALF; i++) acc[i] += dense_value(rows[w].q, c + i, f32) * x[r * k + c + i];
            for (int i = 0; i < HALF; i++) total += acc[i];
            sums[w][r] = total;
        }
}
static inline void dense_quad(const uint8_t *q, int64_t row_bytes, const float *x, int64_t k, const int f32,
                              float sums[4], const uint8_t *ahead) {
    (void)ahead;
    for (int i = 0; i < 4; i += 2) {
        Row a = {q + i * row_bytes, NULL, NULL, NULL}, b = {q + (i + 1) * row_bytes, NULL, NULL, NULL};
        float pair[2][TILE];
        dense_tile(a, b, x, k, 1, f32, pair);
        sums[i] = pair[0][0];
        sums[i + 1] = pair[1][0];
    }
}
#endif
static inline __attribute__((always_inline)) void bf16_tile(Row a, Row b, const float *x, int64_t k, int64_t group,
                                                           const int R, float sums[2][TILE]) {
    (void)group;
    dense_tile(a, b, x, k, R, 0, sums);
}
static inline __attribute__((always_inline)) void f32_tile(Row a, Row b, const float *x, int64_t k, int64_t group,
                                                          const int R, float sums[2][TILE]) {
    (void)group;
    dense_tile(a, b, x, k, R, 1, sums);
}

/* Each format's tile with the row count made a constant, so the accumulators stay in registers; a group of one chunk
 * (GGUF's 32 columns) is a constant too, so the group loop runs straight-line code (4-bit at batch 1: 8.9 -> 8.2 us
 * for 128 x 1024 weights on one core, quiet). */
#define TILE_ROWS(name, group)                                                                             \
    switch (R) {                                                                                           \
        case 1: name##_tile(a, b, xp, k, group, 1, sums); break;                                           \
        case 2: name##_tile(a, b, xp, k, group, 2, sums); break;                                           \
        case 3: name##_tile(a, b, xp, k, group, 3, sums); break;                                           \
        default: name##_tile(a, b, xp, k, group, 4, sums); break;                                          \
    }
#define TILES(name)                                                                                        \
    static void name##_tiles(Row a, Row b, const float *xp, int64_t k, int64_t group, int R,             \
                             float sums[2][TILE]) {                                                      \
        if (group == CHUNK) TILE_ROWS(name, CHUNK)                                                       \
        else TILE_ROWS(name, group)                                                                      \
    }
TILES(int4)
TILES(int8)
TILES(bf16)
TILES(f32)

/* A lone row of x against dense rows [j0, j1) of n: four output rows at a time (dense_quad: four FMA chains where a
 * pair of rows has two), each line of the next four rows fetched into L2 beside the same column of these (past the
 * block too: a thread's next block follows it). Against the pairs with the next pair fetched at once before each
 * pair (2 threads, float32 weights): 40 -> 82-102 GB/s from L3, 27-29 -> 32-35 from DRAM; a burst of prefetches
 * stalls the core that issues it. Returns the first row left for the pairs (fewer than four remain). */
static int64_t dense_quads(int f32, const float *x, int64_t k, const uint8_t *q, int64_t row_bytes, const float *bias,
                           float *out, int64_t j0, int64_t j1, int64_t n, int fetch) {
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4) {
        const uint8_t *ahead = fetch && j + 8 <= n ? q + (j + 4) * row_bytes : NULL;
        float sums[4];
        if (f32) dense_quad(q + j * row_bytes, row_bytes, x, k, 1, sums, ahead);
        else dense_quad(q + j * row_bytes, row_bytes, x, k, 0, sums, ahead);
        for (int i = 0; i < 4; i++) out[j + i] = bias != NULL ? sums[i] + bias[j + i] : sums[i];
    }
    return j;
}

/* Output rows [j0, j1) of out [m, n] = x [m, k] . W.T (+ bias): one work item. */
static void run_block(TileFn tiles, const float *x, int64_t m, int64_t k, const uint8_t *q, int64_t row_bytes,
                      int64_t n, const float *scales, const float *zeros8, int64_t group, const float *bias,
                      float *out, int64_t j0, int64_t j1) {
    int64_t groups = k / group;
    /* Tiles of x outermost, the block's weights kept in cache across them. The quantized rows stay in L1. A block of
     * dense rows (float32, bf16) too wide for L1 is read from L2 by every tile after the first, while that tile's x
     * (4 rows) stays in L1: half the L2 traffic of the other order, x read from L2 by every pair of weight rows. So
     * the first tile need not wait on memory, each tile fetches its share of the next block's rows into L2 as it
     * goes (SmolLM2-135M's projections and head at 8-16 rows of x: 1.08-1.19x; docs/quantization.md). With a single
     * tile of x each pair of weight rows is read once anyway, and the next pair is fetched while it computes. */
    int dense = tiles == f32_tiles || tiles == bf16_tiles;
    int64_t ntiles = (m + TILE - 1) / TILE, share = ntiles > 1 ? (row_bytes + ntiles - 1) / ntiles : row_bytes;
    /* dense rows read once (one tile of x) fetch the rows after them as they go */
    int fetch_next = dense && ntiles == 1 && (j1 - j0) * row_bytes > 16384;
    int64_t first = j0;  /* a lone row of x: fours first, any rest in pairs */
    if (dense && m == 1) first = dense_quads(tiles == f32_tiles, x, k, q, row_bytes, bias, out, j0, j1, n, fetch_next);
    for (int64_t r0 = 0; r0 < m; r0 += TILE)
        for (int64_t j = first; j < j1; j += 2) {
            int R = m - r0 < TILE ? (int)(m - r0) : TILE;
            int64_t j2 = j + 1 < j1 ? j + 1 : j;  /* a last odd row pairs with itself */
            if (dense && ntiles > 1 && j + BLOCK < n) {  /* this tile's share of the next block's two rows */
                int64_t lo = r0 / TILE * share, hi = lo + share < row_bytes ? lo + share : row_bytes;
                for (int64_t byte = lo; byte < hi; byte += 64) {
                    __builtin_prefetch(q + (j + BLOCK) * row_bytes + byte, 0, 2);
                    if (j2 + BLOCK < n) __builtin_prefetch(q + (j2 + BLOCK) * row_bytes + byte, 0, 2);
                }
            }
            /* the next pair streams into L2 line by line beside this one (a burst of its rows before each pair
             * stalled the core: dense_quads) */
            int ahead = fetch_next && j2 + 2 < n;
            Row a = {q + j * row_bytes, scales + j * groups, zeros8 == NULL ? NULL : zeros8 + j * groups,
                     ahead ? q + (j + 2) * row_bytes : NULL};
            Row b = {q + j2 * row_bytes, scales + j2 * groups, zeros8 == NULL ? NULL : zeros8 + j2 * groups,
                     ahead ? q + (j2 + 2) * row_bytes : NULL};
            float sums[2][TILE];
            tiles(a, b, x + r0 * k, k, group, R, sums);
            for (int r = 0; r < R; r++) {
                out[(r0 + r) * n + j] = bias != NULL ? sums[0][r] + bias[j] : sums[0][r];
                if (j2 != j) out[(r0 + r) * n + j2] = bias != NULL ? sums[1][r] + bias[j2] : sums[1][r];
            }
        }
}

/* out [m, n] = x [m, k] . W.T (+ bias); row_bytes: bytes per stored weight row; zeros8 may be NULL. */
static void run(TileFn tiles, const float *x, int64_t m, int64_t k, const uint8_t *q, int64_t row_bytes, int64_t n,
                const float *scales, const float *zeros8, int64_t group, const float *bias, float *out,
                int threads) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t blk = 0; blk < blocks; blk++)
        run_block(tiles, x, m, k, q, row_bytes, n, scales, zeros8, group, bias, out, blk * BLOCK,
                  (blk + 1) * BLOCK < n ? (blk + 1) * BLOCK : n);
}

/* 4-bit groups; returns 0, or -1 when scratch memory could not be had (the caller raises). */
int int4_linear(const float *x, int64_t m, int64_t k, const uint8_t *qweight, int64_t n, const float *scales,
                const float *zeros8, int64_t group, const float *bias, float *out, int threads) {
    float *xp = malloc(sizeof(float) * (size_t)(m * k));
    if (xp == NULL) return -1;
    permute_x(x, m, k, xp);
    run(int4_tiles, xp, m, k, qweight, k / 2, n, scales, zeros8, group, bias, out, threads);
    free(xp);
    return 0;
}

/* 8-bit blocks of `block` columns (a multiple of 16) with scales [N, K / block]. */
int int8_linear(const float *x, int64_t m, int64_t k, const int8_t *weight, int64_t n, const float *scales,
                int64_t block, const float *bias, float *out, int threads) {
    run(int8_tiles, x, m, k, (const uint8_t *)weight, k, n, scales, NULL, block, bias, out, threads);
    return 0;
}

/* bfloat16 weights [N, K] (K a multiple of 16), float32 x and out. */
int bf16_linear(const float *x, int64_t m, int64_t k, const uint16_t *weight, int64_t n, const float *bias, float *out,
                int threads) {
    run(bf16_tiles, x, m, k, (const uint8_t *)weight, 2 * k, n, NULL, NULL, k, bias, out, threads);
    return 0;
}

/* float32 weights [N, K] (K a multiple of 16), float32 x and out. */
int f32_linear(const float *x, int64_t m, int64_t k, const float *weight, int64_t n, const float *bias, float *out,
               int threads) {
    run(f32_tiles, x, m, k, (const uint8_t *)weight, 4 * k, n, NULL, NULL, k, bias, out, threads);
    return 0;
}

/* One projection of a stack of experts [E, N, K]: form 0 = 4-bit groups (scale, zero8 [E, N, K/group]), form 1 =
 * int8 blocks of `group` columns (scale [E, N, K/group]), form 2 = bfloat16, form 3 = float32 (no scales; group K). */
typedef struct {
    int form;
    const uint8_t *q;
    const float *scale, *zero8;
    int64_t group;
} Stack;

/* h [pairs, n] = x_p . W[e].T for every routed pair p (rows of x in expert order, start[e] .. start[e + 1] for
 * expert e), work-shared inside the caller's parallel region over (expert, block of output rows) items. Static: a
 * thread takes the same contiguous run of items every call, one stream for its prefetchers, and a call repeating the
 * last one's experts finds its share in its own L2 (items handed out as threads came free, one at a time or guided,
 * read batch 1 at 2/3 the speed). */
static void grouped(Stack w, const float *x, int64_t k, int64_t n, const int64_t *start, const int64_t *hit,
                    int64_t nhit, float *h) {
    static const TileFn by_form[] = {int4_tiles, int8_tiles, bf16_tiles, f32_tiles};
    TileFn tiles = by_form[w.form];
    int64_t row_bytes = w.form == 0 ? k / 2 : w.form == 1 ? k : w.form == 2 ? 2 * k : 4 * k;
    int64_t groups = k / w.group, blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < nhit * blocks; item++) {
        int64_t e = hit[item / blocks], blk = item % blocks, p0 = start[e];
        const float *scale = w.scale == NULL ? NULL : w.scale + e * n * groups;
        const float *zero8 = w.zero8 == NULL ? NULL : w.zero8 + e * n * groups;
        run_block(tiles, x + p0 * k, start[e + 1] - p0, k, w.q + e * n * row_bytes, row_bytes, n,
                  scale, zero8, w.group, NULL, h + p0 * n, blk * BLOCK,
                  (blk + 1) * BLOCK < n ? (blk + 1) * BLOCK : n);
    }
}

/* One pair's down-projection row o [inner] = act(gate) * up of its row of h; 4-bit (form 0) in the 4-bit kernel's
 * permuted order, a chunk at a time (inner is whole chunks there). */
static void activated_row(const float *h, int64_t inner, int act, int form, float *o) {
    if (form != 0) {
        gated_row(h, h + inner, inner, act, o);
        return;
    }
    for (int64_t c = 0; c < inner; c += CHUNK) {
        float chunk[CHUNK];
        gated_row(h + c, h + inner + c, CHUNK, act, chunk);
        permute_x(chunk, 1, CHUNK, o + c);
    }
}

/* A mixture of experts' sparse MLP on expert stacks (quantized or dense: Stack's forms), in one call: out [T, H] =
 * sum_j weights[t, j] * W2[e] . (act(G[e] . x_t) * U[e] . x_t), e = ids[t, j], with W13 [E, 2I, H] (gate rows first)
 * and W2 [E, H, I].
 * The (token, expert) pairs are grouped by expert (a counting sort, token order within one), so each routed expert's
 * weights stream once per call with up to TILE of its rows at a time; a token's k results are summed in its own j
 * order, so its output does not depend on what else shares the call (nor on which thread computed a row). ids are
 * read here, from memory: no host value leaves the call (a CPU decode graph replays it). Every phase runs in one
 * parallel region, so the threads are forked once. Returns 0; -1 without scratch memory; -2 for an id outside
 * [0, E). */
int moe_quant(const float *x, int64_t tokens, int64_t hidden, int64_t inner, int64_t experts, const int64_t *ids,
              const float *weights, int64_t k, int form13, const uint8_t *q13, const float *s13, const float *z13,
              int64_t group13, int form2, const uint8_t *q2, const float *s2, const float *z2, int64_t group2,
              int act, float *out, int threads) {
    int64_t pairs = tokens * k;
    if (pairs == 0) return 0;
    for (int64_t p = 0; p < pairs; p++)
        if (ids[p] < 0 || ids[p] >= experts) return -2;
    int64_t *start = calloc((size_t)(experts + 1), sizeof(int64_t)), *hit = malloc(sizeof(int64_t) * (size_t)experts);
    int64_t *slot = malloc(sizeof(int64_t) * (size_t)pairs);  /* pair (t, j) -> its row in expert order */
    float *xs = malloc(sizeof(float) * (size_t)(pairs * (hidden > inner ? hidden : inner)));
    float *h = malloc(sizeof(float) * (size_t)(pairs * 2 * inner)), *y = malloc(sizeof(float) * (size_t)(pairs * hidden));
    int status = -1;
    if (start == NULL || hit == NULL || slot == NULL || xs == NULL || h == NULL || y == NULL) goto done;
    for (int64_t p = 0; p < pairs; p++) start[ids[p] + 1]++;
    int64_t nhit = 0;
    for (int64_t e = 0; e < experts; e++) {
        if (start[e + 1]) hit[nhit++] = e;
        start[e + 1] += start[e];
    }
    int64_t *cursor = calloc((size_t)experts, sizeof(int64_t));
    if (cursor == NULL) goto done;
    for (int64_t p = 0; p < pairs; p++) slot[p] = start[ids[p]] + cursor[ids[p]]++;
    free(cursor);
    Stack w13 = {form13, q13, s13, z13, group13}, w2 = {form2, q2, s2, z2, group2};
#pragma omp parallel num_threads(threads)
    {
        /* xs: the routed rows of x in expert order (4-bit: each 32-column chunk as its even, then its odd columns) */
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            if (form13 == 0) permute_x(x + (p / k) * hidden, 1, hidden, xs + slot[p] * hidden);
            else memcpy(xs + slot[p] * hidden, x + (p / k) * hidden, sizeof(float) * (size_t)hidden);
        }
        grouped(w13, xs, hidden, 2 * inner, start, hit, nhit, h);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < pairs; r++)  /* xs, now read: the down projection's rows */
            activated_row(h + r * 2 * inner, inner, act, form2, xs + r * inner);
        grouped(w2, xs, inner, hidden, start, hit, nhit, y);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; t++) {
            float *o = out + t * hidden;
            for (int64_t c = 0; c < hidden; c++) o[c] = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                const float *row = y + slot[t * k + j] * hidden;
                float wt = weights[t * k + j];
                for (int64_t c = 0; c < hidden; c++) o[c] += wt * row[c];
            }
        }
    }
    status = 0;
done:
    free(start); free(hit); free(slot); free(xs); free(h); free(y);
    return status;
}
