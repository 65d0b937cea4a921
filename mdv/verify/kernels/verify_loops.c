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
 * increasing token ids and the permutation equals torch's stable sort's.  The eight byte histograms are
 * counted in the pass that makes the keys (one read of the keys per byte, not two), bytes on which every key
 * agrees are skipped, and the ids move as uint32 (V < 2^32; 12 bytes a move, not 16), widened at the end.
 * p, q: [N, V]; order: [N, V]; keys, keys2: [V] uint64; ids: [V] int64, read as two [V] uint32 (work). */
void sel_rank_order(long N, long V, const double *p, const double *q, int64_t *order,
                    uint64_t *keys, uint64_t *keys2, int64_t *ids)
{
    long count[8][256];
    uint32_t *ids_a = (uint32_t *)ids, *ids_b = ids_a + V;
    if (V == 0)
        return;
    for (long n = 0; n < N; n++) {
        const double *pn = p + n * V, *qn = q + n * V;
        memset(count, 0, sizeof count);
        for (long x = 0; x < V; x++) {
            double r = qn[x] > 0.0 ? pn[x] / qn[x] : 0.0;
            r = r + 0.0;  /* -0.0 -> +0.0, as the reference's "+ 0.0" */
            uint64_t bits;
            memcpy(&bits, &r, sizeof bits);
            keys[x] = ~bits;
            ids_a[x] = (uint32_t)x;
            for (int b = 0; b < 8; b++)
                count[b][(keys[x] >> (8 * b)) & 0xFF]++;
        }
        uint64_t *src_k = keys, *dst_k = keys2;
        uint32_t *src_i = ids_a, *dst_i = ids_b;
        for (int b = 0; b < 8; b++) {
            int shift = 8 * b;
            if (count[b][(src_k[0] >> shift) & 0xFF] == V)
                continue;  /* every key has the same byte here: the pass would not move anything */
            long at = 0;
            for (int d = 0; d < 256; d++) {  /* counts -> each byte value's first place */
                long c = count[b][d];
                count[b][d] = at;
                at += c;
            }
            for (long x = 0; x < V; x++) {
                long to = count[b][(src_k[x] >> shift) & 0xFF]++;
                dst_k[to] = src_k[x];
                dst_i[to] = src_i[x];
            }
            uint64_t *tk = src_k; src_k = dst_k; dst_k = tk;
            uint32_t *ti = src_i; src_i = dst_i; dst_i = ti;
        }
        for (long x = 0; x < V; x++)
            order[n * V + x] = src_i[x];
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

/* One sweep's update of every theta from the unmarked-above masses s (rank order), for one root; returns
 * whether some theta changed value.  The loop has no carried dependency but that or, so the compiler
 * vectorises it where the root is an instruction (sqrt) or products (cube_root); every operation is correctly
 * rounded per element, so vector and scalar code give the same bits. */
#define FILL_UPDATE(NAME, POWER, ROOT)                                                                \
    static int NAME(long V, int m, double eps, double line, double inv_m, const double *restrict s,   \
                    const double *restrict qs, const double *restrict ts, double *restrict th)       \
    {                                                                                                 \
        (void)inv_m;                                                                                  \
        (void)m;                                                                                      \
        int moved = 0;                                                                                \
        for (long i = 0; i < V; i++) {                                                                \
            double si = s[i];                                                                         \
            double d = (POWER) - ts[i];                                                               \
            d = d < 0.0 ? 0.0 : d;                                                                    \
            double root = ROOT;                                                                       \
            double rest = d >= eps ? root : d * line;                                                 \
            double qi = qs[i];                                                                        \
            double t = (si - rest) / (qi > 0.0 ? qi : 1.0);                                           \
            t = t < 0.0 ? 0.0 : (t > 1.0 ? 1.0 : t);                                                  \
            t = qi > 0.0 ? t : 0.0;                                                                   \
            moved |= t != th[i];                                                                      \
            th[i] = t;                                                                                \
        }                                                                                             \
        return moved;                                                                                 \
    }

static double int_power(double x, int m)  /* x^m by repeated products, as torch's _int_power */
{
    double out = x;
    for (int k = 1; k < m; k++)
        out = out * x;
    return out;
}

/* d^(1/3) for d in [FILL_EPS, 1] (where fill uses its root; elsewhere the result is discarded) without a
 * division or a square root (~4x cheaper than Newton on y^3 = d from a square-root seed, which took five
 * divisions).  z = d^(-1/3) is seeded by the exponent bits, z0 = bits(0x553ef000 - hi(d) / 3) (hi: the upper
 * 32 bits; relative error at most 0.035 for every normal d), refined by four Newton steps
 * z <- z + z (1 - d z^3) / 3 (errors at most 2.4e-3, 1.2e-5, 2.8e-10, then rounding); then y = d z^2 and one
 * Newton step on y^3 = d, y <- y - (y^3 - d) z^2 / 3 (z^2 = 1/y^2 to rounding), leave it within 1 ulp of the
 * exact root (tested against a correctly rounded one; libm's cbrt is off by up to 3 ulp).  At d = 0 it gives
 * NaN (0 z^3 with z^3 = inf), as the old root's 0/0 did: fill discards it there.
 * The integer division by 3 is by a constant, so it vectorises as a multiplication. */
static inline double cube_root(double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    bits = (uint64_t)(0x553ef000u - (uint32_t)(bits >> 32) / 3u) << 32;
    double z;
    memcpy(&z, &bits, sizeof z);
    for (int k = 0; k < 4; k++)
        z = z + z * ((1.0 - d * ((z * z) * z)) * (1.0 / 3.0));
    double y = d * (z * z);
    return y - ((y * y) * y - d) * (z * z) * (1.0 / 3.0);
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

/* fill's FILL_SWEEPS Jacobi sweeps for one row (sel_fill_marks and sel_fill_law share it, so their thetas
 * have the same bits): from theta = 1,
 *     s(i) = clamp(1 - sum_{k<i} qs(k) theta(k), 0, 1),   d = max(s^m - ts(i), 0),
 *     theta(i) = clamp((s - root(d)) / qs(i), 0, 1)  (0 where qs(i) = 0),
 * in rank order (qs = q[order], ts = target[order]); root(d) = d^(1/m) (sqrt for m = 2, cube_root for 3,
 * two square roots for 4, pow above), or d * line below eps (line = eps^(1/m - 1), passed in so both paths
 * use the same bits).  Per sweep the running sum is taken left to right in double, as torch's cumsum,
 * then every theta is updated from it.  A sweep that changes no theta's value leaves the next sweep the
 * same running sums (+0 and -0 add alike to them), so the same s and the same thetas, bit for bit, and so
 * on: the sweeps stop there, with the bits of running them all (where every target is out of reach, as at
 * deep prefixes where P(u)/Q_S(u) is large, after the second sweep).  qs, ts: [V] (rank order); th: [V] out
 * (rank order); s: [V] work. */
static void fill_sweeps(long V, int m, int sweeps, double eps, double line, const double *qs, const double *ts,
                        double *th, double *s)
{
    const double inv_m = 1.0 / m;
    for (long i = 0; i < V; i++)
        th[i] = 1.0;
    for (int sweep = 0; sweep < sweeps; sweep++) {
        double above = 0.0;  /* marked mass ranked above i, from the previous sweep's thetas */
        for (long i = 0; i < V; i++) {
            double si = 1.0 - above;
            s[i] = si < 0.0 ? 0.0 : (si > 1.0 ? 1.0 : si);
            above = above + qs[i] * th[i];
        }
        int moved;
        if (m == 2)
            moved = fill_update_2(V, m, eps, line, inv_m, s, qs, ts, th);
        else if (m == 3)
            moved = fill_update_3(V, m, eps, line, inv_m, s, qs, ts, th);
        else if (m == 4)
            moved = fill_update_4(V, m, eps, line, inv_m, s, qs, ts, th);
        else
            moved = fill_update_m(V, m, eps, line, inv_m, s, qs, ts, th);
        if (!moved)
            break;
    }
}

/* fill's marks theta (selection.fill_marks_torch) by fill_sweeps.  q, target: [N, V]; order: [N, V]; theta:
 * [N, V] out, in token space; work: [4 V]. */
void sel_fill_marks(long N, long V, const double *q, const double *target, const int64_t *order, int m,
                    int sweeps, double eps, double line, double *theta, double *work)
{
    double *qs = work, *ts = work + V, *th = work + 2 * V, *s = work + 3 * V;
    for (long n = 0; n < N; n++) {
        const int64_t *on = order + n * V;
        for (long i = 0; i < V; i++) {
            qs[i] = q[n * V + on[i]];
            ts[i] = target[n * V + on[i]];
        }
        fill_sweeps(V, m, sweeps, eps, line, qs, ts, th, s);
        for (long i = 0; i < V; i++)
            theta[n * V + on[i]] = th[i];
    }
}

/* ------------------------------------------------------------------------------ the closed-form marginals
 * (selection.NodeLaw.marginal): each rule's factors for m >= 2 survivors, and sum_j T_m(x, j) added as
 * acc(x) += weight * marginal(x) straight into token space (the reference's `acc = acc + pi(m) * marginal`,
 * the same two roundings), so no [N, V] intermediate is materialised.  The elementwise algebra is the
 * reference's, operation for operation; its sums over V (torch reductions, not sequential) are long double
 * running sums here, so those sums, and what is computed from them, differ in their last bits. */

/* mpbv.power_sum: N_m(X, Y) = sum_{j<m} X^j Y^(m-1-j) by N_2 = X + Y, N_{k+1} = X N_k + Y^k (m >= 2). */
static inline double power_sum(double X, double Y, int m)
{
    double out = X + Y, y_pow = Y;
    for (int k = 2; k < m; k++) {
        y_pow = y_pow * Y;
        out = X * out + y_pow;
    }
    return out;
}

/* lex's marginal (selection.lex_marginal): q * N_m(q + c, c).  q, c (lex's below-mass), acc: [N, V];
 * weight: [N]. */
void sel_lex_marginal(long N, long V, int m, const double *q, const double *c, const double *weight, double *acc)
{
    for (long n = 0; n < N; n++) {
        const double *qn = q + n * V, *cn = c + n * V;
        double *an = acc + n * V, w = weight[n];
        for (long x = 0; x < V; x++)
            an[x] = an[x] + w * (qn[x] * power_sum(qn[x] + cn[x], cn[x], m));
    }
}

/* K-SEQ's factors' elementwise parts at rho (no sums: the loops vectorise).  kseq_accept_parts: beta, mu,
 * nu and capped = p / rho (kept in o until kseq_residual_parts overwrites it); kseq_residual_parts: the
 * unnormalised residual w = max(p - q f, 0), 0 where q >= p / rho, and o = max(r - nu, 0). */
VECTOR_CLONES static void kseq_accept_parts(long V, double rho, const double *restrict p, const double *restrict q,
                                            double *restrict beta, double *restrict mu, double *restrict nu,
                                            double *restrict capped)
{
    for (long x = 0; x < V; x++) {
        double den = rho * q[x];
        double b = p[x] / (den > 0.0 ? den : 1.0);
        b = den > 0.0 ? b : 0.0;
        b = b < 0.0 ? 0.0 : (b > 1.0 ? 1.0 : b);
        double mux = q[x] * b, nux = q[x] - mux;
        beta[x] = b;
        mu[x] = mux;
        nu[x] = nux < 0.0 ? 0.0 : nux;
        capped[x] = p[x] / rho;
    }
}

VECTOR_CLONES static void kseq_residual_parts(long V, double factor, double r, const double *restrict p,
                                              const double *restrict q, const double *restrict nu,
                                              double *restrict o_capped, double *restrict res)
{
    for (long x = 0; x < V; x++) {
        double w = q[x] >= o_capped[x] ? 0.0 : p[x] - q[x] * factor, ox = r - nu[x];
        res[x] = w < 0.0 ? 0.0 : w;
        o_capped[x] = ox < 0.0 ? 0.0 : ox;
    }
}

/* K-SEQ's factors with m >= 2 survivors at rho (selection.kseq_factors_torch, with spectr.kseq_accept_prob
 * and spectr.kseq_residual):
 *     beta = clamp(p / (rho q), 0, 1) (0 where q = 0),  mu = q beta,  nu = max(q - mu, 0),  r = sum nu,
 *     o = max(r - nu, 0),  res = norm((p - q f)_+) with 0 where q >= p/rho, f = (1 - (1 - b)^m) / b,
 *     b = clamp(sum min(q, p/rho), 0, 1) (f = m at b = 0),
 *     1 - (1 - b)^m = -expm1(m log clamp(sum (q - p/rho)_+, 0, 1)),
 *     res = p where its mass is at most tol * max(sum p, 1) (normalize_or's fallback),
 *     moments M_t = sum res nu^t, t < m.
 * The elementwise parts in vectorised passes, the sums in scalar long double ones.  p, q: [N, V]; rho: [N];
 * beta, mu, nu, o, res: [N, V] out; r: [N] out; moments: [N, m] out. */
void sel_kseq_factors(long N, long V, int m, double tol, const double *p, const double *q, const double *rho,
                      double *beta, double *mu, double *nu, double *o, double *res, double *r, double *moments)
{
    for (long n = 0; n < N; n++) {
        const double *pn = p + n * V, *qn = q + n * V;
        double *nun = nu + n * V, *on = o + n * V, *rn = res + n * V;
        kseq_accept_parts(V, rho[n], pn, qn, beta + n * V, mu + n * V, nun, on);
        long double accepted = 0.0L, rejected = 0.0L, p_mass = 0.0L, nu_mass = 0.0L;
        for (long x = 0; x < V; x++) {
            double qx = qn[x], capped = on[x];
            accepted += qx < capped ? qx : capped;
            rejected += qx - capped > 0.0 ? qx - capped : 0.0;
            p_mass += pn[x];
            nu_mass += nun[x];
        }
        double b_all = (double)accepted, reject = (double)rejected, r_row = (double)nu_mass;
        b_all = b_all < 0.0 ? 0.0 : (b_all > 1.0 ? 1.0 : b_all);
        reject = reject < 0.0 ? 0.0 : (reject > 1.0 ? 1.0 : reject);
        double factor = b_all > 0.0 ? -expm1(m * log(reject)) / b_all : (double)m;
        kseq_residual_parts(V, factor, r_row, pn, qn, nun, on, rn);
        long double res_mass = 0.0L;
        for (long x = 0; x < V; x++)
            res_mass += rn[x];
        double mass = (double)res_mass, floor = (double)p_mass;
        if (mass > tol * (floor < 1.0 ? 1.0 : floor))
            for (long x = 0; x < V; x++)
                rn[x] = rn[x] / mass;
        else  /* no residual mass: p itself */
            memcpy(rn, pn, (size_t)V * sizeof *rn);
        /* the moments M_t four at a time per pass (four long double sums in registers, each still left to
         * right), nu^t by products from 1 as the reference's powers */
        for (int t0 = 0; t0 < m; t0 += 4) {
            long double m0 = 0.0L, m1 = 0.0L, m2 = 0.0L, m3 = 0.0L;
            for (long x = 0; x < V; x++) {
                double nu_pow = 1.0, rx = rn[x];
                for (int k = 0; k < t0; k++)
                    nu_pow = nu_pow * nun[x];
                m0 += rx * nu_pow;
                nu_pow = nu_pow * nun[x];
                m1 += rx * nu_pow;
                nu_pow = nu_pow * nun[x];
                m2 += rx * nu_pow;
                nu_pow = nu_pow * nun[x];
                m3 += rx * nu_pow;
            }
            long double sums[4] = {m0, m1, m2, m3};
            for (int t = t0; t < m && t < t0 + 4; t++)
                moments[n * m + t] = (double)sums[t - t0];
        }
        r[n] = r_row;
    }
}

/* K-SEQ's marginal with m >= 2 survivors from its factors (selection.kseq_marginal):
 *     mu N_m(r, 1) + res nu N_m(r, o) + nu max(F - res o^(m-1), 0),   F = sum_y res(y) o(y)^(m-1),
 * o^(m-1) by products (torch's pow for m - 1 <= 3, rounded differently above).  mu, nu, o, res, acc: [N, V];
 * r, weight: [N]. */
void sel_kseq_marginal(long N, long V, int m, const double *mu, const double *nu, const double *o,
                       const double *res, const double *r, const double *weight, double *acc)
{
    for (long n = 0; n < N; n++) {
        const double *mun = mu + n * V, *nun = nu + n * V, *on = o + n * V, *rn = res + n * V;
        double *an = acc + n * V, w = weight[n], rr = r[n];
        long double fallback_mass = 0.0L;
        for (long x = 0; x < V; x++)
            fallback_mass += rn[x] * int_power(on[x], m - 1);
        double total = (double)fallback_mass, accepted = power_sum(rr, 1.0, m);
        for (long x = 0; x < V; x++) {
            double fallback = total - rn[x] * int_power(on[x], m - 1);
            fallback = fallback < 0.0 ? 0.0 : fallback;
            double marg = mun[x] * accepted + rn[x] * nun[x] * power_sum(rr, on[x], m) + nun[x] * fallback;
            an[x] = an[x] + w * marg;
        }
    }
}

/* fill's marks and factors with m survivors (selection.fill_factors on fill_marks_torch's thetas): the
 * sweeps (fill_sweeps, the bits of sel_fill_marks), then in rank order
 *     marked = qs theta,  unmarked = qs (1 - theta),  others = max((1 - qs) - sum_{k<i} marked(k), 0),
 *     below = max(sum unmarked - sum_{k<=i} unmarked(k), 0),
 * the running sums left to right in double as torch's cumsum, the total in long double.  Where acc is not
 * NULL, the same last pass adds weight times fill's marginal (selection.fill_marginal) at each token's place,
 *     marked N_m(qs + others, unmarked + others) + unmarked N_m(unmarked + below, below),
 * so the factors are not read back in another pass.  qs, ts (q and the targets in rank order, gathered once
 * per prefix: every count reads the same), order: [N, V]; theta: [N, V] out (token space); ths, marked,
 * unmarked, others, below: [N, V] out (rank order); weight: [N] and acc: [N, V] (token space), or NULL;
 * work: [V]. */
void sel_fill_law(long N, long V, int m, int sweeps, double eps, double line, const double *qs, const double *ts,
                  const int64_t *order, double *theta, double *ths, double *marked, double *unmarked,
                  double *others, double *below, const double *weight, double *acc, double *work)
{
    for (long n = 0; n < N; n++) {
        const int64_t *on = order + n * V;
        const double *qn = qs + n * V;
        double *th = ths + n * V, *mk = marked + n * V, *um = unmarked + n * V;
        double *ot = others + n * V, *bl = below + n * V;
        fill_sweeps(V, m, sweeps, eps, line, qn, ts + n * V, th, work);
        double above = 0.0;
        long double unmarked_mass = 0.0L;
        for (long i = 0; i < V; i++) {
            double left = (1.0 - qn[i]) - above;
            mk[i] = qn[i] * th[i];
            um[i] = qn[i] * (1.0 - th[i]);
            ot[i] = left < 0.0 ? 0.0 : left;
            above = above + mk[i];
            unmarked_mass += um[i];
            theta[n * V + on[i]] = th[i];
        }
        double total = (double)unmarked_mass, cum = 0.0;
        double *an = acc != NULL ? acc + n * V : NULL, w = acc != NULL ? weight[n] : 0.0;
        for (long i = 0; i < V; i++) {
            cum = cum + um[i];
            double b = total - cum;
            bl[i] = b < 0.0 ? 0.0 : b;
            if (an != NULL) {
                double marg = mk[i] * power_sum(qn[i] + ot[i], um[i] + ot[i], m)
                              + um[i] * power_sum(um[i] + bl[i], bl[i], m);
                an[on[i]] = an[on[i]] + w * marg;
            }
        }
    }
}

/* The choice's score of a rule (selection._node_step): sum_x min(target(x), marginal(x)) per row, a long
 * double running sum (torch's sum rounds otherwise, and differently for one row than in a batch).
 * target, marginal: [N, V]; score: [N] out. */
void sel_overlap(long N, long V, const double *target, const double *marginal, double *score)
{
    for (long n = 0; n < N; n++) {
        const double *tn = target + n * V, *mn = marginal + n * V;
        long double sum = 0.0L;
        for (long x = 0; x < V; x++)
            sum += tn[x] < mn[x] ? tn[x] : mn[x];
        score[n] = (double)sum;
    }
}

/* The choice's ceiling (selection.reach_mass and overlap): sum_x min(target(x), R(x)) per row, with
 * R(x) = pi(1) q(x) + sum_{m >= 2, pi(m) > 0} pi(m) (q(x) N_m(1, 1 - q(x))), the terms in the reference's order
 * (N_m by power_sum), the sum left to right in long double.  target, q: [N, V]; pi: [N, K+1]; ceiling: [N] out. */
void sel_ceiling(long N, long V, int K, const double *target, const double *q, const double *pi, double *ceiling)
{
    for (long n = 0; n < N; n++) {
        const double *tn = target + n * V, *qn = q + n * V, *pn = pi + n * (K + 1);
        long double sum = 0.0L;
        for (long x = 0; x < V; x++) {
            double qx = qn[x], keep = 1.0 - qx, reach = pn[1] * qx;
            for (int m = 2; m <= K; m++)
                if (pn[m] > 0.0)
                    reach = reach + pn[m] * (qx * power_sum(1.0, keep, m));
            sum += tn[x] < reach ? tn[x] : reach;
        }
        ceiling[n] = (double)sum;
    }
}

/* The draft's support of one row (selection.support_columns, its reference: the tokens with q > 0 and one column
 * for the rest): vocab gets the ids with q > 0 in increasing order, p_cols / q_cols their p and q and, after them,
 * the target's mass off the support (summed left to right in long double) with q = 0.  Stops and returns -1 as
 * soon as more than max_cols tokens have q > 0 (scoring on them would not pay); else returns S, the support's
 * size.  p, q: [V]; vocab: [max_cols] (int64); p_cols, q_cols: [max_cols + 1]. */
long sel_support(long V, const double *p, const double *q, long max_cols, int64_t *vocab, double *p_cols,
                 double *q_cols)
{
    long S = 0;
    long double off = 0.0L;
    for (long x = 0; x < V; x++) {
        if (q[x] > 0.0) {
            if (S == max_cols)
                return -1;
            vocab[S] = x;
            p_cols[S] = p[x];
            q_cols[S] = q[x];
            S++;
        } else {
            off += p[x];
        }
    }
    p_cols[S] = (double)off;
    q_cols[S] = 0.0;
    return S;
}

/* ------------------------------------------------------------------------------ one prefix's choice, rule by rule
 * One token rule of select_gbv's choice at one prefix (selection._score_prefix_stepwise for one row in mode "choose",
 * where some count m >= 2 is possible and the prefix is not forced): the functions above in the reference's order on
 * the same inputs, so the same bits, in one call per rule instead of one per loop.  The caller keeps the choice (which
 * rule next, which wins) and allocates only the rules it computes.  rule 0 (lex, first): fill's rank order, lex's c
 * off it, the targets ratio p, lex's row and the ceiling; rule 1 (kseq): its prefix sums, then per count rho*, the
 * factors and the marginal; rule 2 (fill): q and the targets in rank order, then per count the law.  A rule's row is
 * sum_m pi(m) marginal_m, the count m = 1 (pi(1) q) added first, as the reference's acc.add_.  Returns the rule's
 * score sum_x min(target, row).  p, q: [V]; pi: [K+1]; lines: [K+1] fill's root line per count (FILL_EPS^(1/m - 1));
 * order, below, target: [V] (out for rule 0, in after); row: [V] out; ceiling: [1] out (rule 0); rule 1: masses,
 * the addresses (int64) of ratio [V], p_below, p_above, q_below, q_above [V + 1], p_zero [1] (work), rho [K + 1] out,
 * kseq the addresses of 6 arrays per count m >= 2 from 6 (m - 2): beta, mu, nu, o, res [V], then r and the moments
 * [1 + m] (0 for an impossible count); rule 2: qs, ts [V] out, fill the addresses of 6 [V] arrays per count (theta
 * in token space; ths, marked, unmarked, others, below in rank order); work: [4 V] doubles.  Arguments a rule does
 * not use may be NULL. */
double sel_node_rule(int rule, long V, int K, const double *p, const double *q, double ratio, const double *pi,
                     int rho_iters, double tol, int sweeps, double eps, const double *lines, int64_t *order,
                     double *below, double *target, double *row, double *ceiling, const int64_t *masses, double *rho,
                     const int64_t *kseq, double *qs, double *ts, const int64_t *fill, double *work)
{
#define FIELD(table, i) ((double *)(intptr_t)(table)[i])
    if (rule == 0) {
        sel_rank_order(1, V, p, q, order, (uint64_t *)work, (uint64_t *)(work + V), (int64_t *)(work + 2 * V));
        sel_lex_below(1, V, p, q, order, below);
        for (long x = 0; x < V; x++)
            target[x] = ratio * p[x];
    } else if (rule == 1) {
        sel_sorted_masses(1, V, p, q, order, FIELD(masses, 0), FIELD(masses, 1), FIELD(masses, 2), FIELD(masses, 3),
                          FIELD(masses, 4), FIELD(masses, 5));
    } else {
        for (long i = 0; i < V; i++) {
            qs[i] = q[order[i]];
            ts[i] = target[order[i]];
        }
    }
    for (long x = 0; x < V; x++)
        row[x] = 0.0;
    for (int m = 1; m <= K; m++) {
        double w = pi[m];
        if (!(w > 0.0))
            continue;
        if (m == 1) {
            for (long x = 0; x < V; x++)
                row[x] = row[x] + w * q[x];
        } else if (rule == 0) {
            sel_lex_marginal(1, V, m, q, below, &w, row);
        } else if (rule == 1) {
            const int64_t *f = kseq + 6 * (m - 2);
            sel_kseq_rho(1, V, m, rho_iters, FIELD(masses, 0), FIELD(masses, 1), FIELD(masses, 2), FIELD(masses, 3),
                         FIELD(masses, 4), FIELD(masses, 5), rho + m);
            sel_kseq_factors(1, V, m, tol, p, q, rho + m, FIELD(f, 0), FIELD(f, 1), FIELD(f, 2), FIELD(f, 3),
                             FIELD(f, 4), FIELD(f, 5), FIELD(f, 5) + 1);
            sel_kseq_marginal(1, V, m, FIELD(f, 1), FIELD(f, 2), FIELD(f, 3), FIELD(f, 4), FIELD(f, 5), &w, row);
        } else {
            const int64_t *f = fill + 6 * (m - 2);
            sel_fill_law(1, V, m, sweeps, eps, lines[m], qs, ts, order, FIELD(f, 0), FIELD(f, 1), FIELD(f, 2),
                         FIELD(f, 3), FIELD(f, 4), FIELD(f, 5), &w, row, work);
        }
    }
    double score;
    sel_overlap(1, V, target, row, &score);
    if (rule == 0)
        sel_ceiling(1, V, K, target, q, pi, ceiling);
    return score;
#undef FIELD
}
