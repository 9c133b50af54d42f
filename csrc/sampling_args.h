// Argument checking shared by the pybind11 bindings: Python passes each tensor as
// (data_ptr, dtype_code, shape, strides) so that no torch header is needed here.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sdcp {

// Must match sdcp_fast/kernels/cpu_backend.py.
enum DTypeCode : int { kF32 = 0, kBF16 = 1, kF16 = 2, kF64 = 3, kI32 = 4, kI64 = 5, kBool = 6 };

struct TensorArg {
    void* data = nullptr;
    int dtype = -1;
    std::vector<int64_t> shape;

    int64_t numel() const {
        int64_t n = 1;
        for (int64_t s : shape) n *= s;
        return n;
    }
    int64_t dim(size_t i) const { return shape.at(i); }
};

inline TensorArg tensor_arg(const pybind11::tuple& t, const char* name, std::initializer_list<int> dtypes,
                            size_t ndim) {
    if (t.size() != 4) throw pybind11::value_error(std::string(name) + ": expected (ptr, dtype, shape, strides)");
    TensorArg a;
    a.data = reinterpret_cast<void*>(t[0].cast<uintptr_t>());
    a.dtype = t[1].cast<int>();
    a.shape = t[2].cast<std::vector<int64_t>>();
    auto strides = t[3].cast<std::vector<int64_t>>();
    bool ok = false;
    for (int d : dtypes) ok = ok || d == a.dtype;
    if (!ok) throw pybind11::value_error(std::string(name) + ": unsupported dtype code " + std::to_string(a.dtype));
    if (a.shape.size() != ndim || strides.size() != ndim)
        throw pybind11::value_error(std::string(name) + ": expected " + std::to_string(ndim) + " dimensions");
    int64_t expect = 1;
    for (size_t i = ndim; i-- > 0;) {
        if (a.shape[i] < 0) throw pybind11::value_error(std::string(name) + ": negative size");
        if (a.shape[i] != 1 && strides[i] != expect)
            throw pybind11::value_error(std::string(name) + ": must be contiguous");
        expect *= a.shape[i];
    }
    if (a.data == nullptr && a.numel() > 0) throw pybind11::value_error(std::string(name) + ": null data");
    return a;
}

inline void expect_dim(const TensorArg& a, size_t i, int64_t want, const char* name) {
    if (a.dim(i) != want)
        throw pybind11::value_error(std::string(name) + ": dimension " + std::to_string(i) + " is " +
                                    std::to_string(a.dim(i)) + ", expected " + std::to_string(want));
}

}  // namespace sdcp
