/* RMSNorm on the CPU in float32: out = x / sqrt(mean(x^2) + eps) * (weight + offset), optionally of x + residual
 * (returned too). Row sums keep 16 lane sums added in a fixed order, so a row's
 * result does not depend on the batch. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "lanes.h"

/* x, out [rows, d]. With residual (and summed) [rows, d]: summed = x + residual, and summed is normalized. */
void rms_norm(const float *x, const float *residual, float *summed, const float *weight, float offset, float eps,
              int64_t rows, int64_t d, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *src = x + r * d;
        float *o = out + r * d;
        if (residual != NULL) {
            float *sum = summed + r * d;
            for (int64_t i = 0; i < d; i++) sum[i] = src[i] + residual[r * d + i];
            src = sum;
        }
        float inv = 1.0f / sqrtf(lane_dot(src, src, d) / (float)d + eps);
        for (int64_t i = 0; i < d; i++) o[i] = src[i] * inv * (weight[i] + offset);
    }
}
