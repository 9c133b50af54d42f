// Matrix products with weights kept in GGUF's quantized blocks (Q8_0, Q4_0, Q4_1), on raw host
// buffers. No torch and no pybind11 here: quant_binding.cpp checks arguments.
//
// Activations are quantized per 32-value block to int8 (scale = max|x| / 127, round half to even),
// as llama.cpp does, so each block's dot product is an exact int32 sum; block sums are scaled in
// float32. The plain-torch definition is sdcp_fast/kernels/quant_reference.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sdcp {

// Must match sdcp_fast/kernels/quant_reference.py (QUANT_KINDS).
enum class QuantKind : int { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2 };

constexpr int64_t kQuantBlock = 32;
int64_t quant_block_bytes(QuantKind kind);

// The packed layout the products read (made once at load: quant_reference.pack): the output
// columns in groups of kQuantPackCols (the last group padded with zero columns); a group's
// blocks one after another, each block of the group holding the 8 columns' float16 scales (16
// bytes), for Q4_1 their float16 mins (16 bytes), then the values in 32-byte pieces, piece p
// holding bytes 4p..4p+3 of each column's GGUF values in column order (Q8_0: 8 pieces, values
// 4p..4p+3; Q4: 4 pieces of nibbles, values 4p..4p+3 low and 16+4p..16+4p+3 high). Same bytes
// per block as GGUF's layout: 8 x 34, 8 x 18, 8 x 20.
constexpr int64_t kQuantPackCols = 8;

// out[t, n] = sum_k x[t, k] * w[n, k] for t < rows, n < n_out; w packed as above (k a
// multiple of 32). Each output depends on its own row of x and of w only, in a fixed order: a
// row's result is the same whatever the other rows and the thread count (what makes a pass over
// M + 1 positions agree with M + 1 one-token passes).
void quant_matmul(QuantKind kind, const uint8_t* w, int64_t n_out, int64_t k, const float* x, int64_t rows,
                  float* out, int threads);

// The int8 activation blocks (what quant_matmul multiplies by): q[rows, k], scale d and
// d * sum(q) per block, [rows, k / 32] each. Exposed for the parity tests.
void quantize_activations(const float* x, int64_t rows, int64_t k, int8_t* q, float* d, float* s);

std::vector<std::string> quant_isas();
std::string quant_isa();
// The active set as an index into quant_isas() (0 scalar, 1 avx2, 2 avx512): the row-invariant
// float kernels (rowwise_kernels.cpp) follow it.
int quant_isa_index();
bool set_quant_isa(const std::string& name);

}  // namespace sdcp
