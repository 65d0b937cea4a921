/* One pre-norm Llama decoder layer on panel-packed weights, in one call: the lean forward's fast path.
 *
 * mdv.models.lean's torch loop issues ~40 small torch operations per layer (norms, rotary, cache writes,
 * reshapes, attention, activation), ~0.35-0.5 ms per layer on a CPU at decode sizes: 10-15 ms of a 30-layer
 * pass whose weights stream in ~30 ms.  Here the same math runs in C around the panel products
 * (panel_linear.c), for T = R * n new tokens of R rows (x row-major [R][n][d]):
 *
 *   a = RMSNorm_1(x);  [q | k | v] = a * W_qkv^T                       (one fused sibling stream)
 *   q, k <- q * cos + rotate_half(q) * sin                              (transformers' rotary tables)
 *   K[r, h, S + t] <- k,  V[r, h, S + t] <- v                           (the session's preallocated cache)
 *   o[h] = softmax(q[h] . K[h / G]^T * scale + mask) V[h / G]           (query head h reads kv head h / G)
 *   x <- x + o * W_o^T;  b = RMSNorm_2(x);  [g | u] = b * W_gu^T;  x <- x + (silu(g) * u) * W_d^T
 *
 * RMSNorm(z) = w * z / sqrt(mean(z^2) + eps) with the mean accumulated in double; softmax subtracts the row
 * maximum, takes exp 8-wide (exp8, within 1 ulp of expf; 16-wide exp16 gives the same values) and sums in double.
 * The attention runs one query at a time (attention()) or, from 40 queries per key/value head on, as panel
 * products over packed keys and values (tiled_attention(); lean_attention_mode chooses).  Every other value is float32,
 * so a layer here equals the torch loop up to float32 rounding (tests/test_lean_layer.py), not bit for bit.
 * Masks: NULL (n = 1: the query sees the whole cache and itself) or mask [n][S + n] (1 = visible; causal or
 * a token tree).
 *
 * Built into the same library as panel_linear.c (mdv.models.panels); called through ctypes. */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

int panel_linear(const float* x, const float* P, const float* b, float* y, int M, int N, int K, int threads);
int panel_linear_f16(const float* x, const unsigned short* P, const float* b, float* y, int M, int N, int K, int threads);
int panel_linear_i8(const float* x, const signed char* P, const float* b, float* y, int M, int N, int K, int threads);

/* The panels' weight kind (LeanWeights.weight_kind). */
enum { WEIGHTS_F32 = 0, WEIGHTS_F16 = 1, WEIGHTS_I8 = 2 };

static int linear(int kind, const float* x, const void* P, const float* b, float* y, int M, int N, int K, int threads) {
    switch (kind) {
        case WEIGHTS_F16: return panel_linear_f16(x, (const unsigned short*)P, b, y, M, N, K, threads);
        case WEIGHTS_I8: return panel_linear_i8(x, (const signed char*)P, b, y, M, N, K, threads);
        default: return panel_linear(x, (const float*)P, b, y, M, N, K, threads);
    }
}

static void rms_norm(const float* x, const float* w, float eps, float* out, int T, int d) {
    for (int t = 0; t < T; t++) {
        const float* z = x + (size_t)t * d;
        __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();  /* sum of squares in double, 8 at a time */
        int i = 0;
        for (; i + 8 <= d; i += 8) {
            __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(z + i)), hi = _mm256_cvtps_pd(_mm_loadu_ps(z + i + 4));
            a = _mm256_fmadd_pd(lo, lo, a);
            b = _mm256_fmadd_pd(hi, hi, b);
        }
        double lanes[4];
        _mm256_storeu_pd(lanes, _mm256_add_pd(a, b));
        double ss = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
        for (; i < d; i++) ss += (double)z[i] * z[i];
        float r = 1.0f / sqrtf((float)(ss / d) + eps);
        float* o = out + (size_t)t * d;
        for (int i = 0; i < d; i++) o[i] = w[i] * (z[i] * r);
    }
}

/* q . k over D values: 8-wide partial sums when D % 8 == 0 (the head sizes of real models), else in order */
static float dot(const float* q, const float* k, int D) {
    if (D % 8 != 0) {
        float s = 0.0f;
        for (int i = 0; i < D; i++) s += q[i] * k[i];
        return s;
    }
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < D; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* exp of 8 floats (Cephes' expf: exp(x) = 2^m exp(r), r = x - m ln 2 in two parts, a degree-5 polynomial,
 * as in avx_mathfun by J. Pommier; measured within 1 ulp of expf, max relative error 1.19e-7).  Below -87.33
 * (exp < FLT_MIN) the result is 0, so exp(-inf) = 0 as a masked attention key needs; above 88.37 it
 * saturates at ~2.4e38. */
static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365447505531f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);  /* also true for -inf */
    /* those lanes compute exp(0) and are zeroed at the end: clamped to lo they made a subnormal product, which
     * takes a microcode assist (a masked attention key cost ~2.5x an unmasked one) */
    x = _mm256_blendv_ps(_mm256_min_ps(x, hi), _mm256_setzero_ps(), under);
    __m256 m = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(m, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(m, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(m), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/* z [N] <- exp(z - shift), 8 at a time (exp8; the tail through the same 8-wide code) */
static void exp_shifted(float* z, float shift, int N) {
    __m256 sh = _mm256_set1_ps(shift);
    int i = 0;
    for (; i + 8 <= N; i += 8) _mm256_storeu_ps(z + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(z + i), sh)));
    if (i < N) {
        float tail[8] = {0};
        memcpy(tail, z + i, sizeof(float) * (N - i));
        _mm256_storeu_ps(tail, exp8(_mm256_sub_ps(_mm256_loadu_ps(tail), sh)));
        memcpy(z + i, tail, sizeof(float) * (N - i));
    }
}

/* m [N] = silu(g) * u = g / (1 + exp(-g)) * u */
static void silu_mul(float* restrict m, const float* restrict g, const float* restrict u, int N) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= N; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 den = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, gv)));
        _mm256_storeu_ps(m + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
    }
    for (; i < N; i++) m[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* o [D] = sum_j (e_j * inv) v_j over the keys with e_j > 0, in key order for every column: 64 columns at a time
 * in 8 registers when D % 8 == 0 (the column blocks are independent FMA chains), else one column at a time */
static void accumulate_values(float* restrict o, const float* restrict e, float inv, const float* restrict v,
                              int keys, int D) {
    int c = 0;
    if (D % 8 == 0) {
        for (; c + 64 <= D; c += 64) {
            __m256 acc[8];
            for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
            for (int j = 0; j < keys; j++) {
                float p = e[j] * inv;
                if (p == 0.0f) continue;
                __m256 pb = _mm256_set1_ps(p);
                const float* vj = v + (size_t)j * D + c;
                for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vj + 8 * i), acc[i]);
            }
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + c + 8 * i, acc[i]);
        }
        for (; c < D; c += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int j = 0; j < keys; j++) {
                float p = e[j] * inv;
                if (p == 0.0f) continue;
                acc = _mm256_fmadd_ps(_mm256_set1_ps(p), _mm256_loadu_ps(v + (size_t)j * D + c), acc);
            }
            _mm256_storeu_ps(o + c, acc);
        }
        return;
    }
    for (; c < D; c++) {
        float acc = 0.0f;
        for (int j = 0; j < keys; j++) {
            float p = e[j] * inv;
            if (p != 0.0f) acc += p * v[(size_t)j * D + c];
        }
        o[c] = acc;
    }
}

/* s [keys] = q . k_j for the keys k_j = K[j] (rows of D): 8 keys at a time when D % 8 == 0, their 8 partial-sum
 * vectors reduced together (3 levels of horizontal adds), the remaining keys one by one (dot) */
static void scores_of(const float* restrict q, const float* restrict K, int keys, int D, float* restrict s) {
    int j = 0;
    if (D % 8 == 0) {
        for (; j + 8 <= keys; j += 8) {
            const float* k = K + (size_t)j * D;
            __m256 a[8];
            for (int c = 0; c < 8; c++) a[c] = _mm256_setzero_ps();
            for (int i = 0; i < D; i += 8) {
                __m256 qv = _mm256_loadu_ps(q + i);
                for (int c = 0; c < 8; c++) a[c] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (size_t)c * D + i), a[c]);
            }
            __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
            __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
            __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
            _mm256_storeu_ps(s + j, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)));
        }
    }
    for (; j < keys; j++) s[j] = dot(q, K + (size_t)j * D, D);
}

/* z [D] <- z * cos + rotate_half(z) * sin, rotate_half(z) = [-z_2, z_1] (halves of D) */
static void rotary(float* z, const float* cs, const float* sn, int D) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        float a = z[i], b = z[i + half];
        z[i] = a * cs[i] - b * sn[i];
        z[i + half] = b * cs[i + half] + a * sn[i + half];
    }
}

/* s [N] <- s * scale, or -inf where vis[j] == 0 (vis NULL: all visible); returns the maximum */
static float scale_mask_max(float* restrict s, const unsigned char* restrict vis, float scale, int N) {
    const __m256 sc = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    __m256 mv = ninf;
    int j = 0;
    for (; j + 8 <= N; j += 8) {
        __m256 z = _mm256_mul_ps(_mm256_loadu_ps(s + j), sc);
        if (vis) {
            __m128i b = _mm_loadl_epi64((const __m128i*)(vis + j));      /* 8 bytes */
            __m256i w = _mm256_cvtepu8_epi32(b);
            __m256 hidden = _mm256_castsi256_ps(_mm256_cmpeq_epi32(w, _mm256_setzero_si256()));
            z = _mm256_blendv_ps(z, ninf, hidden);
        }
        _mm256_storeu_ps(s + j, z);
        mv = _mm256_max_ps(mv, z);
    }
    float buf[8];
    _mm256_storeu_ps(buf, mv);
    float mx = -INFINITY;
    for (int i = 0; i < 8; i++) mx = buf[i] > mx ? buf[i] : mx;
    for (; j < N; j++) {
        s[j] = vis && !vis[j] ? -INFINITY : s[j] * scale;
        if (s[j] > mx) mx = s[j];
    }
    return mx;
}

/* sum of s [N] in double, 4 lanes at a time */
static double sum_double(const float* s, int N) {
    __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
    int j = 0;
    for (; j + 8 <= N; j += 8) {
        a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm_loadu_ps(s + j)));
        b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm_loadu_ps(s + j + 4)));
    }
    double buf[4];
    _mm256_storeu_pd(buf, _mm256_add_pd(a, b));
    double t = (buf[0] + buf[1]) + (buf[2] + buf[3]);
    for (; j < N; j++) t += s[j];
    return t;
}

/* A layer's weights: panels (float32, float16 bits or int8 with their scales: weight_kind) and padded biases
 * or NULL. */
typedef struct {
    const float* ln1; const float* ln2; float eps;
    const void* qkv; const float* qkv_b; int qkv_n;   /* fused q|k|v stream and its padded width */
    const void* o; const float* o_b; int o_n;
    const void* gu; const float* gu_b; int gu_n;      /* fused gate|up stream */
    const void* down; const float* down_b; int down_n;
    int weight_kind;                                  /* WEIGHTS_F32, WEIGHTS_F16 or WEIGHTS_I8 */
    int k_off, v_off, up_off;                         /* column offsets of k, v, up in the fused outputs */
    int d, H, Hkv, D, ffn;
    float scale;
} LeanWeights;

/* A pass: shared by its layers. */
typedef struct {
    int R, n, S;                                      /* rows, new tokens per row, cached tokens before */
    const float* cos; const float* sin;               /* rotary tables [R][n][D] */
    const unsigned char* mask;                        /* [n][S + n] (1 = visible) or NULL (n = 1) */
    long row_stride, head_stride;                     /* cache strides in floats: [r][h][pos][D] */
    float* work;                                      /* lean_layer_work_floats(...) floats */
    int threads;
} LeanPass;

/* heads [T, H*D] = softmax(q . K^T * scale + mask) V for every (row, query head, new token), query head h
 * reading key/value head h / G; the queries are the q columns of wide [T, qkv_n], the keys and values the
 * cache's positions 0..S+n-1 (the pass's own already written) */
static void attention(const LeanWeights* W, const LeanPass* P, const float* wide, const float* kc, const float* vc,
                      float* heads, float* scores) {
    const int D = W->D, H = W->H, n = P->n, keys = P->S + n, G = H / W->Hkv;
    const int threads = P->threads > 0 ? P->threads : 1, items = P->R * H * n;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int it = 0; it < items; it++) {
        int t = it % n, h = (it / n) % H, r = it / (n * H);
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float* s = scores + (size_t)tid * keys;
        const float* q = wide + (size_t)(r * n + t) * W->qkv_n + (size_t)h * D;
        const float* kb = kc + (size_t)r * P->row_stride + (size_t)(h / G) * P->head_stride;
        const float* vb = vc + (size_t)r * P->row_stride + (size_t)(h / G) * P->head_stride;
        const unsigned char* vis = P->mask ? P->mask + (size_t)t * keys : NULL;
        scores_of(q, kb, keys, D, s);
        float mx = scale_mask_max(s, vis, W->scale, keys);
        exp_shifted(s, mx, keys);  /* exp(-inf) = 0: masked keys drop out */
        double total = sum_double(s, keys);
        float inv = (float)(1.0 / total);
        float* o = heads + (size_t)(r * n + t) * H * D + (size_t)h * D;
        accumulate_values(o, s, inv, vb, keys, D);
    }
}

/* ---- AVX-512 softmax rows for the tiled attention (chosen when the panel kernel runs AVX-512: panel_isa) */
int panel_isa(int request);
#define TARGET512 __attribute__((target("avx512f")))

/* exp8 on 16 lanes: the same operations lane by lane, so the same values */
TARGET512 static inline __m512 exp16(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365447505531f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_mask_mov_ps(_mm512_min_ps(x, hi), under, _mm512_setzero_ps());
    __m512 m = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(m, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(m, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(m), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}

/* w [N] = softmax(s * scale, -inf where vis[j] == 0) of one query's scores s [N] (overwritten), as
 * scale_mask_max, exp_shifted and sum_double do it: float32 exp of s - max, the sum in double (16 lanes, then
 * the tail), w = e * (float)(1 / sum) */
TARGET512 static void softmax_row16(float* restrict s, const unsigned char* restrict vis, float scale, int N,
                                    float* restrict w) {
    const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    __m512 mv = ninf;
    int j = 0;
    for (; j + 16 <= N; j += 16) {
        __m512 z = _mm512_mul_ps(_mm512_loadu_ps(s + j), sc);
        if (vis) {
            __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(vis + j)));
            z = _mm512_mask_mov_ps(z, _mm512_cmpeq_epi32_mask(b, _mm512_setzero_si512()), ninf);
        }
        _mm512_storeu_ps(s + j, z);
        mv = _mm512_max_ps(mv, z);
    }
    float mx = _mm512_reduce_max_ps(mv);
    for (int i = j; i < N; i++) {
        s[i] = vis && !vis[i] ? -INFINITY : s[i] * scale;
        if (s[i] > mx) mx = s[i];
    }
    const __m512 sh = _mm512_set1_ps(mx);
    __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
    for (j = 0; j + 16 <= N; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), sh));
        _mm512_storeu_ps(s + j, e);
        a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        b = _mm512_add_pd(b, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    if (j < N) {
        const __mmask16 k = (__mmask16)((1u << (N - j)) - 1);
        __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), sh)));
        _mm512_mask_storeu_ps(s + j, k, e);
        a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        b = _mm512_add_pd(b, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    const __m512 inv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(a, b))));
    for (j = 0; j + 16 <= N; j += 16) _mm512_storeu_ps(w + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), inv));
    if (j < N) {
        const __mmask16 k = (__mmask16)((1u << (N - j)) - 1);
        _mm512_mask_storeu_ps(w + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), inv));
    }
}

/* the same on 8 lanes (attention()'s own functions) */
static void softmax_row8(float* restrict s, const unsigned char* restrict vis, float scale, int N, float* restrict w) {
    float mx = scale_mask_max(s, vis, scale, N);
    exp_shifted(s, mx, N);  /* exp(-inf) = 0: masked keys drop out */
    float inv = (float)(1.0 / sum_double(s, N));
    for (int j = 0; j < N; j++) w[j] = s[j] * inv;
}

/* dst[i][c] = src[c][i] for an 8 x 8 block of floats (rows src_stride and dst_stride floats apart) */
static inline void transpose8x8(const float* src, size_t src_stride, float* dst, size_t dst_stride) {
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + (size_t)i * src_stride);
    for (int i = 0; i < 8; i += 2) { t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]); t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + (size_t)i * dst_stride, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(dst + (size_t)(i + 4) * dst_stride, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

/* z [N] <- exp(z) through exp16 (exported for tests/test_lean_layer.py, which checks it gives exp8's bits);
 * returns -1, leaving z, on a CPU without AVX-512F */
int lean_exp16(float* z, int N);
TARGET512 static void exp16_all(float* z, int N) {
    int i = 0;
    for (; i + 16 <= N; i += 16) _mm512_storeu_ps(z + i, exp16(_mm512_loadu_ps(z + i)));
    if (i < N) {
        const __mmask16 k = (__mmask16)((1u << (N - i)) - 1);
        _mm512_mask_storeu_ps(z + i, k, exp16(_mm512_maskz_loadu_ps(k, z + i)));
    }
}
int lean_exp16(float* z, int N) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return -1;
    exp16_all(z, N);
    return 0;
}

/* Queries per work item of the tiled attention (below): its products then have ~14-24 rows, the panel kernel's
 * register blocks.  Fixed, not derived from the thread count, so 1 and 2 threads give the same bits. */
#define ATT_QC 24

static inline int round16(int x) { return (x + 15) & ~15; }

/* The tiled attention's scratch in floats: 16 to start the panels on a cache line, the keys as panels
 * [R*Hkv][keys16/16][D][16], the values as panels [R*Hkv][D16/16][keys][16], and per thread ATT_QC queries,
 * their scores, weights and outputs. */
static long tiled_attention_floats(int R, int Hkv, int D, int keys, int threads) {
    const long keys16 = round16(keys), D16 = round16(D);
    return 16 + (long)R * Hkv * (keys16 * D + D16 * keys) + (long)threads * round16(ATT_QC * (D + keys16 + keys + D16));
}

/* The same attention as :c:func:`attention` for passes of n >= 2 new tokens, as panel products: the G * n
 * queries of key/value head g read the same keys and values, so per (row, g) the keys are packed once as
 * panels of 16 keys (kernels/panel_linear.c's layout of a weight [keys, D]) and the values as panels of 16
 * columns (a weight [D, keys]); then for each block of <= ATT_QC queries Q:
 *
 *   S = Q K^T  (panel_linear, M = |Q| rows),  W = softmax(S * scale + mask) row by row,  O = W V  (panel_linear)
 *
 * Per query the softmax is attention()'s (scale_mask_max, exp_shifted, sum_double) and O sums the weighted
 * values in key order (a masked key adds 0); S sums over D in the panel kernel's order instead of dot()'s
 * 8-wide partial sums (float32 rounding apart, the same values); where the products run AVX-512 the softmax
 * runs 16 lanes wide (softmax_row16: exp16 gives exp8's values).  Why: attention() runs one query at a time
 * with 8-wide FMAs, a load per FMA and a horizontal reduction per 8 keys.  On the default target at n = 33
 * (128 cached tokens, 1 thread) it took 7.5-8.0 ms of a ~80 ms pass, this one 5.0-5.9 ms: packing 1.1-1.3 ms
 * (mostly reading the cold cache: 0.25 ms when warm), the two products 1.5-1.8 ms each (~105 GFLOP/s), the
 * softmax 1.0 ms.  Below TILED_MIN_QUERIES queries per key/value head the packing costs more than it saves. */
static void tiled_attention(const LeanWeights* W, const LeanPass* P, const float* wide, const float* kc,
                            const float* vc, float* heads, float* work) {
    const int D = W->D, H = W->H, Hkv = W->Hkv, n = P->n, R = P->R, G = H / Hkv, keys = P->S + n;
    const int keys16 = round16(keys), D16 = round16(D), groups = R * Hkv;
    const int threads = P->threads > 0 ? P->threads : 1;
    float* kp = (float*)(((size_t)work + 63) & ~(size_t)63);  /* [groups][keys16 / 16][D][16] */
    float* vp = kp + (size_t)groups * keys16 * D;         /* [groups][D16 / 16][keys][16] */
    float* scratch = vp + (size_t)groups * D16 * keys;    /* [threads][ATT_QC * (D + keys16 + keys + D16)] */
    const size_t per_thread = round16(ATT_QC * (D + keys16 + keys + D16));  /* whole lines: no sharing */
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int pi = 0; pi < 2 * groups; pi++) {  /* the keys (even pi) and the values (odd pi) of every group */
        const int gi = pi / 2, r = gi / Hkv, g = gi % Hkv;
        const float* kb = kc + (size_t)r * P->row_stride + (size_t)g * P->head_stride;  /* [keys][D] */
        const float* vb = vc + (size_t)r * P->row_stride + (size_t)g * P->head_stride;
        float* kd = kp + (size_t)gi * keys16 * D;
        float* vd = vp + (size_t)gi * D16 * keys;
        if (pi % 2 == 0) for (int j0 = 0; j0 < keys16; j0 += 16) {  /* panel j0 / 16: line e = (K[j0..j0+15][e]), keys past the end 0 */
            float* panel = kd + (size_t)j0 * D;
            for (int h = 0; h < 16; h += 8) {  /* keys j0+h..j0+h+7: columns h..h+7 of the panel's lines */
                const int w = keys - j0 - h < 0 ? 0 : keys - j0 - h < 8 ? keys - j0 - h : 8;
                int e = 0;
                if (w == 8)
                    for (; e + 8 <= D; e += 8) transpose8x8(kb + (size_t)(j0 + h) * D + e, D, panel + (size_t)e * 16 + h, 16);
                for (; e < D; e++) {
                    float* line = panel + (size_t)e * 16 + h;
                    for (int c = 0; c < w; c++) line[c] = kb[(size_t)(j0 + h + c) * D + e];
                    for (int c = w; c < 8; c++) line[c] = 0.0f;
                }
            }
        }
        else for (int c0 = 0; c0 < D16; c0 += 16) {  /* panel c0 / 16: line j = V[j][c0..c0+15], columns past D 0 */
            float* panel = vd + (size_t)c0 * keys;
            const int w = D - c0 < 16 ? D - c0 : 16;
            for (int j = 0; j < keys; j++) {
                float* line = panel + (size_t)j * 16;
                const float* row = vb + (size_t)j * D + c0;
                for (int c = 0; c < w; c++) line[c] = row[c];
                for (int c = w; c < 16; c++) line[c] = 0.0f;
            }
        }
    }
    const int nq = G * n, chunks = (nq + ATT_QC - 1) / ATT_QC, items = groups * chunks;
    const int wide16 = panel_isa(-1) == 2;  /* the softmax on 16 lanes where the products run AVX-512 */
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int it = 0; it < items; it++) {
        const int gi = it / chunks, c = it % chunks, r = gi / Hkv, g = gi % Hkv;
        const int q0 = (int)((long)c * nq / chunks), m = (int)((long)(c + 1) * nq / chunks) - q0;
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float* qs = scratch + (size_t)tid * per_thread;   /* [m][D] queries, (head, token) order */
        float* ss = qs + (size_t)ATT_QC * D;               /* [m][keys16] scores */
        float* ws = ss + (size_t)ATT_QC * keys16;          /* [m][keys] weights */
        float* os = ws + (size_t)ATT_QC * keys;            /* [m][D16] outputs */
        for (int i = 0; i < m; i++) {
            const int q = q0 + i, h = g * G + q / n, t = q % n;
            memcpy(qs + (size_t)i * D, wide + (size_t)(r * n + t) * W->qkv_n + (size_t)h * D, sizeof(float) * D);
        }
        panel_linear(qs, kp + (size_t)gi * keys16 * D, NULL, ss, m, keys16, D, 1);
        for (int i = 0; i < m; i++) {
            const int t = (q0 + i) % n;
            const unsigned char* vis = P->mask ? P->mask + (size_t)t * keys : NULL;
            if (wide16) softmax_row16(ss + (size_t)i * keys16, vis, W->scale, keys, ws + (size_t)i * keys);
            else softmax_row8(ss + (size_t)i * keys16, vis, W->scale, keys, ws + (size_t)i * keys);
        }
        panel_linear(ws, vp + (size_t)gi * D16 * keys, NULL, os, m, D16, keys, 1);
        for (int i = 0; i < m; i++) {
            const int q = q0 + i, h = g * G + q / n, t = q % n;
            memcpy(heads + (size_t)(r * n + t) * H * D + (size_t)h * D, os + (size_t)i * D16, sizeof(float) * D);
        }
    }
}

/* Which attention a pass runs.  ATTENTION_AUTO: tiled_attention() when a key/value head has at least
 * TILED_MIN_QUERIES queries (G * n), else attention(); ATTENTION_TILED: tiled_attention() whenever n >= 2;
 * ATTENTION_PER_QUERY: attention() always (the reference the tests and the pass_limit benchmark compare with).
 * A pass of one token (no mask) always runs attention().  lean_attention_mode(request) sets the mode
 * (request < 0: leave it) and returns the mode in force.
 *
 * The threshold, measured on the default target (G = 3, 128 cached tokens, 1 thread, whole lean passes
 * interleaved): tiled / per-query 1.01-1.02x at n = 5-9, 1.00x at n = 11-13, 0.98x at 17, 0.97x at 25-33 (at
 * n <= 9 packing the keys and values costs more than the products save). */
enum { ATTENTION_AUTO = 0, ATTENTION_TILED = 1, ATTENTION_PER_QUERY = 2 };
#define TILED_MIN_QUERIES 40
static int attention_mode = ATTENTION_AUTO;

int lean_attention_mode(int request) {
    if (request >= ATTENTION_AUTO && request <= ATTENTION_PER_QUERY) attention_mode = request;
    return attention_mode;
}

/* z [N] <- exp(z) through the attention's exp8 (exported for tests/test_lean_layer.py, which checks its error
 * against a float64 exp) */
void lean_exp(float* z, int N) { exp_shifted(z, 0.0f, N); }

/* The scratch a call needs, in floats: normed [T, d], wide [T, max(qkv_n, gu_n)], heads [T, H*D],
 * proj [T, max(o_n, down_n)], mid [T, ffn], then the attention's scratch: scores [threads][S + n] (n = 1) or
 * tiled_attention's (n >= 2). */
long lean_layer_work_floats(int T, int d, int qkv_n, int o_n, int gu_n, int down_n, int H, int D, int ffn,
                            int keys, int threads, int R, int Hkv) {
    long wide = qkv_n > gu_n ? qkv_n : gu_n, proj = o_n > down_n ? o_n : down_n;
    threads = threads > 0 ? threads : 1;
    long attend = (long)keys * threads, tiled = tiled_attention_floats(R, Hkv, D, keys, threads);
    return (long)T * (d + wide + (long)H * D + proj + ffn) + (tiled > attend ? tiled : attend);
}

/* x [T, d] <- the layer's output, in place.  Returns 0, 1 on inconsistent shapes, 2 when a panel product
 * refused its width (nothing is written past the failure). */
int lean_layer(float* x, const LeanWeights* W, const LeanPass* P, float* kc, float* vc) {
    const int T = P->R * P->n, d = W->d, D = W->D, H = W->H, n = P->n, S = P->S;
    if (W->Hkv <= 0 || H % W->Hkv != 0 || D % 2 != 0 || W->o_n < d || W->down_n < d) return 1;
    const int threads = P->threads > 0 ? P->threads : 1;
    float* normed = P->work;                                                  /* [T, d] */
    float* wide = normed + (size_t)T * d;                                     /* [T, max(qkv_n, gu_n)] */
    float* heads = wide + (size_t)T * (W->qkv_n > W->gu_n ? W->qkv_n : W->gu_n);  /* [T, H*D] */
    float* proj = heads + (size_t)T * H * D;                                  /* [T, max(o_n, down_n)] */
    float* mid = proj + (size_t)T * (W->o_n > W->down_n ? W->o_n : W->down_n);    /* [T, ffn] */
    float* scores = mid + (size_t)T * W->ffn;                                 /* the attention's scratch */

    rms_norm(x, W->ln1, W->eps, normed, T, d);
    if (linear(W->weight_kind, normed, W->qkv, W->qkv_b, wide, T, W->qkv_n, d, threads)) return 2;
    for (int rt = 0; rt < T; rt++) {  /* token t of row r */
        const int r = rt / n, t = rt % n;
        float* row = wide + (size_t)(r * n + t) * W->qkv_n;
        const float* cs = P->cos + (size_t)(r * n + t) * D;
        const float* sn = P->sin + (size_t)(r * n + t) * D;
        for (int h = 0; h < H; h++) rotary(row + (size_t)h * D, cs, sn, D);
        for (int h = 0; h < W->Hkv; h++) {
            float* k = row + W->k_off + (size_t)h * D;
            rotary(k, cs, sn, D);
            size_t at = (size_t)r * P->row_stride + (size_t)h * P->head_stride + (size_t)(S + t) * D;
            memcpy(kc + at, k, sizeof(float) * D);
            memcpy(vc + at, row + W->v_off + (size_t)h * D, sizeof(float) * D);
        }
    }
    const int tiled = n >= 2 && (attention_mode == ATTENTION_TILED
                                 || (attention_mode == ATTENTION_AUTO && H / W->Hkv * n >= TILED_MIN_QUERIES));
    if (tiled) tiled_attention(W, P, wide, kc, vc, heads, scores);
    else attention(W, P, wide, kc, vc, heads, scores);
    if (linear(W->weight_kind, heads, W->o, W->o_b, proj, T, W->o_n, H * D, threads)) return 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++) x[(size_t)t * d + i] += proj[(size_t)t * W->o_n + i];
    rms_norm(x, W->ln2, W->eps, normed, T, d);
    if (linear(W->weight_kind, normed, W->gu, W->gu_b, wide, T, W->gu_n, d, threads)) return 2;
    for (int t = 0; t < T; t++) {
        const float* g = wide + (size_t)t * W->gu_n;
        const float* u = g + W->up_off;
        float* m = mid + (size_t)t * W->ffn;
        silu_mul(m, g, u, W->ffn);
    }
    if (linear(W->weight_kind, mid, W->down, W->down_b, proj, T, W->down_n, W->ffn, threads)) return 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++) x[(size_t)t * d + i] += proj[(size_t)t * W->down_n + i];
    return 0;
}
