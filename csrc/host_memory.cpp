#include "host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace sdcp {

HostAllocation host_alloc(std::size_t size) {
    HostAllocation a;
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    a.size = size;
    a.mapped = ((size ? size : 1) + page - 1) / page * page;
    void* p = mmap(nullptr, a.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    a.ptr = p;
    // Locking is what makes DMA from this buffer safe without a bounce copy; an unlocked
    // buffer still works, it is only pageable.
    a.locked = mlock(p, a.mapped) == 0;
    return a;
}

void host_free(HostAllocation& a) noexcept {
    if (a.ptr == nullptr) return;
    if (a.locked) munlock(a.ptr, a.mapped);
    munmap(a.ptr, a.mapped);
    a.ptr = nullptr;
}

void host_copy(void* dst, const void* src, std::size_t n) noexcept {
    constexpr std::size_t kParallelFrom = std::size_t{8} << 20;
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
#ifdef _OPENMP
    if (n >= kParallelFrom) {
        const int threads = omp_get_max_threads();
        const std::size_t chunk = (n + threads - 1) / threads;
#pragma omp parallel for num_threads(threads)
        for (int t = 0; t < threads; ++t) {
            const std::size_t lo = static_cast<std::size_t>(t) * chunk;
            if (lo < n) std::memcpy(d + lo, s + lo, (n - lo < chunk) ? n - lo : chunk);
        }
        return;
    }
#endif
    std::memcpy(d, s, n);
}

}  // namespace sdcp
