/* exp over 16 float32 lanes (AVX-512), for the softmax of attention and the gated activations: glibc's expf does not
 * vectorize without -ffast-math, and one scalar expf (~10 ns) per element made a 16-row decode step's SiLU and
 * softmax cost more than its matmuls. exp(x) = 2^n exp(r), n = round(x log2 e), r = x - n ln 2 in two parts
 * (Cody-Waite), exp(r) by Cephes' degree-7 polynomial: within 2 ulp of expf over the float range. build.py hashes
 * this header into every library's cache key. */
#ifndef LAYERZERO_NATIVE_VEXP_H
#define LAYERZERO_NATIVE_VEXP_H

#if defined(__AVX512F__)
#include <immintrin.h>

static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

#endif
