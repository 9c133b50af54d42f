// The CPU kernels' instruction-set dispatch, in one place: a kernel source compiled once per
// instruction set, each copy in a region compiled for that set, and the run-time choice of one
// copy from what the CPU reports. The extension is built without -march (setup.py), so it runs
// on any x86-64 and still uses the widest set the CPU has.
//
// A kernel file defines these, then includes this header once:
//   SDCP_ISA_KERNELS        its per-set source, e.g. "quant_impl.inc"
//   SDCP_ISA_AVX2_TARGET    the features its AVX2 copy is compiled for, e.g. "avx2,fma"
//   SDCP_ISA_AVX512_TARGET  those of its AVX-512 copy; left undefined where it has none
// The source is then compiled into sdcp::scalar (any CPU), sdcp::avx2 and sdcp::avx512 (x86
// only), each inside an anonymous namespace, with SDCP_ISA set to SDCP_ISA_SCALAR, SDCP_ISA_AVX2
// or SDCP_ISA_AVX512 for the source to pick its code by. SDCP_ISA_VARIANTS(X) lists X(scalar),
// X(avx2)... for the copies compiled, most portable first, and SDCP_ISA_TARGETS their target
// strings in the same order: what a cpu_isa::Dispatch is built from.
//
// A target string is both what its copy is compiled for and what the CPU must report before
// that copy runs, so the flags and the probe cannot drift apart.
#ifndef SDCP_ISA_DISPATCH_H_
#define SDCP_ISA_DISPATCH_H_

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define SDCP_ISA_X86 1
#endif

#define SDCP_ISA_SCALAR 0
#define SDCP_ISA_AVX2 1
#define SDCP_ISA_AVX512 2

#define SDCP_ISA_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define SDCP_ISA_TARGET_PUSH(t) SDCP_ISA_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define SDCP_ISA_TARGET_POP() SDCP_ISA_PRAGMA(clang attribute pop)
#else
#define SDCP_ISA_TARGET_PUSH(t) SDCP_ISA_PRAGMA(GCC push_options) SDCP_ISA_PRAGMA(GCC target(t))
#define SDCP_ISA_TARGET_POP() SDCP_ISA_PRAGMA(GCC pop_options)
#endif

namespace sdcp::cpu_isa {

// Indexed by level (SDCP_ISA_*), which is also a copy's place in SDCP_ISA_VARIANTS.
inline constexpr const char* kNames[] = {"scalar", "avx2", "avx512"};
inline constexpr int kNumNames = int(sizeof(kNames) / sizeof(kNames[0]));

// -1 for a name that is no instruction set.
inline int level_of(const char* name) {
    for (int i = 0; i < kNumNames; ++i)
        if (std::strcmp(name, kNames[i]) == 0) return i;
    return -1;
}

// Whether the CPU reports every feature of a comma-separated target ("": any CPU). A feature
// missing from the table counts as absent: a copy compiled for something never probed never runs.
inline bool runs(const char* target) {
#ifdef SDCP_ISA_X86
    struct Feature {
        const char* name;
        bool present;
    };
    __builtin_cpu_init();
    // __builtin_cpu_supports takes a literal only: one row per feature a target names
    const Feature table[] = {
        {"avx2", bool(__builtin_cpu_supports("avx2"))},
        {"fma", bool(__builtin_cpu_supports("fma"))},
        {"f16c", bool(__builtin_cpu_supports("f16c"))},
        {"bmi", bool(__builtin_cpu_supports("bmi"))},
        {"bmi2", bool(__builtin_cpu_supports("bmi2"))},
        {"popcnt", bool(__builtin_cpu_supports("popcnt"))},
        {"avx512f", bool(__builtin_cpu_supports("avx512f"))},
        {"avx512bw", bool(__builtin_cpu_supports("avx512bw"))},
        {"avx512vl", bool(__builtin_cpu_supports("avx512vl"))},
        {"avx512vnni", bool(__builtin_cpu_supports("avx512vnni"))},
    };
    for (const char* p = target; *p != '\0';) {
        const size_t len = std::strcspn(p, ",");
        bool present = false;
        for (const Feature& f : table)
            if (std::strlen(f.name) == len && std::strncmp(p, f.name, len) == 0) present = f.present;
        if (!present) return false;
        p += len;
        if (*p == ',') ++p;
    }
    return true;
#else
    return *target == '\0';
#endif
}

// The process-wide choice among a kernel family's copies (Impl: its entry points): at first use
// the widest copy the CPU runs, capped by SDCP_CPU_ISA=scalar|avx2|avx512; select() changes it,
// for tests and benchmarks.
template <class Impl, int N>
class Dispatch {
    static_assert(N >= 1 && N <= kNumNames);

  public:
    // variants[i]: the copy compiled for targets[i] (level i), from SDCP_ISA_VARIANTS and
    // SDCP_ISA_TARGETS. A level runs only where every level below it does.
    Dispatch(const Impl (&variants)[N], const char* const (&targets)[N]) {
        std::copy(variants, variants + N, variants_);
        while (runnable_ + 1 < N && runs(targets[runnable_ + 1])) ++runnable_;
        int level = runnable_;
        if (const char* env = std::getenv("SDCP_CPU_ISA")) {
            const int cap = level_of(env);
            if (cap >= 0) level = std::min(level, cap);
        }
        active_.store(level);
    }

    const Impl& get() const { return variants_[level()]; }
    int level() const { return active_.load(std::memory_order_relaxed); }
    std::string name() const { return kNames[level()]; }

    // The widest copy at or below level that the CPU runs: for a family that follows another's
    // choice instead of keeping its own.
    const Impl& at_most(int level) const { return variants_[std::min(level, runnable_)]; }
    std::string name_at_most(int level) const { return kNames[std::min(level, runnable_)]; }

    // The sets this CPU runs, most portable first.
    std::vector<std::string> names() const { return std::vector<std::string>(kNames, kNames + runnable_ + 1); }

    // False, and nothing changes, where the name is no set or the CPU cannot run it.
    bool select(const std::string& name) {
        const int i = level_of(name.c_str());
        if (i < 0 || i > runnable_) return false;
        active_.store(i);
        return true;
    }

  private:
    Impl variants_[N]{};
    int runnable_ = 0;
    std::atomic<int> active_{0};
};

}  // namespace sdcp::cpu_isa

#endif  // SDCP_ISA_DISPATCH_H_

// ---- The copies of SDCP_ISA_KERNELS (once per including file) ----
#ifdef SDCP_ISA_KERNELS
#ifndef SDCP_ISA_AVX2_TARGET
#error "define SDCP_ISA_AVX2_TARGET (the AVX2 copy's features) before including isa_dispatch.h"
#endif

namespace sdcp::scalar {
namespace {
#define SDCP_ISA SDCP_ISA_SCALAR
#include SDCP_ISA_KERNELS
#undef SDCP_ISA
}  // namespace
}  // namespace sdcp::scalar

#ifdef SDCP_ISA_X86
SDCP_ISA_TARGET_PUSH(SDCP_ISA_AVX2_TARGET)
namespace sdcp::avx2 {
namespace {
#define SDCP_ISA SDCP_ISA_AVX2
#include SDCP_ISA_KERNELS
#undef SDCP_ISA
}  // namespace
}  // namespace sdcp::avx2
SDCP_ISA_TARGET_POP()

#ifdef SDCP_ISA_AVX512_TARGET
SDCP_ISA_TARGET_PUSH(SDCP_ISA_AVX512_TARGET)
#if !defined(__clang__)
// GCC 12 reports the _mm512_undefined_* inside its own intrinsics as uninitialized
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace sdcp::avx512 {
namespace {
#define SDCP_ISA SDCP_ISA_AVX512
#include SDCP_ISA_KERNELS
#undef SDCP_ISA
}  // namespace
}  // namespace sdcp::avx512
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
SDCP_ISA_TARGET_POP()
#define SDCP_ISA_VARIANTS(X) X(scalar), X(avx2), X(avx512)
#define SDCP_ISA_TARGETS "", SDCP_ISA_AVX2_TARGET, SDCP_ISA_AVX512_TARGET
#else
#define SDCP_ISA_VARIANTS(X) X(scalar), X(avx2)
#define SDCP_ISA_TARGETS "", SDCP_ISA_AVX2_TARGET
#endif  // SDCP_ISA_AVX512_TARGET

#else  // not x86: the portable copy only
#define SDCP_ISA_VARIANTS(X) X(scalar)
#define SDCP_ISA_TARGETS ""
#endif  // SDCP_ISA_X86

#endif  // SDCP_ISA_KERNELS
