// sdcp_fast._nio: an HTTP/2 server whose sockets, TLS 1.3 (client certificates required) and
// framing (nghttp2) live in one C++ thread; Python only sees whole requests and hands back
// whole responses (sdcp_fast/transport/nativeserver.py is the asyncio side).
//
// The thread owns every connection: it accepts, runs the handshake, decrypts, feeds nghttp2,
// buffers request bodies under the bounds, and queues a request for Python once its stream
// ends. One eventfd (registered with the asyncio loop) tells Python that requests are waiting;
// take() hands all of them over at once. Python's commands (responses, streamed chunks,
// resets, close) go the other way through one queue and a second eventfd that wakes the
// thread, which frames and encrypts them without the GIL.
//
// The limits and their answers are those of the pure-Python server (h2server.py): streams past
// SETTINGS_MAX_CONCURRENT_STREAMS are refused alone (REFUSED_STREAM), a body over max_body is
// refused (413), bodies held per connection and per server are bounded (503), a body not
// complete within request_timeout is refused (408), a header block over max_header_list ends
// the connection, an idle connection is closed with GOAWAY, and close() sends GOAWAY and lets
// the open streams finish. The problem documents of these answers are written by Python
// (take() reports them as refusals), so both paths answer the same bytes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"

namespace py = pybind11;

namespace {

using nio::Fields;
using nio::copy_bytes;
using nio::latin1;
using nio::now_ms;
using nio::read_length;
using nio::ssl_errors;

struct Limits {
  int64_t max_body, max_header_list, max_streams, max_buffered, max_buffered_total;
  int64_t stream_window, connection_window, max_frame;
  int64_t idle_ms, request_ms, handshake_ms;
};

// What the thread hands to Python.
enum Refusal : int { BODY_TOO_LARGE = 0, CONNECTION_FULL = 1, SERVER_FULL = 2, TOO_SLOW = 3 };
enum EventKind : int { REFUSED = 0, GONE = 1, DRAINED = 2 };

struct Incoming {  // a request whose stream ended: (conn, stream, method, path, fields, body, peer)
  uint64_t conn;
  int32_t sid;
  std::string method, path;
  Fields fields;
  std::string body;
  std::shared_ptr<const std::vector<std::string>> peer;
};

struct Event {  // (kind, conn, stream, code)
  int kind;
  uint64_t conn;
  int32_t sid;
  int code;
};

// What Python hands to the thread.
enum Op : int { RESPOND = 0, START = 1, CHUNK = 2, END = 3, RESET = 4, NOTIFY_DRAINED = 5 };

struct Command {
  int op;
  uint64_t conn;
  int32_t sid;
  Fields fields;
  std::string data;
  uint32_t code = 0;
};

struct Stream {
  Fields fields;
  std::string method, path;
  size_t header_bytes = 0;
  std::string body;
  int64_t size = 0;
  int64_t deadline = 0;  // request_timeout of a body still arriving (0: none)
  bool answered = false;    // handed to Python, or refused
  bool stop_reading = false;  // answered before its request ended: RST_STREAM(NO_ERROR) after the answer
  bool streaming = false;   // a streamed response: Python is told when the stream goes
  bool responded = false;
  bool want_drained = false;
  std::string out;
  size_t out_offset = 0;
  bool out_end = false;
};

struct Server;

struct Conn {
  uint64_t id;
  int fd;
  Server* server;
  SSL* ssl = nullptr;
  nghttp2_session* h2 = nullptr;
  bool handshaking = false;
  std::string pending;  // plaintext framed, not yet written
  size_t pending_offset = 0;
  bool want_out = false;  // EPOLLOUT registered
  std::unordered_map<int32_t, Stream> streams;
  int64_t buffered = 0;
  int64_t opened_ms = 0, last_active_ms = 0;
  bool draining = false;    // our GOAWAY went out: new streams are refused
  bool final_sent = false;  // the last GOAWAY: close once written
  bool dead = false;
  std::shared_ptr<const std::vector<std::string>> peer;
};

// The URI SANs of a verified client certificate (peer.py turns them into a Peer).
std::vector<std::string> uri_sans(X509* cert) {
  std::vector<std::string> out;
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return out;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    out.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                     static_cast<size_t>(ASN1_STRING_length(uri)));
  }
  GENERAL_NAMES_free(names);
  return out;
}

int select_h2(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned int inlen,
              void*) {
  for (unsigned int i = 0; i < inlen; i += 1u + in[i]) {
    if (in[i] == 2 && i + 3 <= inlen && std::memcmp(in + i + 1, "h2", 2) == 0) {
      *out = in + i + 1;
      *outlen = 2;
      return SSL_TLSEXT_ERR_OK;
    }
  }
  return SSL_TLSEXT_ERR_ALERT_FATAL;  // h2 only, as the Python context's ALPN list
}

struct Server {
  Limits limits;
  SSL_CTX* ctx = nullptr;
  int listen_fd = -1, epoll_fd = -1, wake_fd = -1, ready_fd = -1;
  int port = 0;
  std::thread thread;
  std::atomic<bool> stopping{false}, closing{false};
  std::atomic<uint64_t> accepted{0};
  std::atomic<int64_t> connection_count{0};
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  int64_t buffered_total = 0;
  int64_t next_sweep = 0;
  bool close_seen = false;

  std::mutex mu;  // guards the two queues and the flags beside them
  std::vector<Incoming> inbox;
  std::vector<Event> events;
  bool ready_signalled = false;
  std::vector<Command> outbox;
  bool wake_signalled = false;

  Server(const std::string& host, int port_, py::object cert, py::object key, py::object ca, Limits limits_)
      : limits(limits_) {
    if (!cert.is_none()) {
      ctx = SSL_CTX_new(TLS_server_method());
      if (ctx == nullptr) throw std::runtime_error("SSL_CTX_new: " + ssl_errors());
      SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
      SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
      SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: every connection proves its certificate
      std::string c = cert.cast<std::string>(), k = key.cast<std::string>(), a = ca.cast<std::string>();
      if (SSL_CTX_use_certificate_chain_file(ctx, c.c_str()) != 1 ||
          SSL_CTX_use_PrivateKey_file(ctx, k.c_str(), SSL_FILETYPE_PEM) != 1 ||
          SSL_CTX_load_verify_locations(ctx, a.c_str(), nullptr) != 1) {
        std::string why = ssl_errors();
        SSL_CTX_free(ctx);
        throw std::runtime_error("TLS configuration: " + why);
      }
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      SSL_CTX_set_alpn_select_cb(ctx, select_h2, nullptr);
    }
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    std::string service = std::to_string(port_);
    if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || res == nullptr)
      throw std::runtime_error("cannot resolve " + host);
    listen_fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (listen_fd < 0 || bind(listen_fd, res->ai_addr, res->ai_addrlen) != 0 || listen(listen_fd, 1024) != 0) {
      std::string why = std::strerror(errno);
      freeaddrinfo(res);
      if (listen_fd >= 0) close(listen_fd);
      if (ctx) SSL_CTX_free(ctx);
      throw std::runtime_error("cannot listen on " + host + ":" + service + ": " + why);
    }
    freeaddrinfo(res);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
    port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ready_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    watch(listen_fd, EPOLLIN, 0);
    watch(wake_fd, EPOLLIN, 1);
    thread = std::thread([this] { run(); });
  }

  ~Server() {
    stop();
    if (ctx) SSL_CTX_free(ctx);
  }

  // -- the Python side (GIL held, except where released) --------------------------------
  void stop() {
    if (!thread.joinable()) return;
    stopping = true;
    signal_fd(wake_fd);
    {
      py::gil_scoped_release release;
      thread.join();
    }
    for (int fd : {listen_fd, epoll_fd, wake_fd, ready_fd})
      if (fd >= 0) close(fd);
    listen_fd = epoll_fd = wake_fd = ready_fd = -1;
  }

  void begin_close() {
    closing = true;
    signal_fd(wake_fd);
  }

  // Everything waiting: ([(conn, stream, method, path, {name: value}, body, peer URIs)], [(kind, conn, stream, code)]).
  py::tuple take() {
    std::vector<Incoming> got;
    std::vector<Event> evs;
    {
      std::lock_guard<std::mutex> lock(mu);
      got.swap(inbox);
      evs.swap(events);
      ready_signalled = false;
      uint64_t n;
      if (ready_fd >= 0) (void)!read(ready_fd, &n, sizeof n);
    }
    py::list requests(got.size());
    std::unordered_map<const void*, py::tuple> peers;  // one tuple per connection
    for (size_t i = 0; i < got.size(); ++i) {
      Incoming& in = got[i];
      py::dict fields;
      for (auto& [name, value] : in.fields) {
        py::str k = latin1(name), v = latin1(value);
        if (fields.contains(k)) {
          fields[k] = py::str(py::str("{}, {}").format(fields[k], v));
        } else {
          fields[k] = v;
        }
      }
      py::object peer = py::none();
      if (in.peer) {
        auto it = peers.find(in.peer.get());
        if (it == peers.end()) {
          py::tuple uris(in.peer->size());
          for (size_t j = 0; j < in.peer->size(); ++j) uris[j] = py::str((*in.peer)[j]);
          it = peers.emplace(in.peer.get(), uris).first;
        }
        peer = it->second;
      }
      requests[i] = py::make_tuple(
          in.conn, in.sid, latin1(in.method), latin1(in.path), fields,
          py::bytes(in.body), peer);
    }
    py::list out_events(evs.size());
    for (size_t i = 0; i < evs.size(); ++i)
      out_events[i] = py::make_tuple(evs[i].kind, evs[i].conn, evs[i].sid, evs[i].code);
    return py::make_tuple(requests, out_events);
  }

  // One call per batch: [(op, conn, stream, fields, data, code)]; data is any bytes-like object
  // (the MLC answers with memoryviews of its tiers). A command that cannot be read resets its
  // stream (INTERNAL_ERROR) instead of being dropped, and the others of the batch still go:
  // one bad answer must not leave a whole batch of clients waiting for their timeouts. The
  // first such error is raised once the batch is queued.
  void submit(const py::list& batch) {
    std::vector<Command> cmds;
    cmds.reserve(batch.size());
    std::string failure;
    for (const py::handle& item : batch) {
      Command c;
      try {
        auto t = item.cast<py::tuple>();
        c.op = t[0].cast<int>();
        c.conn = t[1].cast<uint64_t>();
        c.sid = t[2].cast<int32_t>();
        try {
          if (!t[3].is_none()) c.fields = t[3].cast<Fields>();
          if (!t[4].is_none()) copy_bytes(t[4], c.data);
          c.code = t[5].cast<uint32_t>();
        } catch (const std::exception& e) {
          if (failure.empty()) failure = std::string("stream ") + std::to_string(c.sid) + " reset: " + e.what();
          c = Command{RESET, c.conn, c.sid, {}, {}, NGHTTP2_INTERNAL_ERROR};
        }
      } catch (const std::exception& e) {  // no stream to name: nothing to reset
        if (failure.empty()) failure = std::string("command dropped: ") + e.what();
        continue;
      }
      cmds.push_back(std::move(c));
    }
    bool signal = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& c : cmds) outbox.push_back(std::move(c));
      if (!wake_signalled) {
        wake_signalled = true;
        signal = true;
      }
    }
    if (signal) signal_fd(wake_fd);
    if (!failure.empty()) throw py::type_error(failure);
  }


  // -- the thread -------------------------------------------------------------------------
  static void signal_fd(int fd) { nio::signal_fd(fd); }

  void watch(int fd, uint32_t events_, uint64_t key, int op = EPOLL_CTL_ADD) {
    epoll_event ev{};
    ev.events = events_;
    ev.data.u64 = key;  // 0: the listening socket, 1: the wake fd, else a connection's id + 1
    epoll_ctl(epoll_fd, op, fd, &ev);
  }

  void post_event(int kind, uint64_t conn, int32_t sid, int code) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back({kind, conn, sid, code});
  }

  void run() {
    epoll_event evs[128];
    while (!stopping) {
      int64_t t = now_ms();
      int timeout = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(next_sweep - t, 100)));
      int n = epoll_wait(epoll_fd, evs, 128, conns.empty() ? 200 : timeout);
      for (int i = 0; i < n; ++i) {
        uint64_t key = evs[i].data.u64;
        if (key == 0) {
          accept_all();
        } else if (key == 1) {
          uint64_t v;
          (void)!read(wake_fd, &v, sizeof v);
        } else {
          auto it = conns.find(key - 1);
          if (it == conns.end()) continue;
          Conn* c = it->second.get();
          if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) readable(c);
          if (!c->dead && (evs[i].events & EPOLLOUT)) write_out(c);
        }
      }
      run_commands();
      if (closing && !close_seen) {
        close_seen = true;
        if (listen_fd >= 0) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
        for (auto& [id, c] : conns) goaway(c.get());
      }
      t = now_ms();
      if (t >= next_sweep) {
        sweep(t);
        next_sweep = t + 25;
      }
      reap();
      notify_python();
    }
    for (auto& [id, c] : conns) drop(c.get());
    conns.clear();
    connection_count = 0;
  }

  void notify_python() {
    bool signal = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if ((!inbox.empty() || !events.empty()) && !ready_signalled) {
        ready_signalled = true;
        signal = true;
      }
    }
    if (signal) signal_fd(ready_fd);
  }

  void accept_all() {
    for (;;) {
      int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (closing) {
        close(fd);
        continue;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Conn>();
      c->id = next_id++;
      c->fd = fd;
      c->server = this;
      c->opened_ms = c->last_active_ms = now_ms();
      watch(fd, EPOLLIN, c->id + 1);
      Conn* raw = c.get();
      conns.emplace(c->id, std::move(c));
      connection_count = static_cast<int64_t>(conns.size());
      if (ctx != nullptr) {
        raw->ssl = SSL_new(ctx);
        SSL_set_fd(raw->ssl, fd);
        SSL_set_accept_state(raw->ssl);
        raw->handshaking = true;
        handshake(raw);
      } else {
        start_h2(raw);
      }
    }
  }

  void handshake(Conn* c) {
    ERR_clear_error();
    int rv = SSL_do_handshake(c->ssl);
    if (rv != 1) {
      int err = SSL_get_error(c->ssl, rv);
      if (err == SSL_ERROR_WANT_READ) return;
      if (err == SSL_ERROR_WANT_WRITE) {
        want_write(c, true);
        return;
      }
      kill(c);  // a failed handshake (no trusted client certificate): never served
      return;
    }
    c->handshaking = false;
    const unsigned char* alpn = nullptr;
    unsigned int alpn_len = 0;
    SSL_get0_alpn_selected(c->ssl, &alpn, &alpn_len);
    X509* cert = SSL_get1_peer_certificate(c->ssl);
    if (alpn_len != 2 || std::memcmp(alpn, "h2", 2) != 0 || cert == nullptr ||
        SSL_get_verify_result(c->ssl) != X509_V_OK) {
      if (cert) X509_free(cert);
      kill(c);
      return;
    }
    c->peer = std::make_shared<const std::vector<std::string>>(uri_sans(cert));
    X509_free(cert);
    start_h2(c);
    if (!c->dead) readable(c);  // the client's preface may have come with its Finished
  }

  void start_h2(Conn* c) {
    nghttp2_session_callbacks* cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_session_callbacks_set_data_source_read_length_callback(cb, read_length);
    nghttp2_option* opt;
    nghttp2_option_new(&opt);
    nghttp2_option_set_no_closed_streams(opt, 1);
    nghttp2_session_server_new2(&c->h2, cb, c, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    accepted++;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<uint32_t>(limits.max_header_list)},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(limits.stream_window)},
        {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, static_cast<uint32_t>(limits.max_frame)},
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
    };
    nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, 4);
    frame_out(c);
    advertise_max_streams(c);
    int64_t extra = limits.connection_window - 65535;
    if (extra > 0) nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0,
                                                         static_cast<int32_t>(limits.connection_window));
    if (closing) goaway(c);
    write_out(c);
  }

  // SETTINGS_MAX_CONCURRENT_STREAMS is advertised but kept from nghttp2, which would end the
  // whole connection for a stream past it where RFC 9113 §5.1.2 makes that a stream error:
  // the entry is added to the SETTINGS frame nghttp2 wrote, and on_begin_headers refuses the
  // streams past it (as csrc/nghttp2/h2_session.cpp does).
  void advertise_max_streams(Conn* c) {
    std::string& out = c->pending;
    size_t pos = c->pending_offset;
    if (out.size() < pos + 9 || out[pos + 3] != NGHTTP2_SETTINGS) return;
    auto* hd = reinterpret_cast<uint8_t*>(&out[pos]);
    size_t length = (size_t(hd[0]) << 16) | (size_t(hd[1]) << 8) | hd[2];
    size_t end = pos + 9 + length;
    length += 6;
    hd[0] = uint8_t(length >> 16), hd[1] = uint8_t(length >> 8), hd[2] = uint8_t(length);
    uint32_t v = static_cast<uint32_t>(limits.max_streams);
    uint8_t entry[6] = {0, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, uint8_t(v >> 24), uint8_t(v >> 16),
                        uint8_t(v >> 8), uint8_t(v)};
    out.insert(end, reinterpret_cast<const char*>(entry), 6);
  }

  void readable(Conn* c) {
    if (c->dead) return;
    if (c->handshaking) {
      handshake(c);
      return;
    }
    char buf[65536];
    for (;;) {
      ssize_t n;
      if (c->ssl) {
        ERR_clear_error();
        int rv = SSL_read(c->ssl, buf, sizeof buf);
        if (rv <= 0) {
          int err = SSL_get_error(c->ssl, rv);
          if (err == SSL_ERROR_WANT_READ) break;
          if (err == SSL_ERROR_WANT_WRITE) {
            want_write(c, true);
            break;
          }
          kill(c);
          return;
        }
        n = rv;
      } else {
        n = ::read(c->fd, buf, sizeof buf);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) {
          kill(c);
          return;
        }
      }
      ssize_t rv = nghttp2_session_mem_recv(c->h2, reinterpret_cast<uint8_t*>(buf), static_cast<size_t>(n));
      if (rv < 0) {
        // nghttp2 queued the GOAWAY that says why: send it and end the connection.
        c->final_sent = true;
        break;
      }
      if (c->dead) return;
      if (c->ssl == nullptr && static_cast<size_t>(n) < sizeof buf) break;
    }
    write_out(c);
  }

  void frame_out(Conn* c) {
    for (;;) {
      const uint8_t* data;
      ssize_t n = nghttp2_session_mem_send(c->h2, &data);
      if (n <= 0) break;
      c->pending.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
  }

  void write_out(Conn* c) {
    if (c->dead || c->handshaking) {
      if (c->handshaking && !c->dead) handshake(c);
      return;
    }
    if (c->h2) frame_out(c);
    while (c->pending_offset < c->pending.size()) {
      const char* p = c->pending.data() + c->pending_offset;
      size_t left = c->pending.size() - c->pending_offset;
      ssize_t n;
      if (c->ssl) {
        ERR_clear_error();
        int rv = SSL_write(c->ssl, p, static_cast<int>(std::min<size_t>(left, 1 << 30)));
        if (rv <= 0) {
          int err = SSL_get_error(c->ssl, rv);
          if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ) {
            want_write(c, true);
            return;
          }
          kill(c);
          return;
        }
        n = rv;
      } else {
        n = ::send(c->fd, p, left, MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) {
            want_write(c, true);
            return;
          }
          kill(c);
          return;
        }
      }
      c->pending_offset += static_cast<size_t>(n);
      if (c->h2 && c->pending_offset == c->pending.size()) {
        c->pending.clear();
        c->pending_offset = 0;
        frame_out(c);  // DATA deferred by the windows may be ready now
      }
    }
    c->pending.clear();
    c->pending_offset = 0;
    want_write(c, false);
    if (c->final_sent || (c->h2 && !nghttp2_session_want_read(c->h2) && !nghttp2_session_want_write(c->h2))) {
      if (c->ssl) SSL_shutdown(c->ssl);
      kill(c);
    }
  }

  void want_write(Conn* c, bool on) {
    if (c->want_out == on) return;
    c->want_out = on;
    watch(c->fd, EPOLLIN | (on ? EPOLLOUT : 0), c->id + 1, EPOLL_CTL_MOD);
  }

  // Graceful close: GOAWAY now (the streams in flight finish), the last one when they are done.
  void goaway(Conn* c) {
    if (c->dead || c->draining) return;
    if (c->h2 == nullptr) {  // still in its handshake: nothing was served on it
      kill(c);
      return;
    }
    c->draining = true;
    nghttp2_submit_goaway(c->h2, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(c->h2),
                          NGHTTP2_NO_ERROR, nullptr, 0);
    if (c->streams.empty()) final_close(c);
    write_out(c);
  }

  void final_close(Conn* c) {
    if (c->final_sent) return;
    nghttp2_session_terminate_session(c->h2, NGHTTP2_NO_ERROR);
    c->final_sent = true;
  }

  void kill(Conn* c) {
    if (c->dead) return;
    c->dead = true;
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
  }

  void drop(Conn* c) {  // free a connection (dead, or the server stops)
    for (auto& [sid, s] : c->streams) {
      if (!s.answered) release(c, s);
      if (s.streaming && !s.responded) post_event(GONE, c->id, sid, 0);
    }
    c->streams.clear();
    if (c->h2) nghttp2_session_del(c->h2);
    if (c->ssl) SSL_free(c->ssl);
    close(c->fd);
  }

  void reap() {
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->second->dead) {
        drop(it->second.get());
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
    connection_count = static_cast<int64_t>(conns.size());
  }

  void sweep(int64_t t) {
    for (auto& [id, cp] : conns) {
      Conn* c = cp.get();
      if (c->dead) continue;
      if (c->handshaking) {
        if (t - c->opened_ms >= limits.handshake_ms) kill(c);
        continue;
      }
      if (limits.idle_ms > 0 && c->streams.empty() && !c->draining && t - c->last_active_ms >= limits.idle_ms) {
        goaway(c);
        continue;
      }
      bool refused = false;
      for (auto& [sid, s] : c->streams) {
        if (!s.answered && s.deadline != 0 && t >= s.deadline) {
          refuse(c, sid, s, TOO_SLOW);
          refused = true;
        }
      }
      if (refused) write_out(c);
    }
  }

  void release(Conn* c, Stream& s) {  // the stream's held body bytes leave the bounds
    c->buffered -= static_cast<int64_t>(s.body.size());
    buffered_total -= static_cast<int64_t>(s.body.size());
    std::string().swap(s.body);
  }

  void refuse(Conn* c, int32_t sid, Stream& s, int why) {
    s.answered = true;
    s.stop_reading = true;
    s.deadline = 0;
    release(c, s);
    post_event(REFUSED, c->id, sid, why);
  }

  void deliver(Conn* c, int32_t sid, Stream& s) {
    s.answered = true;
    s.deadline = 0;
    c->buffered -= static_cast<int64_t>(s.body.size());
    buffered_total -= static_cast<int64_t>(s.body.size());
    Incoming in{c->id, sid, std::move(s.method), std::move(s.path), std::move(s.fields), std::move(s.body), c->peer};
    std::lock_guard<std::mutex> lock(mu);
    inbox.push_back(std::move(in));
  }

  void run_commands() {
    std::vector<Command> cmds;
    {
      std::lock_guard<std::mutex> lock(mu);
      cmds.swap(outbox);
      wake_signalled = false;
    }
    if (cmds.empty()) return;
    std::vector<Conn*> touched;
    for (Command& cmd : cmds) {
      auto it = conns.find(cmd.conn);
      Conn* c = it == conns.end() || it->second->dead ? nullptr : it->second.get();
      Stream* s = nullptr;
      if (c != nullptr) {
        auto st = c->streams.find(cmd.sid);
        if (st != c->streams.end()) s = &st->second;
      }
      if (s == nullptr || s->responded) {
        if (cmd.op == START || cmd.op == CHUNK || cmd.op == NOTIFY_DRAINED)
          post_event(GONE, cmd.conn, cmd.sid, 0);  // a streamed response whose stream is gone
        continue;
      }
      switch (cmd.op) {
        case RESPOND:
        case START:
          answer(c, cmd.sid, *s, cmd, cmd.op == START);
          break;
        case CHUNK:
          s->out.append(cmd.data);
          nghttp2_session_resume_data(c->h2, cmd.sid);
          break;
        case END:
          s->out_end = true;
          nghttp2_session_resume_data(c->h2, cmd.sid);
          break;
        case NOTIFY_DRAINED:
          if (s->out_offset >= s->out.size()) {
            post_event(DRAINED, c->id, cmd.sid, 0);
          } else {
            s->want_drained = true;
          }
          break;
        case RESET:
          s->responded = true;
          nghttp2_submit_rst_stream(c->h2, NGHTTP2_FLAG_NONE, cmd.sid, cmd.code);
          break;
      }
      if (touched.empty() || touched.back() != c) touched.push_back(c);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (Conn* c : touched) write_out(c);
  }

  void answer(Conn* c, int32_t sid, Stream& s, Command& cmd, bool streaming) {
    std::vector<nghttp2_nv> nva;
    nva.reserve(cmd.fields.size());
    for (auto& [name, value] : cmd.fields)
      nva.push_back({reinterpret_cast<uint8_t*>(name.data()), reinterpret_cast<uint8_t*>(value.data()), name.size(),
                     value.size(), NGHTTP2_NV_FLAG_NONE});
    s.streaming = streaming;
    if (!streaming) s.responded = true;
    if (!streaming && cmd.data.empty()) {
      nghttp2_submit_response(c->h2, sid, nva.data(), nva.size(), nullptr);
      return;
    }
    s.out = std::move(cmd.data);
    s.out_offset = 0;
    s.out_end = !streaming;
    nghttp2_data_provider provider;
    provider.source.ptr = nullptr;
    provider.read_callback = read_data;
    nghttp2_submit_response(c->h2, sid, nva.data(), nva.size(), &provider);
  }

  // -- nghttp2 callbacks --------------------------------------------------------------------
  static Conn* conn_of(void* user) { return static_cast<Conn*>(user); }

  static ssize_t read_data(nghttp2_session*, int32_t sid, uint8_t* buf, size_t length, uint32_t* flags,
                           nghttp2_data_source*, void* user) {
    Conn* c = conn_of(user);
    auto it = c->streams.find(sid);
    if (it == c->streams.end()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      return 0;
    }
    Stream& s = it->second;
    size_t n = std::min(length, s.out.size() - s.out_offset);
    std::memcpy(buf, s.out.data() + s.out_offset, n);
    s.out_offset += n;
    if (s.out_offset == s.out.size()) {
      s.out.clear();
      s.out_offset = 0;
      if (s.want_drained) {
        s.want_drained = false;
        c->server->post_event(DRAINED, c->id, sid, 0);
      }
      if (s.out_end) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        s.responded = true;
        return static_cast<ssize_t>(n);
      }
      if (n == 0) return NGHTTP2_ERR_DEFERRED;
    }
    return static_cast<ssize_t>(n);
  }

  static int on_begin_headers(nghttp2_session* h2, const nghttp2_frame* frame, void* user) {
    Conn* c = conn_of(user);
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    int32_t sid = frame->hd.stream_id;
    if (c->draining || static_cast<int64_t>(c->streams.size()) >= c->server->limits.max_streams) {
      // Refused before anything is handed on, safe for the client to retry (RFC 9113 §5.1.2, §6.8).
      nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, sid, NGHTTP2_REFUSED_STREAM);
      return 0;
    }
    c->streams.emplace(sid, Stream{});
    c->last_active_ms = now_ms();
    return 0;
  }

  static int on_header(nghttp2_session* h2, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                       const uint8_t* value, size_t valuelen, uint8_t, void* user) {
    Conn* c = conn_of(user);
    auto it = c->streams.find(frame->hd.stream_id);
    if (it == c->streams.end()) return 0;
    Stream& s = it->second;
    // RFC 9113 §6.5.2 counts 32 bytes per field on top of its name and value. Past the bound
    // the connection ends, as on the pure-Python path.
    s.header_bytes += namelen + valuelen + 32;
    if (static_cast<int64_t>(s.header_bytes) > c->server->limits.max_header_list) {
      nghttp2_session_terminate_session(h2, NGHTTP2_PROTOCOL_ERROR);
      return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    if (frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;  // trailers: not handed on
    const char* n = reinterpret_cast<const char*>(name);
    const char* v = reinterpret_cast<const char*>(value);
    if (namelen > 0 && n[0] == ':') {
      if (namelen == 7 && std::memcmp(n, ":method", 7) == 0) s.method.assign(v, valuelen);
      else if (namelen == 5 && std::memcmp(n, ":path", 5) == 0) s.path.assign(v, valuelen);
      return 0;
    }
    s.fields.emplace_back(std::string(n, namelen), std::string(v, valuelen));
    return 0;
  }

  static int on_data_chunk(nghttp2_session*, uint8_t, int32_t sid, const uint8_t* data, size_t len, void* user) {
    Conn* c = conn_of(user);
    auto it = c->streams.find(sid);
    if (it == c->streams.end() || it->second.answered) return 0;
    Stream& s = it->second;
    Server* srv = c->server;
    const Limits& L = srv->limits;
    s.size += static_cast<int64_t>(len);
    int64_t n = static_cast<int64_t>(len);
    if (s.size > L.max_body) {
      srv->refuse(c, sid, s, BODY_TOO_LARGE);
    } else if (c->buffered + n > std::max(L.max_buffered, L.max_body)) {
      // Bodies of all this connection's streams together, then of all connections.
      srv->refuse(c, sid, s, CONNECTION_FULL);
    } else if (srv->buffered_total + n > std::max(L.max_buffered_total, L.max_body)) {
      srv->refuse(c, sid, s, SERVER_FULL);
    } else {
      s.body.append(reinterpret_cast<const char*>(data), len);
      c->buffered += n;
      srv->buffered_total += n;
    }
    return 0;
  }

  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    Conn* c = conn_of(user);
    int32_t sid = frame->hd.stream_id;
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
    auto it = c->streams.find(sid);
    if (it == c->streams.end()) return 0;
    Stream& s = it->second;
    bool ended = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    Server* srv = c->server;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
      for (auto& [name, value] : s.fields) {
        if (name == "content-length" && !value.empty() &&
            std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
            (value.size() > 18 || std::stoll(value) > srv->limits.max_body)) {
          srv->refuse(c, sid, s, BODY_TOO_LARGE);
          return 0;
        }
      }
      if (!ended && srv->limits.request_ms > 0) s.deadline = now_ms() + srv->limits.request_ms;
    }
    if (ended && !s.answered) srv->deliver(c, sid, s);
    return 0;
  }

  static int on_frame_send(nghttp2_session* h2, const nghttp2_frame* frame, void* user) {
    Conn* c = conn_of(user);
    if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) return 0;
    auto it = c->streams.find(frame->hd.stream_id);
    if (it != c->streams.end() && it->second.stop_reading &&
        nghttp2_session_get_stream_remote_close(h2, frame->hd.stream_id) == 0) {
      // Answered before the request ended: ask the client to stop sending (RFC 9113 §8.1).
      nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
    }
    return 0;
  }

  static int on_stream_close(nghttp2_session*, int32_t sid, uint32_t, void* user) {
    Conn* c = conn_of(user);
    auto it = c->streams.find(sid);
    if (it == c->streams.end()) return 0;
    Stream& s = it->second;
    if (!s.answered) c->server->release(c, s);
    if (s.streaming && !s.responded) c->server->post_event(GONE, c->id, sid, 0);
    c->streams.erase(it);
    c->last_active_ms = now_ms();
    if (c->draining && c->streams.empty()) c->server->final_close(c);
    return 0;
  }
};

}  // namespace

PYBIND11_MODULE(_nio, m) {
  m.doc() = "An HTTP/2 + TLS 1.3 server and client, each in one C++ thread (sdcp_fast.transport.nativeserver "
            "and nativeclient wrap them)";
  nio::register_client(m);
  m.attr("OPENSSL_VERSION") = OpenSSL_version(OPENSSL_VERSION);
  m.attr("NGHTTP2_VERSION") = nghttp2_version(0)->version_str;
  py::class_<Server>(m, "Server")
      .def(py::init([](const std::string& host, int port, py::object cert, py::object key, py::object ca,
                       int64_t max_body, int64_t max_header_list, int64_t max_streams, int64_t max_buffered,
                       int64_t max_buffered_total, int64_t stream_window, int64_t connection_window,
                       int64_t max_frame, double idle_timeout, double request_timeout, double handshake_timeout) {
             Limits l{max_body, max_header_list, max_streams, max_buffered, max_buffered_total, stream_window,
                      connection_window, max_frame, static_cast<int64_t>(idle_timeout * 1000),
                      static_cast<int64_t>(request_timeout * 1000), static_cast<int64_t>(handshake_timeout * 1000)};
             return std::make_unique<Server>(host, port, cert, key, ca, l);
           }),
           py::arg("host"), py::arg("port"), py::arg("cert"), py::arg("key"), py::arg("ca"), py::arg("max_body"),
           py::arg("max_header_list"), py::arg("max_streams"), py::arg("max_buffered"),
           py::arg("max_buffered_total"), py::arg("stream_window"), py::arg("connection_window"),
           py::arg("max_frame"), py::arg("idle_timeout"), py::arg("request_timeout"), py::arg("handshake_timeout"))
      .def_property_readonly("port", [](Server& s) { return s.port; })
      .def_property_readonly("ready_fd", [](Server& s) { return s.ready_fd; })
      .def_property_readonly("accepted", [](Server& s) { return s.accepted.load(); })
      .def_property_readonly("connections", [](Server& s) { return s.connection_count.load(); })
      .def("take", &Server::take)
      .def("submit", &Server::submit)
      .def("close", &Server::begin_close)
      .def("stop", &Server::stop);
}
