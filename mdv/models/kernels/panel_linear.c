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
 * On a CPU with AVX-512F an AVX-512 kernel (below) runs instead, with the same bits; panel_isa chooses.
 *
 * Built by mdv.models.panels with gcc -O3 -mavx2 -mfma -mf16c -fopenmp (the AVX-512 functions carry their own
 * target attribute, so one build runs on both kinds of CPU); called through ctypes. */
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

/* ---- AVX-512: one zmm holds a panel's 16 columns, so a block of up to MAX512 rows keeps its whole [rows x 16]
 * block of y in registers (32 zmm) and reads each panel once per block instead of once per 6 rows, with half the
 * FMA instructions of the AVX2 kernel.  Chosen at run time on CPUs with AVX-512F (panel_isa); the library is
 * still compiled for AVX2 only, so one build runs on both.
 *
 * Same bits as the AVX2 kernel: each lane of a zmm FMA is the same rounded operation as in a ymm one, and every
 * row keeps the AVX2 kernel's summation order, i.e. a row is split into even/odd-k chains exactly when the AVX2
 * kernel puts it in a block of <= SPLIT_ROWS rows (the last M % 6 rows when M % 6 <= SPLIT_ROWS; all rows when
 * M <= SPLIT_ROWS).  The other rows run in blocks of 3..MAX512 rows, one chain each per column.
 *
 * Measured on an AVX-512 Xeon (this project's CI machine) at 1 thread, in the lean pass of the default target
 * (pass_limit lean_compare=[avx2_kernel], interleaved): the pass takes 0.87x the AVX2 kernel's time at 9 rows,
 * 0.76x at 17, 0.79x at 33, the same at 1-5 rows (there the stream is the limit).  With one block the next
 * panel is prefetched as in the AVX2 kernel; with several (> MAX512 rows) the blocks take the panel 64 lines at a
 * time (CHUNK512) and leave the stream to the hardware: on the [49152 x 576] head on huge pages, 17 rows
 * 13.7 -> 11.5 ms against block after block, and 11.5 -> 10.7 ms without the next-panel prefetch.
 *
 * The rows run over two neighbouring panels at once (KERNEL512X2; the last panel alone when their count is odd), so
 * one broadcast of x feeds two FMAs: one broadcast load per FMA kept the kernel below the FMA peak.  On all of
 * the default target's shapes (its 121 linears, huge pages, 1 thread, each pass after a cache eviction):
 * 9 rows 49.1 -> 43.9 ms, 13 rows 63.6 -> 55.5, 17 rows 57.7 -> 51.5, 33 rows 98.4 -> 80.7 (1-5 rows: 40-42 ms,
 * the stream).  Where the body is one block, the 1-2 split rows after it ride in the same pass
 * (KERNEL512X2T): 7 rows 43.0 -> 38.1 ms, 8 rows 45.1 -> 39.4, 13 rows 46.7 -> 41.7 (6 and 12 rows: 36.4, 39.7). */
#define MAX512 14  /* rows in a block: 2 x 14 accumulators, two weights and a broadcast in 32 zmm */
#define CHUNK512 64
#define TARGET512 __attribute__((target("avx512f")))
#define LOAD512_W32(ptr) _mm512_loadu_ps(ptr)
#define LOAD512_W16(ptr) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(ptr)))
#define LOAD512_W8(ptr) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(ptr))))

/* The end of a 512 block: int8 scales, bias, store (the AVX2 kernel's order: a * s, then + b). */
#define FINISH512(MB, WT, EXTRA)                                                                            \
    if (EXTRA) {                                                                                           \
        __m512 s = _mm512_loadu_ps((const float*)(const void*)(panel + 16 * (size_t)K));                   \
        _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) a[j] = _mm512_mul_ps(a[j], s);               \
    }                                                                                                      \
    if (b) {                                                                                               \
        __m512 bb = _mm512_loadu_ps(b + n0);                                                               \
        _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) a[j] = _mm512_add_ps(a[j], bb);              \
    }                                                                                                      \
    _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) _mm512_storeu_ps(y + (size_t)(m0 + j) * N + n0, a[j]);

/* MB rows over one panel (the last one, when the panels' count is odd), one chain per row (the AVX2 kernel's rows
 * in blocks of 3-6), over the panel's lines k0..k1-1: the
 * row sums start at 0 (k0 = 0) or at the partial sums left in y, and are finished (k1 = K) or left in y. */
#define KERNEL512(MB, WT, LOAD, EXTRA, SUFFIX)                                                              \
TARGET512 static void k512_##MB##SUFFIX(const float* restrict x, const WT* restrict panel, const float* restrict b, \
                                      float* restrict y, int N, int K, int n0, int m0, const WT* next,     \
                                      int k0, int k1) {                                                    \
    __m512 a[MB];                                                                                          \
    if (k0 == 0) { _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) a[j] = _mm512_setzero_ps(); }     \
    else { _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) a[j] = _mm512_loadu_ps(y + (size_t)(m0 + j) * N + n0); } \
    const float* xr = x + (size_t)m0 * K;                                                                   \
    for (int k = k0; k < k1; k++) {                                                                        \
        _mm_prefetch((const char*)(panel + 16 * (size_t)(k + PREFETCH)), _MM_HINT_T0);                     \
        if (next) _mm_prefetch((const char*)(next + 16 * (size_t)k), _MM_HINT_T1);                         \
        __m512 w = LOAD(panel + 16 * (size_t)k);                                                           \
        _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++)                                              \
            a[j] = _mm512_fmadd_ps(w, _mm512_set1_ps(xr[(size_t)j * K + k]), a[j]);                        \
    }                                                                                                      \
    if (k1 < K) {                                                                                          \
        _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) _mm512_storeu_ps(y + (size_t)(m0 + j) * N + n0, a[j]); \
        return;                                                                                            \
    }                                                                                                      \
    FINISH512(MB, WT, EXTRA)                                                                               \
}

/* Line KK of a pair of panels (w, v) into MB rows of XR (one chain each: a, c) -- the step both pair kernels
 * take; declares w and v for what follows in the same block. */
#define PAIR_STEP512(LOAD, KK, XR, MB)                                                                      \
    __m512 w = LOAD(panel + 16 * (size_t)(KK)), v = LOAD(panel1 + 16 * (size_t)(KK));                      \
    _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) {                                                \
        __m512 xb = _mm512_set1_ps((XR)[(size_t)j * K + (KK)]);                                            \
        a[j] = _mm512_fmadd_ps(w, xb, a[j]);                                                               \
        c[j] = _mm512_fmadd_ps(v, xb, c[j]);                                                               \
    }

/* ... and the T split rows of xt into the chains E0 (panel) and E1 (panel1), after PAIR_STEP512 */
#define SPLIT_STEP512(KK, T, E0, E1)                                                                        \
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                                  \
        __m512 xb = _mm512_set1_ps(xt[(size_t)t * K + (KK)]);                                             \
        E0[t] = _mm512_fmadd_ps(w, xb, E0[t]);                                                             \
        E1[t] = _mm512_fmadd_ps(v, xb, E1[t]);                                                             \
    }

/* The same rows over two neighbouring panels at once (32 columns): each broadcast of x[m, k] feeds two FMAs,
 * halving the loads per FMA (MB <= MAX512 rows).
 * Each column's sum is the single-panel kernel's, so the bits are the same. */
#define KERNEL512X2(MB, WT, LOAD, EXTRA, SUFFIX)                                                            \
TARGET512 static void k512x2_##MB##SUFFIX(const float* restrict x, const WT* restrict panel, const float* restrict b, \
                                        float* restrict y, int N, int K, int n0, int m0, const WT* next,   \
                                        int k0, int k1) {                                                  \
    const WT* restrict panel1 = panel + (size_t)(K + EXTRA) * 16;                                          \
    __m512 a[MB], c[MB];                                                                                   \
    if (k0 == 0) { _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) { a[j] = _mm512_setzero_ps(); c[j] = _mm512_setzero_ps(); } } \
    else { _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) {                                         \
        a[j] = _mm512_loadu_ps(y + (size_t)(m0 + j) * N + n0); c[j] = _mm512_loadu_ps(y + (size_t)(m0 + j) * N + n0 + 16); } } \
    const float* xr = x + (size_t)m0 * K;                                                                   \
    for (int k = k0; k < k1; k++) {                                                                        \
        _mm_prefetch((const char*)(panel + 16 * (size_t)(k + PREFETCH)), _MM_HINT_T0);                     \
        _mm_prefetch((const char*)(panel1 + 16 * (size_t)(k + PREFETCH)), _MM_HINT_T0);                    \
        if (next) { _mm_prefetch((const char*)(next + 16 * (size_t)k), _MM_HINT_T1);                       \
                    _mm_prefetch((const char*)(next + (size_t)(K + EXTRA) * 16 + 16 * (size_t)k), _MM_HINT_T1); } \
        PAIR_STEP512(LOAD, k, xr, MB)                                                                      \
    }                                                                                                      \
    if (k1 < K) {                                                                                          \
        _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) {                                            \
            _mm512_storeu_ps(y + (size_t)(m0 + j) * N + n0, a[j]); _mm512_storeu_ps(y + (size_t)(m0 + j) * N + n0 + 16, c[j]); } \
        return;                                                                                            \
    }                                                                                                      \
    if (EXTRA) {                                                                                           \
        __m512 s0 = _mm512_loadu_ps((const float*)(const void*)(panel + 16 * (size_t)K));                  \
        __m512 s1 = _mm512_loadu_ps((const float*)(const void*)(panel1 + 16 * (size_t)K));                 \
        _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) { a[j] = _mm512_mul_ps(a[j], s0); c[j] = _mm512_mul_ps(c[j], s1); } \
    }                                                                                                      \
    if (b) {                                                                                               \
        __m512 b0 = _mm512_loadu_ps(b + n0), b1 = _mm512_loadu_ps(b + n0 + 16);                            \
        _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) { a[j] = _mm512_add_ps(a[j], b0); c[j] = _mm512_add_ps(c[j], b1); } \
    }                                                                                                      \
    _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) {                                                \
        _mm512_storeu_ps(y + (size_t)(m0 + j) * N + n0, a[j]); _mm512_storeu_ps(y + (size_t)(m0 + j) * N + n0 + 16, c[j]); } \
}

/* MB <= SPLIT_ROWS rows, even and odd k in separate chains, added at the end (the AVX2 kernel's split rows). */
#define KERNEL512_SPLIT(MB, WT, LOAD, EXTRA, SUFFIX)                                                        \
TARGET512 static void k512s_##MB##SUFFIX(const float* restrict x, const WT* restrict panel, const float* restrict b, \
                                       float* restrict y, int N, int K, int n0, int m0, const WT* next) {  \
    __m512 a[MB], c[MB];                                                                                   \
    _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++) { a[j] = _mm512_setzero_ps(); c[j] = _mm512_setzero_ps(); } \
    const float* xr = x + (size_t)m0 * K;                                                                   \
    int k = 0;                                                                                             \
    for (; k + 2 <= K; k += 2) {                                                                           \
        if (sizeof(WT) <= 2) _mm_prefetch((const char*)(panel + 16 * (size_t)(k + PREFETCH)), _MM_HINT_T0); \
        if (next) { _mm_prefetch((const char*)(next + 16 * (size_t)k), _MM_HINT_T1);                       \
                    _mm_prefetch((const char*)(next + 16 * (size_t)k + 16), _MM_HINT_T1); }                 \
        __m512 w = LOAD(panel + 16 * (size_t)k), v = LOAD(panel + 16 * (size_t)k + 16);                    \
        _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++) {                                             \
            a[j] = _mm512_fmadd_ps(w, _mm512_set1_ps(xr[(size_t)j * K + k]), a[j]);                        \
            c[j] = _mm512_fmadd_ps(v, _mm512_set1_ps(xr[(size_t)j * K + k + 1]), c[j]);                    \
        }                                                                                                  \
    }                                                                                                      \
    for (; k < K; k++) {                                                                                   \
        __m512 w = LOAD(panel + 16 * (size_t)k);                                                           \
        _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++)                                               \
            a[j] = _mm512_fmadd_ps(w, _mm512_set1_ps(xr[(size_t)j * K + k]), a[j]);                        \
    }                                                                                                      \
    _Pragma("GCC unroll 8") for (int j = 0; j < MB; j++) a[j] = _mm512_add_ps(a[j], c[j]);                 \
    FINISH512(MB, WT, EXTRA)                                                                               \
}

#define KERNELS512(WT, LOAD, EXTRA, SUFFIX)                                                                 \
    KERNEL512_SPLIT(1, WT, LOAD, EXTRA, SUFFIX) KERNEL512_SPLIT(2, WT, LOAD, EXTRA, SUFFIX)                 \
    KERNEL512(3, WT, LOAD, EXTRA, SUFFIX) KERNEL512(4, WT, LOAD, EXTRA, SUFFIX)                             \
    KERNEL512(5, WT, LOAD, EXTRA, SUFFIX) KERNEL512(6, WT, LOAD, EXTRA, SUFFIX)                             \
    KERNEL512(7, WT, LOAD, EXTRA, SUFFIX) KERNEL512(8, WT, LOAD, EXTRA, SUFFIX)                             \
    KERNEL512(9, WT, LOAD, EXTRA, SUFFIX) KERNEL512(10, WT, LOAD, EXTRA, SUFFIX)                            \
    KERNEL512(11, WT, LOAD, EXTRA, SUFFIX) KERNEL512(12, WT, LOAD, EXTRA, SUFFIX)                           \
    KERNEL512(13, WT, LOAD, EXTRA, SUFFIX) KERNEL512(14, WT, LOAD, EXTRA, SUFFIX)                           \
    typedef void (*k512##SUFFIX##_fn)(const float*, const WT*, const float*, float*, int, int, int, int, const WT*, int, int); \
    static const k512##SUFFIX##_fn K512##SUFFIX[MAX512 + 1] = {                                            \
        NULL, NULL, NULL, k512_3##SUFFIX, k512_4##SUFFIX, k512_5##SUFFIX, k512_6##SUFFIX,                   \
        k512_7##SUFFIX, k512_8##SUFFIX, k512_9##SUFFIX, k512_10##SUFFIX, k512_11##SUFFIX,                   \
        k512_12##SUFFIX, k512_13##SUFFIX, k512_14##SUFFIX};                                                  \
    KERNEL512X2(3, WT, LOAD, EXTRA, SUFFIX) KERNEL512X2(4, WT, LOAD, EXTRA, SUFFIX) KERNEL512X2(5, WT, LOAD, EXTRA, SUFFIX) \
    KERNEL512X2(6, WT, LOAD, EXTRA, SUFFIX) KERNEL512X2(7, WT, LOAD, EXTRA, SUFFIX) KERNEL512X2(8, WT, LOAD, EXTRA, SUFFIX) \
    KERNEL512X2(9, WT, LOAD, EXTRA, SUFFIX) KERNEL512X2(10, WT, LOAD, EXTRA, SUFFIX) KERNEL512X2(11, WT, LOAD, EXTRA, SUFFIX) \
    KERNEL512X2(12, WT, LOAD, EXTRA, SUFFIX) KERNEL512X2(13, WT, LOAD, EXTRA, SUFFIX) KERNEL512X2(14, WT, LOAD, EXTRA, SUFFIX) \
    static const k512##SUFFIX##_fn K512X2##SUFFIX[MAX512 + 1] = { \
        NULL, NULL, NULL, k512x2_3##SUFFIX, k512x2_4##SUFFIX, k512x2_5##SUFFIX, k512x2_6##SUFFIX, k512x2_7##SUFFIX, \
        k512x2_8##SUFFIX, k512x2_9##SUFFIX, k512x2_10##SUFFIX, k512x2_11##SUFFIX, k512x2_12##SUFFIX, k512x2_13##SUFFIX, \
        k512x2_14##SUFFIX};

/* One block of MB rows (one chain each) and the T <= SPLIT_ROWS split rows after them (even and odd k in
 * separate chains, k512s's order) over a pair of panels, in one pass: the last M % 6 rows of a pass whose body
 * is one block no longer reread the pair from L2 one panel at a time after it (a 7- or 13-row pass took ~15%
 * more than a 6- or 12-row one, all of it in those 1-2 rows).  The same bits as the two kernels it replaces.
 * Registers: 2 MB + 4 T accumulators, two weights and a broadcast (MB <= 12 with T = 1, MB <= 10 with T = 2). */
#define KERNEL512X2T(MB, T, WT, LOAD, EXTRA, SUFFIX)                                                        \
TARGET512 static void k512x2t_##MB##_##T##SUFFIX(const float* restrict x, const WT* restrict panel,          \
                                                const float* restrict b, float* restrict y, int N, int K, int n0, \
                                                const WT* next) {                                          \
    const WT* restrict panel1 = panel + (size_t)(K + EXTRA) * 16;                                          \
    __m512 a[MB], c[MB], e0[T], e1[T], o0[T], o1[T];                                                       \
    _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) { a[j] = _mm512_setzero_ps(); c[j] = _mm512_setzero_ps(); } \
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                                  \
        e0[t] = _mm512_setzero_ps(); e1[t] = _mm512_setzero_ps(); o0[t] = _mm512_setzero_ps(); o1[t] = _mm512_setzero_ps(); } \
    const float* xt = x + (size_t)MB * K;  /* the split rows */                                            \
    int k = 0;                                                                                             \
    for (; k + 2 <= K; k += 2) {                                                                           \
        _mm_prefetch((const char*)(panel + 16 * (size_t)(k + PREFETCH)), _MM_HINT_T0);                     \
        _mm_prefetch((const char*)(panel1 + 16 * (size_t)(k + PREFETCH)), _MM_HINT_T0);                    \
        _mm_prefetch((const char*)(panel + 16 * (size_t)(k + 1 + PREFETCH)), _MM_HINT_T0);                 \
        _mm_prefetch((const char*)(panel1 + 16 * (size_t)(k + 1 + PREFETCH)), _MM_HINT_T0);                \
        if (next) {                                                                                        \
            _mm_prefetch((const char*)(next + 16 * (size_t)k), _MM_HINT_T1);                               \
            _mm_prefetch((const char*)(next + 16 * (size_t)k + 16), _MM_HINT_T1);                          \
            _mm_prefetch((const char*)(next + (size_t)(K + EXTRA) * 16 + 16 * (size_t)k), _MM_HINT_T1);    \
            _mm_prefetch((const char*)(next + (size_t)(K + EXTRA) * 16 + 16 * (size_t)k + 16), _MM_HINT_T1); \
        }                                                                                                  \
        { PAIR_STEP512(LOAD, k, x, MB) SPLIT_STEP512(k, T, e0, e1) }       /* even k: the split rows' first chains */ \
        { PAIR_STEP512(LOAD, k + 1, x, MB) SPLIT_STEP512(k + 1, T, o0, o1) }  /* odd k: their second */     \
    }                                                                                                      \
    for (; k < K; k++) {  /* K odd: the last k joins the even chains, as in k512s */                       \
        PAIR_STEP512(LOAD, k, x, MB) SPLIT_STEP512(k, T, e0, e1)                                           \
    }                                                                                                      \
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) { e0[t] = _mm512_add_ps(e0[t], o0[t]); e1[t] = _mm512_add_ps(e1[t], o1[t]); } \
    if (EXTRA) {                                                                                           \
        __m512 s0 = _mm512_loadu_ps((const float*)(const void*)(panel + 16 * (size_t)K));                  \
        __m512 s1 = _mm512_loadu_ps((const float*)(const void*)(panel1 + 16 * (size_t)K));                 \
        _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) { a[j] = _mm512_mul_ps(a[j], s0); c[j] = _mm512_mul_ps(c[j], s1); } \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) { e0[t] = _mm512_mul_ps(e0[t], s0); e1[t] = _mm512_mul_ps(e1[t], s1); } \
    }                                                                                                      \
    if (b) {                                                                                               \
        __m512 b0 = _mm512_loadu_ps(b + n0), b1 = _mm512_loadu_ps(b + n0 + 16);                            \
        _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) { a[j] = _mm512_add_ps(a[j], b0); c[j] = _mm512_add_ps(c[j], b1); } \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) { e0[t] = _mm512_add_ps(e0[t], b0); e1[t] = _mm512_add_ps(e1[t], b1); } \
    }                                                                                                      \
    _Pragma("GCC unroll 32") for (int j = 0; j < MB; j++) {                                                \
        _mm512_storeu_ps(y + (size_t)j * N + n0, a[j]); _mm512_storeu_ps(y + (size_t)j * N + n0 + 16, c[j]); } \
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                                  \
        _mm512_storeu_ps(y + (size_t)(MB + t) * N + n0, e0[t]); _mm512_storeu_ps(y + (size_t)(MB + t) * N + n0 + 16, e1[t]); } \
}

/* The one-block bodies a tail follows: the AVX2 kernel's blocks of 6 make the body a multiple of 6 (6 or 12 when
 * it is one block of <= MAX512 rows) */
#define KERNELS512X2T(WT, LOAD, EXTRA, SUFFIX)                                                              \
    KERNEL512X2T(6, 1, WT, LOAD, EXTRA, SUFFIX) KERNEL512X2T(6, 2, WT, LOAD, EXTRA, SUFFIX)                 \
    KERNEL512X2T(12, 1, WT, LOAD, EXTRA, SUFFIX)                                                           \
    typedef void (*k512t##SUFFIX##_fn)(const float*, const WT*, const float*, float*, int, int, int, const WT*); \
    static k512t##SUFFIX##_fn k512x2t##SUFFIX(int body, int tail) {                                        \
        if (body == 6) return tail == 1 ? k512x2t_6_1##SUFFIX : tail == 2 ? k512x2t_6_2##SUFFIX : NULL;    \
        return body == 12 && tail == 1 ? k512x2t_12_1##SUFFIX : NULL;                                      \
    }

KERNELS512(float, LOAD512_W32, EXTRA_W32, _f32)
KERNELS512(unsigned short, LOAD512_W16, EXTRA_W16, _f16)
KERNELS512(signed char, LOAD512_W8, EXTRA_W8, _i8)
KERNELS512X2T(float, LOAD512_W32, EXTRA_W32, _f32)
KERNELS512X2T(unsigned short, LOAD512_W16, EXTRA_W16, _f16)
KERNELS512X2T(signed char, LOAD512_W8, EXTRA_W8, _i8)

#define PANEL_LINEAR512(NAME, WT, EXTRA, SUFFIX)                                                            \
TARGET512 static void NAME##_512(const float* x, const WT* P, const float* b, float* y, int M, int N, int K, int threads) { \
    int panels = N / 16;                                                                                   \
    int tail = M % 6 <= SPLIT_ROWS ? M % 6 : 0;  /* the rows the AVX2 kernel splits */                      \
    int body = M - tail, blocks = (body + MAX512 - 1) / MAX512;                                            \
    int units = (panels + 1) / 2;  /* pairs of panels (the last one alone if their count is odd) */       \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                                      \
    for (int u = 0; u < units; u++) {                                                                      \
        int p = 2 * u, pair = p + 1 < panels;                                                              \
        const WT* panel = P + (size_t)p * (K + EXTRA) * 16;                                                \
        /* a single block prefetches the next pair (when a whole pair follows) */                         \
        const WT* next = p + 3 < panels ? panel + (size_t)2 * (K + EXTRA) * 16 : NULL;                     \
        int n0 = 16 * p, m0 = 0;                                                                           \
        k512t##SUFFIX##_fn fused = blocks == 1 && pair && tail ? k512x2t##SUFFIX(body, tail) : NULL;       \
        if (fused) {  /* one block and the split rows in one pass over the pair */                         \
            fused(x, panel, b, y, N, K, n0, next);                                                         \
            continue;                                                                                      \
        }                                                                                                  \
        /* several blocks take the panel CHUNK512 lines at a time, every block per chunk, so the weight stream   \
         * advances at one pace over the panel's whole compute; they leave the stream to the hardware prefetchers \
         * and the in-panel prefetch, which runs on into the next panel (the AVX-512 comment above) */          \
        int chunk = blocks > 1 ? CHUNK512 : K, k0 = 0;                                                     \
        do {                                                                                               \
            int k1 = k0 + chunk < K ? k0 + chunk : K;                                                      \
            m0 = 0;                                                                                        \
            for (int blk = 0; blk < blocks; blk++) {  /* body rows in blocks of equal size (each >= 3) */    \
                int mb = (body - m0) / (blocks - blk);                                                     \
                const WT* nx = blocks == 1 ? next : NULL;                                                  \
                if (pair) K512X2##SUFFIX[mb](x, panel, b, y, N, K, n0, m0, nx, k0, k1);                    \
                else K512##SUFFIX[mb](x, panel, b, y, N, K, n0, m0, nx, k0, k1);                           \
                m0 += mb;                                                                                  \
            }                                                                                              \
            k0 = k1;                                                                                       \
        } while (k0 < K);                                                                                  \
        for (int q = p; q < p + 2 && q < panels; q++) {  /* the split rows, one panel at a time */          \
            const WT* pq = P + (size_t)q * (K + EXTRA) * 16;                                               \
            const WT* nq = q + 1 < panels ? pq + (size_t)(K + EXTRA) * 16 : NULL;                          \
            if (tail == 1) k512s_1##SUFFIX(x, pq, b, y, N, K, 16 * q, m0, nq);                             \
            else if (tail == 2) k512s_2##SUFFIX(x, pq, b, y, N, K, 16 * q, m0, nq);                        \
        }                                                                                                  \
    }                                                                                                      \
}

PANEL_LINEAR512(panel_linear, float, EXTRA_W32, _f32)
PANEL_LINEAR512(panel_linear_f16, unsigned short, EXTRA_W16, _f16)
PANEL_LINEAR512(panel_linear_i8, signed char, EXTRA_W8, _i8)

/* Which kernel the products run: PANEL_ISA_AUTO (AVX-512 where the CPU has it, else AVX2), or one forced by
 * panel_isa (tests compare the two bit for bit; benchmarks time them side by side). */
enum { PANEL_ISA_AUTO = 0, PANEL_ISA_AVX2 = 1, PANEL_ISA_AVX512 = 2 };
static int isa_request = PANEL_ISA_AUTO;

static int cpu_has_avx512(void) {
    static int has = -1;  /* asked once: the CPU does not change under a process */
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512f") != 0;
    }
    return has;
}

static int isa_in_effect(void) {
    if (isa_request == PANEL_ISA_AVX2) return PANEL_ISA_AVX2;
    return cpu_has_avx512() ? PANEL_ISA_AVX512 : PANEL_ISA_AVX2;
}

/* request < 0: only report; else set PANEL_ISA_AUTO / _AVX2 / _AVX512.  Returns the kernel now in effect
 * (PANEL_ISA_AVX2 or PANEL_ISA_AVX512), or -1 (nothing changed) when AVX-512 is asked for on a CPU without it
 * or the request is unknown.  Not thread-safe: set it before the products run. */
int panel_isa(int request) {
    if (request > PANEL_ISA_AVX512 || (request == PANEL_ISA_AVX512 && !cpu_has_avx512())) return -1;
    if (request >= 0) isa_request = request;
    return isa_in_effect();
}

/* x [M, K], P [N/16][K][16], b [N] or NULL, y [M, N]: x, b, y float32, P float32 (panel_linear) or float16
 * bits (panel_linear_f16), or P [N/16][K + 4][16] int8 with the scales (panel_linear_i8), all contiguous.
 * Returns 0, or 1 when N is not a multiple of 16 (nothing written). */
#define PANEL_LINEAR(NAME, WT, EXTRA, SUFFIX)                                                               \
int NAME(const float* x, const WT* P, const float* b, float* y, int M, int N, int K, int threads) {         \
    if (N % 16 != 0 || M < 0 || K < 0) return 1;                                                           \
    if (isa_in_effect() == PANEL_ISA_AVX512) { NAME##_512(x, P, b, y, M, N, K, threads); return 0; }         \
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
