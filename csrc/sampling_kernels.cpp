// CPU kernels for SDCP verification. Definitions: sdcp_fast/kernels/reference.py.
//
// Determinism: every sum over the vocabulary is taken in fixed blocks of kBlock ids whose
// partial sums are added in block order, so a row's result is the same whether its blocks
// run on one thread or many, and whatever other sessions share the batch.
#include "sampling_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SDCP_AVX2 1
#endif

// Wide vectors where the build targets AVX-512 (-march=native); no effect elsewhere.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8 && defined(__x86_64__)
#pragma GCC target("prefer-vector-width=512")
#endif

namespace sdcp {
namespace {

constexpr int64_t kBlock = 2048;
// Below these sizes a parallel region costs more than it saves (waking threads on a busy
// machine takes a scheduler tick): rows x vocab per call, and blocks per row.
constexpr int64_t kParallelIds = int64_t(1) << 20;
constexpr int64_t kParallelBlocks = 32;

inline float load(const float* p, int64_t j) { return p[j]; }
inline float load(const uint16_t* p, int64_t j) {
    uint32_t bits = uint32_t(p[j]) << 16;  // bfloat16 is the top half of a float32
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline int32_t as_int(float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline float as_float(int32_t i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

// exp(x) for x <= 0 without a libm call, so loops vectorize: x = n ln2 + r with a degree-6
// polynomial for exp(r) (Cephes coefficients); relative error about 2e-7; 0 below -87 and
// for -inf or NaN. Written without selects, floorf or fmaxf: with those GCC (trapping math,
// NaN rules) leaves store loops scalar.
inline float fast_exp(float x) {
    const int32_t keep = -static_cast<int32_t>(x >= -87.0f);  // all ones, or zero
    const float xc = as_float(as_int(x) & keep);
    const float t = xc * 1.44269504088896341f + 0.5f;
    int32_t n = static_cast<int32_t>(t);
    n -= static_cast<int32_t>(static_cast<float>(n) > t);  // floor, t may be negative
    const float nf = static_cast<float>(n);
    const float r = xc - nf * 0.693359375f + nf * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    return as_float(as_int(y * as_float((n + 127) << 23)) & keep);
}

#ifdef SDCP_AVX2
// fast_exp on 8 lanes (same reduction and polynomial, with FMAs and a hardware rounding of
// n, so not bit-identical to it): the exp of every id of a target row is the CPU's main cost.
inline __m256 exp8(__m256 x) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);  // false for NaN
    x = _mm256_and_ps(x, keep);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), keep);
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

// Max of x[0..n).
template <class T>
float block_max(const T* x, int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
    int64_t i = 0;
#ifdef SDCP_AVX2
    __m256 mv = _mm256_set1_ps(m);
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, load8(x + i));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mv);
    for (float v : lanes) m = std::max(m, v);
#endif
    for (; i < n; ++i) m = std::max(m, load(x, i));
    return m;
}

// Sum over i < n of exp((x[i] - m) * inv_temp) in float64, each exp stored to w[i] when w is
// not null: the block is in L1 from block_max, so a row costs one read of memory.
template <class T>
double exp_sum(const T* x, int64_t n, float m, float inv_temp, float* w) {
    int64_t i = 0;
    double acc = 0.0;
#ifdef SDCP_AVX2
    const __m256 mv = _mm256_set1_ps(m), tv = _mm256_set1_ps(inv_temp);
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_mul_ps(_mm256_sub_ps(load8(x + i), mv), tv));
        if (w != nullptr) _mm256_storeu_ps(w + i, e);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(a0, a1));
    acc = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
    for (; i < n; ++i) {
        const float e = fast_exp((load(x, i) - m) * inv_temp);
        if (w != nullptr) w[i] = e;
        acc += double(e);
    }
    return acc;
}

// Runs body(k) for each block k; in parallel only when no enclosing region is (sessions
// already fill the threads), so small batches still use every core on the vocabulary.
template <class F>
void for_blocks(int64_t nblocks, F&& body) {
    bool par = !omp_in_parallel() && nblocks >= kParallelBlocks && omp_get_max_threads() > 1;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t k = 0; k < nblocks; ++k) body(k);
}

inline int64_t num_blocks(int64_t vocab) { return (vocab + kBlock - 1) / kBlock; }

// p of one row under a profile: p(j) = kept(j) ? w(j) / norm : 0, w(j) = exp((l_j - lmax) / T).
// The kept set is every id, or the ids ranked (logit desc, id asc) no later than (thr, thr_id).
struct Stats {
    bool greedy = false;
    float inv_temp = 1.0f;  // 1 / T: a multiply per id instead of a divide (exact when T = 1)
    float lmax = 0.0f;
    double norm = 1.0;
    bool filtered = false;
    float thr = 0.0f;
    int64_t thr_id = 0;
    // Plain rows may keep their exps: cached[j] * block_scale[j / kBlock] = p(j), so the
    // residual or final draw on this row reads them instead of computing exp again.
    const float* cached = nullptr;
    std::vector<double> block_scale;
};

inline bool kept(const Stats& s, float l, int64_t j) {
    return !s.filtered || l > s.thr || (l == s.thr && j <= s.thr_id);
}
inline float weight(const Stats& s, float l) { return s.greedy ? 1.0f : fast_exp((l - s.lmax) * s.inv_temp); }
inline double prob(const Stats& s, float l, int64_t j) {
    return kept(s, l, j) ? double(weight(s, l)) / s.norm : 0.0;
}

template <class T>
float row_max(const T* row, int64_t vocab) {
    float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < vocab; ++j) m = std::max(m, load(row, j));
    return m;
}

template <class T>
int64_t first_index_of(const T* row, int64_t vocab, float value) {
    for (int64_t j = 0; j < vocab; ++j)
        if (load(row, j) == value) return j;
    return 0;  // only for NaN rows
}

// Max and normalizer of an unfiltered row in one read of memory: each block's max and its
// sum of exp((l - block max) / T) are taken while the block is in L1, then rescaled to the
// row max in block order.
template <class T>
void max_and_norm(const T* row, int64_t vocab, Stats& s, float* keep_exps) {
    int64_t nb = num_blocks(vocab);
    std::vector<float> part_max(nb);
    std::vector<double> part_sum(nb);
    const float inv_temp = s.inv_temp;
    for_blocks(nb, [&](int64_t k) {
        int64_t j0 = k * kBlock, n = std::min(vocab, j0 + kBlock) - j0;
        const T* x = row + j0;
        const float m = block_max(x, n);
        part_max[k] = m;
        // an all -inf block gives NaN arguments, hence exps of 0 (the cached ones too)
        part_sum[k] = exp_sum(x, n, m, inv_temp, keep_exps != nullptr ? keep_exps + j0 : nullptr);
    });
    float lmax = -std::numeric_limits<float>::infinity();
    for (float m : part_max) lmax = std::max(lmax, m);
    double norm = 0.0;
    for (int64_t k = 0; k < nb; ++k)
        if (part_sum[k] > 0.0) norm += part_sum[k] * double(fast_exp((part_max[k] - lmax) * inv_temp));
    s.lmax = lmax;
    s.norm = norm;
    if (keep_exps != nullptr) {
        s.cached = keep_exps;
        s.block_scale.resize(nb);
        for (int64_t k = 0; k < nb; ++k)
            s.block_scale[k] = part_sum[k] > 0.0 ? double(fast_exp((part_max[k] - lmax) * inv_temp)) / norm : 0.0;
    }
}


// Top-k / top-p without sorting: a radix walk over an order-preserving 32-bit key of the
// logit, 8 bits per level from the top, in descending key order. Each level histograms the
// remaining candidates (count and mass per bin, masses summed in id order), keeps the bin
// where the walk stops and drops the rest; the first level reads the row, later ones only
// the shrinking candidate list. The candidates stay in ascending id order, so the ties
// at the final key come out ranked (the reference ranks ties by id).
inline uint32_t order_key(float x) {
    uint32_t b;
    x = x == 0.0f ? 0.0f : x;  // -0.0 ranks as +0.0
    std::memcpy(&b, &x, 4);
    return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

struct Cut {
    int64_t above = 0;       // ids with a larger key
    double mass_above = 0.0;  // and their weight
    std::vector<int32_t> ties;  // ids with the cut key, ascending
};

// stop(above, mass_above, count_in_bin, mass_in_bin): the walk ends in this bin. If it never
// says so (rounding), the lowest non-empty bin is taken.
template <class Stop>
Cut radix_cut(const uint32_t* keys, const float* w, std::vector<int32_t> cand, Stop&& stop, Cut c = Cut()) {
    for (int shift = 24; shift >= 0; shift -= 8) {
        int64_t cnt[256] = {0};
        double mass[256] = {0.0};
        for (int32_t j : cand) {
            uint32_t bin = (keys[j] >> shift) & 255u;
            cnt[bin] += 1;
            mass[bin] += double(w[j]);
        }
        int lowest = 0;
        while (cnt[lowest] == 0) ++lowest;
        int bin = 255;
        for (; bin > lowest; --bin) {
            if (cnt[bin] == 0) continue;
            if (stop(c.above, c.mass_above, cnt[bin], mass[bin])) break;
            c.above += cnt[bin];
            c.mass_above += mass[bin];
        }
        std::vector<int32_t> next;
        next.reserve(size_t(cnt[bin]));
        for (int32_t j : cand)
            if (int((keys[j] >> shift) & 255u) == bin) next.push_back(j);
        cand.swap(next);
    }
    c.ties = std::move(cand);
    return c;
}

// The walk's first level: 256 bins of 1/16 of a unit of (lmax - l) / T below the row max
// (the last bin holds the rest). Ordered like the key, and fine where the cuts of top-k and
// top-p fall, so the key levels that follow see few candidates.
struct Coarse {
    int64_t cnt[256] = {0};
    double mass[256] = {0.0};
};

template <class Stop>
Cut kept_cut(int64_t vocab, const uint32_t* keys, const float* w, const uint8_t* bins, const Coarse& h, Stop&& stop) {
    const int64_t* cnt = h.cnt;
    const double* mass = h.mass;
    int last = 255;
    while (cnt[last] == 0) --last;
    Cut c;
    int bin = 0;
    for (; bin < last; ++bin) {
        if (cnt[bin] == 0) continue;
        if (stop(c.above, c.mass_above, cnt[bin], mass[bin])) break;
        c.above += cnt[bin];
        c.mass_above += mass[bin];
    }
    std::vector<int32_t> cand;
    cand.reserve(size_t(cnt[bin]));
    for (int64_t j = 0; j < vocab; ++j)
        if (bins[j] == bin) cand.push_back(int32_t(j));
    return radix_cut(keys, w, std::move(cand), stop, c);
}

template <class T>
void select_kept(const T* row, int64_t vocab, Stats& s, int64_t top_k, int64_t top_p) {
    std::vector<uint32_t> keys(vocab);
    std::vector<float> w(vocab);
    std::vector<uint8_t> bins(vocab);
    const float lmax = s.lmax, inv_temp = s.inv_temp;
    float* wp = w.data();
    const double total = exp_sum(row, vocab, lmax, inv_temp, wp);
    for (int64_t j = 0; j < vocab; ++j) {
        const float l = load(row, j);
        keys[j] = order_key(l);
        const float d = (lmax - l) * inv_temp * 16.0f;  // +inf for -inf logits
        bins[j] = d < 255.0f ? uint8_t(d) : uint8_t(255);
    }
    Coarse h;  // shared by both walks
    for (int64_t j = 0; j < vocab; ++j) {
        h.cnt[bins[j]] += 1;
        h.mass[bins[j]] += double(wp[j]);
    }
    // top-k: the cut key is the k-th ranked; c of its ties are kept
    Cut cut;
    int64_t c = 0;
    double mass = total;
    if (top_k > 0) {
        cut = kept_cut(vocab, keys.data(), wp, bins.data(), h, [&](int64_t above, double, int64_t n, double) {
            return above + n >= top_k;
        });
        c = top_k - cut.above;
        mass = cut.mass_above + double(c) * double(w[cut.ties[0]]);
    }
    if (top_p > 0) {
        const double limit = double(top_p) / 1000.0 * mass;
        Cut p = kept_cut(vocab, keys.data(), wp, bins.data(), h, [&](int64_t, double mass_above, int64_t, double m) {
            return mass_above + m >= limit;
        });
        // the i-th tie (0-based) is kept iff mass_above + i * w < limit
        const double wt = double(w[p.ties[0]]);
        const int64_t n = int64_t(p.ties.size());
        int64_t cp = wt > 0.0 ? int64_t(std::min(double(n), std::ceil((limit - p.mass_above) / wt))) : n;
        cp = std::max<int64_t>(1, std::min(cp, n));
        uint32_t kp = keys[p.ties[0]];
        if (top_k == 0 || kp > keys[cut.ties[0]]) {
            cut = std::move(p);
            c = cp;
        } else if (kp == keys[cut.ties[0]]) {
            c = std::min(c, cp);
        }  // else the nucleus reaches past the top-k set: top-k's cut stands
    }
    c = std::min<int64_t>(c, int64_t(cut.ties.size()));
    s.filtered = true;
    s.thr = load(row, cut.ties[0]);
    s.thr_id = cut.ties[size_t(c - 1)];
    s.norm = cut.mass_above + double(c) * double(w[cut.ties[0]]);
}

// keep_exps (vocab floats, or null) lets a plain row keep its exps for a later draw.
template <class T>
Stats row_stats(const T* row, int64_t vocab, const Profile& pr, float* keep_exps = nullptr) {
    Stats s;
    int64_t top_k = pr.top_k >= vocab ? 0 : pr.top_k;
    int64_t top_p = pr.top_p_milli >= 1000 ? 0 : pr.top_p_milli;
    if (pr.temperature_milli != 0 && top_k == 0 && top_p == 0) {
        s.inv_temp = float(1000.0 / double(pr.temperature_milli));
        max_and_norm(row, vocab, s, keep_exps);
        return s;
    }
    s.lmax = row_max(row, vocab);
    if (pr.temperature_milli == 0) {  // one-hot argmax: w = 1 on the single kept id
        s.greedy = true;
        s.filtered = true;
        s.thr = s.lmax;
        s.thr_id = first_index_of(row, vocab, s.lmax);
        return s;
    }
    s.inv_temp = float(1000.0 / double(pr.temperature_milli));
    select_kept(row, vocab, s, top_k, top_p);
    return s;
}

// The one inverse-CDF rule: smallest id with cumulative weight (ascending ids) > u * total;
// if rounding leaves none, the largest id with positive weight; -1 without positive mass.
// fill(j0, j1, out) writes the weights of ids j0..j1-1 as doubles.
template <class Fill>
int64_t inverse_cdf(int64_t vocab, double u, Fill&& fill) {
    int64_t nb = num_blocks(vocab);
    std::vector<double> part(nb);
    for_blocks(nb, [&](int64_t k) {
        double buf[kBlock];
        int64_t j0 = k * kBlock, j1 = std::min(vocab, j0 + kBlock);
        fill(j0, j1, buf);
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < j1 - j0; ++i) acc += buf[i];
        part[k] = acc;
    });
    double total = 0.0;
    for (double v : part) total += v;
    if (!(total > 0.0)) return -1;
    double target = u * total, acc = 0.0;
    int64_t k = 0;
    while (k < nb && !(acc + part[k] > target)) acc += part[k++];
    double buf[kBlock];
    for (; k < nb; ++k) {  // past the block the partial sums point at, only if rounding says so
        int64_t j0 = k * kBlock, j1 = std::min(vocab, j0 + kBlock);
        fill(j0, j1, buf);
        for (int64_t i = 0; i < j1 - j0; ++i) {
            if (buf[i] > 0.0) {
                acc += buf[i];
                if (target < acc) return j0 + i;
            }
        }
    }
    for (k = nb - 1; k >= 0; --k) {
        if (!(part[k] > 0.0)) continue;
        int64_t j0 = k * kBlock, j1 = std::min(vocab, j0 + kBlock);
        fill(j0, j1, buf);
        for (int64_t i = j1 - j0 - 1; i >= 0; --i)
            if (buf[i] > 0.0) return j0 + i;
    }
    return -1;
}

// max(0, p(j) - q(j)) for ids j0..j1-1 (q == nullptr: p itself). The common unfiltered
// case has its own loop so that it vectorizes.
template <class T>
void fill_probs(const T* row, const Stats& s, const float* q, int64_t j0, int64_t j1, double* out) {
    if (s.cached != nullptr) {  // j0..j1 is one block of the row's statistics
        const double scale = s.block_scale[j0 / kBlock];
        const float* w = s.cached + j0;
        const int64_t n = j1 - j0;
        if (q == nullptr) {
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) out[i] = double(w[i]) * scale;
        } else {
            const float* qb = q + j0;
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) {
                double v = double(w[i]) * scale - double(qb[i]);
                out[i] = v > 0.0 ? v : 0.0;
            }
        }
        return;
    }
    if (!s.filtered && !s.greedy) {
        const float lmax = s.lmax, inv_temp = s.inv_temp;
        const double inv_norm = 1.0 / s.norm;
        if (q == nullptr) {
#pragma omp simd
            for (int64_t j = j0; j < j1; ++j) out[j - j0] = double(fast_exp((load(row, j) - lmax) * inv_temp)) * inv_norm;
        } else {
#pragma omp simd
            for (int64_t j = j0; j < j1; ++j) {
                double v = double(fast_exp((load(row, j) - lmax) * inv_temp)) * inv_norm - double(q[j]);
                out[j - j0] = v > 0.0 ? v : 0.0;
            }
        }
        return;
    }
    for (int64_t j = j0; j < j1; ++j) {
        double p = prob(s, load(row, j), j);
        out[j - j0] = q == nullptr ? p : std::max(0.0, p - double(q[j]));
    }
}

template <class T>
auto prob_fill(const T* row, const Stats& s) {
    return [row, &s](int64_t j0, int64_t j1, double* out) { fill_probs(row, s, nullptr, j0, j1, out); };
}

template <class T>
void profile_rows(const T* logits, int64_t rows, int64_t vocab, const int64_t* tm, const int64_t* tk,
                  const int64_t* tp, float* probs) {
#pragma omp parallel for schedule(dynamic, 1) if (rows > 1 && rows * vocab >= kParallelIds)
    for (int64_t n = 0; n < rows; ++n) {
        const T* row = logits + n * vocab;
        std::unique_ptr<float[]> exps(new float[vocab]);
        Stats s = row_stats(row, vocab, Profile{tm[n], tk[n], tp[n]}, exps.get());
        float* out = probs + n * vocab;
        double buf[kBlock];
        for (int64_t j0 = 0; j0 < vocab; j0 += kBlock) {
            int64_t j1 = std::min(vocab, j0 + kBlock);
            fill_probs(row, s, nullptr, j0, j1, buf);
            for (int64_t j = j0; j < j1; ++j) out[j] = float(buf[j - j0]);
        }
    }
}

template <class T>
void greedy_sessions(const T* target, int64_t vocab, const int64_t* tokens, const int64_t* cu, int64_t batch,
                     int32_t* accepted, int32_t* emitted, int64_t width) {
#pragma omp parallel for schedule(dynamic, 1) if (batch > 1 && batch * vocab >= kParallelIds)
    for (int64_t b = 0; b < batch; ++b) {
        int64_t t0 = cu[b], m = cu[b + 1] - cu[b];
        int64_t a = 0;
        for (;; ++a) {
            const T* row = target + (t0 + b + a) * vocab;
            int64_t best = first_index_of(row, vocab, row_max(row, vocab));
            emitted[b * width + a] = int32_t(best);
            if (a == m || tokens[t0 + a] != best) break;
        }
        accepted[b] = int32_t(a);
    }
}

template <class T>
void speculative_sessions(const T* target, int64_t vocab, const int64_t* tm, const int64_t* tk,
                          const int64_t* tp, const float* q_probs, const int64_t* tokens, const int64_t* cu,
                          int64_t batch, const double* u, int32_t* accepted, int32_t* emitted, int64_t width,
                          bool* bad) {
#pragma omp parallel for schedule(dynamic, 1) if (batch > 1 && batch * vocab >= kParallelIds)
    for (int64_t b = 0; b < batch; ++b) {
        int64_t t0 = cu[b], m = cu[b + 1] - cu[b];
        bool is_bad = false;
        for (int64_t i = 0; i < m; ++i) {
            float q = q_probs[(t0 + i) * vocab + tokens[t0 + i]];
            is_bad = is_bad || !(q > 0.0f && std::isfinite(q));
        }
        bad[b] = is_bad;
        accepted[b] = 0;
        if (is_bad) continue;  // decided before any uniform is read
        Profile pr{tm[b], tk[b], tp[b]};
        std::unique_ptr<float[]> exps(new float[vocab]);  // the current row's exps, for its draw
        int64_t a = 0, extra = -1;
        for (; a < m; ++a) {
            const T* row = target + (t0 + b + a) * vocab;
            Stats s = row_stats(row, vocab, pr, exps.get());
            int64_t x = tokens[t0 + a];
            const float* qrow = q_probs + (t0 + a) * vocab;
            double p = s.cached != nullptr ? double(s.cached[x]) * s.block_scale[x / kBlock] : prob(s, load(row, x), x);
            double q = double(qrow[x]);
            if (u[(b * width + a) * 2] < std::min(1.0, p / q)) {
                emitted[b * width + a] = int32_t(x);
                continue;
            }
            double r = u[(b * width + a) * 2 + 1];
            extra = inverse_cdf(vocab, r, [&](int64_t j0, int64_t j1, double* out) {
                fill_probs(row, s, qrow, j0, j1, out);
            });
            if (extra < 0) extra = inverse_cdf(vocab, r, prob_fill(row, s));  // p == q up to rounding
            break;
        }
        if (a == m) {
            const T* row = target + (t0 + b + m) * vocab;
            Stats s = row_stats(row, vocab, pr, exps.get());
            extra = inverse_cdf(vocab, u[(b * width + m) * 2 + 1], prob_fill(row, s));
        }
        emitted[b * width + a] = int32_t(extra);
        accepted[b] = int32_t(a);
    }
}

}  // namespace

void apply_sampling_profile(const void* logits, LogitType type, int64_t rows, int64_t vocab,
                            const int64_t* temperature_milli, const int64_t* top_k,
                            const int64_t* top_p_milli, float* probs) {
    if (type == LogitType::F32)
        profile_rows(static_cast<const float*>(logits), rows, vocab, temperature_milli, top_k, top_p_milli, probs);
    else
        profile_rows(static_cast<const uint16_t*>(logits), rows, vocab, temperature_milli, top_k, top_p_milli,
                     probs);
}

void sample_from_probs(const float* probs, int64_t rows, int64_t vocab, const double* uniforms,
                       int32_t* tokens) {
#pragma omp parallel for schedule(dynamic, 1) if (rows > 1 && rows * vocab >= kParallelIds)
    for (int64_t n = 0; n < rows; ++n) {
        const float* row = probs + n * vocab;
        tokens[n] = int32_t(inverse_cdf(vocab, uniforms[n], [row](int64_t j0, int64_t j1, double* out) {
            for (int64_t j = j0; j < j1; ++j) out[j - j0] = double(row[j]);
        }));
    }
}

void verify_greedy(const void* target, LogitType type, int64_t vocab, const int64_t* tokens,
                   const int64_t* cu, int64_t batch, int32_t* accepted, int32_t* emitted, int64_t width) {
    if (type == LogitType::F32)
        greedy_sessions(static_cast<const float*>(target), vocab, tokens, cu, batch, accepted, emitted, width);
    else
        greedy_sessions(static_cast<const uint16_t*>(target), vocab, tokens, cu, batch, accepted, emitted, width);
}

void verify_speculative(const void* target, LogitType type, int64_t vocab, const int64_t* temperature_milli,
                        const int64_t* top_k, const int64_t* top_p_milli, const float* q_probs,
                        const int64_t* tokens, const int64_t* cu, int64_t batch, const double* uniforms,
                        int32_t* accepted, int32_t* emitted, int64_t width, bool* bad) {
    if (type == LogitType::F32)
        speculative_sessions(static_cast<const float*>(target), vocab, temperature_milli, top_k, top_p_milli,
                             q_probs, tokens, cu, batch, uniforms, accepted, emitted, width, bad);
    else
        speculative_sessions(static_cast<const uint16_t*>(target), vocab, temperature_milli, top_k, top_p_milli,
                             q_probs, tokens, cu, batch, uniforms, accepted, emitted, width, bad);
}

}  // namespace sdcp
