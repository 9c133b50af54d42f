// pybind11 layer of the paged KV copies: checks dtypes, shapes, contiguity and every index
// against the cache bounds (an out-of-range slot would corrupt memory), then copies without the GIL.
#include <pybind11/pybind11.h>

#include <string>

#include "paged_kv_kernels.h"
#include "sampling_args.h"

namespace py = pybind11;
using sdcp::expect_dim;
using sdcp::tensor_arg;
using sdcp::TensorArg;

namespace {

int64_t element_bytes(int dtype) { return dtype == sdcp::kF32 ? 4 : 2; }

void write_kv(py::tuple cache, py::tuple values, py::tuple slots) {
    TensorArg c = tensor_arg(cache, "cache", {sdcp::kF32, sdcp::kBF16, sdcp::kF16}, 4);
    TensorArg v = tensor_arg(values, "values", {c.dtype}, 3);
    TensorArg s = tensor_arg(slots, "slot_mapping", {sdcp::kI64}, 1);
    expect_dim(v, 1, c.dim(2), "values");
    expect_dim(v, 2, c.dim(3), "values");
    expect_dim(s, 0, v.dim(0), "slot_mapping");
    const int64_t* sl = static_cast<const int64_t*>(s.data);
    int64_t capacity = c.dim(0) * c.dim(1);
    for (int64_t t = 0; t < s.dim(0); ++t)
        if (sl[t] >= capacity) throw py::value_error("slot_mapping: slot " + std::to_string(sl[t]) + " >= " +
                                                     std::to_string(capacity));
    int64_t row = c.dim(2) * c.dim(3) * element_bytes(c.dtype);
    py::gil_scoped_release nogil;
    sdcp::paged_kv_write(static_cast<char*>(c.data), static_cast<const char*>(v.data), sl, v.dim(0), row);
}

void gather_kv(py::tuple cache, py::tuple block_table, py::tuple seq_lens, py::tuple out) {
    TensorArg c = tensor_arg(cache, "cache", {sdcp::kF32, sdcp::kBF16, sdcp::kF16}, 4);
    TensorArg bt = tensor_arg(block_table, "block_table", {sdcp::kI32}, 2);
    TensorArg sl = tensor_arg(seq_lens, "seq_lens", {sdcp::kI32}, 1);
    TensorArg o = tensor_arg(out, "out", {c.dtype}, 3);
    int64_t batch = bt.dim(0), max_blocks = bt.dim(1), block_size = c.dim(1);
    expect_dim(sl, 0, batch, "seq_lens");
    const int32_t* lens = static_cast<const int32_t*>(sl.data);
    const int32_t* table = static_cast<const int32_t*>(bt.data);
    int64_t total = 0;
    for (int64_t b = 0; b < batch; ++b) {
        if (lens[b] < 0 || lens[b] > max_blocks * block_size) throw py::value_error("seq_lens: out of range");
        for (int64_t k = 0; k * block_size < lens[b]; ++k) {
            int32_t blk = table[b * max_blocks + k];
            if (blk < 0 || blk >= c.dim(0)) throw py::value_error("block_table: block " + std::to_string(blk) +
                                                                  " outside the cache");
        }
        total += lens[b];
    }
    expect_dim(o, 0, total, "out");
    expect_dim(o, 1, c.dim(2), "out");
    expect_dim(o, 2, c.dim(3), "out");
    int64_t row = c.dim(2) * c.dim(3) * element_bytes(c.dtype);
    py::gil_scoped_release nogil;
    sdcp::paged_kv_gather(static_cast<const char*>(c.data), table, batch, max_blocks, lens, block_size, row,
                          static_cast<char*>(o.data));
}

}  // namespace

void register_paged_kv(py::module_& m) {
    m.def("paged_kv_write", &write_kv, "scatter [T, H, D] rows into cache slots (negative slot: skip)");
    m.def("paged_kv_gather", &gather_kv, "read each session's positions through its block table");
}
