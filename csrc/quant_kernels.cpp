// Quantized-weight matrix products (definitions: sdcp_fast/kernels/quant_reference.py).
//
// quant_impl.inc is compiled once per instruction set: scalar (any CPU), AVX2 + FMA, and
// AVX-512 VNNI (VL/BW, 256-bit vectors: vpdpbusd replaces AVX2's two-step byte products), each
// in a region compiled for that set, as the sampling kernels are; the set is picked at run time
// from what the CPU reports (SDCP_CPU_ISA=scalar|avx2|avx512 caps it; set_quant_isa changes it,
// for tests and benchmarks). Activations are quantized by one scalar routine for every set, so
// all sets multiply the same int8 values.
#include "quant_kernels.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define SDCP_QUANT_X86 1
#endif

namespace sdcp {

namespace quant_scalar {
namespace {
#define QUANT_SIMD 0
#include "quant_impl.inc"
#undef QUANT_SIMD
}  // namespace
}  // namespace quant_scalar

#ifdef SDCP_QUANT_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace quant_avx2 {
namespace {
#define QUANT_SIMD 1
#include "quant_impl.inc"
#undef QUANT_SIMD
}  // namespace
}  // namespace quant_avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), \
                             apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
// GCC 12 reports the _mm512_undefined_* inside its own intrinsics as uninitialized
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace quant_avx512 {
namespace {
#define QUANT_SIMD 2
#include "quant_impl.inc"
#undef QUANT_SIMD
}  // namespace
}  // namespace quant_avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#endif  // SDCP_QUANT_X86

namespace {

struct QuantImpl {
    const char* name;
    decltype(&quant_scalar::run_matmul) matmul;
};

const QuantImpl kQuantImpls[] = {
    {"scalar", &quant_scalar::run_matmul},
#ifdef SDCP_QUANT_X86
    {"avx2", &quant_avx2::run_matmul},
    {"avx512", &quant_avx512::run_matmul},
#endif
};
constexpr int kNumQuantImpls = int(sizeof(kQuantImpls) / sizeof(kQuantImpls[0]));

int quant_supported() {
    int best = 0;
#ifdef SDCP_QUANT_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = 1;
    if (best == 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        best = 2;
#endif
    return best;
}

int quant_index(const std::string& name) {
    for (int i = 0; i < kNumQuantImpls; ++i)
        if (name == kQuantImpls[i].name) return i;
    return -1;
}

std::atomic<int>& quant_active() {
    static std::atomic<int> a{[] {
        int best = quant_supported();
        if (const char* env = std::getenv("SDCP_CPU_ISA")) {
            int want = quant_index(env);
            if (want >= 0) best = std::min(best, want);
        }
        return best;
    }()};
    return a;
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
    kQuantImpls[quant_active().load(std::memory_order_relaxed)].matmul(kind, w, n_out, k, sc.q.data(), sc.d.data(),
                                                                       sc.s.data(), rows, out, std::max(threads, 1));
}

std::vector<std::string> quant_isas() {
    std::vector<std::string> out;
    for (int i = 0; i <= quant_supported(); ++i) out.emplace_back(kQuantImpls[i].name);
    return out;
}

std::string quant_isa() { return kQuantImpls[quant_active().load()].name; }

int quant_isa_index() { return quant_active().load(std::memory_order_relaxed); }

bool set_quant_isa(const std::string& name) {
    int i = quant_index(name);
    if (i < 0 || i > quant_supported()) return false;
    quant_active().store(i);
    return true;
}

}  // namespace sdcp
