// What the native I/O server and client share: header fields as sent, a monotonic clock in
// milliseconds, OpenSSL's queued errors as text, and the eventfd signal between threads.
#pragma once

#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nio {

using Fields = std::vector<std::pair<std::string, std::string>>;

inline int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline std::string ssl_errors() {
  std::string out;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

inline void signal_fd(int fd) {
  uint64_t one = 1;
  if (fd >= 0) (void)!write(fd, &one, sizeof one);
}

// Any bytes-like object's bytes (responses and bodies may be memoryviews of a cache's tiers).
inline void copy_bytes(pybind11::handle obj, std::string& out) {
  if (PyBytes_Check(obj.ptr())) {
    out.assign(PyBytes_AS_STRING(obj.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(obj.ptr())));
    return;
  }
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) throw pybind11::error_already_set();
  out.assign(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
}

// Header bytes as Python text, one code point per byte (as HTTP/2 field octets are read).
inline pybind11::str latin1(const std::string& s) {
  return pybind11::reinterpret_steal<pybind11::str>(PyUnicode_DecodeLatin1(s.data(), s.size(), nullptr));
}

// nghttp2's DATA frames as large as both windows and the peer's frame size allow.
inline ssize_t read_length(nghttp2_session*, uint8_t, int32_t, int32_t session_window, int32_t stream_window,
                           uint32_t remote_max_frame, void*) {
  return std::min<ssize_t>({session_window, stream_window, static_cast<ssize_t>(remote_max_frame)});
}

void register_client(pybind11::module_& m);  // client.cpp

}  // namespace nio
