// Placeholder: filled in by the component that owns it.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void register_sampling(py::module_& m) { (void)m; }
