#include "host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>

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
    // One thread: splitting the copy across OpenMP threads measured slower than a single
    // memcpy on small shared hosts (thread wake-up and contention cost more than the
    // bandwidth gained); the win here is only that the caller has released the GIL.
    std::memcpy(dst, src, n);
}

}  // namespace sdcp
