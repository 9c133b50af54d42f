// sdcp_fast._nio.Client: HTTP/2 requests over TLS 1.3 with our client certificate, from one
// C++ thread (sdcp_fast/transport/nativeclient.py is the asyncio side).
//
// The thread owns every connection: it connects, runs the handshake (the server's certificate
// checked against the CA and the host it was asked for, ALPN h2), frames and encrypts the
// requests Python queued and decrypts and collects the responses. Python queues a request in
// one call and learns of every finished one through one eventfd; take() hands them over at
// once, each whole (status, fields, body) or as the way it failed. One connection per origin
// carries many streams; nghttp2 holds requests past the server's SETTINGS_MAX_CONCURRENT_STREAMS
// until a stream closes. A GOAWAY sends new requests to a new connection; the streams it
// refused (above its last stream id) come back as REFUSED, which Python sends once more. Python
// times requests out itself and cancels them (RST_STREAM CANCEL).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
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
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common.h"

namespace py = pybind11;

namespace nio {
namespace {

// How a request ended without a response (0: it has one). The numbers are nativeclient.py's.
enum Failure : int { ANSWERED = 0, CONNECT = 1, REFUSED = 2, LOST = 3, RESET = 4, TOO_LARGE = 5, TIMEOUT = 6, CLOSED = 7 };

struct Outgoing {  // a request Python queued
  uint64_t id;
  std::string host;
  int port;
  bool tls;
  Fields head;  // pseudo-header fields first, as sent
  std::string body;
};

struct Finished {  // what take() hands back: (id, failure, status, fields, body, message)
  uint64_t id;
  int failure;
  int status;
  Fields fields;
  std::string body;
  std::string message;
};

struct CStream {
  uint64_t id;
  std::string out;
  size_t out_offset = 0;
  int status = 0;
  Fields fields;
  std::string in;
};

struct Client;

struct CConn {
  uint64_t key;  // its epoll key (2 and up)
  std::string origin, host;
  int port = 0;
  bool tls = true;
  int fd = -1;
  SSL* ssl = nullptr;
  nghttp2_session* h2 = nullptr;
  enum State { CONNECTING, HANDSHAKING, OPEN } state = CONNECTING;
  bool dead = false, goaway = false, want_out = false;
  std::vector<Outgoing> waiting;  // until the connection is open
  std::unordered_map<int32_t, CStream> streams;
  std::string pending;
  size_t pending_offset = 0;
  int64_t started_ms = 0, last_active_ms = 0;
  Client* client = nullptr;
};

bool is_ip(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

struct Client {
  SSL_CTX* ctx = nullptr;
  int64_t max_body, max_frame, stream_window, connection_window, connect_ms, idle_ms;
  int epoll_fd = -1, wake_fd = -1, ready_fd = -1;
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> connection_count{0};
  uint64_t next_key = 2;
  std::unordered_map<uint64_t, std::unique_ptr<CConn>> conns;      // by epoll key
  std::unordered_map<std::string, CConn*> by_origin;                // the connection new requests take
  std::unordered_map<uint64_t, std::pair<CConn*, int32_t>> where;  // request id -> its stream (0: waiting)
  int64_t next_sweep = 0;

  std::mutex mu;  // guards the queues below
  std::vector<Outgoing> outbox;
  std::vector<uint64_t> cancels;
  bool wake_signalled = false;
  std::vector<Finished> inbox;
  bool ready_signalled = false;

  Client(py::object cert, py::object key, py::object ca, int64_t max_body_, int64_t max_frame_,
         int64_t stream_window_, int64_t connection_window_, double connect_timeout, double idle_timeout)
      : max_body(max_body_), max_frame(max_frame_), stream_window(stream_window_),
        connection_window(connection_window_), connect_ms(static_cast<int64_t>(connect_timeout * 1000)),
        idle_ms(static_cast<int64_t>(idle_timeout * 1000)) {
    if (!cert.is_none()) {
      ctx = SSL_CTX_new(TLS_client_method());
      if (ctx == nullptr) throw std::runtime_error("SSL_CTX_new: " + ssl_errors());
      SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
      SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
      std::string c = cert.cast<std::string>(), k = key.cast<std::string>(), a = ca.cast<std::string>();
      if (SSL_CTX_use_certificate_chain_file(ctx, c.c_str()) != 1 ||
          SSL_CTX_use_PrivateKey_file(ctx, k.c_str(), SSL_FILETYPE_PEM) != 1 ||
          SSL_CTX_load_verify_locations(ctx, a.c_str(), nullptr) != 1) {
        std::string why = ssl_errors();
        SSL_CTX_free(ctx);
        throw std::runtime_error("TLS configuration: " + why);
      }
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
      static const unsigned char alpn[] = {2, 'h', '2'};
      SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn);
    }
    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ready_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    watch(wake_fd, EPOLLIN, 1);
    thread = std::thread([this] { run(); });
  }

  ~Client() {
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
    for (int fd : {epoll_fd, wake_fd, ready_fd})
      if (fd >= 0) close(fd);
    epoll_fd = wake_fd = ready_fd = -1;
  }

  // One call per loop iteration: [(id, host, port, tls, [(name, value)], body)].
  void request_batch(const py::list& batch) {
    std::vector<Outgoing> got;
    got.reserve(batch.size());
    for (const py::handle& item : batch) {
      auto t = item.cast<py::tuple>();
      Outgoing o{t[0].cast<uint64_t>(), t[1].cast<std::string>(), t[2].cast<int>(), t[3].cast<bool>(),
                 t[4].cast<Fields>(), {}};
      if (o.tls && ctx == nullptr) throw std::invalid_argument("https needs a client with a certificate");
      if (!t[5].is_none()) copy_bytes(t[5], o.body);
      got.push_back(std::move(o));
    }
    queue([&] {
      for (auto& o : got) outbox.push_back(std::move(o));
    });
  }

  void cancel(uint64_t id) {
    queue([&] { cancels.push_back(id); });
  }

  template <class F>
  void queue(F&& put) {
    bool signal = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      put();
      if (!wake_signalled) wake_signalled = signal = true;
    }
    if (signal) signal_fd(wake_fd);
  }


  // Every finished request: [(id, failure, status, [(name, value)], body, message)].
  py::list take() {
    std::vector<Finished> got;
    {
      std::lock_guard<std::mutex> lock(mu);
      got.swap(inbox);
      ready_signalled = false;
      uint64_t n;
      if (ready_fd >= 0) (void)!read(ready_fd, &n, sizeof n);
    }
    py::list out(got.size());
    for (size_t i = 0; i < got.size(); ++i) {
      Finished& f = got[i];
      py::list fields(f.fields.size());
      for (size_t j = 0; j < f.fields.size(); ++j) {
        auto& [name, value] = f.fields[j];
        fields[j] = py::make_tuple(latin1(name), latin1(value));
      }
      out[i] = py::make_tuple(f.id, f.failure, f.status, fields, py::bytes(f.body), py::str(f.message));
    }
    return out;
  }

  // -- the thread -------------------------------------------------------------------------
  void watch(int fd, uint32_t events, uint64_t key, int op = EPOLL_CTL_ADD) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = key;
    epoll_ctl(epoll_fd, op, fd, &ev);
  }

  void finish(Finished f) {
    where.erase(f.id);
    std::lock_guard<std::mutex> lock(mu);
    inbox.push_back(std::move(f));
  }

  void fail(uint64_t id, int failure, std::string message) { finish(Finished{id, failure, 0, {}, {}, std::move(message)}); }

  void run() {
    epoll_event evs[128];
    while (!stopping) {
      int64_t t = now_ms();
      int timeout = conns.empty() ? 200 : static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(next_sweep - t, 100)));
      int n = epoll_wait(epoll_fd, evs, 128, timeout);
      for (int i = 0; i < n; ++i) {
        uint64_t key = evs[i].data.u64;
        if (key == 1) {
          uint64_t v;
          (void)!read(wake_fd, &v, sizeof v);
          continue;
        }
        auto it = conns.find(key);
        if (it == conns.end()) continue;
        CConn* c = it->second.get();
        if (c->state == CConn::CONNECTING) {
          connected(c);
          continue;
        }
        if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) readable(c);
        if (!c->dead && (evs[i].events & EPOLLOUT)) write_out(c);
      }
      run_commands();
      t = now_ms();
      if (t >= next_sweep) {
        sweep(t);
        next_sweep = t + 25;
      }
      reap();
      notify_python();
    }
    for (auto& [key, c] : conns) lose(c.get(), CLOSED, "the transport was closed");
    reap();
    notify_python();
  }

  void notify_python() {
    bool signal = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!inbox.empty() && !ready_signalled) ready_signalled = signal = true;
    }
    if (signal) signal_fd(ready_fd);
  }

  void run_commands() {
    std::vector<Outgoing> todo;
    std::vector<uint64_t> gone;
    {
      std::lock_guard<std::mutex> lock(mu);
      todo.swap(outbox);
      gone.swap(cancels);
      wake_signalled = false;
    }
    std::vector<CConn*> touched;
    for (uint64_t id : gone) {
      auto it = where.find(id);
      if (it == where.end()) continue;  // finished meanwhile: Python drops its answer
      auto [c, sid] = it->second;
      where.erase(it);
      if (sid == 0) {
        auto& w = c->waiting;
        w.erase(std::remove_if(w.begin(), w.end(), [id](const Outgoing& o) { return o.id == id; }), w.end());
      } else if (!c->dead) {
        c->streams.erase(sid);
        nghttp2_submit_rst_stream(c->h2, NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL);
        touched.push_back(c);
      }
    }
    for (Outgoing& o : todo) {
      std::string origin = o.host + ":" + std::to_string(o.port) + (o.tls ? "/tls" : "/h2c");
      auto it = by_origin.find(origin);
      CConn* c = it == by_origin.end() ? nullptr : it->second;
      if (c == nullptr || c->dead || c->goaway) c = open(origin, o);
      if (c == nullptr) continue;  // failed at once: answered
      if (c->state != CConn::OPEN) {
        where[o.id] = {c, 0};
        c->waiting.push_back(std::move(o));
      } else {
        submit(c, std::move(o));
        touched.push_back(c);
      }
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (CConn* c : touched) write_out(c);
  }

  CConn* open(const std::string& origin, const Outgoing& o) {
    std::string where_to = o.host + ":" + std::to_string(o.port);
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    std::string service = std::to_string(o.port);
    int rc = getaddrinfo(o.host.c_str(), service.c_str(), &hints, &res);
    if (rc != 0 || res == nullptr) {
      fail(o.id, CONNECT, "cannot connect to " + where_to + ": " + gai_strerror(rc));
      return nullptr;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) err = errno;
    freeaddrinfo(res);
    if (err != 0) {
      if (fd >= 0) close(fd);
      fail(o.id, CONNECT, "cannot connect to " + where_to + ": " + std::strerror(err));
      return nullptr;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<CConn>();
    c->key = next_key++;
    c->origin = origin;
    c->host = o.host;
    c->port = o.port;
    c->tls = o.tls;
    c->fd = fd;
    c->client = this;
    c->started_ms = c->last_active_ms = now_ms();
    watch(fd, EPOLLOUT, c->key);
    CConn* raw = c.get();
    conns.emplace(raw->key, std::move(c));
    by_origin[origin] = raw;
    connection_count = static_cast<int64_t>(conns.size());
    return raw;
  }

  std::string where_to(const CConn* c) const { return c->host + ":" + std::to_string(c->port); }

  void connected(CConn* c) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == EINPROGRESS) return;
    if (err != 0) {
      lose(c, CONNECT, "cannot connect to " + where_to(c) + ": " + std::strerror(err));
      return;
    }
    watch(c->fd, EPOLLIN, c->key, EPOLL_CTL_MOD);
    if (!c->tls) {
      start_h2(c);
      return;
    }
    c->ssl = SSL_new(ctx);
    SSL_set_fd(c->ssl, c->fd);
    SSL_set_connect_state(c->ssl);
    X509_VERIFY_PARAM* param = SSL_get0_param(c->ssl);
    if (is_ip(c->host)) {
      X509_VERIFY_PARAM_set1_ip_asc(param, c->host.c_str());
    } else {
      SSL_set_tlsext_host_name(c->ssl, c->host.c_str());
      SSL_set1_host(c->ssl, c->host.c_str());
    }
    c->state = CConn::HANDSHAKING;
    handshake(c);
  }

  void handshake(CConn* c) {
    ERR_clear_error();
    int rv = SSL_do_handshake(c->ssl);
    if (rv != 1) {
      int err = SSL_get_error(c->ssl, rv);
      if (err == SSL_ERROR_WANT_READ) {
        want_write(c, false);
        return;
      }
      if (err == SSL_ERROR_WANT_WRITE) {
        want_write(c, true);
        return;
      }
      std::string why = ssl_errors();
      long verify = SSL_get_verify_result(c->ssl);
      if (verify != X509_V_OK) why = X509_verify_cert_error_string(verify);
      lose(c, CONNECT, "cannot connect to " + where_to(c) + ": TLS handshake failed: " + (why.empty() ? "closed" : why));
      return;
    }
    const unsigned char* alpn = nullptr;
    unsigned int alpn_len = 0;
    SSL_get0_alpn_selected(c->ssl, &alpn, &alpn_len);
    if (alpn_len != 2 || std::memcmp(alpn, "h2", 2) != 0) {
      lose(c, CONNECT, where_to(c) + " did not negotiate HTTP/2 (ALPN h2)");
      return;
    }
    start_h2(c);
  }

  void start_h2(CConn* c) {
    nghttp2_session_callbacks* cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_data_source_read_length_callback(cb, read_length);
    nghttp2_option* opt;
    nghttp2_option_new(&opt);
    nghttp2_option_set_no_closed_streams(opt, 1);
    nghttp2_session_client_new2(&c->h2, cb, c, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(stream_window)},
        {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, static_cast<uint32_t>(max_frame)},
    };
    nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, 3);
    if (connection_window > 65535)
      nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0, static_cast<int32_t>(connection_window));
    c->state = CConn::OPEN;
    c->last_active_ms = now_ms();
    std::vector<Outgoing> waiting;
    waiting.swap(c->waiting);
    for (Outgoing& o : waiting) submit(c, std::move(o));
    write_out(c);
  }

  void submit(CConn* c, Outgoing o) {
    std::vector<nghttp2_nv> nva;
    nva.reserve(o.head.size());
    for (auto& [name, value] : o.head)
      nva.push_back({reinterpret_cast<uint8_t*>(name.data()), reinterpret_cast<uint8_t*>(value.data()), name.size(),
                     value.size(), NGHTTP2_NV_FLAG_NONE});
    nghttp2_data_provider provider;
    provider.source.ptr = nullptr;
    provider.read_callback = read_data;
    bool has_body = !o.body.empty();
    // The stream's record is made before the submit: nghttp2 reads the body through it.
    int32_t sid = nghttp2_submit_request(c->h2, nullptr, nva.data(), nva.size(), has_body ? &provider : nullptr, nullptr);
    if (sid < 0) {
      // Stream ids used up: refused before anything went out, so Python sends it again on a
      // new connection.
      c->goaway = true;
      fail(o.id, REFUSED, std::string("request not sent: ") + nghttp2_strerror(sid));
      return;
    }
    CStream s;
    s.id = o.id;
    s.out = std::move(o.body);
    c->streams.emplace(sid, std::move(s));
    where[o.id] = {c, sid};
    c->last_active_ms = now_ms();
  }

  void readable(CConn* c) {
    if (c->dead) return;
    if (c->state == CConn::HANDSHAKING) {
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
          lose(c, LOST, "connection closed before the response");
          return;
        }
        n = rv;
      } else {
        n = ::read(c->fd, buf, sizeof buf);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) {
          lose(c, LOST, "connection closed before the response");
          return;
        }
      }
      ssize_t rv = nghttp2_session_mem_recv(c->h2, reinterpret_cast<uint8_t*>(buf), static_cast<size_t>(n));
      if (rv < 0) {
        lose(c, LOST, std::string("connection closed before the response: ") + nghttp2_strerror(static_cast<int>(rv)));
        return;
      }
      if (c->dead) return;
      if (c->ssl == nullptr && static_cast<size_t>(n) < sizeof buf) break;
    }
    write_out(c);
  }

  void write_out(CConn* c) {
    if (c->dead) return;
    if (c->state == CConn::HANDSHAKING) {
      handshake(c);
      return;
    }
    if (c->state != CConn::OPEN) return;
    for (;;) {
      if (c->pending_offset == c->pending.size()) {
        c->pending.clear();
        c->pending_offset = 0;
        const uint8_t* data;
        ssize_t n;
        while ((n = nghttp2_session_mem_send(c->h2, &data)) > 0)
          c->pending.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
        if (n < 0) {
          lose(c, LOST, std::string("connection failed: ") + nghttp2_strerror(static_cast<int>(n)));
          return;
        }
        if (c->pending.empty()) break;
      }
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
          lose(c, LOST, "connection closed before the response");
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
          lose(c, LOST, "connection closed before the response");
          return;
        }
      }
      c->pending_offset += static_cast<size_t>(n);
    }
    want_write(c, false);
    if (!nghttp2_session_want_read(c->h2) && !nghttp2_session_want_write(c->h2)) lose(c, LOST, "connection closed");
  }

  void want_write(CConn* c, bool on) {
    if (c->want_out == on) return;
    c->want_out = on;
    watch(c->fd, EPOLLIN | (on ? EPOLLOUT : 0), c->key, EPOLL_CTL_MOD);
  }

  // The connection is over: every request on it or waiting for it ends with ``failure``.
  void lose(CConn* c, int failure, const std::string& message) {
    if (c->dead) return;
    c->dead = true;
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
    for (Outgoing& o : c->waiting) fail(o.id, failure == LOST ? CONNECT : failure, message);
    c->waiting.clear();
    for (auto& [sid, s] : c->streams) fail(s.id, failure == CONNECT ? LOST : failure, message);
    c->streams.clear();
    auto it = by_origin.find(c->origin);
    if (it != by_origin.end() && it->second == c) by_origin.erase(it);
  }

  void sweep(int64_t t) {
    for (auto& [key, cp] : conns) {
      CConn* c = cp.get();
      if (c->dead) continue;
      if (c->state != CConn::OPEN) {
        if (t - c->started_ms >= connect_ms)
          lose(c, TIMEOUT, "cannot connect to " + where_to(c) + ": no TLS/TCP connection within the timeout");
        continue;
      }
      if (idle_ms > 0 && c->streams.empty() && t - c->last_active_ms >= idle_ms) {
        nghttp2_session_terminate_session(c->h2, NGHTTP2_NO_ERROR);
        c->goaway = true;
        write_out(c);
        if (!c->dead) lose(c, LOST, "idle connection closed");
      }
    }
  }

  void reap() {
    for (auto it = conns.begin(); it != conns.end();) {
      CConn* c = it->second.get();
      if (c->dead) {
        if (c->h2) nghttp2_session_del(c->h2);
        if (c->ssl) SSL_free(c->ssl);
        close(c->fd);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
    connection_count = static_cast<int64_t>(conns.size());
  }

  // -- nghttp2 callbacks --------------------------------------------------------------------
  static CConn* conn_of(void* user) { return static_cast<CConn*>(user); }

  static ssize_t read_data(nghttp2_session*, int32_t sid, uint8_t* buf, size_t length, uint32_t* flags,
                           nghttp2_data_source*, void* user) {
    CConn* c = conn_of(user);
    auto it = c->streams.find(sid);
    if (it == c->streams.end()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      return 0;
    }
    CStream& s = it->second;
    size_t n = std::min(length, s.out.size() - s.out_offset);
    std::memcpy(buf, s.out.data() + s.out_offset, n);
    s.out_offset += n;
    if (s.out_offset == s.out.size()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      std::string().swap(s.out);
      s.out_offset = 0;
    }
    return static_cast<ssize_t>(n);
  }

  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                       const uint8_t* value, size_t valuelen, uint8_t, void* user) {
    CConn* c = conn_of(user);
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat == NGHTTP2_HCAT_HEADERS) return 0;  // trailers
    auto it = c->streams.find(frame->hd.stream_id);
    if (it == c->streams.end()) return 0;
    CStream& s = it->second;
    const char* n = reinterpret_cast<const char*>(name);
    const char* v = reinterpret_cast<const char*>(value);
    if (namelen == 7 && std::memcmp(n, ":status", 7) == 0) {
      int status = 0;
      for (size_t i = 0; i < valuelen && v[i] >= '0' && v[i] <= '9'; ++i) status = status * 10 + (v[i] - '0');
      s.status = status;
      s.fields.clear();  // an informational (1xx) response's fields are not the final one's
      return 0;
    }
    if (namelen > 0 && n[0] == ':') return 0;
    s.fields.emplace_back(std::string(n, namelen), std::string(v, valuelen));
    return 0;
  }

  static int on_data_chunk(nghttp2_session* h2, uint8_t, int32_t sid, const uint8_t* data, size_t len, void* user) {
    CConn* c = conn_of(user);
    auto it = c->streams.find(sid);
    if (it == c->streams.end()) return 0;
    CStream& s = it->second;
    Client* cl = c->client;
    if (static_cast<int64_t>(s.in.size() + len) > cl->max_body) {
      uint64_t id = s.id;
      c->streams.erase(it);
      nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL);
      cl->fail(id, TOO_LARGE, "response body over " + std::to_string(cl->max_body) + " bytes");
      return 0;
    }
    s.in.append(reinterpret_cast<const char*>(data), len);
    return 0;
  }

  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    CConn* c = conn_of(user);
    if (frame->hd.type == NGHTTP2_GOAWAY) {
      // New requests go to a new connection; nghttp2 closes the streams above the last id
      // with REFUSED_STREAM (on_stream_close), which Python sends once more.
      c->goaway = true;
      auto it = c->client->by_origin.find(c->origin);
      if (it != c->client->by_origin.end() && it->second == c) c->client->by_origin.erase(it);
    }
    return 0;
  }

  static int on_stream_close(nghttp2_session*, int32_t sid, uint32_t code, void* user) {
    CConn* c = conn_of(user);
    auto it = c->streams.find(sid);
    if (it == c->streams.end()) return 0;  // cancelled, or refused for its size: answered already
    CStream s = std::move(it->second);
    c->streams.erase(it);
    c->last_active_ms = now_ms();
    Client* cl = c->client;
    if (code == NGHTTP2_NO_ERROR && s.status >= 200) {
      cl->finish(Finished{s.id, ANSWERED, s.status, std::move(s.fields), std::move(s.in), {}});
    } else if (code == NGHTTP2_REFUSED_STREAM) {
      cl->fail(s.id, REFUSED, "the server refused the stream (REFUSED_STREAM) before processing it");
    } else {
      cl->fail(s.id, RESET, std::string("stream reset by the server: ") + nghttp2_http2_strerror(code));
    }
    return 0;
  }
};

}  // namespace

void register_client(py::module_& m) {
  py::class_<Client>(m, "Client")
      .def(py::init([](py::object cert, py::object key, py::object ca, int64_t max_body, int64_t max_frame,
                       int64_t stream_window, int64_t connection_window, double connect_timeout,
                       double idle_timeout) {
             return std::make_unique<Client>(cert, key, ca, max_body, max_frame, stream_window, connection_window,
                                             connect_timeout, idle_timeout);
           }),
           py::arg("cert"), py::arg("key"), py::arg("ca"), py::arg("max_body"), py::arg("max_frame"),
           py::arg("stream_window"), py::arg("connection_window"), py::arg("connect_timeout"),
           py::arg("idle_timeout"))
      .def_property_readonly("ready_fd", [](Client& c) { return c.ready_fd; })
      .def_property_readonly("connections", [](Client& c) { return c.connection_count.load(); })
      .def("request_batch", &Client::request_batch)
      .def("cancel", &Client::cancel)
      .def("take", &Client::take)
      .def("stop", &Client::stop);
}

}  // namespace nio
