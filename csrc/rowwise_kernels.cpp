// Row-invariant float kernels of a CPU pass (definitions: sdcp_fast/kernels/rowwise_reference.py).
//
// The reductions (rowwise_impl.inc) are compiled per instruction set and follow the quantized
// kernels' choice (SDCP_CPU_ISA, set_quant_isa). The elementwise kernels (RoPE, the gated
// activation) are one portable loop: they reduce nothing.
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

// rowwise_impl.inc for scalar and AVX2 + FMA (isa_dispatch.h); AVX-512 takes the AVX2 copy.
#define SDCP_ISA_KERNELS "rowwise_impl.inc"
#define SDCP_ISA_AVX2_TARGET "avx2,fma"
#include "isa_dispatch.h"

namespace sdcp {

namespace {

struct Impl {
    decltype(&scalar::add_rms_norm) add_rms_norm;
    decltype(&scalar::paged_attention_rows) paged_attention_rows;
    decltype(&scalar::linear_f32) linear_f32;
};

#define SDCP_IMPL(ns) \
    Impl { &ns::add_rms_norm, &ns::paged_attention_rows, &ns::linear_f32 }

// Only for its copies and their probe: the level is the quantized products' (a pass runs both).
const auto& dispatch() {
    static const cpu_isa::Dispatch d({SDCP_ISA_VARIANTS(SDCP_IMPL)}, {SDCP_ISA_TARGETS});
    return d;
}

const Impl& impl() { return dispatch().at_most(quant_isa_index()); }

}  // namespace

void add_rms_norm(float* x, const float* delta, const float* w, int64_t rows, int64_t dim, float eps,
                  bool unit_offset, float* out) {
    impl().add_rms_norm(x, delta, w, rows, dim, eps, unit_offset, out);
}

void paged_attention_rows(const float* q, const float* k_cache, const float* v_cache, int64_t block_size,
                          int64_t hq, int64_t hkv, int64_t d, const int32_t* table, int64_t table_width,
                          const int32_t* row_seq, const int64_t* row_pos, int64_t rows, float scale,
                          int64_t window, float softcap, float* out, int threads) {
    impl().paged_attention_rows(q, k_cache, v_cache, block_size, hq, hkv, d, table, table_width, row_seq, row_pos,
                                rows, scale, window, softcap, out, std::max(threads, 1));
}

void linear_f32(const float* x, int64_t rows, int64_t k, const float* w, int64_t n_out, const float* bias,
                float* out, int threads) {
    impl().linear_f32(x, rows, k, w, n_out, bias, out, std::max(threads, 1));
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

std::string rowwise_isa() { return dispatch().name_at_most(quant_isa_index()); }

}  // namespace sdcp
