/* One row of a gated activation in float32: o[i] = act(gate[i]) * up[i]. act: 0 = SiLU, 1 = GeLU (tanh approximation),
 * 2 = GeLU (erf). SiLU and the tanh GeLU run 16 lanes (8 with AVX2) at a time through vexp.h (silu(g) = g / (1 +
 * e^-g), gelu_tanh(g) = g / (1 + e^-2u), u = sqrt(2/pi) (g + 0.044715 g^3)); an element's arithmetic depends only on
 * its column, never on the rows beside it. Shared by the activation kernels and the MoE kernels. */
#ifndef LAYERZERO_NATIVE_GATED_H
#define LAYERZERO_NATIVE_GATED_H

#include <math.h>
#include <stdint.h>

#include "vexp.h"

static inline float gated_scalar(float g, int act) {
    if (act == 0) return g / (1.0f + expf(-g));
    if (act == 1) return g / (1.0f + expf(-1.5957691216057308f * (g + 0.044715f * g * g * g)));
    return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
}

static inline void gated_row(const float *gate, const float *up, int64_t inner, int act, float *o) {
    int64_t i = 0;
#if defined(__AVX512F__)
    if (act != 2) {
        const __m512 one = _mm512_set1_ps(1.0f);
        for (; i + 16 <= inner; i += 16) {
            __m512 g = _mm512_loadu_ps(gate + i), arg = g;
            if (act == 1)
                arg = _mm512_mul_ps(_mm512_set1_ps(1.5957691216057308f),
                                    _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), g),
                                                    _mm512_mul_ps(g, g), g));
            __m512 a = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), arg))));
            _mm512_storeu_ps(o + i, _mm512_mul_ps(a, _mm512_loadu_ps(up + i)));
        }
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (act != 2) {
        const __m256 one = _mm256_set1_ps(1.0f);
        for (; i + 8 <= inner; i += 8) {
            __m256 g = _mm256_loadu_ps(gate + i), arg = g;
            if (act == 1)
                arg = _mm256_mul_ps(_mm256_set1_ps(1.5957691216057308f),
                                    _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), g),
                                                    _mm256_mul_ps(g, g), g));
            __m256 a = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), arg))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(a, _mm256_loadu_ps(up + i)));
        }
    }
#endif
    for (; i < inner; i++) o[i] = gated_scalar(gate[i], act) * up[i];
}

#endif
