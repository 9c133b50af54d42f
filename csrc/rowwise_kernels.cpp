// Row-invariant float kernels of a CPU pass (definitions: sdcp_fast/kernels/rowwise_reference.py).
//
// rowwise_impl.inc is compiled for scalar and for AVX2 + FMA, in regions compiled for that set
// as the quantized products are; the set follows the quantized kernels' choice
// (SDCP_CPU_ISA, set_quant_isa), AVX-512 using the AVX2 variant. The elementwise kernels (RoPE,
// the gated activation) are one portable loop: they reduce nothing.
#if defined(__GNUC__) && !defined(__clang__)
// a * b + c must round twice everywhere here (no contraction into an FMA that one code path
// would get and another not)
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#include "rowwise_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "quant_kernels.h"

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define SDCP_ROWWISE_X86 1
#endif

namespace sdcp {

namespace rowwise_scalar {
#define RW_SIMD 0
#include "rowwise_impl.inc"
#undef RW_SIMD
}  // namespace rowwise_scalar

#ifdef SDCP_ROWWISE_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace rowwise_avx2 {
#define RW_SIMD 1
#include "rowwise_impl.inc"
#undef RW_SIMD
}  // namespace rowwise_avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace {

bool use_avx2() {
#ifdef SDCP_ROWWISE_X86
    return quant_isa_index() >= 1;
#else
    return false;
#endif
}

}  // namespace

#ifdef SDCP_ROWWISE_X86
#define RW_DISPATCH(fn, ...) (use_avx2() ? rowwise_avx2::fn(__VA_ARGS__) : rowwise_scalar::fn(__VA_ARGS__))
#else
#define RW_DISPATCH(fn, ...) rowwise_scalar::fn(__VA_ARGS__)
#endif

void add_rms_norm(float* x, const float* delta, const float* w, int64_t rows, int64_t dim, float eps,
                  bool unit_offset, float* out) {
    RW_DISPATCH(add_rms_norm, x, delta, w, rows, dim, eps, unit_offset, out);
}

void paged_attention_rows(const float* q, const float* k_cache, const float* v_cache, int64_t block_size,
                          int64_t hq, int64_t hkv, int64_t d, const int32_t* table, int64_t table_width,
                          const int32_t* row_seq, const int64_t* row_pos, int64_t rows, float scale,
                          int64_t window, float softcap, float* out, int threads) {
    RW_DISPATCH(paged_attention_rows, q, k_cache, v_cache, block_size, hq, hkv, d, table, table_width, row_seq,
                row_pos, rows, scale, window, softcap, out, std::max(threads, 1));
}

void linear_f32(const float* x, int64_t rows, int64_t k, const float* w, int64_t n_out, const float* bias,
                float* out, int threads) {
    RW_DISPATCH(linear_f32, x, rows, k, w, n_out, bias, out, std::max(threads, 1));
}

void rope_table(const int64_t* positions, const float* inv_freq, int64_t rows, int64_t half, float* cos_out,
                float* sin_out) {
    for (int64_t r = 0; r < rows; ++r) {
        const float p = float(positions[r]);
        for (int64_t j = 0; j < half; ++j) {
            const float a = p * inv_freq[j];
            cos_out[r * half + j] = std::cos(a);
            sin_out[r * half + j] = std::sin(a);
        }
    }
}

namespace {

inline void rotate(const float* x, const float* c, const float* s, int64_t half, float* o) {
    for (int64_t j = 0; j < half; ++j) {
        const float x1 = x[j], x2 = x[j + half];
        o[j] = x1 * c[j] - x2 * s[j];
        o[j + half] = x2 * c[j] + x1 * s[j];
    }
}

}  // namespace

void rope_append(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                 int64_t v_stride, int64_t rows, int64_t hq, int64_t hkv, int64_t d, const float* cos,
                 const float* sin, const int64_t* slots, float* q_out, float* k_cache, float* v_cache) {
    const int64_t half = d / 2;
    for (int64_t r = 0; r < rows; ++r) {
        const float* c = cos + r * half;
        const float* s = sin + r * half;
        for (int64_t h = 0; h < hq; ++h) rotate(q + r * q_stride + h * d, c, s, half, q_out + (r * hq + h) * d);
        if (slots[r] < 0) continue;  // a padding row: nothing cached
        float* kc = k_cache + slots[r] * hkv * d;
        for (int64_t h = 0; h < hkv; ++h) rotate(k + r * k_stride + h * d, c, s, half, kc + h * d);
        std::memcpy(v_cache + slots[r] * hkv * d, v + r * v_stride, size_t(hkv * d) * sizeof(float));
    }
}

void gated_act(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, int64_t rows,
               int64_t f, int act, float* out) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    for (int64_t r = 0; r < rows; ++r) {
        const float* g = gate + r * gate_stride;
        const float* u = up + r * up_stride;
        float* o = out + r * f;
        if (act == 0) {
            for (int64_t j = 0; j < f; ++j) o[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
        } else {
            for (int64_t j = 0; j < f; ++j) {
                const float x = g[j];
                o[j] = 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x))) * u[j];
            }
        }
    }
}

std::string rowwise_isa() { return use_avx2() ? "avx2" : "scalar"; }

}  // namespace sdcp
