/* float32 GEMM for AVX2 CPUs: out[m, n] = x[m, :] . W[n, :] (+ bias[n]), the rows of a prefill or of a large decode
 * batch, past the GEMV's few rows.
 *
 * oneDNN's AVX2 GEMM (brg_matmul:avx2) reaches ~66 GFLOP/s a core on a Zen 4 whose FMA units do ~130, on small LLMs'
 * shapes and on 2048^3 alike. This one is the textbook register-blocked form: W is packed once into panels of 16
 * output columns ([ceil(n/16)][k][16], columns past n zero), and a 6 x 16 block of out lives in 12 ymm accumulators
 * while k runs: each step loads the panel's 16 weights (two vectors) and broadcasts 6 values of x, 12 FMAs. A
 * thread takes whole panels of a block of MC rows; the panel (at most 16 x k floats) and the block of x stay in its
 * L2 while the 6-row strips pass. Every out[i, j] is one FMA chain over k in order, whatever else shares the call:
 * a row gets the same bits alone or in a batch (rows of a short strip are computed beside copies of its first).
 *
 * Built on every CPU; without AVX2 and FMA (the compiler's __AVX2__, __FMA__) the entry point returns -1. */
#include <stdint.h>
#include <string.h>

#define NR 16  /* output columns per panel: two ymm of float32 */
#define MR 6   /* rows of x per strip: 12 accumulators + 2 weight vectors + 1 broadcast of the 16 ymm */
#define MC 96  /* rows per block: x's block (96 x k floats) stays in L2 while a thread's panels pass */

/* W [n, k] (float32, or bfloat16 when bf16 != 0, widened exactly) -> packed [ceil(n/16)][k][16] float32. */
void f32_gemm_pack(const void *w, int64_t n, int64_t k, int bf16, float *packed) {
    const int64_t panels = (n + NR - 1) / NR;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t kk = 0; kk < k; kk++)
            for (int j = 0; j < NR; j++) {
                const int64_t row = p * NR + j;
                float v = 0.0f;
                if (row < n) {
                    if (bf16) {
                        uint32_t bits = (uint32_t)((const uint16_t *)w)[row * k + kk] << 16;
                        memcpy(&v, &bits, sizeof v);
                    } else {
                        v = ((const float *)w)[row * k + kk];
                    }
                }
                packed[(p * k + kk) * NR + j] = v;
            }
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* out[r, col0 + j] for r < rows (<= MR), j < cols (<= NR): x's rows at x + r * k, the panel at b. */
static void strip(const float *x, int64_t k, int rows, const float *b, const float *bias, float *out, int64_t n,
                  int cols) {
    const float *x0 = x, *x1 = rows > 1 ? x + k : x, *x2 = rows > 2 ? x + 2 * k : x;
    const float *x3 = rows > 3 ? x + 3 * k : x, *x4 = rows > 4 ? x + 4 * k : x, *x5 = rows > 5 ? x + 5 * k : x;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#pragma GCC unroll 4
    for (int64_t kk = 0; kk < k; kk++) {
        const __m256 b0 = _mm256_loadu_ps(b + kk * NR), b1 = _mm256_loadu_ps(b + kk * NR + 8);
        __m256 a = _mm256_broadcast_ss(x0 + kk);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(x1 + kk);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(x2 + kk);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(x3 + kk);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(x4 + kk);
        c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(x5 + kk);
        c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    float acc[MR][NR] __attribute__((aligned(32)));
    _mm256_store_ps(acc[0], c00), _mm256_store_ps(acc[0] + 8, c01);
    _mm256_store_ps(acc[1], c10), _mm256_store_ps(acc[1] + 8, c11);
    _mm256_store_ps(acc[2], c20), _mm256_store_ps(acc[2] + 8, c21);
    _mm256_store_ps(acc[3], c30), _mm256_store_ps(acc[3] + 8, c31);
    _mm256_store_ps(acc[4], c40), _mm256_store_ps(acc[4] + 8, c41);
    _mm256_store_ps(acc[5], c50), _mm256_store_ps(acc[5] + 8, c51);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++)
            out[r * n + j] = bias ? acc[r][j] + bias[j] : acc[r][j];
}
#endif

/* out [m, n] float32 = x [m, k] float32 @ W.T (+ bias float32 [n]) with W packed by f32_gemm_pack. Returns 0, or -1
 * where this build has no AVX2 and FMA. */
int f32_gemm(const float *x, int64_t m, int64_t k, const float *packed, int64_t n, const float *bias, float *out,
             int threads) {
#if defined(__AVX2__) && defined(__FMA__)
    const int64_t panels = (n + NR - 1) / NR;
#pragma omp parallel num_threads(threads)
    for (int64_t mc = 0; mc < m; mc += MC) {
        const int64_t m_end = mc + MC < m ? mc + MC : m;
        /* the same panels for every block of rows (a static schedule): no barrier needed between blocks */
#pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < panels; p++) {
            const int64_t col0 = p * NR;
            const int cols = n - col0 < NR ? (int)(n - col0) : NR;
            for (int64_t r = mc; r < m_end; r += MR) {
                const int rows = m_end - r < MR ? (int)(m_end - r) : MR;
                strip(x + r * k, k, rows, packed + p * k * NR, bias ? bias + col0 : 0, out + r * n + col0, n,
                      cols);
            }
        }
    }
    return 0;
#else
    (void)x, (void)m, (void)k, (void)packed, (void)n, (void)bias, (void)out, (void)threads;
    return -1;
#endif
}
