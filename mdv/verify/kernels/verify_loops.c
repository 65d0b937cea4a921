/* The verifiers' per-prefix loops over the vocabulary, one row at a time in plain C (mdv/verify/native.py):
 * K-SEQ's rho* (mdv/verify/spectr.py) and the selected-draft law's sort, prefix sums and sweeps
 * (mdv/verify/selection.py).
 *
 * Each function repeats a torch / numpy / Python computation that is its reference (named at each
 * function), the same operations in the same order; where that reference sums in torch (whose reductions
 * are not sequential) or calls torch's vectorised roots (not correctly rounded), the bits may differ, and
 * tests/test_verify_native.py says by how much.  Rows are independent, so a row gets the same bits alone
 * or in a batch.  Portable C99 (no intrinsics, no OpenMP; -O3 vectorises the sweeps' updates).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* K-SEQ's g(rho) = clamp(reject, 0, 1)^k - max(uncovered, 0) from its two sums, the power as exp(k log x)
 * (0 at x = 0): spectr.kseq_gap's last step, shared by both rho* loops below. */
static double kseq_g(double reject, double uncovered, double k)
{
    reject = reject < 0.0 ? 0.0 : (reject > 1.0 ? 1.0 : reject);
    uncovered = uncovered < 0.0 ? 0.0 : uncovered;
    return (reject > 0.0 ? exp(k * log(reject)) : 0.0) - uncovered;
}

/* K-SEQ's rho* with k > 1 drafts for one row (spectr.kseq_rho at large V): 1 where g(1) >= 0, else
 * RHO_ITERS bisection steps on [1, k] over an active set (spectr._bisect_active_set, its reference): an entry whose ratio r = p/q lies at or below the bracket
 * adds q - p/rho to sum_x (q - p/rho)_+ and nothing to sum_x (p - rho q)_+ for every rho left in it; one
 * above it the reverse; so their masses are folded into four running sums and each step sums only the
 * entries still inside.  r = inf where q = 0 < p; p = q = 0 contributes nothing.  The sums run left to
 * right in long double (x87 extended precision where the platform has it: a double running sum over V
 * terms drifts by ~V eps, which moved the root by 3e-13 at V = 5000); the reference sums in torch and
 * Python floats, the same terms with other rounding.  p, q: [V]; work: [3 V].  Returns the upper end of
 * the bracket. */
double kseq_rho_active(long V, const double *p, const double *q, double k, int iters, double *work)
{
    long double reject_at_1 = 0.0L, uncovered_at_1 = 0.0L;  /* g(1)'s sums: rho* = 1 where g(1) >= 0 */
    double *pa = work, *qa = work + V, *ra = work + 2 * V;
    double lo = 1.0, hi = k;
    long double p_lo = 0.0L, q_lo = 0.0L, p_hi = 0.0L, q_hi = 0.0L;
    long n = 0;
    for (long x = 0; x < V; x++) {
        double px = p[x], qx = q[x], r;
        if (qx > px)
            reject_at_1 += qx - px;
        else
            uncovered_at_1 += px - qx;
        if (qx > 0.0)
            r = px / qx;
        else if (px > 0.0)
            r = INFINITY;
        else
            continue;
        if (r <= lo) {
            p_lo += px;
            q_lo += qx;
        } else if (r > hi) {
            p_hi += px;
            q_hi += qx;
        } else {
            pa[n] = px;
            qa[n] = qx;
            ra[n] = r;
            n++;
        }
    }
    if (kseq_g((double)reject_at_1, (double)uncovered_at_1, k) >= 0.0)
        return 1.0;
    for (int it = 0; it < iters; it++) {
        double mid = 0.5 * (lo + hi);
        long double reject = 0.0L, uncovered = 0.0L;
        long kept = 0;
        for (long i = 0; i < n; i++) {
            if (ra[i] <= lo) {
                p_lo += pa[i];
                q_lo += qa[i];
            } else if (ra[i] > hi) {
                p_hi += pa[i];
                q_hi += qa[i];
            } else {
                pa[kept] = pa[i];
                qa[kept] = qa[i];
                ra[kept] = ra[i];
                kept++;
            }
        }
        n = kept;
        for (long i = 0; i < n; i++) {
            double a = qa[i] - pa[i] / mid, b = pa[i] - mid * qa[i];
            reject += a > 0.0 ? a : 0.0;
            uncovered += b > 0.0 ? b : 0.0;
        }
        if (kseq_g((double)(q_lo - p_lo / mid + reject), (double)(p_hi - mid * q_hi + uncovered), k) >= 0.0)
            hi = mid;
        else
            lo = mid;
    }
    return hi;
}

/* fill's rank order: token ids by (p/q, -x) descending, p/q := 0 where q = 0 (selection.fill_order: a
 * stable ascending sort of the negated float64 bit patterns of the ratios).  The ratios are >= 0, so
 * ~bits sorts ascending exactly as the ratios sort descending; an LSD radix sort is stable, so ties keep
 * increasing token ids and the permutation equals torch's stable sort's.  Bytes on which every key agrees
 * are skipped.  p, q: [N, V]; order: [N, V]; keys, keys2: [V] uint64; idx2: [V] int64 (work). */
void sel_rank_order(long N, long V, const double *p, const double *q, int64_t *order,
                    uint64_t *keys, uint64_t *keys2, int64_t *idx2)
{
    for (long n = 0; n < N; n++) {
        const double *pn = p + n * V, *qn = q + n * V;
        int64_t *idx = order + n * V;
        uint64_t all_and = ~(uint64_t)0, all_or = 0;
        for (long x = 0; x < V; x++) {
            double r = qn[x] > 0.0 ? pn[x] / qn[x] : 0.0;
            r = r + 0.0;  /* -0.0 -> +0.0, as the reference's "+ 0.0" */
            uint64_t bits;
            memcpy(&bits, &r, sizeof bits);
            keys[x] = ~bits;
            idx[x] = x;
            all_and &= keys[x];
            all_or |= keys[x];
        }
        uint64_t *src_k = keys, *dst_k = keys2;
        int64_t *src_i = idx, *dst_i = idx2;
        for (int shift = 0; shift < 64; shift += 8) {
            if ((((all_and ^ all_or) >> shift) & 0xFF) == 0)
                continue;  /* every key has the same byte here: the pass would not move anything */
            long count[257];
            memset(count, 0, sizeof count);
            for (long x = 0; x < V; x++)
                count[((src_k[x] >> shift) & 0xFF) + 1]++;
            for (int b = 0; b < 256; b++)
                count[b + 1] += count[b];
            for (long x = 0; x < V; x++) {
                long at = count[(src_k[x] >> shift) & 0xFF]++;
                dst_k[at] = src_k[x];
                dst_i[at] = src_i[x];
            }
            uint64_t *tk = src_k; src_k = dst_k; dst_k = tk;
            int64_t *ti = src_i; src_i = dst_i; dst_i = ti;
        }
        if (src_i != idx)
            memcpy(idx, src_i, (size_t)V * sizeof *idx);
    }
}

/* lex's c(x), the draft mass ranked strictly below x under (min{1, p/q}, -x) (selection.lex_below_torch,
 * equal bit for bit to mpbv.below_mass's c): the tokens whose clamped ratio is below 1 in fill's order
 * read from the bottom, then the clamped-to-1 ones ("top": p > 0 and p/q >= 1, or q = 0 < p) by decreasing
 * id, summed left to right in double.  p, q, order: [N, V]; below: [N, V] out. */
void sel_lex_below(long N, long V, const double *p, const double *q, const int64_t *order, double *below)
{
    for (long n = 0; n < N; n++) {
        const double *pn = p + n * V, *qn = q + n * V;
        const int64_t *on = order + n * V;
        double *out = below + n * V, acc = 0.0;
#define LEX_TOP(x) (pn[x] > 0.0 && (qn[x] <= 0.0 || pn[x] / qn[x] >= 1.0))
        for (long i = V - 1; i >= 0; i--) {
            long x = (long)on[i];
            if (LEX_TOP(x))
                continue;
            out[x] = acc;
            acc = acc + qn[x];
        }
        for (long x = V - 1; x >= 0; x--) {
            if (!LEX_TOP(x))
                continue;
            out[x] = acc;
            acc = acc + qn[x];
        }
#undef LEX_TOP
    }
}

/* K-SEQ's prefix sums in fill's order read from the bottom (selection.SortedMasses): the ratios p/q of the
 * drafted tokens ascending (0 for undrafted ones), the running sums of p (drafted tokens only) and of q in
 * long double, rounded to double (below: the first i tokens, above: the rest, [V + 1] each), and p_zero,
 * the target's mass on undrafted tokens (q = 0 < p), also summed in long double.  p, q, order: [N, V];
 * ratio: [N, V]; p_below, p_above, q_below, q_above: [N, V + 1]; p_zero: [N] (out). */
void sel_sorted_masses(long N, long V, const double *p, const double *q, const int64_t *order, double *ratio,
                       double *p_below, double *p_above, double *q_below, double *q_above, double *p_zero)
{
    for (long n = 0; n < N; n++) {
        const double *pn = p + n * V, *qn = q + n * V;
        const int64_t *on = order + n * V;
        double *rn = ratio + n * V;
        double *pb = p_below + n * (V + 1), *pa = p_above + n * (V + 1);
        double *qb = q_below + n * (V + 1), *qa = q_above + n * (V + 1);
        long double pc = 0.0L, qc = 0.0L, zero = 0.0L;
        pb[0] = 0.0;
        qb[0] = 0.0;
        for (long i = 0; i < V; i++) {
            long x = (long)on[V - 1 - i];
            double px = pn[x], qx = qn[x];
            int drafted = qx > 0.0;
            rn[i] = drafted ? px / qx : 0.0;
            if (drafted)
                pc += px;
            else
                zero += px;
            qc += qx;
            pb[i + 1] = (double)pc;
            qb[i + 1] = (double)qc;
        }
        /* above = total - below, both in long double (the running sums are taken again in the same order) */
        long double pr = 0.0L, qr = 0.0L;
        for (long i = 0; i < V; i++) {
            pa[i] = (double)(pc - pr);
            qa[i] = (double)(qc - qr);
            long x = (long)on[V - 1 - i];
            if (qn[x] > 0.0)
                pr += pn[x];
            qr += qn[x];
        }
        pa[V] = (double)(pc - pr);
        qa[V] = (double)(qc - qr);
        p_zero[n] = (double)zero;
    }
}

/* K-SEQ's rho* with m drafts off those prefix sums (selection.SortedMasses._row_gap and rho, the same
 * operations in the same order, so the same bits as that Python loop):
 *     g(rho) = (clamp(Q_<(rho) - P_<(rho) / rho, 0, 1))^m - max(P_0 + P_>(rho) - rho Q_>(rho), 0),
 * the power as exp(m log x) (0 at x = 0), the counts by binary search; rho* = 1 where g(1) >= 0, else the
 * upper end of `iters` bisection steps on [1, m].  ratio: [N, V] ascending per row; the sums: [N, V + 1];
 * p_zero, rho: [N]. */
static long count_below(const double *r, long V, double x, int inclusive)
{
    long lo = 0, hi = V;  /* the number of entries < x (or <= x): numpy's searchsorted left (right) */
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (inclusive ? r[mid] <= x : r[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static double kseq_gap(const double *r, long V, const double *pb, const double *pa, const double *qb,
                       const double *qa, double p_zero, double rho, int m)
{
    long i = count_below(r, V, rho, 0), j = count_below(r, V, rho, 1);
    return kseq_g(qb[i] - pb[i] / rho, p_zero + pa[j] - rho * qa[j], m);
}

void sel_kseq_rho(long N, long V, int m, int iters, const double *ratio, const double *p_below,
                  const double *p_above, const double *q_below, const double *q_above, const double *p_zero,
                  double *rho)
{
    for (long n = 0; n < N; n++) {
        const double *r = ratio + n * V;
        const double *pb = p_below + n * (V + 1), *pa = p_above + n * (V + 1);
        const double *qb = q_below + n * (V + 1), *qa = q_above + n * (V + 1);
        if (kseq_gap(r, V, pb, pa, qb, qa, p_zero[n], 1.0, m) >= 0.0) {
            rho[n] = 1.0;
            continue;
        }
        double lo = 1.0, hi = (double)m;
        for (int k = 0; k < iters; k++) {
            double mid = 0.5 * (lo + hi);
            if (kseq_gap(r, V, pb, pa, qb, qa, p_zero[n], mid, m) >= 0.0)
                hi = mid;
            else
                lo = mid;
        }
        rho[n] = hi;
    }
}

/* One sweep's update of every theta from the unmarked-above masses s (rank order), for one root.  The
 * loop has no carried dependency, so the compiler vectorises it where the root is an instruction (sqrt);
 * every operation is correctly rounded per element, so vector and scalar code give the same bits. */
#define FILL_UPDATE(NAME, POWER, ROOT)                                                                \
    static void NAME(long V, int m, double eps, double line, double inv_m, const double *restrict s,  \
                     const double *restrict qs, const double *restrict ts, double *restrict th)      \
    {                                                                                                 \
        (void)inv_m;                                                                                  \
        (void)m;                                                                                      \
        for (long i = 0; i < V; i++) {                                                                \
            double si = s[i];                                                                         \
            double d = (POWER) - ts[i];                                                               \
            d = d < 0.0 ? 0.0 : d;                                                                    \
            double root = ROOT;                                                                       \
            double rest = d >= eps ? root : d * line;                                                 \
            double qi = qs[i];                                                                        \
            double t = (si - rest) / (qi > 0.0 ? qi : 1.0);                                           \
            t = t < 0.0 ? 0.0 : (t > 1.0 ? 1.0 : t);                                                  \
            th[i] = qi > 0.0 ? t : 0.0;                                                               \
        }                                                                                             \
    }

static double int_power(double x, int m)  /* x^m by repeated products, as torch's _int_power */
{
    double out = x;
    for (int k = 1; k < m; k++)
        out = out * x;
    return out;
}

/* d^(1/3) for d in [FILL_EPS, 1] (where fill uses its root; elsewhere the result is discarded): Newton's
 * y <- (2 y + d / y^2) / 3 from y0 = d^(5/16) = d^(1/4) d^(1/16) (four square roots), which lies above the
 * root by a factor d^(-1/48) <= 1.34 there, so five steps converge from above (relative errors at most
 * 0.33, 0.077, 5.3e-3, 2.8e-5, 8e-10, then rounding: within 4 ulp of libm's cbrt, tested).  Unlike cbrt
 * it vectorises. */
static inline double cube_root(double d)
{
    double r4 = sqrt(sqrt(d));
    double y = r4 * sqrt(sqrt(r4));
    for (int k = 0; k < 5; k++)
        y = (y + y + d / (y * y)) / 3.0;
    return y;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

VECTOR_CLONES FILL_UPDATE(fill_update_2, si * si, sqrt(d))
VECTOR_CLONES FILL_UPDATE(fill_update_3, (si * si) * si, cube_root(d))
VECTOR_CLONES FILL_UPDATE(fill_update_4, ((si * si) * si) * si, sqrt(sqrt(d)))
FILL_UPDATE(fill_update_m, int_power(si, m), pow(d, inv_m))

/* fill's marks theta (selection.fill_marks_torch): FILL_SWEEPS Jacobi sweeps from theta = 1 of
 *     s(i) = clamp(1 - sum_{k<i} qs(k) theta(k), 0, 1),   d = max(s^m - ts(i), 0),
 *     theta(i) = clamp((s - root(d)) / qs(i), 0, 1)  (0 where qs(i) = 0),
 * in rank order (qs = q[order], ts = target[order]); root(d) = d^(1/m) (sqrt for m = 2, cube_root for 3,
 * two square roots for 4, pow above), or d * line below eps (line = eps^(1/m - 1), passed in so both paths
 * use the same bits).  Per sweep the running sum is taken left to right in double, as torch's cumsum,
 * then every theta is updated from it.  q, target: [N, V]; order: [N, V]; theta: [N, V] out, in token
 * space; work: [4 V]. */
void sel_fill_marks(long N, long V, const double *q, const double *target, const int64_t *order, int m,
                    int sweeps, double eps, double line, double *theta, double *work)
{
    double *qs = work, *ts = work + V, *th = work + 2 * V, *s = work + 3 * V;
    const double inv_m = 1.0 / m;
    for (long n = 0; n < N; n++) {
        const int64_t *on = order + n * V;
        for (long i = 0; i < V; i++) {
            qs[i] = q[n * V + on[i]];
            ts[i] = target[n * V + on[i]];
            th[i] = 1.0;
        }
        for (int sweep = 0; sweep < sweeps; sweep++) {
            double above = 0.0;  /* marked mass ranked above i, from the previous sweep's thetas */
            for (long i = 0; i < V; i++) {
                double si = 1.0 - above;
                s[i] = si < 0.0 ? 0.0 : (si > 1.0 ? 1.0 : si);
                above = above + qs[i] * th[i];
            }
            if (m == 2)
                fill_update_2(V, m, eps, line, inv_m, s, qs, ts, th);
            else if (m == 3)
                fill_update_3(V, m, eps, line, inv_m, s, qs, ts, th);
            else if (m == 4)
                fill_update_4(V, m, eps, line, inv_m, s, qs, ts, th);
            else
                fill_update_m(V, m, eps, line, inv_m, s, qs, ts, th);
        }
        for (long i = 0; i < V; i++)
            theta[n * V + on[i]] = th[i];
    }
}
