// sdcp_fast._h2: one HTTP/2 connection's framing, HPACK and flow control in nghttp2, behind
// the sans-I/O surface sdcp_fast/transport/h2native.py wraps (bytes in -> events; frames
// queued -> data_to_send). It is built only where libnghttp2's headers are found (setup.py),
// and includes no torch header.
//
// Frames are serialised as soon as they are submitted (flush_frames after every call), as
// the pure-Python path does: frames leave in the order the adapter asked for them, and the
// send windows it reads have already been charged for what it sent.
//
// A connection may ask for whole messages (set_whole_messages): a request (server) or response
// (client) whose headers, body and END_STREAM all arrive in one receive() call is handed on as
// one WHOLE event, its body in one bytes object and its flow-controlled bytes already returned
// to the peer's windows, instead of HEADERS, DATA... and ENDED. Its parts are held only until
// that call returns, so the memory is bounded by the bytes passed in; a message still
// unfinished then is handed on as the usual events. send_message() is the sending side's
// counterpart: headers, then the body and END_STREAM in the same call when the body fits the
// peer's windows.
#include <nghttp2/nghttp2.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// Event kinds handed to Python (h2native.py turns them into h2.events objects).
enum Kind : int {
  HEADERS = 0,     // request (server) or response (client) headers: (kind, sid, [(name, value)], ended)
  TRAILERS = 1,    // (kind, sid, [(name, value)], ended)
  DATA = 2,        // (kind, sid, bytes, flow-controlled length)
  ENDED = 3,       // (kind, sid, None, 0)
  RESET = 4,       // (kind, sid, remote: bool, error code)
  WINDOW = 5,      // (kind, sid, None, delta)
  SETTINGS = 6,    // (kind, 0, {id: value}, 0)
  GOAWAY = 7,      // (kind, 0, (last stream id, debug bytes), error code)
  SETTINGS_ACK = 8,
  PING = 9,        // (kind, 0, opaque data, 0)
  WHOLE = 10,      // whole message: (kind, sid, [(name, value)], flow-controlled length, body bytes)
};

struct Pending {  // a message whose END_STREAM has not arrived yet in this receive() call
  py::list fields;
  std::string body;
  int64_t length = 0;  // body bytes, returned to the peer's windows
};

class ProtocolError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};
class StreamClosed : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Outgoing {
  std::string buffer;  // bytes handed to send_data, not yet framed
  size_t offset = 0;
  bool end = false;       // END_STREAM once the buffer is drained
  bool submitted = false; // a DATA item (our data source) is queued in nghttp2
};

class Session {
 public:
  explicit Session(bool client) : client_(client) {
    nghttp2_session_callbacks* cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_data_source_read_length_callback(cb, read_length);
    nghttp2_option* opt;
    nghttp2_option_new(&opt);
    // The adapter returns received bytes to the peer's windows once it has buffered them
    // (acknowledge_received_data), as with the pure-Python path.
    nghttp2_option_set_no_auto_window_update(opt, 1);
    // No priority tree: a closed stream is gone at once (and find_stream says so).
    nghttp2_option_set_no_closed_streams(opt, 1);
    int rv = client ? nghttp2_session_client_new2(&s_, cb, this, opt) : nghttp2_session_server_new2(&s_, cb, this, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    if (rv != 0) throw std::runtime_error(nghttp2_strerror(rv));
  }
  ~Session() { nghttp2_session_del(s_); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void submit_settings(const std::vector<std::pair<int32_t, uint32_t>>& values) {
    std::vector<nghttp2_settings_entry> iv;
    for (auto& [id, value] : values) {
      if (id == NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS) {
        max_streams_ = value;
        continue;
      }
      iv.push_back({id, value});
      if (id == NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE) max_header_list_ = value;
    }
    size_t start = out_.size();
    check(nghttp2_submit_settings(s_, NGHTTP2_FLAG_NONE, iv.data(), iv.size()));
    flush_frames();
    if (max_streams_ != UINT32_MAX) advertise_max_streams(start);
  }

  void set_whole_messages(bool on) { whole_ = on; }

  void increment_window(int32_t stream_id, int32_t delta) {
    check(nghttp2_submit_window_update(s_, NGHTTP2_FLAG_NONE, stream_id, delta));
    flush_frames();
  }

  // The events of these bytes, and any raised since the last call (a stream nghttp2 closed
  // while frames were being sent).
  // Any contiguous buffer (the adapter passes a view of its receive buffer): nghttp2 and the
  // events copy what they keep before this returns.
  py::list receive(py::buffer data) {
    py::buffer_info info = data.request();
    const auto* buf = static_cast<const uint8_t*>(info.ptr);
    size_t len = static_cast<size_t>(info.size * info.itemsize);
    ssize_t rv = nghttp2_session_mem_recv(s_, buf, len);
    if (rv < 0) {
      pending_.clear();
      pending_order_.clear();
      consumed_.clear();
      flush_frames();  // nghttp2 queued the GOAWAY that says why
      throw ProtocolError(std::string("HTTP/2 protocol error: ") + nghttp2_strerror(static_cast<int>(rv)));
    }
    flush_pending();  // messages not complete in these bytes: the usual events
    // The bytes of whole messages are buffered now (the adapter bounds them as it does DATA).
    for (auto& [sid, n] : consumed_) {
      if (nghttp2_session_find_stream(s_, sid) != nullptr) nghttp2_session_consume_stream(s_, sid, n);
      nghttp2_session_consume_connection(s_, n);
    }
    consumed_.clear();
    flush_frames();  // SETTINGS ACK, PING ACK, RST_STREAM of a refused stream, WINDOW_UPDATE...
    py::list out = events_;
    events_ = py::list();
    return out;
  }

  py::bytes data_to_send() {
    flush_frames();
    py::bytes out(out_);
    out_.clear();
    return out;
  }

  int32_t submit_headers(int32_t stream_id, const std::vector<std::pair<std::string, std::string>>& fields,
                         bool end_stream) {
    int32_t sid = headers_frame(stream_id, fields, end_stream);
    flush_frames();
    return sid;
  }

  // A message's headers (END_STREAM with them when the body is empty), then its body and
  // END_STREAM when the body fits both send windows: true when all of it is sent, false when
  // the body is left to send_data as the windows open.
  bool send_message(int32_t stream_id, const std::vector<std::pair<std::string, std::string>>& fields,
                    py::buffer body) {
    py::buffer_info info = body.request();
    size_t size = static_cast<size_t>(info.size * info.itemsize);
    if (client_ && size != 0) {
      request_with_body(stream_id, fields, static_cast<const char*>(info.ptr), size);
      return true;
    }
    headers_frame(stream_id, fields, size == 0);
    flush_frames();  // the HEADERS frame first, as send_headers then send_data would
    if (size == 0) return true;
    if (static_cast<int64_t>(size) > send_window(stream_id)) return false;
    {
      auto& out = out_streams_[stream_id];
      out.buffer.append(static_cast<const char*>(info.ptr), size);
      out.end = true;
      schedule(stream_id, out);
    }
    return true;
  }

 private:
  // The fields as nghttp2's name/value pairs, pointing into ``fields`` (which must outlive the submit).
  static std::vector<nghttp2_nv> name_values(const std::vector<std::pair<std::string, std::string>>& fields) {
    std::vector<nghttp2_nv> nva;
    nva.reserve(fields.size());
    for (auto& [name, value] : fields) {
      nva.push_back({reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                     reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
                     NGHTTP2_NV_FLAG_NONE});
    }
    return nva;
  }

  // A request and its whole body in one submission. nghttp2 holds a request back while the
  // peer's limit of concurrent streams is reached and opens its stream later; HEADERS
  // submitted alone would then go out with no body to follow (the send of the body found no
  // stream), leaving a stream open at both ends for good. Submitted together, the DATA follows
  // the HEADERS whenever they go, as the windows allow.
  void request_with_body(int32_t stream_id, const std::vector<std::pair<std::string, std::string>>& fields,
                         const char* data, size_t size) {
    if (static_cast<uint32_t>(stream_id) != nghttp2_session_get_next_stream_id(s_))
      throw ProtocolError("stream " + std::to_string(stream_id) + " is not the next stream id");
    std::vector<nghttp2_nv> nva = name_values(fields);
    nghttp2_data_provider provider;
    provider.source.ptr = nullptr;
    provider.read_callback = read_data;
    int32_t sid = nghttp2_submit_request(s_, nullptr, nva.data(), nva.size(), &provider, nullptr);
    check(sid);
    Outgoing& out = out_streams_[sid];
    out.buffer.assign(data, size);
    out.end = true;
    out.submitted = true;
    flush_frames();
  }

  int32_t headers_frame(int32_t stream_id, const std::vector<std::pair<std::string, std::string>>& fields,
                        bool end_stream) {
    std::vector<nghttp2_nv> nva = name_values(fields);
    uint8_t flags = end_stream ? NGHTTP2_FLAG_END_STREAM : NGHTTP2_FLAG_NONE;
    int32_t sid;
    if (client_) {
      if (static_cast<uint32_t>(stream_id) != nghttp2_session_get_next_stream_id(s_))
        throw ProtocolError("stream " + std::to_string(stream_id) + " is not the next stream id");
      sid = nghttp2_submit_headers(s_, flags, -1, nullptr, nva.data(), nva.size(), nullptr);
    } else {
      if (nghttp2_session_find_stream(s_, stream_id) == nullptr || local_closed(stream_id))
        throw StreamClosed(std::to_string(stream_id));
      sid = nghttp2_submit_headers(s_, flags, stream_id, nullptr, nva.data(), nva.size(), nullptr);
    }
    check(sid);
    return sid;
  }

 public:
  void send_data(int32_t stream_id, py::buffer data, bool end_stream) {
    py::buffer_info info = data.request();
    auto& out = writable(stream_id);
    out.buffer.append(static_cast<const char*>(info.ptr), static_cast<size_t>(info.size * info.itemsize));
    out.end = out.end || end_stream;
    schedule(stream_id, out);
  }

  void end_stream(int32_t stream_id) {
    auto& out = writable(stream_id);
    out.end = true;
    schedule(stream_id, out);
  }

  void reset_stream(int32_t stream_id, uint32_t code) {
    if (nghttp2_session_find_stream(s_, stream_id) == nullptr) throw StreamClosed(std::to_string(stream_id));
    reset_by_us_.insert(stream_id);
    check(nghttp2_submit_rst_stream(s_, NGHTTP2_FLAG_NONE, stream_id, code));
    flush_frames();
  }

  void terminate(uint32_t code) {
    check(nghttp2_session_terminate_session(s_, code));
    flush_frames();
  }

  void consume(int32_t stream_id, size_t n) {
    // The stream may be gone (reset meanwhile): its bytes still count for the connection.
    if (stream_id != 0 && nghttp2_session_find_stream(s_, stream_id) != nullptr)
      nghttp2_session_consume_stream(s_, stream_id, n);
    nghttp2_session_consume_connection(s_, n);
    flush_frames();
  }

  // What we may still send on a stream: both send windows, less what is buffered for it.
  int64_t send_window(int32_t stream_id) {
    if (nghttp2_session_find_stream(s_, stream_id) == nullptr || local_closed(stream_id))
      throw StreamClosed(std::to_string(stream_id));
    int64_t stream = nghttp2_session_get_stream_remote_window_size(s_, stream_id);
    int64_t conn = nghttp2_session_get_remote_window_size(s_);
    int64_t queued = 0;
    auto it = out_streams_.find(stream_id);
    if (it != out_streams_.end()) queued = static_cast<int64_t>(it->second.buffer.size() - it->second.offset);
    return std::max<int64_t>(0, std::min(stream - queued, conn - queued_total()));
  }

  uint32_t remote_setting(int32_t id) { return nghttp2_session_get_remote_settings(s_, static_cast<nghttp2_settings_id>(id)); }
  int32_t next_stream_id() { return static_cast<int32_t>(nghttp2_session_get_next_stream_id(s_)); }
  int32_t last_proc_stream_id() { return nghttp2_session_get_last_proc_stream_id(s_); }

  // None: no such stream (never opened, or closed); else (local closed, remote closed).
  py::object stream_state(int32_t stream_id) {
    nghttp2_stream* stream = nghttp2_session_find_stream(s_, stream_id);
    if (stream == nullptr || nghttp2_stream_get_state(stream) == NGHTTP2_STREAM_STATE_CLOSED) return py::none();
    return py::make_tuple(local_closed(stream_id), nghttp2_session_get_stream_remote_close(s_, stream_id) == 1);
  }

 private:
  nghttp2_session* s_ = nullptr;
  bool client_;
  std::string out_;
  py::list events_;
  std::unordered_map<int32_t, py::list> headers_;
  std::unordered_map<int32_t, size_t> header_bytes_;
  size_t max_header_list_ = SIZE_MAX;
  uint32_t max_streams_ = UINT32_MAX;
  std::unordered_set<int32_t> inbound_;  // streams the peer opened that are not closed  // nghttp2 advertises the bound but leaves enforcing it to us
  std::unordered_map<int32_t, Outgoing> out_streams_;
  std::unordered_set<int32_t> reset_by_us_, reported_;
  bool whole_ = false;  // set_whole_messages
  std::unordered_map<int32_t, Pending> pending_;
  std::vector<int32_t> pending_order_;  // pending_'s streams in the order their headers came
  std::vector<std::pair<int32_t, size_t>> consumed_;  // bytes of whole messages to return to the windows

  // Hand on the messages still pending as the usual events (HEADERS, then their body as one
  // DATA event), in the order their headers arrived.
  void flush_pending() {
    if (pending_.empty()) {
      pending_order_.clear();
      return;
    }
    std::unordered_map<int32_t, Pending> held;
    held.swap(pending_);
    for (int32_t sid : pending_order_) {
      auto it = held.find(sid);
      if (it == held.end()) continue;
      Pending& p = it->second;
      events_.append(py::make_tuple(static_cast<int>(HEADERS), sid, std::move(p.fields), 0));
      if (p.length > 0)
        events_.append(py::make_tuple(static_cast<int>(DATA), sid, py::bytes(p.body), p.length));
    }
    pending_order_.clear();
  }

  // SETTINGS_MAX_CONCURRENT_STREAMS is advertised to the peer but kept from nghttp2: once the
  // peer acknowledges it, nghttp2 ends the whole connection for a stream past it, where RFC
  // 9113 §5.1.2 makes that a stream error (REFUSED_STREAM, safe to retry) and the pure-Python
  // path refuses that stream alone. So the entry is added to the SETTINGS frame nghttp2 just
  // wrote, and on_begin_headers refuses the streams past it.
  void advertise_max_streams(size_t start) {
    static const char magic[] = NGHTTP2_CLIENT_MAGIC;
    size_t pos = start;
    if (client_ && out_.compare(pos, NGHTTP2_CLIENT_MAGIC_LEN, magic, NGHTTP2_CLIENT_MAGIC_LEN) == 0)
      pos += NGHTTP2_CLIENT_MAGIC_LEN;
    if (out_.size() < pos + 9 || out_[pos + 3] != NGHTTP2_SETTINGS || out_[pos + 4] != 0)
      throw std::runtime_error("no SETTINGS frame to add SETTINGS_MAX_CONCURRENT_STREAMS to");
    auto* hd = reinterpret_cast<uint8_t*>(&out_[pos]);
    size_t length = (size_t(hd[0]) << 16) | (size_t(hd[1]) << 8) | hd[2];
    length += 6;
    hd[0] = uint8_t(length >> 16), hd[1] = uint8_t(length >> 8), hd[2] = uint8_t(length);
    uint8_t entry[6] = {0, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, uint8_t(max_streams_ >> 24),
                        uint8_t(max_streams_ >> 16), uint8_t(max_streams_ >> 8), uint8_t(max_streams_)};
    out_.insert(pos + 9 + length - 6, reinterpret_cast<const char*>(entry), 6);
  }

  static void check(int rv) {
    if (rv < 0) throw ProtocolError(nghttp2_strerror(rv));
  }

  bool local_closed(int32_t stream_id) {
    nghttp2_stream* stream = nghttp2_session_find_stream(s_, stream_id);
    if (stream == nullptr) return true;
    nghttp2_stream_proto_state state = nghttp2_stream_get_state(stream);
    if (state == NGHTTP2_STREAM_STATE_HALF_CLOSED_LOCAL || state == NGHTTP2_STREAM_STATE_CLOSED) return true;
    auto it = out_streams_.find(stream_id);
    return it != out_streams_.end() && it->second.end;  // END_STREAM asked for (maybe not yet framed)
  }

  int64_t queued_total() {
    int64_t n = 0;
    for (auto& [sid, out] : out_streams_) n += static_cast<int64_t>(out.buffer.size() - out.offset);
    return n;
  }

  Outgoing& writable(int32_t stream_id) {
    if (nghttp2_session_find_stream(s_, stream_id) == nullptr || local_closed(stream_id))
      throw StreamClosed(std::to_string(stream_id));
    return out_streams_[stream_id];
  }

  void schedule(int32_t stream_id, Outgoing& out) {
    if (!out.submitted) {
      nghttp2_data_provider provider;
      provider.source.ptr = nullptr;
      provider.read_callback = read_data;
      int rv = nghttp2_submit_data(s_, NGHTTP2_FLAG_END_STREAM, stream_id, &provider);
      if (rv < 0) {
        out_streams_.erase(stream_id);
        throw StreamClosed(std::string(nghttp2_strerror(rv)));
      }
      out.submitted = true;
    } else {
      nghttp2_session_resume_data(s_, stream_id);
    }
    flush_frames();
  }

  void flush_frames() {
    for (;;) {
      const uint8_t* data;
      ssize_t n = nghttp2_session_mem_send(s_, &data);
      if (n < 0) throw ProtocolError(nghttp2_strerror(static_cast<int>(n)));
      if (n == 0) break;
      out_.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
  }

  void emit(int kind, int32_t sid, py::object payload, int64_t n) {
    // Window updates, SETTINGS ACK and PING concern no message; anything else (a reset, a
    // GOAWAY, SETTINGS, a stream's own events) keeps its place after the pending messages.
    if (!pending_.empty() && kind != WINDOW && kind != SETTINGS_ACK && kind != PING) flush_pending();
    events_.append(py::make_tuple(kind, sid, std::move(payload), n));
  }

  static Session* self(void* user) { return static_cast<Session*>(user); }

  static ssize_t read_length(nghttp2_session* session, uint8_t, int32_t stream_id, int32_t session_window,
                             int32_t stream_window, uint32_t remote_max_frame, void*) {
    // Larger DATA frames than the 16 KiB default when the peer allows them (fewer frames).
    (void)session;
    (void)stream_id;
    return std::min<ssize_t>({session_window, stream_window, static_cast<ssize_t>(remote_max_frame)});
  }

  static ssize_t read_data(nghttp2_session*, int32_t stream_id, uint8_t* buf, size_t length, uint32_t* flags,
                           nghttp2_data_source*, void* user) {
    Session* me = self(user);
    auto it = me->out_streams_.find(stream_id);
    if (it == me->out_streams_.end()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      return 0;
    }
    Outgoing& out = it->second;
    size_t left = out.buffer.size() - out.offset;
    size_t n = std::min(length, left);
    std::memcpy(buf, out.buffer.data() + out.offset, n);
    out.offset += n;
    if (out.offset == out.buffer.size()) {
      out.buffer.clear();
      out.offset = 0;
      if (out.end) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        me->out_streams_.erase(it);
        return static_cast<ssize_t>(n);
      }
      if (n == 0) return NGHTTP2_ERR_DEFERRED;
    }
    return static_cast<ssize_t>(n);
  }

  static int on_begin_headers(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    Session* me = self(user);
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    int32_t sid = frame->hd.stream_id;
    if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
      if (me->inbound_.size() >= me->max_streams_) {
        // Refused before anything is handed on; nghttp2 still decodes the block (HPACK).
        me->reset_by_us_.insert(sid);
        nghttp2_submit_rst_stream(me->s_, NGHTTP2_FLAG_NONE, sid, NGHTTP2_REFUSED_STREAM);
        return 0;
      }
      me->inbound_.insert(sid);
    }
    me->headers_[sid] = py::list();
    me->header_bytes_[sid] = 0;
    return 0;
  }

  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                       const uint8_t* value, size_t valuelen, uint8_t, void* user) {
    Session* me = self(user);
    // RFC 9113 §6.5.2 counts 32 bytes per field on top of its name and value. Past the
    // bound the connection ends (as with the pure-Python path): the header block was decoded
    // into memory already, and a peer that ignores our SETTINGS is not served on.
    size_t& total = me->header_bytes_[frame->hd.stream_id];
    total += namelen + valuelen + 32;
    if (total > me->max_header_list_) {
      nghttp2_session_terminate_session(me->s_, NGHTTP2_PROTOCOL_ERROR);
      return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    auto it = me->headers_.find(frame->hd.stream_id);
    if (it != me->headers_.end()) {
      it->second.append(py::make_tuple(py::bytes(reinterpret_cast<const char*>(name), namelen),
                                       py::bytes(reinterpret_cast<const char*>(value), valuelen)));
    }
    return 0;
  }

  static int on_data_chunk(nghttp2_session*, uint8_t, int32_t stream_id, const uint8_t* data, size_t len,
                           void* user) {
    Session* me = self(user);
    if (!me->pending_.empty()) {
      auto it = me->pending_.find(stream_id);
      if (it != me->pending_.end()) {
        it->second.body.append(reinterpret_cast<const char*>(data), len);
        it->second.length += static_cast<int64_t>(len);  // as a DATA event counts it (nghttp2 consumes padding)
        return 0;
      }
    }
    me->emit(DATA, stream_id, py::bytes(reinterpret_cast<const char*>(data), len), static_cast<int64_t>(len));
    return 0;
  }

  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    Session* me = self(user);
    int32_t sid = frame->hd.stream_id;
    bool ended = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    switch (frame->hd.type) {
      case NGHTTP2_HEADERS: {
        auto it = me->headers_.find(sid);
        if (it == me->headers_.end()) return 0;
        py::list fields = std::move(it->second);
        me->headers_.erase(it);
        me->header_bytes_.erase(sid);
        int kind = frame->headers.cat == NGHTTP2_HCAT_HEADERS ? TRAILERS : HEADERS;
        if (me->whole_ && kind == HEADERS) {
          if (ended) {
            me->events_.append(py::make_tuple(static_cast<int>(WHOLE), sid, fields, 0, py::bytes()));
          } else {
            Pending& p = me->pending_[sid];
            p.fields = std::move(fields);
            me->pending_order_.push_back(sid);
          }
          break;
        }
        me->emit(kind, sid, fields, ended);
        if (ended) me->emit(ENDED, sid, py::none(), 0);
        break;
      }
      case NGHTTP2_DATA: {
        if (!me->pending_.empty()) {
          auto it = me->pending_.find(sid);
          if (it != me->pending_.end()) {
            Pending& p = it->second;
            if (ended) {
              me->consumed_.emplace_back(sid, static_cast<size_t>(p.length));
              me->events_.append(py::make_tuple(static_cast<int>(WHOLE), sid, std::move(p.fields), p.length,
                                                py::bytes(p.body)));
              me->pending_.erase(it);
            }
            break;
          }
        }
        if (ended) me->emit(ENDED, sid, py::none(), 0);
        break;
      }
      case NGHTTP2_RST_STREAM:
        me->reported_.insert(sid);
        me->emit(RESET, sid, py::bool_(true), frame->rst_stream.error_code);
        break;
      case NGHTTP2_WINDOW_UPDATE:
        me->emit(WINDOW, sid, py::none(), frame->window_update.window_size_increment);
        break;
      case NGHTTP2_SETTINGS:
        if (frame->hd.flags & NGHTTP2_FLAG_ACK) {
          me->emit(SETTINGS_ACK, 0, py::none(), 0);
        } else {
          py::dict changed;
          for (size_t i = 0; i < frame->settings.niv; ++i)
            changed[py::int_(frame->settings.iv[i].settings_id)] = py::int_(frame->settings.iv[i].value);
          me->emit(SETTINGS, 0, changed, 0);
        }
        break;
      case NGHTTP2_GOAWAY:
        me->emit(GOAWAY, 0,
                 py::make_tuple(frame->goaway.last_stream_id,
                                py::bytes(reinterpret_cast<const char*>(frame->goaway.opaque_data),
                                          frame->goaway.opaque_data_len)),
                 frame->goaway.error_code);
        break;
      case NGHTTP2_PING:
        if (!(frame->hd.flags & NGHTTP2_FLAG_ACK))
          me->emit(PING, 0, py::bytes(reinterpret_cast<const char*>(frame->ping.opaque_data), 8), 0);
        break;
      default:
        break;
    }
    return 0;
  }

  static int on_stream_close(nghttp2_session*, int32_t stream_id, uint32_t error_code, void* user) {
    Session* me = self(user);
    me->headers_.erase(stream_id);
    me->header_bytes_.erase(stream_id);
    me->inbound_.erase(stream_id);
    me->out_streams_.erase(stream_id);
    bool ours = me->reset_by_us_.erase(stream_id) > 0;
    bool reported = me->reported_.erase(stream_id) > 0;
    // A stream nghttp2 itself reset (a stream error of the peer's) is told to the adapter,
    // which may hold a request or response on it.
    if (error_code != NGHTTP2_NO_ERROR && !ours && !reported) me->emit(RESET, stream_id, py::bool_(false), error_code);
    return 0;
  }
};

}  // namespace

PYBIND11_MODULE(_h2, m) {
  m.doc() = "HTTP/2 framing, HPACK and flow control in nghttp2 (sdcp_fast.transport.h2native wraps it)";
  m.attr("NGHTTP2_VERSION") = nghttp2_version(0)->version_str;
  auto protocol_error = py::register_exception<ProtocolError>(m, "ProtocolError");
  py::register_exception<StreamClosed>(m, "StreamClosed", protocol_error.ptr());
  py::class_<Session>(m, "Session")
      .def(py::init<bool>(), py::arg("client"))
      .def("submit_settings", &Session::submit_settings)
      .def("increment_window", &Session::increment_window)
      .def("receive", &Session::receive)
      .def("data_to_send", &Session::data_to_send)
      .def("set_whole_messages", &Session::set_whole_messages)
      .def("submit_headers", &Session::submit_headers)
      .def("send_message", &Session::send_message)
      .def("send_data", &Session::send_data)
      .def("end_stream", &Session::end_stream)
      .def("reset_stream", &Session::reset_stream)
      .def("terminate", &Session::terminate)
      .def("consume", &Session::consume)
      .def("send_window", &Session::send_window)
      .def("remote_setting", &Session::remote_setting)
      .def("next_stream_id", &Session::next_stream_id)
      .def("last_proc_stream_id", &Session::last_proc_stream_id)
      .def("stream_state", &Session::stream_state);
}
