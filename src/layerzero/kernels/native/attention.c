/* Attention over a paged KV cache on the CPU in float32, one query row at a time, for decode and prefill alike; the
 * cache float32 (`paged_attention`) or bf16 (`paged_attention_bf16`, a CPU bf16 model's: each row widened exactly as it
 * is read, then the same arithmetic). The kernels are attention_paged.h, included once per cache type.
 *
 * Query row t of sequence b is at position p = ctx[b] - q_len[b] + i (i: its index among b's new tokens) and sees
 * the cached keys j in [lo, p], lo = max(0, p - window + 1) with a window, else 0. For each (row, head): scores
 * s_j = scale * q . k_j, then out = sum_j exp(s_j - max) v_j / sum_j exp(s_j - max), over j in ascending order.
 * A decode row and the same row inside a prefill or mixed step run this identical arithmetic, so a request's
 * tokens do not depend on what shares its step. Dot products keep 16 lane sums (vectorized without
 * reassociation, so no -ffast-math), added up in a fixed order; the exponentials run 16 (AVX2: 8) at a time
 * (vexp.h), key j's lane fixed by its index from the window's start, so a row's result still depends on nothing
 * else. Head sizes of
 * 64 and 128 take a vector path with a key row and each head's output held in registers and the rows ahead fetched
 * through the block table (`ATTEND`, AVX-512: about 1.5x the generic loop on 16 decode rows of SmolLM2's shape at a
 * 200-token context, 0.44-0.63 -> 0.29-0.36 ms a layer; `ATTEND8`, its AVX2 form on 8 lanes: docs/quantization.md,
 * "AVX2").
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bf16.h"
#include "lanes.h"
#include "vexp.h"

/* sc[j] = exp(sc[j] - top) for j < n: 16 lanes at a time, key j's lane fixed by its index from the window's start. */
static inline void exp_shifted(float *sc, int64_t n, float top) {
    int64_t j0 = 0;
#if defined(__AVX512F__)
    for (const __m512 m = _mm512_set1_ps(top); j0 + 16 <= n; j0 += 16)
        _mm512_storeu_ps(sc + j0, exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + j0), m)));
#elif defined(__AVX2__) && defined(__FMA__)
    for (const __m256 m = _mm256_set1_ps(top); j0 + 8 <= n; j0 += 8)
        _mm256_storeu_ps(sc + j0, exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j0), m)));
#endif
    for (int64_t j = j0; j < n; j++) sc[j] = expf(sc[j] - top);
}

static inline const float *row_f32(const float *p, int64_t d, float *buf) {
    (void)d, (void)buf;
    return p;
}

static inline const float *row_bf16(const uint16_t *p, int64_t d, float *buf) {
    bf16_widen_n(p, d, buf);
    return buf;
}

/* float32 caches: `paged_attention` */
#define KV_T float
#define KV_NAME(x) x
#define KV_LOAD16(p) _mm512_loadu_ps(p)
#define KV_LOAD8(p) _mm256_loadu_ps(p)
#define KV_ROW(p, d, buf) row_f32(p, d, buf)
#include "attention_paged.h"
#undef KV_T
#undef KV_NAME
#undef KV_LOAD16
#undef KV_LOAD8
#undef KV_ROW

/* bf16 caches (a CPU bf16 model's): `paged_attention_bf16`, each row widened exactly as it is read */
#define KV_T uint16_t
#define KV_NAME(x) x##_bf16
#define KV_LOAD16(p) bf16_widen16(p)
#define KV_LOAD8(p) bf16_widen8(p)
#define KV_ROW(p, d, buf) row_bf16(p, d, buf)
#include "attention_paged.h"
