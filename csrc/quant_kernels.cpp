// Quantized-weight matrix products (definitions: sdcp_fast/kernels/quant_reference.py).
//
// Activations are quantized by one scalar routine for every instruction set, so all sets
// multiply the same int8 values.
#include "quant_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// quant_impl.inc once per instruction set, chosen at run time (isa_dispatch.h): scalar, AVX2 +
// FMA + F16C and AVX-512 VNNI (VL/BW, 256-bit vectors: vpdpbusd replaces AVX2's two-step byte
// products).
#define SDCP_ISA_KERNELS "quant_impl.inc"
#define SDCP_ISA_AVX2_TARGET "avx2,fma,f16c"
#define SDCP_ISA_AVX512_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#include "isa_dispatch.h"

namespace sdcp {

namespace {

#define SDCP_MATMUL(ns) &ns::run_matmul

auto& dispatch() {
    static cpu_isa::Dispatch d({SDCP_ISA_VARIANTS(SDCP_MATMUL)}, {SDCP_ISA_TARGETS});
    return d;
}

// Reused per thread: a pass quantizes each layer's input once, and allocating it every call
// would cost more than the quantizing.
struct Scratch {
    std::vector<int8_t> q;
    std::vector<float> d, s;
};

}  // namespace

int64_t quant_block_bytes(QuantKind kind) {
    switch (kind) {
        case QuantKind::Q8_0: return 34;
        case QuantKind::Q4_0: return 18;
        case QuantKind::Q4_1: return 20;
    }
    return 0;
}

void quantize_activations(const float* x, int64_t rows, int64_t k, int8_t* q, float* d, float* s) {
    const int64_t nb = k / kQuantBlock;
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < nb; ++b) {
            const float* v = x + r * k + b * kQuantBlock;
            int8_t* o = q + r * k + b * kQuantBlock;
            float amax = 0.0f;
            for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
            const float scale = amax / 127.0f;
            const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
            int32_t sum = 0;
            for (int j = 0; j < kQuantBlock; ++j) {
                // Ties to even, as torch.round: |v * inv| <= 127 here, so adding and removing
                // 1.5 * 2^23 rounds in the default mode without a libm call (nearbyint is one on
                // a baseline x86-64 build). Needs IEEE arithmetic: no -ffast-math for this file.
                const float r = (v[j] * inv + 12582912.0f) - 12582912.0f;
                const int32_t iv = int32_t(r);
                o[j] = int8_t(iv);
                sum += iv;
            }
            d[r * nb + b] = scale;
            s[r * nb + b] = scale * float(sum);
        }
    }
}

void quant_matmul(QuantKind kind, const uint8_t* w, int64_t n_out, int64_t k, const float* x, int64_t rows,
                  float* out, int threads) {
    thread_local Scratch sc;
    const int64_t nb = k / kQuantBlock;
    sc.q.resize(size_t(rows * k));
    sc.d.resize(size_t(rows * nb));
    sc.s.resize(size_t(rows * nb));
    quantize_activations(x, rows, k, sc.q.data(), sc.d.data(), sc.s.data());
    // Small products are not worth waking a second thread for.
    if (n_out * k * std::max<int64_t>(rows, 1) < (int64_t(1) << 16)) threads = 1;
    dispatch().get()(kind, w, n_out, k, sc.q.data(), sc.d.data(), sc.s.data(), rows, out, std::max(threads, 1));
}

std::vector<std::string> quant_isas() { return dispatch().names(); }

std::string quant_isa() { return dispatch().name(); }

int quant_isa_index() { return dispatch().level(); }

bool set_quant_isa(const std::string& name) { return dispatch().select(name); }

}  // namespace sdcp
