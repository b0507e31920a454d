/* bfloat16 GEMM on Intel AMX: out[m, n] = x[m, :] . W[n, :] (+ bias[n]) for bf16 x and W, float32 accumulation,
 * the result rounded to bf16 (round to nearest even) or kept in float32.
 *
 * AMX multiplies a tile of 16 rows x 32 bf16 of x by a tile of W laid out in pairs: tile row p holds, for each of 16
 * output columns, W[col, 2p] and W[col, 2p + 1] side by side. `amx_pack` lays W [N, K] out once in that form, per
 * 16-column block of W and 32-column chunk of K one 1 KiB tile ([N/16][K/32][16 pairs][16 columns][2]; columns past N
 * are zero), so a block's chunks are one contiguous stream. x needs no packing: its tile is 16 rows of 64 bytes read
 * with x's row stride.
 *
 * `amx_linear` gives each thread whole pairs of column blocks (their W stays in L2 while every 32-row pair of x's
 * blocks passes over it) and keeps four accumulator tiles (2 row blocks x 2 column blocks). A row's result depends
 * only on that row (the k order is fixed), so a request gets the same bits alone or in a batch.
 *
 * Built on every CPU; without AMX (the compiler's __AMX_BF16__) the entry points return -1 and layerzero says why.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define HAVE_AMX 1
#endif

#define COLS 16   /* output columns per tile (float32 accumulators of 64 bytes) */
#define KSTEP 32  /* bf16 of x per tile row (64 bytes) */
#define ROWS 16   /* rows of x per tile */
#define TILE_ELEMS (ROWS * KSTEP)  /* bf16 in one packed W tile: 16 pairs x 16 columns x 2 */
#define LINES (TILE_ELEMS * 2 / 64)  /* cache lines in a packed W tile */
#ifndef MCHUNK
#define MCHUNK 128  /* rows of x per pass over the weights: x's chunk stays in L2 while a thread's W streams past */
#endif

/* W [n, k] bf16 -> packed [ceil(n/16)][k/32][16][16][2]; k a multiple of 32. */
int amx_pack(const uint16_t *w, int64_t n, int64_t k, uint16_t *packed) {
    if (k % KSTEP)
        return -2;
    int64_t blocks = (n + COLS - 1) / COLS, chunks = k / KSTEP;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t c = 0; c < chunks; c++) {
            uint16_t *tile = packed + (b * chunks + c) * TILE_ELEMS;
            for (int p = 0; p < KSTEP / 2; p++)
                for (int col = 0; col < COLS; col++) {
                    int64_t row = b * COLS + col, at = c * KSTEP + 2 * p;
                    tile[p * 2 * COLS + 2 * col] = row < n ? w[row * k + at] : 0;
                    tile[p * 2 * COLS + 2 * col + 1] = row < n ? w[row * k + at + 1] : 0;
                }
        }
    return 0;
}

#ifdef HAVE_AMX
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* Linux hands out the AMX register state only to processes that ask (once, for the whole process). */
static int permitted(void) {
    static int state = 0;  /* 0 not asked, 1 granted, -1 refused */
    if (state == 0)
        state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return state == 1;
}

/* Tiles: 0-1 row block 0's accumulators (column blocks 0, 1), 2-3 row block 1's, 4-5 x's two row blocks, 6-7 W's two
 * column blocks. A row block of r0 / r1 rows (r1 may be 0: unused). */
static void configure(int r0, int r1) {
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    int rows[8] = {r0, r0, r1, r1, r0, r1, KSTEP / 2, KSTEP / 2};
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = rows[t] ? rows[t] : 1;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* One accumulator tile (rows x 16 float32 at acc) into out's rows, columns [n0, n0 + valid). */
static void store(const float *acc, int rows, int valid, int64_t n0, const float *bias, void *out, int64_t ldo,
                  int bf16_out) {
    __mmask16 mask = (__mmask16)((1u << valid) - 1);
    __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(acc + r * COLS), b);
        if (bf16_out)
            _mm256_mask_storeu_epi16((uint16_t *)out + r * ldo + n0, mask, (__m256i)_mm512_cvtneps_pbh(v));
        else
            _mm512_mask_storeu_ps((float *)out + r * ldo + n0, mask, v);
    }
}

/* acc[0..3] = (row block 0, 1) x (column block 0, 1) of x's rows at x0 (row block 1 present when r1, column block 1
 * when two) times the packed column blocks at w0 (block 1 follows block 0's chunks), k in 32-column steps. */
static inline void multiply(const uint16_t *x0, int64_t k, int r1, const uint16_t *w0, int two, int64_t chunks,
                            const char *ahead, int per_chunk, float acc[4][ROWS * COLS]) {
    const uint16_t *x1 = x0 + ROWS * k, *w1 = w0 + chunks * TILE_ELEMS;
    const int64_t xs = k * 2;  /* x's row stride in bytes */
    _tile_zero(0);
    _tile_zero(1);
    if (r1) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t c = 0; c < chunks; c++) {
        for (int line = 0; line < per_chunk; line++)
            _mm_prefetch(ahead + 64 * (c * per_chunk + line), _MM_HINT_T0);
        _tile_loadd(4, x0 + c * KSTEP, xs);
        _tile_loadd(6, w0 + c * TILE_ELEMS, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two) {
            _tile_loadd(7, w1 + c * TILE_ELEMS, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (r1) {
            _tile_loadd(5, x1 + c * KSTEP, xs);
            _tile_dpbf16ps(2, 5, 6);
            if (two)
                _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, acc[0], 64);
    if (two)
        _tile_stored(1, acc[1], 64);
    if (r1) {
        _tile_stored(2, acc[2], 64);
        if (two)
            _tile_stored(3, acc[3], 64);
    }
}
#endif

/* out [m, n] (bf16 if bf16_out, else float32) = x [m, k] bf16 @ W.T (+ bias float32 [n]) with W packed by amx_pack.
 * Returns 0, or -1 where this CPU / build / kernel has no AMX. */
int amx_linear(const uint16_t *x, int64_t m, int64_t k, const uint16_t *packed, int64_t n, const float *bias,
               void *out, int bf16_out, int threads) {
#ifdef HAVE_AMX
    if (!permitted())
        return -1;
    if (k % KSTEP)
        return -2;
    const int64_t blocks = (n + COLS - 1) / COLS, pairs = (blocks + 1) / 2, chunks = k / KSTEP;
#pragma omp parallel num_threads(threads)
    {
        float acc[4][ROWS * COLS] __attribute__((aligned(64)));
        int cr0 = -1, cr1 = -1;
        for (int64_t mc = 0; mc < m; mc += MCHUNK) {
            const int64_t m_end = mc + MCHUNK < m ? mc + MCHUNK : m;
            /* the same column pairs for every chunk of x: a thread's W stays in its L2; no barrier needed */
#pragma omp for schedule(static) nowait
            for (int64_t p = 0; p < pairs; p++) {
                const int64_t b0 = 2 * p;
                const int two = b0 + 1 < blocks;
                const uint16_t *w0 = packed + b0 * chunks * TILE_ELEMS;
                /* W comes from memory and tile loads alone wait on each line: while this pair multiplies, the
                 * next pair's W (this thread's next, with a static schedule) is fetched, spread over the passes */
                const int64_t passes = (m_end - mc + 2 * ROWS - 1) / (2 * ROWS);
                const char *next = (const char *)(w0 + 2 * chunks * TILE_ELEMS);
                int64_t lines = b0 + 2 < blocks ? (b0 + 3 < blocks ? 2 : 1) * chunks * LINES : 0;
                const int per_chunk = (int)((lines + passes * chunks - 1) / (passes * chunks));
                for (int64_t m0 = mc; m0 < m_end; m0 += 2 * ROWS) {
                    int r0 = m_end - m0 < ROWS ? (int)(m_end - m0) : ROWS;
                    int r1 = m_end - m0 - r0 < ROWS ? (int)(m_end - m0 - r0) : ROWS;
                    if (r0 != cr0 || r1 != cr1) {
                        configure(r0, r1);
                        cr0 = r0, cr1 = r1;
                    }
                    const char *ahead = next + 64 * per_chunk * chunks * ((m0 - mc) / (2 * ROWS));
                    multiply(x + m0 * k, k, r1, w0, two, chunks, ahead, per_chunk, acc);
                    const int64_t n0 = b0 * COLS, n1 = n0 + COLS;
                    const int v0 = n - n0 < COLS ? (int)(n - n0) : COLS;
                    const int v1 = two ? (n - n1 < COLS ? (int)(n - n1) : COLS) : 0;
                    const size_t unit = bf16_out ? 2 : 4;
                    char *o0 = (char *)out + m0 * n * unit, *o1 = o0 + ROWS * n * unit;
                    store(acc[0], r0, v0, n0, bias, o0, n, bf16_out);
                    if (two)
                        store(acc[1], r0, v1, n1, bias, o0, n, bf16_out);
                    if (r1) {
                        store(acc[2], r1, v0, n0, bias, o1, n, bf16_out);
                        if (two)
                            store(acc[3], r1, v1, n1, bias, o1, n, bf16_out);
                    }
                }
            }
        }
        _tile_release();
    }
    return 0;
#else
    (void)x, (void)m, (void)k, (void)packed, (void)n, (void)bias, (void)out, (void)bf16_out, (void)threads;
    return -1;
#endif
}

/* 1 where this build has AMX and Linux granted it, else 0. */
int amx_available(void) {
#ifdef HAVE_AMX
    return permitted();
#else
    return 0;
#endif
}
