/* Rotary position embedding on the CPU in float32, into a new contiguous [T, H, D] tensor.
 * Half-split (neox): (x1, x2) = (x[:D/2], x[D/2:]) -> (x1 c - x2 s, x2 c + x1 s); interleaved: the same on the pairs
 * (x[2i], x[2i+1]). x may be a strided view: row stride and head stride in elements, the last dimension contiguous.
 * A prompt's rows are split over the OpenMP threads; a decode step's few run on the calling thread. */
#include <stdint.h>

void rope(const float *x, int64_t row_stride, int64_t head_stride, const float *cos, const float *sin, int64_t tokens,
          int64_t heads, int64_t d, int interleaved, float *out) {
    int64_t half = d / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * d >= 65536)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < heads; h++) {
            const float *src = x + t * row_stride + h * head_stride;
            float *dst = out + (t * heads + h) * d;
            if (interleaved) {
                for (int64_t i = 0; i < half; i++) {
                    float a = src[2 * i], b = src[2 * i + 1];
                    dst[2 * i] = a * c[i] - b * s[i];
                    dst[2 * i + 1] = b * c[i] + a * s[i];
                }
            } else {
                for (int64_t i = 0; i < half; i++) {
                    float a = src[i], b = src[half + i];
                    dst[i] = a * c[i] - b * s[i];
                    dst[half + i] = b * c[i] + a * s[i];
                }
            }
        }
    }
}
