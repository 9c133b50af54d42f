// Page-locked host buffers for the MLC's host tier (no torch, no Python: raw memory only).
#pragma once

#include <cstddef>

namespace sdcp {

struct HostAllocation {
    void* ptr = nullptr;
    std::size_t size = 0;    // bytes the caller asked for
    std::size_t mapped = 0;  // bytes mapped (whole pages)
    bool locked = false;     // true when mlock succeeded (RLIMIT_MEMLOCK may forbid it)
};

// Page-aligned anonymous mapping, pre-faulted, locked when the limit allows. Throws std::bad_alloc.
HostAllocation host_alloc(std::size_t size);
void host_free(HostAllocation& a) noexcept;

// memcpy; callers run it with the GIL released.
void host_copy(void* dst, const void* src, std::size_t n) noexcept;

}  // namespace sdcp
