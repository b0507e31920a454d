/* Gated activations on the CPU in float32: out[t, i] = act(x[t, i]) * x[t, I + i] for x [T, 2I] (a fused gate/up
 * projection), rows split over the threads; gated.h holds the row's arithmetic. */
#include <stdint.h>

#include "gated.h"

void gated_activation(const float *x, int64_t tokens, int64_t inner, int act, float *out) {
#pragma omp parallel for schedule(static) if (tokens * inner >= 16384)
    for (int64_t t = 0; t < tokens; t++) gated_row(x + t * 2 * inner, x + t * 2 * inner + inner, inner, act,
                                                   out + t * inner);
}
