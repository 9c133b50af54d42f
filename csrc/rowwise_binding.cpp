// pybind11 layer of the row-invariant float kernels. Called several times per layer per pass, so
// it takes addresses and sizes as plain integers: sdcp_fast/kernels/rowwise.py checks dtypes,
// shapes and contiguity before it calls.
#include <pybind11/pybind11.h>

#include "rowwise_kernels.h"

namespace py = pybind11;

namespace {

template <typename T>
T* ptr(uintptr_t p) {
    return reinterpret_cast<T*>(p);
}

void add_rms_norm(uintptr_t x, uintptr_t delta, uintptr_t w, int64_t rows, int64_t dim, float eps, bool unit_offset,
                  uintptr_t out) {
    if (rows < 0 || dim <= 0) throw py::value_error("bad size");
    sdcp::add_rms_norm(ptr<float>(x), ptr<const float>(delta), ptr<const float>(w), rows, dim, eps, unit_offset,
                       ptr<float>(out));
}

void rope_table(uintptr_t positions, uintptr_t inv_freq, int64_t rows, int64_t half, uintptr_t cos_out,
                uintptr_t sin_out) {
    sdcp::rope_table(ptr<const int64_t>(positions), ptr<const float>(inv_freq), rows, half, ptr<float>(cos_out),
                     ptr<float>(sin_out));
}

void rope_append(uintptr_t q, int64_t q_stride, uintptr_t k, int64_t k_stride, uintptr_t v, int64_t v_stride,
                 int64_t rows, int64_t hq, int64_t hkv, int64_t d, uintptr_t cos, uintptr_t sin, uintptr_t slots,
                 uintptr_t q_out, uintptr_t k_cache, uintptr_t v_cache) {
    if (d % 2 != 0) throw py::value_error("head dim must be even");
    sdcp::rope_append(ptr<const float>(q), q_stride, ptr<const float>(k), k_stride, ptr<const float>(v), v_stride,
                      rows, hq, hkv, d, ptr<const float>(cos), ptr<const float>(sin), ptr<const int64_t>(slots),
                      ptr<float>(q_out), ptr<float>(k_cache), ptr<float>(v_cache));
}

void attention(uintptr_t q, uintptr_t k_cache, uintptr_t v_cache, int64_t block_size, int64_t hq, int64_t hkv,
               int64_t d, uintptr_t table, int64_t table_width, uintptr_t row_seq, uintptr_t row_pos, int64_t rows,
               float scale, int64_t window, float softcap, uintptr_t out, int threads) {
    if (hkv <= 0 || hq % hkv != 0) throw py::value_error("query heads must be a multiple of KV heads");
    py::gil_scoped_release nogil;
    sdcp::paged_attention_rows(ptr<const float>(q), ptr<const float>(k_cache), ptr<const float>(v_cache), block_size,
                               hq, hkv, d, ptr<const int32_t>(table), table_width, ptr<const int32_t>(row_seq),
                               ptr<const int64_t>(row_pos), rows, scale, window, softcap, ptr<float>(out), threads);
}

void gated_act(uintptr_t gate, int64_t gate_stride, uintptr_t up, int64_t up_stride, int64_t rows, int64_t f,
               int act, uintptr_t out) {
    if (act != 0 && act != 1) throw py::value_error("act must be 0 (SiLU) or 1 (GELU tanh)");
    sdcp::gated_act(ptr<const float>(gate), gate_stride, ptr<const float>(up), up_stride, rows, f, act,
                    ptr<float>(out));
}

void linear_f32(uintptr_t x, int64_t rows, int64_t k, uintptr_t w, int64_t n_out, uintptr_t bias, uintptr_t out,
                int threads) {
    py::gil_scoped_release nogil;
    sdcp::linear_f32(ptr<const float>(x), rows, k, ptr<const float>(w), n_out, ptr<const float>(bias),
                     ptr<float>(out), threads);
}

}  // namespace

void register_rowwise(py::module_& m) {
    m.def("rw_add_rms_norm", &add_rms_norm);
    m.def("rw_rope_table", &rope_table);
    m.def("rw_rope_append", &rope_append);
    m.def("rw_attention", &attention);
    m.def("rw_gated_act", &gated_act);
    m.def("rw_linear_f32", &linear_f32);
    m.def("rowwise_isa", &sdcp::rowwise_isa);
}
