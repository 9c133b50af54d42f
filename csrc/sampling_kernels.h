// Rules 1 and 2 of SDCP §6.4, the §4.1 sampling profile and inverse-CDF sampling on raw
// host buffers. No torch and no pybind11 here: sampling_binding.cpp checks arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sdcp {

enum class LogitType : int { F32 = 0, BF16 = 1 };

// A session's (or row's) profile, already normalised: top_k 0 and top_p_milli 0 disable.
struct Profile {
    int64_t temperature_milli;
    int64_t top_k;
    int64_t top_p_milli;
};

// Logits in, float32 probabilities out: probs[n, v].
void apply_sampling_profile(const void* logits, LogitType type, int64_t rows, int64_t vocab,
                            const int64_t* temperature_milli, const int64_t* top_k,
                            const int64_t* top_p_milli, float* probs);

// Inverse CDF per row: smallest id whose cumulative weight exceeds u * total; -1 if no mass.
void sample_from_probs(const float* probs, int64_t rows, int64_t vocab, const double* uniforms,
                       int32_t* tokens);

// Ragged batch: session b has tokens[cu[b]..cu[b+1]) and target rows cu[b]+b .. cu[b+1]+b.
// accepted[B] and emitted[B, width] are written; emitted must arrive filled with -1.
void verify_greedy(const void* target, LogitType type, int64_t vocab, const int64_t* tokens,
                   const int64_t* cu, int64_t batch, int32_t* accepted, int32_t* emitted, int64_t width);

// uniforms[B, width, 2] (width = M_max + 1); bad[B] flags q(x) <= 0 before any uniform is read.
// q_rounds[b] points at session b's draft rows [cu[b+1] - cu[b], vocab], each session's where
// it lies (rows read in place from shared memory are not gathered into one buffer first).
void verify_speculative(const void* target, LogitType type, int64_t vocab, const int64_t* temperature_milli,
                        const int64_t* top_k, const int64_t* top_p_milli, const float* const* q_rounds,
                        const int64_t* tokens, const int64_t* cu, int64_t batch, const double* uniforms,
                        int32_t* accepted, int32_t* emitted, int64_t width, bool* bad);

// Instruction sets: those this CPU runs (most portable first), the one in use, and a switch
// to another of them (false if it cannot run here). The choice is process-wide.
std::vector<std::string> available_isas();
std::string isa();
bool set_isa(const std::string& name);

}  // namespace sdcp
