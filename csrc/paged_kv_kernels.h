// Paged KV cache copies on raw host buffers; dtype-agnostic (element size in bytes).
// Layout: cache[num_blocks, block_size, H, D]; slot s = block * block_size + offset.
#pragma once

#include <cstdint>

namespace sdcp {

// cache[slot[t]] = values[t] for every t with slot[t] >= 0; a token is `row_bytes` long.
void paged_kv_write(char* cache, const char* values, const int64_t* slots, int64_t tokens, int64_t row_bytes);

// out = positions 0..seq_lens[b]-1 of each session through block_table[b, :], in batch order.
void paged_kv_gather(const char* cache, const int32_t* block_table, int64_t batch, int64_t max_blocks,
                     const int32_t* seq_lens, int64_t block_size, int64_t row_bytes, char* out);

}  // namespace sdcp
