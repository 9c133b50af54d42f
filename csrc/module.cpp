// The one pybind11 module, sdcp_fast._C. Each area registers its functions from its
// own translation unit so that files stay owned by one component.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void register_sampling(py::module_& m);   // csrc/sampling_binding.cpp (kernels: rules 1/2, profile)
void register_paged_kv(py::module_& m);   // csrc/paged_kv_binding.cpp (kernels: paged KV read/write)
void register_host_memory(py::module_& m);  // csrc/host_memory_binding.cpp (MLC: page-locked buffers)
void register_quant(py::module_& m);  // csrc/quant_binding.cpp (kernels: quantized-weight matmul)
void register_rowwise(py::module_& m);  // csrc/rowwise_binding.cpp (kernels: row-invariant float ops)

PYBIND11_MODULE(_C, m) {
    m.doc() = "sdcp_fast native CPU backend (no torch headers; raw buffers in, raw buffers out)";
    m.attr("ABI_VERSION") = 1;
    register_sampling(m);
    register_paged_kv(m);
    register_host_memory(m);
    register_quant(m);
    register_rowwise(m);
}
