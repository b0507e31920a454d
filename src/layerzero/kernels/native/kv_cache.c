/* KV-cache store on the CPU (float32): token t's keys and values (Hkv * D contiguous floats at t * stride) go to
 * flat slot slot_mapping[t] of the caches; a negative slot (padding) is skipped. Returns 0, or -2 when a slot lies
 * past the cache (nothing is written then). */
#include <stdint.h>
#include <string.h>

int store_kv_cache(const float *key, int64_t key_stride, const float *value, int64_t value_stride, float *key_cache,
                   float *value_cache, const int64_t *slots, int64_t tokens, int64_t width, int64_t num_slots) {
    for (int64_t t = 0; t < tokens; t++)
        if (slots[t] >= num_slots) return -2;
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        memcpy(key_cache + slots[t] * width, key + t * key_stride, sizeof(float) * (size_t)width);
        memcpy(value_cache + slots[t] * width, value + t * value_stride, sizeof(float) * (size_t)width);
    }
    return 0;
}
