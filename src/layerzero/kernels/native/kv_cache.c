/* KV-cache store on the CPU: token t's float32 keys and values (Hkv * D contiguous floats at t * stride) go to flat
 * slot slot_mapping[t] of the caches, float32 (`store_kv_cache`) or bf16 rounded to nearest even as torch rounds
 * (`store_kv_cache_bf16`, a CPU bf16 model's cache); a negative slot (padding) is skipped. Returns 0, or -2 when a
 * slot lies past the cache (nothing is written then). */
#include <stdint.h>
#include <string.h>

#include "bf16.h"

static int slots_fit(const int64_t *slots, int64_t tokens, int64_t num_slots) {
    for (int64_t t = 0; t < tokens; t++)
        if (slots[t] >= num_slots) return 0;
    return 1;
}

int store_kv_cache(const float *key, int64_t key_stride, const float *value, int64_t value_stride, float *key_cache,
                   float *value_cache, const int64_t *slots, int64_t tokens, int64_t width, int64_t num_slots) {
    if (!slots_fit(slots, tokens, num_slots)) return -2;
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        memcpy(key_cache + slots[t] * width, key + t * key_stride, sizeof(float) * (size_t)width);
        memcpy(value_cache + slots[t] * width, value + t * value_stride, sizeof(float) * (size_t)width);
    }
    return 0;
}

int store_kv_cache_bf16(const float *key, int64_t key_stride, const float *value, int64_t value_stride,
                        uint16_t *key_cache, uint16_t *value_cache, const int64_t *slots, int64_t tokens, int64_t width,
                        int64_t num_slots) {
    if (!slots_fit(slots, tokens, num_slots)) return -2;
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        bf16_round_n(key + t * key_stride, width, key_cache + slots[t] * width);
        bf16_round_n(value + t * value_stride, width, value_cache + slots[t] * width);
    }
    return 0;
}
