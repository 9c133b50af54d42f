#include "paged_kv_kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace sdcp {

void paged_kv_write(char* cache, const char* values, const int64_t* slots, int64_t tokens, int64_t row_bytes) {
#pragma omp parallel for schedule(static) if (tokens * row_bytes > (1 << 20))
    for (int64_t t = 0; t < tokens; ++t)
        if (slots[t] >= 0) std::memcpy(cache + slots[t] * row_bytes, values + t * row_bytes, row_bytes);
}

void paged_kv_gather(const char* cache, const int32_t* block_table, int64_t batch, int64_t max_blocks,
                     const int32_t* seq_lens, int64_t block_size, int64_t row_bytes, char* out) {
    // One work item per (session, block): a block's used positions are one contiguous copy.
    std::vector<int64_t> first_item(batch + 1, 0), first_pos(batch + 1, 0);
    for (int64_t b = 0; b < batch; ++b) {
        first_item[b + 1] = first_item[b] + (seq_lens[b] + block_size - 1) / block_size;
        first_pos[b + 1] = first_pos[b] + seq_lens[b];
    }
    int64_t items = first_item[batch];
    (void)max_blocks;
#pragma omp parallel for schedule(static) if (first_pos[batch] * row_bytes > (1 << 20))
    for (int64_t it = 0; it < items; ++it) {
        int64_t b = std::upper_bound(first_item.begin(), first_item.end(), it) - first_item.begin() - 1;
        int64_t k = it - first_item[b];
        int64_t n = std::min<int64_t>(block_size, seq_lens[b] - k * block_size);
        const char* src = cache + int64_t(block_table[b * max_blocks + k]) * block_size * row_bytes;
        std::memcpy(out + (first_pos[b] + k * block_size) * row_bytes, src, n * row_bytes);
    }
}

}  // namespace sdcp
