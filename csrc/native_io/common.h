// What the native I/O server and client share: header fields as sent, a monotonic clock in
// milliseconds, OpenSSL's queued errors as text, and the eventfd signal between threads.
#pragma once

#include <openssl/err.h>
#include <pybind11/pybind11.h>
#include <unistd.h>

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

void register_client(pybind11::module_& m);  // client.cpp

}  // namespace nio
