/* A float32 dot product kept as 16 lane sums added up in a fixed order: GCC vectorizes it without -ffast-math (no
 * reassociation), and a row's result does not depend on what else a kernel computes. Shared by attention.c and
 * norm.c; build.py hashes this header into every library's cache key. */
#ifndef LAYERZERO_NATIVE_LANES_H
#define LAYERZERO_NATIVE_LANES_H

#include <stdint.h>

#define LANES 16

static inline float lane_dot(const float *a, const float *b, int64_t d) {
    float lanes[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= d; i += LANES)
        for (int l = 0; l < LANES; l++) lanes[l] += a[i + l] * b[i + l];
    float total = 0.0f;
    for (int l = 0; l < LANES; l++) total += lanes[l];
    for (; i < d; i++) total += a[i] * b[i];
    return total;
}

#endif
