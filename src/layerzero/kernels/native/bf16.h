/* bfloat16 <-> float32 for kernels that read or write bf16 rows while computing in float32 (the rows a CPU bf16
 * model hands its oneDNN bf16 GEMMs). Widening is exact (the 16 bits become the float's high half); narrowing rounds
 * to nearest even as torch's .to(torch.bfloat16) does, bit for bit (NaN becomes torch's quiet NaN, 0x7fc0), so a
 * kernel's bf16 output equals its float32 output cast by torch. AVX512-BF16's vcvtneps2bf16 is not used: it treats
 * denormal inputs as zero, torch does not. build.py hashes this header into every library's cache key. */
#ifndef LAYERZERO_NATIVE_BF16_H
#define LAYERZERO_NATIVE_BF16_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

static inline float bf16_widen(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__AVX512F__)
/* 16 bf16 values at p widened into float32 lanes. */
static inline __m512 bf16_widen16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#endif

#if defined(__AVX2__)
/* 8 bf16 values at p widened into float32 lanes. */
static inline __m256 bf16_widen8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
#endif

/* n values of src widened into dst, n rounded from src into dst. */
static inline void bf16_widen_n(const uint16_t *src, int64_t n, float *dst) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, bf16_widen16(src + i));
#endif
    for (; i < n; i++) dst[i] = bf16_widen(src[i]);
}

static inline void bf16_round_n(const float *src, int64_t n, uint16_t *dst) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), nan = _mm512_set1_epi32(0x7fc0);
    for (; i + 16 <= n; i += 16) {
        __m512 f = _mm512_loadu_ps(src + i);
        __m512i u = _mm512_castps_si512(f);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias),
                                                       _mm512_and_si512(_mm512_srli_epi32(u, 16), one)), 16);
        r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), nan);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
    }
#endif
    for (; i < n; i++) dst[i] = bf16_round(src[i]);
}

#endif
