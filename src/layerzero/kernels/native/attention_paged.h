/* The body of attention.c for one KV-cache element type, included once per type: KV_T (float, or uint16_t holding
 * bf16 bits), KV_NAME(x) (the type's names of the functions), KV_LOAD16(p) (16 cache elements as float32 lanes) and
 * KV_ROW(p, d, buf) (a cache row as float32: itself, or widened into buf). The arithmetic after the load is the same
 * for both types, so a bf16 cache gives what a float32 cache holding the same (bf16-rounded) values gives. */
#if defined(__AVX512F__)
/* One work item (query row at q, `per` heads sharing one KV head) for a head size of C * 16 floats, C a constant, so
 * a key row and each head's output stay in registers: per key, each head's score is one vector of products reduced
 * by a fixed shuffle tree; per value row, each head's output accumulates in C vectors. Key and value rows are found
 * through the block table. The same arithmetic for a head whatever `per` is: a row's result depends on nothing else. */
#define ATTEND(C)                                                                                                  \
    static void KV_NAME(attend_##C)(const float *q, int64_t per, int64_t d, const KV_T *kc, const KV_T *vc,      \
                                    const int32_t *table, int64_t bs, int64_t row_stride, int64_t kv_offset,    \
                                    int64_t lo, int64_t pos, float scale, float *scores, int64_t max_ctx,       \
                                    float *out) {                                                               \
        int64_t n = pos - lo + 1;                                                                                 \
        float top[per];                                                                                           \
        for (int64_t g = 0; g < per; g++) top[g] = -INFINITY;                                                     \
        for (int64_t j = lo; j <= pos; j++) {                                                                     \
            const KV_T *k = kc + ((int64_t)table[j / bs] * bs + j % bs) * row_stride + kv_offset;                 \
            if (j + 4 <= pos) { /* the hardware prefetcher does not follow the block table */                    \
                const KV_T *ahead = kc + ((int64_t)table[(j + 4) / bs] * bs + (j + 4) % bs) * row_stride + kv_offset;\
                for (int c = 0; c < C; c++) _mm_prefetch((const char *)(ahead + 16 * c), _MM_HINT_T0);          \
            }                                                                                                     \
            __m512 kv[C];                                                                                         \
            for (int c = 0; c < C; c++) kv[c] = KV_LOAD16(k + 16 * c);                                            \
            for (int64_t g = 0; g < per; g++) {                                                                   \
                const float *qg = q + g * d;                                                                      \
                __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qg), kv[0]);                                           \
                for (int c = 1; c < C; c++) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * c), kv[c], acc);      \
                float s = scale * _mm512_reduce_add_ps(acc);                                                      \
                scores[g * max_ctx + j - lo] = s;                                                                 \
                if (s > top[g]) top[g] = s;                                                                       \
            }                                                                                                     \
        }                                                                                                         \
        for (int64_t g = 0; g < per; g++) {                                                                       \
            float *sc = scores + g * max_ctx, total = 0.0f;                                                       \
            exp_shifted(sc, n, top[g]);                                                                           \
            __m512 o[C];                                                                                          \
            for (int c = 0; c < C; c++) o[c] = _mm512_setzero_ps();                                               \
            for (int64_t j = lo; j <= pos; j++) {                                                                 \
                const KV_T *v = vc + ((int64_t)table[j / bs] * bs + j % bs) * row_stride + kv_offset;             \
                if (j + 4 <= pos) {                                                                               \
                    const KV_T *ahead = vc + ((int64_t)table[(j + 4) / bs] * bs + (j + 4) % bs) * row_stride      \
                                         + kv_offset;                                                             \
                    for (int c = 0; c < C; c++) _mm_prefetch((const char *)(ahead + 16 * c), _MM_HINT_T0);      \
                }                                                                                                 \
                float e = sc[j - lo];                                                                             \
                __m512 ev = _mm512_set1_ps(e);                                                                    \
                total += e;                                                                                       \
                for (int c = 0; c < C; c++) o[c] = _mm512_fmadd_ps(ev, KV_LOAD16(v + 16 * c), o[c]);              \
            }                                                                                                     \
            __m512 inv = _mm512_set1_ps(total > 0.0f ? 1.0f / total : 0.0f); /* no visible key (padding): 0 */    \
            for (int c = 0; c < C; c++) _mm512_storeu_ps(out + g * d + 16 * c, _mm512_mul_ps(o[c], inv));         \
        }                                                                                                         \
    }
ATTEND(4)
ATTEND(8)
#elif defined(__AVX2__) && defined(__FMA__)
/* ATTEND's AVX2 form for a head size of C * 8 floats: 8-lane vectors, a key row's C vectors loaded once for all
 * `per` heads, each head's output accumulated 8 vectors (64 columns) at a time over the value rows. */
#define ATTEND8(C)                                                                                                 \
    static void KV_NAME(attend8_##C)(const float *q, int64_t per, int64_t d, const KV_T *kc, const KV_T *vc,     \
                                     const int32_t *table, int64_t bs, int64_t row_stride, int64_t kv_offset,   \
                                     int64_t lo, int64_t pos, float scale, float *scores, int64_t max_ctx,      \
                                     float *out) {                                                              \
        int64_t n = pos - lo + 1;                                                                                 \
        float top[per];                                                                                           \
        for (int64_t g = 0; g < per; g++) top[g] = -INFINITY;                                                     \
        for (int64_t j = lo; j <= pos; j++) {                                                                     \
            const KV_T *k = kc + ((int64_t)table[j / bs] * bs + j % bs) * row_stride + kv_offset;                 \
            if (j + 4 <= pos) { /* the hardware prefetcher does not follow the block table */                    \
                const KV_T *ahead = kc + ((int64_t)table[(j + 4) / bs] * bs + (j + 4) % bs) * row_stride + kv_offset;\
                for (int c = 0; c < C; c += 64 / (8 * (int)sizeof(KV_T)))                                          \
                    _mm_prefetch((const char *)(ahead + 8 * c), _MM_HINT_T0);                                     \
            }                                                                                                     \
            __m256 kv[C];                                                                                         \
            for (int c = 0; c < C; c++) kv[c] = KV_LOAD8(k + 8 * c);                                              \
            for (int64_t g = 0; g < per; g++) {                                                                   \
                const float *qg = q + g * d;                                                                      \
                __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qg), kv[0]);                                           \
                for (int c = 1; c < C; c++) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8 * c), kv[c], acc);       \
                __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));                \
                h = _mm_add_ps(h, _mm_movehl_ps(h, h));                                                           \
                float s = scale * _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));                               \
                scores[g * max_ctx + j - lo] = s;                                                                 \
                if (s > top[g]) top[g] = s;                                                                       \
            }                                                                                                     \
        }                                                                                                         \
        for (int64_t g = 0; g < per; g++) {                                                                       \
            float *sc = scores + g * max_ctx, total = 0.0f;                                                       \
            exp_shifted(sc, n, top[g]);                                                                           \
            for (int64_t j = 0; j < n; j++) total += sc[j];                                                       \
            __m256 inv = _mm256_set1_ps(total > 0.0f ? 1.0f / total : 0.0f); /* no visible key (padding): 0 */    \
            for (int c0 = 0; c0 < C; c0 += 8) {                                                                   \
                __m256 o[8];                                                                                      \
                for (int c = 0; c < 8; c++) o[c] = _mm256_setzero_ps();                                           \
                for (int64_t j = lo; j <= pos; j++) {                                                             \
                    const KV_T *v = vc + ((int64_t)table[j / bs] * bs + j % bs) * row_stride + kv_offset + 8 * c0;\
                    if (j + 4 <= pos) {                                                                           \
                        const KV_T *ahead = vc + ((int64_t)table[(j + 4) / bs] * bs + (j + 4) % bs) * row_stride      \
                                            + kv_offset + 8 * c0;                                                 \
                        for (int c = 0; c < 8; c += 64 / (8 * (int)sizeof(KV_T)))                                   \
                            _mm_prefetch((const char *)(ahead + 8 * c), _MM_HINT_T0);                            \
                    }                                                                                             \
                    __m256 ev = _mm256_set1_ps(sc[j - lo]);                                                       \
                    for (int c = 0; c < 8; c++) o[c] = _mm256_fmadd_ps(ev, KV_LOAD8(v + 8 * c), o[c]);            \
                }                                                                                                 \
                for (int c = 0; c < 8; c++) _mm256_storeu_ps(out + g * d + 8 * (c0 + c), _mm256_mul_ps(o[c], inv));\
            }                                                                                                     \
        }                                                                                                         \
    }
ATTEND8(8)
ATTEND8(16)
#endif

/* q [T, H, D] with row stride q_stride (heads side by side); caches [blocks, bs, Hkv, D]; tables [B, max_blocks]
 * int32; cu_q [B + 1] int32 or NULL (decode: row t is sequence t, one token); ctx [B] int32; window <= 0 means
 * none; rows of a sequence with more than max_q_len (> 0) new tokens are left untouched. Returns 0, -1 without memory, -2 on lengths or tables that would read outside the cache. */
int KV_NAME(paged_attention)(const float *q, int64_t q_stride, const KV_T *kc, const KV_T *vc, const int32_t *tables,
                    int64_t max_blocks, const int32_t *cu_q, const int32_t *ctx, int64_t batch, int64_t heads, int64_t kv_heads,
                    int64_t d, int64_t bs, int64_t num_blocks, int64_t max_ctx, float scale, int64_t window,
                    int64_t max_q_len, float *out, int threads) {
    for (int64_t b = 0; b < batch; b++) {  /* bounds first: a bad length or table must not read past the cache */
        int64_t q_len = cu_q == NULL ? 0 : cu_q[b + 1] - cu_q[b];  /* a decode row may be padding, context 0 */
        if (ctx[b] < 0 || ctx[b] > max_ctx || ctx[b] > max_blocks * bs || q_len < 0 || q_len > ctx[b]) return -2;
        for (int64_t j = 0; j < (ctx[b] + bs - 1) / bs; j++)
            if (tables[b * max_blocks + j] < 0 || tables[b * max_blocks + j] >= num_blocks) return -2;
    }
    int64_t rows = cu_q == NULL ? batch : cu_q[batch];
    int64_t *seq_of = malloc(sizeof(int64_t) * (size_t)(rows > 0 ? rows : 1));
    float *scratch = malloc(sizeof(float) * (size_t)(threads * (heads / kv_heads) * (max_ctx > 0 ? max_ctx : 1)));
    if (seq_of == NULL || scratch == NULL) {
        free(seq_of);
        free(scratch);
        return -1;
    }
    for (int64_t b = 0; b < batch; b++) {
        int64_t start = cu_q == NULL ? b : cu_q[b], end = cu_q == NULL ? b + 1 : cu_q[b + 1];
        for (int64_t t = start; t < end; t++) seq_of[t] = b;
    }
    int64_t group = heads / kv_heads, row_stride = kv_heads * d;
    /* Each work item is `per` query heads of one row that share a KV head: each key and value row is loaded once for
     * all of them. With few rows (batch-1 decode) items are single heads, so every thread still gets work. A head's
     * arithmetic is the same either way. */
    int64_t per = rows * kv_heads >= 4 * (int64_t)threads ? group : 1, items = rows * (heads / per);
#pragma omp parallel num_threads(threads)
    {
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        float *scores = scratch + (int64_t)thread * per * max_ctx;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < items; item++) {
            int64_t t = item / (heads / per), h0 = (item % (heads / per)) * per, b = seq_of[t];
            int64_t first = cu_q == NULL ? b : cu_q[b], q_len = cu_q == NULL ? 1 : cu_q[b + 1] - cu_q[b];
            if (max_q_len > 0 && q_len > max_q_len) continue;  /* a long chunk: the caller attends to it */
            int64_t pos = ctx[b] - q_len + (t - first);
            int64_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0, n = pos - lo + 1;
            const int32_t *table = tables + b * max_blocks;
            int64_t kv_offset = (h0 / group) * d;
#if defined(__AVX512F__)
            if (d == 64 || d == 128) {  /* the common head sizes: registers hold a key row and each head's output */
                (d == 64 ? KV_NAME(attend_4) : KV_NAME(attend_8))(q + t * q_stride + h0 * d, per, d, kc, vc, table,
                                                                  bs, row_stride, kv_offset, lo, pos, scale, scores,
                                                                  max_ctx, out + (t * heads + h0) * d);
                continue;
            }
#elif defined(__AVX2__) && defined(__FMA__)
            if (d == 64 || d == 128) {
                (d == 64 ? KV_NAME(attend8_8) : KV_NAME(attend8_16))(q + t * q_stride + h0 * d, per, d, kc, vc, table,
                                                                     bs, row_stride, kv_offset, lo, pos, scale,
                                                                     scores, max_ctx, out + (t * heads + h0) * d);
                continue;
            }
#endif
            float top[per], total[per];
            for (int64_t g = 0; g < per; g++) top[g] = -INFINITY;
            float row[d];  /* a key or value row in float32 (a bf16 cache's widened) */
            for (int64_t j = lo; j <= pos; j++) {
                const float *k = KV_ROW(kc + ((int64_t)table[j / bs] * bs + j % bs) * row_stride + kv_offset, d, row);
                for (int64_t g = 0; g < per; g++) {
                    float s = scale * lane_dot(q + t * q_stride + (h0 + g) * d, k, d);
                    scores[g * max_ctx + j - lo] = s;
                    if (s > top[g]) top[g] = s;
                }
            }
            for (int64_t g = 0; g < per; g++) {
                float *o = out + (t * heads + h0 + g) * d;
                exp_shifted(scores + g * max_ctx, n, top[g]);
                total[g] = 0.0f;
                for (int64_t i = 0; i < d; i++) o[i] = 0.0f;
            }
            for (int64_t j = lo; j <= pos; j++) {
                const float *v = KV_ROW(vc + ((int64_t)table[j / bs] * bs + j % bs) * row_stride + kv_offset, d, row);
                for (int64_t g = 0; g < per; g++) {
                    float e = scores[g * max_ctx + j - lo], *o = out + (t * heads + h0 + g) * d;
                    total[g] += e;
                    for (int64_t i = 0; i < d; i++) o[i] += e * v[i];
                }
            }
            for (int64_t g = 0; g < per; g++) {
                float inv = total[g] > 0.0f ? 1.0f / total[g] : 0.0f;  /* no visible key (padding) gives 0 */
                float *o = out + (t * heads + h0 + g) * d;
                for (int64_t i = 0; i < d; i++) o[i] *= inv;
            }
        }
    }
    free(seq_of);
    free(scratch);
    return 0;
}

#undef ATTEND
#undef ATTEND8
