/* Gated activations on the CPU: out[t, i] = act(x[t, i]) * x[t, I + i] for x [T, 2I] (a fused gate/up projection),
 * rows split over the threads; gated.h holds the row's arithmetic, in float32. The bf16 form reads and writes
 * bfloat16 rows (a CPU bf16 model's gate_up GEMM output and down GEMM input) and computes in float32: each block of
 * a row is widened, goes through gated_row, and is rounded, so its result is the float32 kernel's on the widened
 * input, rounded to bf16 (bf16.h). */
#include <stdint.h>

#include "bf16.h"
#include "gated.h"

#define BLOCK 512  /* columns widened at a time: three float32 blocks stay in L1 */

void gated_activation(const float *x, int64_t tokens, int64_t inner, int act, float *out) {
#pragma omp parallel for schedule(static) if (tokens * inner >= 16384)
    for (int64_t t = 0; t < tokens; t++) gated_row(x + t * 2 * inner, x + t * 2 * inner + inner, inner, act,
                                                   out + t * inner);
}

void gated_activation_bf16(const uint16_t *x, int64_t tokens, int64_t inner, int act, uint16_t *out) {
#pragma omp parallel for schedule(static) if (tokens * inner >= 16384)
    for (int64_t t = 0; t < tokens; t++) {
        float gate[BLOCK], up[BLOCK], o[BLOCK];
        const uint16_t *row = x + t * 2 * inner;
        for (int64_t c = 0; c < inner; c += BLOCK) {
            int64_t n = inner - c < BLOCK ? inner - c : BLOCK;
            bf16_widen_n(row + c, n, gate);
            bf16_widen_n(row + inner + c, n, up);
            gated_row(gate, up, n, act, o);
            bf16_round_n(o, n, out + t * inner + c);
        }
    }
}
