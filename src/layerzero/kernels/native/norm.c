/* RMSNorm on the CPU in float32: out = x / sqrt(mean(x^2) + eps) * (weight + offset), optionally of x + residual
 * (returned too). Row sums keep 16 lane sums added in a fixed order, so a row's
 * result does not depend on the batch. The bf16 form adds bfloat16 rows x (a CPU bf16 model's projection output) to
 * the float32 residual stream and writes the normed rows in bfloat16 (the next projection's GEMM input): the float32
 * kernel's arithmetic on the widened x, its output rounded (bf16.h). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "bf16.h"
#include "lanes.h"

/* x, out [rows, d]. With residual (and summed) [rows, d]: summed = x + residual, and summed is normalized. */
void rms_norm(const float *x, const float *residual, float *summed, const float *weight, float offset, float eps,
              int64_t rows, int64_t d, float *out) {
#pragma omp parallel for schedule(static) if (rows * d >= 65536)
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

/* x bf16, residual and summed float32, out bf16, all [rows, d]: summed = x + residual, out = norm(summed). */
void add_rms_norm_bf16(const uint16_t *x, const float *residual, float *summed, const float *weight, float offset,
                       float eps, int64_t rows, int64_t d, uint16_t *out) {
#pragma omp parallel for schedule(static) if (rows * d >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        float *sum = summed + r * d, normed[512];
        bf16_widen_n(x + r * d, d, sum);
        for (int64_t i = 0; i < d; i++) sum[i] += residual[r * d + i];
        float inv = 1.0f / sqrtf(lane_dot(sum, sum, d) / (float)d + eps);
        for (int64_t c = 0; c < d; c += 512) {
            int64_t n = d - c < 512 ? d - c : 512;
            for (int64_t i = 0; i < n; i++) normed[i] = sum[c + i] * inv * (weight[c + i] + offset);
            bf16_round_n(normed, n, out + r * d + c);
        }
    }
}
