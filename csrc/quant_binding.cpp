// pybind11 layer of the quantized-weight kernels. Called once per linear layer per pass, so
// it takes addresses and sizes as plain integers (no per-call tuples): the Python launcher in
// sdcp_fast/kernels/quant.py checks dtypes, shapes and contiguity before it calls.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "quant_kernels.h"

namespace py = pybind11;

namespace {

sdcp::QuantKind kind_of(int code) {
    if (code < 0 || code > 2) throw py::value_error("quant kind must be 0 (Q8_0), 1 (Q4_0) or 2 (Q4_1)");
    return static_cast<sdcp::QuantKind>(code);
}

void quant_matmul(int kind, uintptr_t w, int64_t n_out, int64_t k, uintptr_t x, int64_t rows, uintptr_t out,
                  int threads) {
    const sdcp::QuantKind q = kind_of(kind);
    if (k % sdcp::kQuantBlock != 0) throw py::value_error("k must be a multiple of 32");
    if (n_out < 0 || rows < 0) throw py::value_error("negative size");
    if ((n_out * k * rows) != 0 && (w == 0 || x == 0 || out == 0)) throw py::value_error("null buffer");
    py::gil_scoped_release nogil;
    sdcp::quant_matmul(q, reinterpret_cast<const uint8_t*>(w), n_out, k, reinterpret_cast<const float*>(x), rows,
                       reinterpret_cast<float*>(out), threads);
}

void quantize_activations(uintptr_t x, int64_t rows, int64_t k, uintptr_t q, uintptr_t d, uintptr_t s) {
    if (k % sdcp::kQuantBlock != 0) throw py::value_error("k must be a multiple of 32");
    py::gil_scoped_release nogil;
    sdcp::quantize_activations(reinterpret_cast<const float*>(x), rows, k, reinterpret_cast<int8_t*>(q),
                               reinterpret_cast<float*>(d), reinterpret_cast<float*>(s));
}

}  // namespace

void register_quant(py::module_& m) {
    m.def("quant_matmul", &quant_matmul, "out[rows, n] = x[rows, k] @ dequant(w)[n, k]^T, w packed (quant_kernels.h; raw addresses)",
          py::arg("kind"), py::arg("w"), py::arg("n_out"), py::arg("k"), py::arg("x"), py::arg("rows"),
          py::arg("out"), py::arg("threads"));
    m.def("quantize_activations", &quantize_activations, "int8 blocks of x: q, d, d * sum(q)");
    m.def("quant_isas", &sdcp::quant_isas);
    m.def("quant_isa", &sdcp::quant_isa);
    m.def("set_quant_isa", &sdcp::set_quant_isa);
    m.def("quant_block_bytes", [](int kind) { return sdcp::quant_block_bytes(kind_of(kind)); });
}
