// The float parts of a CPU decoder pass, on raw host float32 buffers: RMSNorm (with the residual
// add before it), RoPE with the KV-cache append, causal attention over a paged cache, the gated
// activation and the float32 matrix product. No torch and no pybind11 here: rowwise_binding.cpp
// takes addresses, sdcp_fast/kernels/rowwise.py checks arguments.
//
// Batch invariance: every output row is computed from its own input row alone, in an order
// fixed by the row's own sizes (never by how many rows share the call, nor by the thread
// count), so a pass over M + 1 positions gives each position the bits a one-position pass
// gives it. The plain-torch definitions are in sdcp_fast/kernels/rowwise_reference.py.
#pragma once

#include <cstdint>
#include <string>

namespace sdcp {

// x[r] += delta[r] when delta is not null (x is written back: the residual stream), then
// out[r] = w * (x[r] / rms(x[r])) (unit_offset: (1 + w)). rows x dim, contiguous.
void add_rms_norm(float* x, const float* delta, const float* w, int64_t rows, int64_t dim, float eps,
                  bool unit_offset, float* out);

// cos and sin [rows, half] of positions[r] * inv_freq[j] (float32 product, then cosf/sinf).
void rope_table(const int64_t* positions, const float* inv_freq, int64_t rows, int64_t half, float* cos_out,
                float* sin_out);

// Rotates q (rows x hq heads x d, row stride q_stride) into q_out [rows, hq, d] and k (row stride
// k_stride) into k_cache[slots[r]]; copies v (row stride v_stride) to v_cache[slots[r]]. Caches:
// [slots, hkv, d] contiguous. RoPE rotates the two halves of each head (Hugging Face layout).
void rope_append(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                 int64_t v_stride, int64_t rows, int64_t hq, int64_t hkv, int64_t d, const float* cos,
                 const float* sin, const int64_t* slots, float* q_out, float* k_cache, float* v_cache);

// Causal attention for each query row r (session row_seq[r], position row_pos[r]) over the
// session's cached positions [lo, row_pos[r]] (lo = row_pos[r] - window + 1 with a window > 0,
// else 0), read through table[row_seq[r], j / block_size] from caches [blocks, block_size, hkv,
// d]. Query head h reads KV head h / (hq / hkv). softcap > 0: scores become
// softcap * tanh(s / softcap). out [rows, hq, d].
void paged_attention_rows(const float* q, const float* k_cache, const float* v_cache, int64_t block_size,
                          int64_t hq, int64_t hkv, int64_t d, const int32_t* table, int64_t table_width,
                          const int32_t* row_seq, const int64_t* row_pos, int64_t rows, float scale,
                          int64_t window, float softcap, float* out, int threads);

// out[r, j] = act(gate[r, j]) * up[r, j]; act: 0 SiLU, 1 tanh-approximated GELU.
void gated_act(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, int64_t rows,
               int64_t f, int act, float* out);

// out[r, n] = sum_k x[r, k] * w[n, k] (+ bias[n]); x [rows, k], w [n_out, k] contiguous.
void linear_f32(const float* x, int64_t rows, int64_t k, const float* w, int64_t n_out, const float* bias,
                float* out, int threads);

std::string rowwise_isa();

}  // namespace sdcp
