/* y = x · Wᵀ (+ b) for the few rows of a decode or verification pass, on a weight repacked into panels.
 *
 * The weight W [N, K] (N % 16 == 0) is stored as P [N/16][K][16]: panel p holds the 16 output columns
 * 16p..16p+15 of every input k, contiguously, so the whole weight is one sequential stream.  For a block
 * of up to 6 rows of x the kernel keeps the [rows x 16] block of y in 12 AVX2 registers and, for each k,
 * multiplies the panel's 16 weights by the broadcast x[m, k] of each row (the 6 x 16 micro-kernel of
 * BLIS-style GEMMs, Goto & van de Geijn 2008).  One panel is read once per 6 rows of x, so for M <= 6 the
 * weight crosses memory once and the pass runs at the read bandwidth; above it the panel is reread from
 * the cache.  Sums over k run in order (on random [49152 x 576] weights the error against a float64
 * product, 2e-5, is below MKL's sgemm's, 4e-5).
 *
 * Int8 panels (panel_linear_i8) hold W's per-column-quantised values and, after the K lines of each panel,
 * one more line of the panel's 16 float32 column scales s: P8 [N/16][K + 4][16] bytes, the last 4 "rows" the
 * scales.  Then y[m, n] = s[n] * sum_k x[m, k] P8[p, k, c] (+ b[n]): the same sums as a float32 panel of
 * the int8 values, times the scale (a quarter of the float32 bytes to stream).
 *
 * Built by mdv.models.panels with gcc -O3 -mavx2 -mfma -mf16c -fopenmp; called through ctypes. */
#include <stddef.h>
#include <immintrin.h>

/* Lines (one per k: 16 floats = 64 bytes) to prefetch ahead; measured on an AVX2 EPYC at 1 thread: -10 to -17%
 * at 5-17 rows, none at 1-2 rows (where it only costs load slots), 32 as good as 16-64. */
#define PREFETCH 32

/* Next-panel prefetch: while a panel is multiplied, each of its row blocks also asks for the next panel's
 * lines, one per k, into L2 (_MM_HINT_T1, so the panel being read keeps L1).  Without it the memory idles at
 * every panel boundary and, for more than 6 rows, during the later row blocks, which reread the panel from the
 * cache.  Measured on an AVX2 EPYC at 1 thread, interleaved in one process, each call after a cache eviction
 * ([49152 x 576] float32 head): 1 row 12.1 -> 9.5 ms, 5 rows 13.0 -> 9.7, 9 rows 14.6 -> 13.2, 13 rows
 * 17.3 -> 15.9; float16 and int8 panels -13% to -40% at 1-6 rows. */

/* Weights stored as float32 (W32) or as IEEE float16 (W16: converted to float32 in registers with F16C, so a
 * float16 panel gives the same bits as a float32 panel of the same, float16-representable, values). */
#define LOAD_W32(ptr) _mm256_loadu_ps(ptr)
#define LOAD_W16(ptr) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(ptr)))
#define LOAD_W8(ptr) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(ptr))))
/* Extra 16-column lines after a panel's K lines: int8 panels carry their 16 float32 scales there. */
#define EXTRA_W32 0
#define EXTRA_W16 0
#define EXTRA_W8 4

/* For 1-2 rows the MB x 2 accumulator chains are too few to hide the FMA latency (5 cycles on Zen 2), most
 * of all on float16 panels, whose line carries only 32 k-values: even and odd k then sum into separate
 * accumulators, added at the end (measured on an AVX2 EPYC at 1 thread, interleaved: float16 14 -> 15-17
 * GB/s, float32 unchanged; from 3 rows on the split was 5-20% slower and is not used).  Both dtypes split
 * alike, so float16 panels of float16 values keep float32 panels' bits; a row's sum order depends on
 * whether its block has <= SPLIT_ROWS rows. */
#define SPLIT_ROWS 2

#define KERNEL(MB, WT, LOAD, EXTRA, SUFFIX)                                                                 \
static void kernel##MB##SUFFIX(const float* restrict x, const WT* restrict panel, const float* restrict b, \
                       float* restrict y, int N, int K, int n0, int m0, const WT* next) {                  \
    __m256 a0[MB], a1[MB], c0[MB], c1[MB];                                                                 \
    _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++) {                                                 \
        a0[j] = _mm256_setzero_ps(); a1[j] = _mm256_setzero_ps(); c0[j] = _mm256_setzero_ps(); c1[j] = _mm256_setzero_ps(); } \
    const float* xr = x + (size_t)m0 * K;                                                                   \
    int k = 0;                                                                                             \
    const int split = MB <= SPLIT_ROWS;                                                                   \
    if (split) {                                                                                           \
        for (; k + 2 <= K; k += 2) {                                                                       \
            /* float16 / int8 lines hold 2 / 4 k: the stream needs the software prefetch (float32: no gain) */ \
            if (sizeof(WT) <= 2) _mm_prefetch((const char*)(panel + 16 * (size_t)(k + PREFETCH)), _MM_HINT_T0); \
            if (next) { _mm_prefetch((const char*)(next + 16 * (size_t)k), _MM_HINT_T1);                   \
                        _mm_prefetch((const char*)(next + 16 * (size_t)k + 16), _MM_HINT_T1); }             \
            __m256 w0 = LOAD(panel + 16 * (size_t)k), w1 = LOAD(panel + 16 * (size_t)k + 8);               \
            __m256 v0 = LOAD(panel + 16 * (size_t)k + 16), v1 = LOAD(panel + 16 * (size_t)k + 24);         \
            _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++) {                                         \
                __m256 xb = _mm256_broadcast_ss(xr + (size_t)j * K + k);                                   \
                __m256 xc = _mm256_broadcast_ss(xr + (size_t)j * K + k + 1);                               \
                a0[j] = _mm256_fmadd_ps(w0, xb, a0[j]);                                                    \
                a1[j] = _mm256_fmadd_ps(w1, xb, a1[j]);                                                    \
                c0[j] = _mm256_fmadd_ps(v0, xc, c0[j]);                                                    \
                c1[j] = _mm256_fmadd_ps(v1, xc, c1[j]);                                                    \
            }                                                                                              \
        }                                                                                                  \
    }                                                                                                      \
    for (; k < K; k++) {                                                                                   \
        /* from 3 rows on the FMAs hide less of the stream: fetch the panel PREFETCH lines ahead */          \
        if (MB > 2) _mm_prefetch((const char*)(panel + 16 * (size_t)(k + PREFETCH)), _MM_HINT_T0);         \
        if (next) _mm_prefetch((const char*)(next + 16 * (size_t)k), _MM_HINT_T1);                         \
        __m256 w0 = LOAD(panel + 16 * (size_t)k), w1 = LOAD(panel + 16 * (size_t)k + 8);                   \
        _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++) {                                             \
            __m256 xb = _mm256_broadcast_ss(xr + (size_t)j * K + k);                                       \
            a0[j] = _mm256_fmadd_ps(w0, xb, a0[j]);                                                        \
            a1[j] = _mm256_fmadd_ps(w1, xb, a1[j]);                                                        \
        }                                                                                                  \
    }                                                                                                      \
    if (split) {                                                                                           \
        _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++) { a0[j] = _mm256_add_ps(a0[j], c0[j]); a1[j] = _mm256_add_ps(a1[j], c1[j]); } \
    }                                                                                                      \
    if (EXTRA) {  /* int8: the column scales sit after the K lines */                                      \
        const float* sc = (const float*)(const void*)(panel + 16 * (size_t)K);                              \
        __m256 s0 = _mm256_loadu_ps(sc), s1 = _mm256_loadu_ps(sc + 8);                                     \
        _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++) { a0[j] = _mm256_mul_ps(a0[j], s0); a1[j] = _mm256_mul_ps(a1[j], s1); } \
    }                                                                                                      \
    if (b) {                                                                                               \
        __m256 b0 = _mm256_loadu_ps(b + n0), b1 = _mm256_loadu_ps(b + n0 + 8);                             \
        _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++) { a0[j] = _mm256_add_ps(a0[j], b0); a1[j] = _mm256_add_ps(a1[j], b1); } \
    }                                                                                                      \
    _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++) {                                                 \
        _mm256_storeu_ps(y + (size_t)(m0 + j) * N + n0, a0[j]);                                            \
        _mm256_storeu_ps(y + (size_t)(m0 + j) * N + n0 + 8, a1[j]);                                        \
    }                                                                                                      \
}

KERNEL(1, float, LOAD_W32, EXTRA_W32, _f32) KERNEL(2, float, LOAD_W32, EXTRA_W32, _f32) KERNEL(3, float, LOAD_W32, EXTRA_W32, _f32)
KERNEL(4, float, LOAD_W32, EXTRA_W32, _f32) KERNEL(5, float, LOAD_W32, EXTRA_W32, _f32) KERNEL(6, float, LOAD_W32, EXTRA_W32, _f32)
KERNEL(1, unsigned short, LOAD_W16, EXTRA_W16, _f16) KERNEL(2, unsigned short, LOAD_W16, EXTRA_W16, _f16) KERNEL(3, unsigned short, LOAD_W16, EXTRA_W16, _f16)
KERNEL(4, unsigned short, LOAD_W16, EXTRA_W16, _f16) KERNEL(5, unsigned short, LOAD_W16, EXTRA_W16, _f16) KERNEL(6, unsigned short, LOAD_W16, EXTRA_W16, _f16)
KERNEL(1, signed char, LOAD_W8, EXTRA_W8, _i8) KERNEL(2, signed char, LOAD_W8, EXTRA_W8, _i8) KERNEL(3, signed char, LOAD_W8, EXTRA_W8, _i8)
KERNEL(4, signed char, LOAD_W8, EXTRA_W8, _i8) KERNEL(5, signed char, LOAD_W8, EXTRA_W8, _i8) KERNEL(6, signed char, LOAD_W8, EXTRA_W8, _i8)

/* x [M, K], P [N/16][K][16], b [N] or NULL, y [M, N]: x, b, y float32, P float32 (panel_linear) or float16
 * bits (panel_linear_f16), or P [N/16][K + 4][16] int8 with the scales (panel_linear_i8), all contiguous.
 * Returns 0, or 1 when N is not a multiple of 16 (nothing written). */
#define PANEL_LINEAR(NAME, WT, EXTRA, SUFFIX)                                                               \
int NAME(const float* x, const WT* P, const float* b, float* y, int M, int N, int K, int threads) {         \
    if (N % 16 != 0 || M < 0 || K < 0) return 1;                                                           \
    int panels = N / 16;                                                                                   \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                                      \
    for (int p = 0; p < panels; p++) {                                                                     \
        const WT* panel = P + (size_t)p * (K + EXTRA) * 16;                                                \
        int n0 = 16 * p, m0 = 0;                                                                           \
        /* every row block of this panel fetches the next panel's lines into L2 (module comment) */         \
        const WT* next = p + 1 < panels ? panel + (size_t)(K + EXTRA) * 16 : NULL;                         \
        for (; m0 + 6 <= M; m0 += 6) kernel6##SUFFIX(x, panel, b, y, N, K, n0, m0, next);                  \
        switch (M - m0) {                                                                                  \
            case 5: kernel5##SUFFIX(x, panel, b, y, N, K, n0, m0, next); break;                            \
            case 4: kernel4##SUFFIX(x, panel, b, y, N, K, n0, m0, next); break;                            \
            case 3: kernel3##SUFFIX(x, panel, b, y, N, K, n0, m0, next); break;                            \
            case 2: kernel2##SUFFIX(x, panel, b, y, N, K, n0, m0, next); break;                            \
            case 1: kernel1##SUFFIX(x, panel, b, y, N, K, n0, m0, next); break;                            \
        }                                                                                                  \
    }                                                                                                      \
    return 0;                                                                                              \
}

PANEL_LINEAR(panel_linear, float, EXTRA_W32, _f32)
PANEL_LINEAR(panel_linear_f16, unsigned short, EXTRA_W16, _f16)
PANEL_LINEAR(panel_linear_i8, signed char, EXTRA_W8, _i8)
