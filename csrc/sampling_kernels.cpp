// CPU kernels for SDCP verification. Definitions: sdcp_fast/kernels/reference.py.
#include "sampling_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

// sampling_impl.inc once per instruction set, chosen at run time (isa_dispatch.h): scalar,
// AVX2 + FMA (BMI and POPCNT for the lane masks) and AVX-512 F.
#define SDCP_ISA_KERNELS "sampling_impl.inc"
#define SDCP_ISA_AVX2_TARGET "avx2,fma,bmi,bmi2,popcnt"
#define SDCP_ISA_AVX512_TARGET "avx512f,avx2,fma,bmi,bmi2,popcnt"
#include "isa_dispatch.h"

namespace sdcp {

namespace {

struct Impl {
    decltype(&scalar::run_apply_profile) apply_profile;
    decltype(&scalar::run_sample) sample;
    decltype(&scalar::run_greedy) greedy;
    decltype(&scalar::run_speculative) speculative;
};

#define SDCP_IMPL(ns) \
    Impl { &ns::run_apply_profile, &ns::run_sample, &ns::run_greedy, &ns::run_speculative }

auto& dispatch() {
    static cpu_isa::Dispatch d({SDCP_ISA_VARIANTS(SDCP_IMPL)}, {SDCP_ISA_TARGETS});
    return d;
}

const Impl& impl() { return dispatch().get(); }

}  // namespace

std::vector<std::string> available_isas() { return dispatch().names(); }

std::string isa() { return dispatch().name(); }

bool set_isa(const std::string& name) { return dispatch().select(name); }

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
                        const int64_t* top_k, const int64_t* top_p_milli, const float* const* q_rounds,
                        const int64_t* tokens, const int64_t* cu, int64_t batch, const double* uniforms,
                        int32_t* accepted, int32_t* emitted, int64_t width, bool* bad) {
    impl().speculative(target, type, vocab, temperature_milli, top_k, top_p_milli, q_rounds, tokens, cu, batch,
                       uniforms, accepted, emitted, width, bad);
}

}  // namespace sdcp
