// MLC host tier: page-locked buffers exposed through the buffer protocol, so Python
// wraps them in memoryviews (and torch.frombuffer) without copying.
#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>

#include "host_memory.h"

namespace py = pybind11;

namespace {

class HostBuffer {
  public:
    explicit HostBuffer(std::size_t size) : a_(sdcp::host_alloc(size)) {}
    ~HostBuffer() { sdcp::host_free(a_); }
    HostBuffer(const HostBuffer&) = delete;
    HostBuffer& operator=(const HostBuffer&) = delete;

    std::size_t size() const { return a_.size; }
    bool locked() const { return a_.locked; }
    char* data() const { return static_cast<char*>(a_.ptr); }

  private:
    sdcp::HostAllocation a_;
};

py::buffer_info contiguous_bytes(const py::buffer& b, bool writable) {
    py::buffer_info info = b.request(writable);
    if (info.ndim > 1) {
        // C-contiguity is required: a strided view would need a gather, not a copy.
        py::ssize_t expect = info.itemsize;
        for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
            if (info.strides[i] != expect) throw std::invalid_argument("buffer is not C-contiguous");
            expect *= info.shape[i];
        }
    } else if (info.ndim == 1 && info.strides[0] != info.itemsize) {
        throw std::invalid_argument("buffer is not contiguous");
    }
    return info;
}

void copy_into(const py::buffer& dst, const py::buffer& src, py::ssize_t offset) {
    py::buffer_info d = contiguous_bytes(dst, true);
    py::buffer_info s = contiguous_bytes(src, false);
    const py::ssize_t dn = d.size * d.itemsize;
    const py::ssize_t sn = s.size * s.itemsize;
    if (offset < 0 || offset + sn > dn) throw std::out_of_range("source does not fit at that offset");
    char* dp = static_cast<char*>(d.ptr) + offset;
    py::gil_scoped_release nogil;
    sdcp::host_copy(dp, s.ptr, static_cast<std::size_t>(sn));
}

}  // namespace

void register_host_memory(py::module_& m) {
    py::class_<HostBuffer, std::shared_ptr<HostBuffer>>(m, "HostBuffer", py::buffer_protocol(),
                                                        "Page-aligned host buffer, mlock'ed when allowed.")
        .def(py::init<std::size_t>(), py::arg("size"))
        .def_property_readonly("size", &HostBuffer::size)
        .def_property_readonly("locked", &HostBuffer::locked, "True when the pages are locked in RAM")
        .def("__len__", &HostBuffer::size)
        .def_buffer([](HostBuffer& b) -> py::buffer_info {
            return py::buffer_info(b.data(), 1, py::format_descriptor<unsigned char>::format(), 1,
                                   {static_cast<py::ssize_t>(b.size())}, {1});
        });
    m.def("host_copy", &copy_into, py::arg("dst"), py::arg("src"), py::arg("offset") = 0,
          "Copy the bytes of src into dst at offset with the GIL released.");
}
