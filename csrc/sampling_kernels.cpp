// CPU kernels for SDCP verification. Definitions: sdcp_fast/kernels/reference.py.
//
// One source (sampling_impl.inc) compiled once per instruction set: scalar (any CPU),
// AVX2 + FMA and AVX-512 (F), each in a region compiled for that set, so the extension itself
// needs no -march flag and runs on any x86-64. The set is chosen at run time from what the
// CPU reports (SDCP_CPU_ISA=scalar|avx2|avx512 caps it; set_isa changes it, for tests and
// benchmarks).
#include "sampling_kernels.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define SDCP_X86 1
#endif

namespace sdcp {

namespace scalar {
namespace {
#include "simd_scalar.inc"
#include "sampling_impl.inc"
}  // namespace
}  // namespace scalar

#ifdef SDCP_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,bmi,bmi2,popcnt"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2,popcnt")
#endif
namespace avx2 {
namespace {
#include "simd_avx2.inc"
#include "sampling_impl.inc"
}  // namespace
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,bmi,bmi2,popcnt"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,bmi,bmi2,popcnt")
// GCC 12 reports the _mm512_undefined_* inside its own intrinsics as uninitialized
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace avx512 {
namespace {
#include "simd_avx512.inc"
#include "sampling_impl.inc"
}  // namespace
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#endif  // SDCP_X86

namespace {

struct Impl {
    const char* name;
    decltype(&scalar::run_apply_profile) apply_profile;
    decltype(&scalar::run_sample) sample;
    decltype(&scalar::run_greedy) greedy;
    decltype(&scalar::run_speculative) speculative;
};

#define SDCP_IMPL(ns) \
    Impl { #ns, &ns::run_apply_profile, &ns::run_sample, &ns::run_greedy, &ns::run_speculative }

// Ordered from the most portable; supported() says how far this CPU goes.
const Impl kImpls[] = {
    SDCP_IMPL(scalar),
#ifdef SDCP_X86
    SDCP_IMPL(avx2),
    SDCP_IMPL(avx512),
#endif
};
constexpr int kNumImpls = int(sizeof(kImpls) / sizeof(kImpls[0]));

int supported() {
    int best = 0;
#ifdef SDCP_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
        __builtin_cpu_supports("popcnt"))
        best = 1;
    if (best == 1 && __builtin_cpu_supports("avx512f")) best = 2;
#endif
    return best;
}

int index_of(const std::string& name) {
    for (int i = 0; i < kNumImpls; ++i)
        if (name == kImpls[i].name) return i;
    return -1;
}

int initial() {
    int best = supported();
    if (const char* env = std::getenv("SDCP_CPU_ISA")) {
        int want = index_of(env);
        if (want >= 0) best = std::min(best, want);
    }
    return best;
}

std::atomic<int>& active() {
    static std::atomic<int> a{initial()};
    return a;
}

const Impl& impl() { return kImpls[active().load(std::memory_order_relaxed)]; }

}  // namespace

std::vector<std::string> available_isas() {
    std::vector<std::string> out;
    for (int i = 0; i <= supported(); ++i) out.emplace_back(kImpls[i].name);
    return out;
}

std::string isa() { return impl().name; }

bool set_isa(const std::string& name) {
    int i = index_of(name);
    if (i < 0 || i > supported()) return false;
    active().store(i);
    return true;
}

void apply_sampling_profile(const void* logits, LogitType type, int64_t rows, int64_t vocab,
                            const int64_t* temperature_milli, const int64_t* top_k,
                            const int64_t* top_p_milli, float* probs) {
    impl().apply_profile(logits, type, rows, vocab, temperature_milli, top_k, top_p_milli, probs);
}

void sample_from_probs(const float* probs, int64_t rows, int64_t vocab, const double* uniforms,
                       int32_t* tokens) {
    impl().sample(probs, rows, vocab, uniforms, tokens);
}

void verify_greedy(const void* target, LogitType type, int64_t vocab, const int64_t* tokens,
                   const int64_t* cu, int64_t batch, int32_t* accepted, int32_t* emitted, int64_t width) {
    impl().greedy(target, type, vocab, tokens, cu, batch, accepted, emitted, width);
}

void verify_speculative(const void* target, LogitType type, int64_t vocab, const int64_t* temperature_milli,
                        const int64_t* top_k, const int64_t* top_p_milli, const float* q_probs,
                        const int64_t* tokens, const int64_t* cu, int64_t batch, const double* uniforms,
                        int32_t* accepted, int32_t* emitted, int64_t width, bool* bad) {
    impl().speculative(target, type, vocab, temperature_milli, top_k, top_p_milli, q_probs, tokens, cu, batch,
                       uniforms, accepted, emitted, width, bad);
}

}  // namespace sdcp
