// The SDCP CBOR codec of sdcp_fast/protocol/cbor.py, in C++: the same deterministic encoding
// (RFC 8949 §4.2.1) and the same strict, bounded decoding, check for check and message for
// message, so that either can stand in for the other (tests/protocol/test_cbor*.py run both on
// the same inputs). The Python module stays the reference: a rule changes there first.
//
// Every failure is sdcp_fast.protocol.problems.BadRequest (the protocol's problem), as there,
// raised with the Python codec's detail text. Byte and text strings are copied once, straight
// from the input buffer into their Python objects: no per-byte work in Python.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int MAX_DEPTH = 32;  // protocol/cbor.py MAX_DEPTH
enum Major { UINT = 0, NINT = 1, BSTR = 2, TSTR = 3, ARRAY = 4, MAP = 5, TAG = 6, SIMPLE = 7 };

PyObject* g_bad_request = nullptr;  // sdcp_fast.protocol.problems.BadRequest
PyObject* g_mapping = nullptr;      // collections.abc.Mapping

struct Failed {};  // a Python error is set; unwinds to the entry point

[[noreturn]] void fail(const std::string& detail) {
    PyObject* text = PyUnicode_FromStringAndSize(detail.data(), (Py_ssize_t)detail.size());
    if (text == nullptr) throw Failed{};
    PyObject* exc = PyObject_CallOneArg(g_bad_request, text);
    Py_DECREF(text);
    if (exc != nullptr) {
        PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    throw Failed{};
}

[[noreturn]] void fail_with(const char* prefix, PyObject* obj, const char* suffix, bool repr) {
    PyObject* text = repr ? PyObject_Repr(obj) : PyObject_Format(obj, nullptr);
    if (text == nullptr) throw Failed{};
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(text, &n);
    if (s == nullptr) {
        Py_DECREF(text);
        throw Failed{};
    }
    std::string detail = std::string(prefix) + std::string(s, (size_t)n) + suffix;
    Py_DECREF(text);
    fail(detail);
}

// An owned reference that is released on unwinding.
struct Ref {
    PyObject* p;
    explicit Ref(PyObject* obj) : p(obj) {
        if (p == nullptr) throw Failed{};
    }
    Ref(const Ref&) = delete;
    Ref& operator=(const Ref&) = delete;
    ~Ref() { Py_XDECREF(p); }
    PyObject* release() {
        PyObject* out = p;
        p = nullptr;
        return out;
    }
};

// -- encoding ----------------------------------------------------------------------------------

// The encoding is written straight into the bytes object it is returned in: grown by realloc
// (large blocks move by remapping, not copying) and cut to size at the end, so a large byte
// string is copied once, from the value into the result.
class Out {
  public:
    Out() : obj_(PyBytes_FromStringAndSize(nullptr, 256)), size_(0), cap_(256) {
        if (obj_ == nullptr) throw Failed{};
    }
    Out(const Out&) = delete;
    Out& operator=(const Out&) = delete;
    ~Out() { Py_XDECREF(obj_); }

    size_t size() const { return size_; }
    char* data() { return PyBytes_AS_STRING(obj_); }
    void resize(size_t n) { size_ = n; }  // only ever shrinks
    void push_back(char c) {
        reserve(1);
        data()[size_++] = c;
    }
    void append(const char* src, size_t n) {
        reserve(n);
        std::memcpy(data() + size_, src, n);
        size_ += n;
    }
    PyObject* finish() {
        if (_PyBytes_Resize(&obj_, (Py_ssize_t)size_) < 0) {
            obj_ = nullptr;
            throw Failed{};
        }
        PyObject* out = obj_;
        obj_ = nullptr;
        return out;
    }

  private:
    void reserve(size_t extra) {
        if (size_ + extra <= cap_) return;
        // Slack after a large string: the small items after it must not move it again.
        size_t cap = std::max(cap_ * 2, size_ + extra + 65536);
        if (cap > (size_t)PY_SSIZE_T_MAX) {
            PyErr_NoMemory();
            throw Failed{};
        }
        if (_PyBytes_Resize(&obj_, (Py_ssize_t)cap) < 0) {
            obj_ = nullptr;
            throw Failed{};
        }
        cap_ = cap;
    }

    PyObject* obj_;
    size_t size_, cap_;
};

void put_head(Out& out, int major, uint64_t arg) {
    const char mt = (char)(major << 5);
    if (arg < 24) {
        out.push_back((char)(mt | (char)arg));
    } else if (arg < 0x100) {
        out.push_back((char)(mt | 24));
        out.push_back((char)arg);
    } else if (arg < 0x10000) {
        char b[3] = {(char)(mt | 25), (char)(arg >> 8), (char)arg};
        out.append(b, 3);
    } else if (arg < 0x100000000ULL) {
        char b[5] = {(char)(mt | 26), (char)(arg >> 24), (char)(arg >> 16), (char)(arg >> 8), (char)arg};
        out.append(b, 5);
    } else {
        char b[9];
        b[0] = (char)(mt | 27);
        for (int i = 0; i < 8; ++i) b[1 + i] = (char)(arg >> (56 - 8 * i));
        out.append(b, 9);
    }
}

// Appends an int's head; false (no error set) when it is outside [-2**64, 2**64 - 1].
bool put_int(Out& out, PyObject* value) {
    int overflow = 0;
    long long small = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow == 0) {
        if (small == -1 && PyErr_Occurred()) throw Failed{};
        if (small >= 0) put_head(out, UINT, (uint64_t)small);
        else put_head(out, NINT, (uint64_t)(-1 - small));
        return true;
    }
    if (overflow > 0) {
        unsigned long long big = PyLong_AsUnsignedLongLong(value);
        if (big == (unsigned long long)-1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw Failed{};
            PyErr_Clear();
            return false;
        }
        put_head(out, UINT, big);
        return true;
    }
    Ref inverted(PyNumber_Invert(value));  // -1 - value, >= 0 here
    unsigned long long arg = PyLong_AsUnsignedLongLong(inverted.p);
    if (arg == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw Failed{};
        PyErr_Clear();
        return false;
    }
    put_head(out, NINT, arg);
    return true;
}

void put_bytes(Out& out, int major, const char* data, size_t n) {
    put_head(out, major, n);
    out.append(data, n);
}

void encode(PyObject* value, Out& out, int depth);

// A plain non-negative int below 2**64 inside an array: appended without the depth check, as
// the Python encoder's token-list fast path does. False when the item needs the general path.
bool put_plain_uint(Out& out, PyObject* item) {
    if (!PyLong_CheckExact(item)) return false;
    int overflow = 0;
    long long small = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow == 0 && small >= 0) {
        put_head(out, UINT, (uint64_t)small);
        return true;
    }
    if (overflow > 0) {
        unsigned long long big = PyLong_AsUnsignedLongLong(item);
        if (big == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return false;
        }
        put_head(out, UINT, big);
        return true;
    }
    return false;
}

struct Entry {
    size_t key_at, key_len, end;  // offsets into the scratch copy
};

using Pair = PyObject* (*)(PyObject*, Py_ssize_t, int);

// The entries in the order the Python encoder takes them (key, value, key, value, ...), then
// put in key order: this raises exactly the Python encoder's first error. Used when
// encode_map's one pass failed, to tell why.
void encode_map_in_order(PyObject* items, Py_ssize_t count, Pair get, Out& out, int depth) {
    const size_t base = out.size();
    std::vector<Entry> entries;
    entries.reserve((size_t)count);
    for (Py_ssize_t i = 0; i < count; ++i) {
        const size_t key_at = out.size() - base;
        encode(get(items, i, 0), out, depth + 1);
        const size_t key_len = out.size() - base - key_at;
        encode(get(items, i, 1), out, depth + 1);
        entries.push_back({key_at, key_len, out.size() - base});
    }
    const char* region = out.data() + base;
    auto key_less = [region](const Entry& a, const Entry& b) {
        int c = std::memcmp(region + a.key_at, region + b.key_at, std::min(a.key_len, b.key_len));
        return c != 0 ? c < 0 : a.key_len < b.key_len;
    };
    bool sorted = true;
    for (size_t i = 1; i < entries.size(); ++i) {
        if (!key_less(entries[i - 1], entries[i])) {
            sorted = false;
            break;
        }
    }
    if (sorted) return;
    std::string scratch(out.data() + base, out.size() - base);
    const char* src = scratch.data();
    auto less = [src](const Entry& a, const Entry& b) {
        int c = std::memcmp(src + a.key_at, src + b.key_at, std::min(a.key_len, b.key_len));
        return c != 0 ? c < 0 : a.key_len < b.key_len;
    };
    std::stable_sort(entries.begin(), entries.end(), less);
    for (size_t i = 1; i < entries.size(); ++i) {
        const Entry& a = entries[i - 1];
        const Entry& b = entries[i];
        if (a.key_len == b.key_len && std::memcmp(src + a.key_at, src + b.key_at, a.key_len) == 0)
            fail("map has two keys with the same encoding");
    }
    out.resize(base);
    for (const Entry& e : entries) out.append(src + e.key_at, e.end - e.key_at);
}

// Above zero while a map is encoded again in the Python encoder's order: the maps inside it
// go straight to that order too. Each map retrying on its own would encode a value nested d
// maps deep 2**d times (a map too deep to encode, d = 33, never finished). Any encoder that
// reads it above zero still writes the same bytes and raises the same error, only slower.
int g_in_order = 0;

struct InOrder {
    InOrder() { ++g_in_order; }
    ~InOrder() { --g_in_order; }
};

// The keys first (small), sorted; then each value written once, after its key, in key order,
// so no large value is moved to sort the map. Any failure, or two keys with one encoding,
// starts over in the Python encoder's order, which raises what it would raise.
void encode_map(PyObject* items, Py_ssize_t count, Pair get, Out& out, int depth) {
    put_head(out, MAP, (uint64_t)count);
    const size_t base = out.size();
    if (g_in_order > 0) {
        encode_map_in_order(items, count, get, out, depth);
        return;
    }
    std::vector<std::string> keys;
    std::vector<Py_ssize_t> order;
    bool ok = true;
    try {
        keys.reserve((size_t)count);
        for (Py_ssize_t i = 0; i < count; ++i) {
            encode(get(items, i, 0), out, depth + 1);
            keys.emplace_back(out.data() + base, out.size() - base);
            out.resize(base);
            order.push_back(i);
        }
        std::stable_sort(order.begin(), order.end(), [&keys](Py_ssize_t a, Py_ssize_t b) {
            return keys[(size_t)a] < keys[(size_t)b];  // bytewise: std::string compares unsigned chars
        });
        for (size_t i = 1; ok && i < order.size(); ++i) ok = keys[(size_t)order[i - 1]] != keys[(size_t)order[i]];
        for (size_t i = 0; ok && i < order.size(); ++i) {
            const std::string& key = keys[(size_t)order[i]];
            out.append(key.data(), key.size());
            encode(get(items, order[i], 1), out, depth + 1);
        }
    } catch (const Failed&) {
        if (!PyErr_Occurred()) throw;
        PyErr_Clear();
        ok = false;
    }
    if (ok) return;
    out.resize(base);
    const InOrder in_order;
    encode_map_in_order(items, count, get, out, depth);
}

PyObject* dict_pair(PyObject* pairs, Py_ssize_t i, int which) {
    return PyTuple_GET_ITEM(PyList_GET_ITEM(pairs, i), which);
}

PyObject* mapping_pair(PyObject* pairs, Py_ssize_t i, int which) {
    PyObject* pair = PyList_GET_ITEM(pairs, i);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_ValueError, "items() must give (key, value) pairs");
        throw Failed{};
    }
    return PyTuple_GET_ITEM(pair, which);
}

void encode(PyObject* value, Out& out, int depth) {
    if (depth > MAX_DEPTH) fail("value nested too deeply to encode");
    if (value == Py_False) {
        out.push_back((char)0xf4);
    } else if (value == Py_True) {
        out.push_back((char)0xf5);
    } else if (value == Py_None) {
        out.push_back((char)0xf6);
    } else if (PyLong_Check(value)) {
        if (!put_int(out, value)) fail_with("integer ", value, " is outside the CBOR 64-bit range", false);
    } else if (PyBytes_Check(value)) {
        put_bytes(out, BSTR, PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value));
    } else if (PyByteArray_Check(value)) {
        put_bytes(out, BSTR, PyByteArray_AS_STRING(value), (size_t)PyByteArray_GET_SIZE(value));
    } else if (PyMemoryView_Check(value)) {
        Py_buffer view;
        if (PyObject_GetBuffer(value, &view, PyBUF_SIMPLE) == 0) {
            put_bytes(out, BSTR, (const char*)view.buf, (size_t)view.len);
            PyBuffer_Release(&view);
        } else {  // not contiguous: bytes() gathers it, as the Python encoder does
            PyErr_Clear();
            Ref raw(PyBytes_FromObject(value));
            put_bytes(out, BSTR, PyBytes_AS_STRING(raw.p), (size_t)PyBytes_GET_SIZE(raw.p));
        }
    } else if (PyUnicode_Check(value)) {
        Py_ssize_t n = 0;
        const char* s = PyUnicode_AsUTF8AndSize(value, &n);
        if (s == nullptr) {  // lone surrogates have no UTF-8 form
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) throw Failed{};
            PyErr_Clear();
            fail("text is not valid Unicode");
        }
        put_bytes(out, TSTR, s, (size_t)n);
    } else if (PyList_Check(value) || PyTuple_Check(value)) {
        Ref items(PySequence_Fast(value, "not a sequence"));  // the list or tuple itself
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(items.p);
        put_head(out, ARRAY, (uint64_t)n);
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* item = PySequence_Fast_GET_ITEM(items.p, i);
            if (!put_plain_uint(out, item)) encode(item, out, depth + 1);
        }
    } else if (PyDict_Check(value)) {
        Ref pairs(PyDict_Items(value));
        encode_map(pairs.p, PyList_GET_SIZE(pairs.p), dict_pair, out, depth);
    } else {
        int is_mapping = PyObject_IsInstance(value, g_mapping);
        if (is_mapping < 0) throw Failed{};
        if (is_mapping) {
            Ref pairs(PyMapping_Items(value));
            encode_map(pairs.p, PyList_GET_SIZE(pairs.p), mapping_pair, out, depth);
        } else {
            Ref name(PyObject_GetAttrString((PyObject*)Py_TYPE(value), "__name__"));
            fail_with("", name.p, " has no SDCP CBOR encoding", false);
        }
    }
}

// -- decoding ----------------------------------------------------------------------------------

struct Head {
    int major, info;
    uint64_t arg;
    bool indefinite;
};

char break_marker;
PyObject* const BREAK = reinterpret_cast<PyObject*>(&break_marker);  // a marker, never a real object

struct Reader {
    const unsigned char* buf;
    size_t len, pos;
    // decode_members only: the GIL is let go after every this many array items built, so a
    // long token list never holds other threads for more than a moment (0: never).
    uint64_t yield_every = 0;

    const unsigned char* take(uint64_t n) {
        if (n > len - pos) fail("CBOR input ends inside a data item");
        const unsigned char* at = buf + pos;
        pos += (size_t)n;
        return at;
    }

    Head head() {
        if (pos >= len) fail("CBOR input ends before a data item");
        const unsigned char initial = buf[pos++];
        Head h{initial >> 5, initial & 0x1f, 0, false};
        if (h.info < 24) {
            h.arg = (uint64_t)h.info;
        } else if (h.info <= 27) {
            const unsigned char* b = take(1ULL << (h.info - 24));
            for (int i = 0; i < (1 << (h.info - 24)); ++i) h.arg = h.arg << 8 | b[i];
        } else if (h.info == 31) {
            h.indefinite = true;
        } else {
            fail("reserved additional information " + std::to_string(h.info) + " in CBOR head");
        }
        return h;
    }

    uint64_t length(uint64_t arg, uint64_t unit) {
        // Each element needs at least ``unit`` more input bytes: refuse before allocating.
        if (arg > (len - pos) / unit) fail("CBOR length exceeds the input");
        return arg;
    }

    PyObject* item(int depth) {
        PyObject* value = item_or_break(depth);
        if (value == BREAK) fail("CBOR break code outside an indefinite-length item");
        return value;
    }

    static PyObject* text(const unsigned char* s, size_t n, const char* detail) {
        PyObject* out = PyUnicode_DecodeUTF8((const char*)s, (Py_ssize_t)n, "strict");
        if (out == nullptr) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) throw Failed{};
            PyErr_Clear();
            fail(detail);
        }
        return out;
    }

    // A new reference, or BREAK.
    PyObject* item_or_break(int depth) {
        if (depth > MAX_DEPTH) fail("CBOR nesting too deep");
        const Head h = head();
        switch (h.major) {
            case UINT:
            case NINT:
                if (h.indefinite) fail("indefinite length on an integer");
                if (h.major == UINT) return check(PyLong_FromUnsignedLongLong(h.arg));
                if (h.arg <= (uint64_t)INT64_MAX) return check(PyLong_FromLongLong(-1 - (long long)h.arg));
                {
                    Ref arg(PyLong_FromUnsignedLongLong(h.arg));
                    return check(PyNumber_Invert(arg.p));
                }
            case BSTR:
            case TSTR: {
                if (h.indefinite) return chunks(h.major);
                const unsigned char* s = take(h.arg);
                if (h.major == BSTR) return check(PyBytes_FromStringAndSize((const char*)s, (Py_ssize_t)h.arg));
                return text(s, (size_t)h.arg, "CBOR text string is not valid UTF-8");
            }
            case ARRAY:
                return h.indefinite ? indefinite_array(depth) : array(length(h.arg, 1), depth);
            case MAP:
                return map(h, depth);
            case TAG:
                fail("CBOR tags are not used by SDCP");
            default:
                break;
        }
        switch (h.info) {
            case 20: Py_RETURN_FALSE;
            case 21: Py_RETURN_TRUE;
            case 22: Py_RETURN_NONE;
            case 31: return BREAK;
            case 25: case 26: case 27: fail("floating-point numbers are not used by SDCP");
            default: fail("CBOR simple value " + std::to_string(h.arg) + " is not used by SDCP");
        }
    }

    static PyObject* check(PyObject* obj) {
        if (obj == nullptr) throw Failed{};
        return obj;
    }

    PyObject* array(uint64_t count, int depth) {
        if (count && depth >= MAX_DEPTH) fail("CBOR nesting too deep");
        // Room for at most 64 Ki items up front, then grown as items arrive: a head that claims
        // millions of items costs memory only for those the input really holds.
        const uint64_t ready = std::min<uint64_t>(count, 1 << 16);
        Ref items(PyList_New((Py_ssize_t)ready));
        for (uint64_t i = 0; i < count; ++i) {
            PyObject* value;
            if (pos < len && buf[pos] < 24) {  // token lists dominate: small uints skip item()
                value = check(PyLong_FromLong(buf[pos]));
                ++pos;
            } else {
                value = item(depth + 1);
            }
            if (yield_every && i % yield_every == yield_every - 1) {
                Py_BEGIN_ALLOW_THREADS
                Py_END_ALLOW_THREADS
            }
            if (i < ready) {
                PyList_SET_ITEM(items.p, (Py_ssize_t)i, value);
            } else {
                int rc = PyList_Append(items.p, value);
                Py_DECREF(value);
                if (rc < 0) throw Failed{};
            }
        }
        return items.release();
    }

    PyObject* indefinite_array(int depth) {
        Ref items(PyList_New(0));
        for (;;) {
            PyObject* value = item_or_break(depth + 1);
            if (value == BREAK) return items.release();
            int rc = PyList_Append(items.p, value);
            Py_DECREF(value);
            if (rc < 0) throw Failed{};
        }
    }

    void entry(PyObject* result, PyObject* key_owned, int depth) {
        Ref key(key_owned);
        if (!(PyLong_CheckExact(key.p) || PyUnicode_CheckExact(key.p) || PyBytes_CheckExact(key.p)))
            fail("CBOR map key must be an integer, text or byte string");
        int present = PyDict_Contains(result, key.p);
        if (present < 0) throw Failed{};
        if (present) fail_with("duplicate CBOR map key ", key.p, "", true);
        Ref value(item(depth + 1));
        if (PyDict_SetItem(result, key.p, value.p) < 0) throw Failed{};
    }

    PyObject* map(const Head& h, int depth) {
        Ref result(PyDict_New());
        if (!h.indefinite) {
            const uint64_t count = length(h.arg, 2);
            for (uint64_t i = 0; i < count; ++i) entry(result.p, item(depth + 1), depth);
        } else {
            for (;;) {
                PyObject* key = item_or_break(depth + 1);
                if (key == BREAK) break;
                entry(result.p, key, depth);
            }
        }
        return result.release();
    }

    // An indefinite-length string: definite chunks of the same major type, then break.
    PyObject* chunks(int major) {
        std::string joined;
        for (;;) {
            if (pos < len && buf[pos] == 0xff) {
                ++pos;
                if (major == BSTR) return check(PyBytes_FromStringAndSize(joined.data(), (Py_ssize_t)joined.size()));
                return text((const unsigned char*)joined.data(), joined.size(), "CBOR text string is not valid UTF-8");
            }
            const Head c = head();
            if (c.major != major || c.indefinite) fail("bad chunk inside an indefinite-length string");
            const unsigned char* s = take(c.arg);
            if (major == TSTR) {
                // RFC 8949 §3.2.3: each chunk is valid UTF-8 on its own.
                Ref chunk(text(s, (size_t)c.arg, "CBOR text chunk is not valid UTF-8"));
            }
            joined.append((const char*)s, (size_t)c.arg);
        }
    }
};

// -- validating without building (decode_members) ----------------------------------------------

// The checks of Reader, with no Python object built and no Python API called, so they run with
// the GIL released: a record's members that the format ignores are checked, never built.
struct Invalid {
    std::string detail;
};

[[noreturn]] void invalid(const std::string& detail) { throw Invalid{detail}; }

// Strict UTF-8 as Python's decoder takes it: no overlong forms, no surrogates, nothing past U+10FFFF.
bool valid_utf8(const unsigned char* s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const unsigned char c = s[i];
        if (c < 0x80) {
            ++i;
            continue;
        }
        size_t more;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) {
            more = 1, cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            more = 2, cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            more = 3, cp = c & 0x07;
        } else {
            return false;
        }
        if (more > n - i - 1) return false;
        for (size_t k = 1; k <= more; ++k) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if ((more == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (more == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return false;
        i += more + 1;
    }
    return true;
}

struct Checker {
    const unsigned char* buf;
    size_t len, pos;
    uint64_t items = 0;  // data items checked (break codes not counted)

    const unsigned char* take(uint64_t n) {
        if (n > len - pos) invalid("CBOR input ends inside a data item");
        const unsigned char* at = buf + pos;
        pos += (size_t)n;
        return at;
    }

    Head head() {
        if (pos >= len) invalid("CBOR input ends before a data item");
        const unsigned char initial = buf[pos++];
        Head h{initial >> 5, initial & 0x1f, 0, false};
        if (h.info < 24) {
            h.arg = (uint64_t)h.info;
        } else if (h.info <= 27) {
            const unsigned char* b = take(1ULL << (h.info - 24));
            for (int i = 0; i < (1 << (h.info - 24)); ++i) h.arg = h.arg << 8 | b[i];
        } else if (h.info == 31) {
            h.indefinite = true;
        } else {
            invalid("reserved additional information " + std::to_string(h.info) + " in CBOR head");
        }
        return h;
    }

    uint64_t length(uint64_t arg, uint64_t unit) {
        if (arg > (len - pos) / unit) invalid("CBOR length exceeds the input");
        return arg;
    }

    void item(int depth, std::string* key = nullptr) {
        if (!item_or_break(depth, key)) invalid("CBOR break code outside an indefinite-length item");
    }

    // False for a break code. ``key``: where a map key's identity goes (its type and value).
    bool item_or_break(int depth, std::string* key = nullptr) {
        if (depth > MAX_DEPTH) invalid("CBOR nesting too deep");
        const Head h = head();
        if (!(h.major == SIMPLE && h.info == 31)) ++items;
        switch (h.major) {
            case UINT:
            case NINT:
                if (h.indefinite) invalid("indefinite length on an integer");
                if (key) *key = std::string(1, (char)(h.major == UINT ? 'i' : 'n')) + std::to_string(h.arg);
                return true;
            case BSTR:
            case TSTR: {
                std::string joined;
                if (h.indefinite) {
                    chunks(h.major, key ? &joined : nullptr);
                } else {
                    const unsigned char* s = take(h.arg);
                    if (h.major == TSTR && !valid_utf8(s, (size_t)h.arg)) invalid("CBOR text string is not valid UTF-8");
                    if (key) joined.assign((const char*)s, (size_t)h.arg);
                }
                if (key) *key = (h.major == BSTR ? "b" : "t") + joined;
                return true;
            }
            case ARRAY:
                if (h.indefinite) {
                    while (item_or_break(depth + 1)) {
                    }
                } else {
                    const uint64_t count = length(h.arg, 1);
                    if (count && depth >= MAX_DEPTH) invalid("CBOR nesting too deep");
                    for (uint64_t i = 0; i < count; ++i) item(depth + 1);
                }
                break;
            case MAP:
                map(h, depth);
                break;
            case TAG:
                invalid("CBOR tags are not used by SDCP");
            default:
                switch (h.info) {
                    case 20: case 21: case 22: break;
                    case 31: return false;
                    case 25: case 26: case 27: invalid("floating-point numbers are not used by SDCP");
                    default: invalid("CBOR simple value " + std::to_string(h.arg) + " is not used by SDCP");
                }
                if (key) invalid("CBOR map key must be an integer, text or byte string");
                return true;
        }
        if (key) invalid("CBOR map key must be an integer, text or byte string");
        return true;
    }

    // One key and its value; false at the break of an indefinite map. ``seen`` holds the keys
    // so far (duplicates are refused, as by Reader); the value's start and end go to ``value``.
    bool entry(int depth, std::vector<std::string>& seen, std::string& key, size_t* value_at) {
        if (!item_or_break(depth + 1, &key)) return false;
        if (std::find(seen.begin(), seen.end(), key) != seen.end()) invalid("duplicate CBOR map key");
        seen.push_back(key);
        if (value_at) *value_at = pos;
        item(depth + 1);
        return true;
    }

    void map(const Head& h, int depth) {
        std::vector<std::string> seen;  // empty maps, the common hostile case, allocate nothing
        std::string key;
        const uint64_t count = h.indefinite ? UINT64_MAX : length(h.arg, 2);
        for (uint64_t i = 0; i < count; ++i) {
            key.clear();
            if (!entry(depth, seen, key, nullptr)) {
                if (!h.indefinite) invalid("CBOR break code outside an indefinite-length item");
                break;
            }
        }
    }

    void chunks(int major, std::string* joined) {
        for (;;) {
            if (pos < len && buf[pos] == 0xff) {
                ++pos;
                if (major == TSTR && joined && !valid_utf8((const unsigned char*)joined->data(), joined->size()))
                    invalid("CBOR text string is not valid UTF-8");
                return;
            }
            const Head c = head();
            if (c.major != major || c.indefinite) invalid("bad chunk inside an indefinite-length string");
            const unsigned char* s = take(c.arg);
            if (major == TSTR && !valid_utf8(s, (size_t)c.arg)) invalid("CBOR text chunk is not valid UTF-8");
            if (joined) joined->append((const char*)s, (size_t)c.arg);
        }
    }
};

// The input's bytes for the length of a call: a buffer of bytes/bytearray/memoryview, or a
// gathered copy of a memoryview that is not contiguous. Decoding runs no Python code, so the
// bytes cannot change under the reader.
struct Input {
    Py_buffer view{};
    bool held = false;
    PyObject* copy = nullptr;

    explicit Input(PyObject* data) {
        if (!(PyBytes_Check(data) || PyByteArray_Check(data) || PyMemoryView_Check(data)))
            fail("CBOR input must be bytes");
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) == 0) {
            held = true;
            return;
        }
        PyErr_Clear();
        copy = PyBytes_FromObject(data);
        if (copy == nullptr) throw Failed{};
    }
    ~Input() {
        if (held) PyBuffer_Release(&view);
        Py_XDECREF(copy);
    }
    Reader reader(size_t pos) const {
        if (held) return Reader{(const unsigned char*)view.buf, (size_t)view.len, pos};
        return Reader{(const unsigned char*)PyBytes_AS_STRING(copy), (size_t)PyBytes_GET_SIZE(copy), pos};
    }
};

py::object steal(PyObject* obj) { return py::reinterpret_steal<py::object>(obj); }

py::object py_encode(py::handle value) {
    try {
        Out out;
        encode(value.ptr(), out, 0);
        return steal(out.finish());
    } catch (const Failed&) {
        throw py::error_already_set();
    }
}

py::object py_decode(py::handle data) {
    try {
        Input input(data.ptr());
        Reader reader = input.reader(0);
        Ref value(reader.item(0));
        if (reader.pos != reader.len)
            fail(std::to_string(reader.len - reader.pos) + " bytes after the CBOR data item");
        return steal(value.release());
    } catch (const Failed&) {
        throw py::error_already_set();
    }
}

// One item of a sequence at ``pos``: (item, where the next one starts).
py::tuple py_decode_at(py::handle data, size_t pos) {
    try {
        Input input(data.ptr());
        Reader reader = input.reader(pos);
        if (pos > reader.len) fail("CBOR input ends before a data item");
        Ref value(reader.item(0));
        return py::make_tuple(steal(value.release()), reader.pos);
    } catch (const Failed&) {
        throw py::error_already_set();
    }
}

// The single CBOR data item in ``data``, checked whole as decode checks it but with the GIL
// released, and built only where it is a map's member named in ``keys`` (text keys): a dict of
// those members, or None when the item is not a map. The members built may hold at most
// ``max_items`` data items between them. Only bytes are taken: they cannot change while the
// GIL is released.
py::object py_decode_members(py::handle data, const std::vector<std::string>& keys, uint64_t max_items) {
    try {
        if (!PyBytes_Check(data.ptr())) fail("CBOR input must be bytes");
        const unsigned char* buf = (const unsigned char*)PyBytes_AS_STRING(data.ptr());
        const size_t len = (size_t)PyBytes_GET_SIZE(data.ptr());
        std::vector<std::pair<size_t, size_t>> wanted;  // (key index, value start)
        std::string error;
        bool is_map = false;
        uint64_t built = 0;
        {
            py::gil_scoped_release unlocked;
            try {
                Checker c{buf, len, 0};
                if (len && buf[0] >> 5 == MAP) {
                    is_map = true;
                    const Head h = c.head();
                    std::vector<std::string> seen;
                    std::string key;
                    const uint64_t count = h.indefinite ? UINT64_MAX : c.length(h.arg, 2);
                    for (uint64_t i = 0; i < count; ++i) {
                        key.clear();
                        size_t value_at = 0;
                        const uint64_t before = c.items;
                        if (!c.entry(0, seen, key, &value_at)) {
                            if (!h.indefinite) invalid("CBOR break code outside an indefinite-length item");
                            break;
                        }
                        for (size_t k = 0; k < keys.size(); ++k) {
                            if (key.size() == keys[k].size() + 1 && key[0] == 't' && key.compare(1, std::string::npos, keys[k]) == 0) {
                                wanted.emplace_back(k, value_at);
                                built += c.items - before - 1;  // the value's items, not its key
                            }
                        }
                    }
                } else {
                    c.item(0);
                }
                if (c.pos != c.len) invalid(std::to_string(c.len - c.pos) + " bytes after the CBOR data item");
            } catch (const Invalid& exc) {
                error = exc.detail;
            }
        }
        if (!error.empty()) fail(error);
        if (built > max_items)
            fail("the record's members hold " + std::to_string(built) + " data items; at most " + std::to_string(max_items));
        if (!is_map) return py::none();
        Ref result(PyDict_New());
        for (const auto& [k, at] : wanted) {
            Reader reader{buf, len, at};
            reader.yield_every = 1 << 16;
            Ref value(reader.item(1));
            Ref name(PyUnicode_FromStringAndSize(keys[k].data(), (Py_ssize_t)keys[k].size()));
            if (PyDict_SetItem(result.p, name.p, value.p) < 0) throw Failed{};
        }
        return steal(result.release());
    } catch (const Failed&) {
        throw py::error_already_set();
    }
}

// True when ``values`` is a list or tuple of plain ints in [0, 2**64): a token list that needs
// no check per item (protocol/cbor.py py_all_uints is the same test).
bool py_all_uints(py::handle values) {
    PyObject* seq = values.ptr();
    if (!(PyList_Check(seq) || PyTuple_Check(seq))) return false;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyLong_CheckExact(item)) return false;
        unsigned long long v = PyLong_AsUnsignedLongLong(item);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();  // negative or >= 2**64
            return false;
        }
    }
    return true;
}

// -- messages (sdcp_fast/protocol/message_codec.py) --------------------------------------------

// A message class's member table, compiled once: each member's wire key and CDDL type, for the
// generated fast path of message_codec.py in C. As there, it takes only values that plainly
// pass (an int of the exact type in range, bytes of the size, a definite-length map of text
// keys, ...) and answers None for anything else, with no error set: the Python path then runs
// from the start, so every error, problem and edge value comes out exactly as it would there.
enum MemberKind { K_UINT = 0, K_BSTR = 1, K_TSTR = 2, K_BOOL = 3, K_UINTS = 4, K_NESTED = 5, K_OTHER = 6 };

struct MessageCodec;

struct MemberSpec {
    PyObject* attr = nullptr;  // the attribute's name (interned)
    std::string wire;          // the key's UTF-8 bytes
    std::string key;           // the key as encoded: head, then the bytes
    int kind = K_OTHER;
    bool optional = false;
    uint64_t lo = 0, hi = UINT64_MAX;
    bool has_only = false;
    std::vector<uint64_t> only;
    Py_ssize_t size = -1;  // Bstr: the size, -1 any
    bool nonempty = false;
    PyObject* nested_capsule = nullptr;  // K_NESTED: the member class's codec, kept alive here
    MessageCodec* nested = nullptr;
    bool nested_strict = false;
    PyObject* kind_obj = nullptr;  // K_OTHER: the Kind whose parse/dump runs
};

struct MessageCodec {
    PyObject* cls = nullptr;
    bool strict = false;
    bool make_new = false;  // object.__new__ and the __dict__ filled, as the generated parse does
    std::vector<MemberSpec> members;
    std::vector<size_t> dump_order;  // members in RFC 8949 §4.2.1 key order

    ~MessageCodec() {
        Py_XDECREF(cls);
        for (MemberSpec& m : members) {
            Py_XDECREF(m.attr);
            Py_XDECREF(m.nested_capsule);
            Py_XDECREF(m.kind_obj);
        }
    }
};

struct NotPlain {};  // the fast path declines; no Python error is left set

constexpr const char* CODEC_CAPSULE = "sdcp_fast.protocol._cbor_native.MessageCodec";
PyObject* g_empty_tuple = nullptr;
PyObject* g_parse_name = nullptr;
PyObject* g_dump_name = nullptr;

void codec_free(PyObject* capsule) {
    delete static_cast<MessageCodec*>(PyCapsule_GetPointer(capsule, CODEC_CAPSULE));
}

uint64_t as_u64(PyObject* value) {
    unsigned long long v = PyLong_AsUnsignedLongLong(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) throw Failed{};
    return v;
}

// compile_message(cls, strict, make_new, members): members is a sequence of tuples
// (attr, wire, kind, optional, lo, hi, only or None, size or -1, nonempty, nested codec or None,
// nested strict, kind object).
py::object py_compile_message(py::handle cls, bool strict, bool make_new, py::handle members) {
    try {
        auto codec = std::make_unique<MessageCodec>();
        codec->cls = Py_NewRef(cls.ptr());
        codec->strict = strict;
        codec->make_new = make_new;
        Ref seq(PySequence_Fast(members.ptr(), "members must be a sequence"));
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.p);
        if (n > 23) throw std::invalid_argument("at most 23 members");  // the map head is one byte
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* t = PySequence_Fast_GET_ITEM(seq.p, i);
            if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 12) throw std::invalid_argument("member spec");
            codec->members.emplace_back();
            MemberSpec& m = codec->members.back();
            m.attr = Py_NewRef(PyTuple_GET_ITEM(t, 0));
            PyUnicode_InternInPlace(&m.attr);
            Py_ssize_t wn = 0;
            const char* w = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(t, 1), &wn);
            if (w == nullptr) throw Failed{};
            m.wire.assign(w, (size_t)wn);
            m.kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 2));
            m.optional = PyObject_IsTrue(PyTuple_GET_ITEM(t, 3)) == 1;
            m.lo = as_u64(PyTuple_GET_ITEM(t, 4));
            m.hi = as_u64(PyTuple_GET_ITEM(t, 5));
            PyObject* only = PyTuple_GET_ITEM(t, 6);
            if (only != Py_None) {
                m.has_only = true;
                Ref values(PySequence_Fast(only, "only must be a sequence"));
                for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(values.p); ++k)
                    m.only.push_back(as_u64(PySequence_Fast_GET_ITEM(values.p, k)));
            }
            m.size = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 7));
            m.nonempty = PyObject_IsTrue(PyTuple_GET_ITEM(t, 8)) == 1;
            PyObject* nested = PyTuple_GET_ITEM(t, 9);
            if (nested != Py_None) {
                void* p = PyCapsule_GetPointer(nested, CODEC_CAPSULE);
                if (p == nullptr) throw Failed{};
                m.nested_capsule = Py_NewRef(nested);
                m.nested = static_cast<MessageCodec*>(p);
            }
            m.nested_strict = PyObject_IsTrue(PyTuple_GET_ITEM(t, 10)) == 1;
            m.kind_obj = Py_NewRef(PyTuple_GET_ITEM(t, 11));
            if (PyErr_Occurred()) throw Failed{};
            if (m.kind < K_UINT || m.kind > K_OTHER || (m.kind == K_NESTED && m.nested == nullptr))
                throw std::invalid_argument("member kind");
            Out key;
            put_bytes(key, TSTR, m.wire.data(), m.wire.size());
            m.key.assign(key.data(), key.size());
        }
        for (size_t i = 0; i < codec->members.size(); ++i) codec->dump_order.push_back(i);
        std::sort(codec->dump_order.begin(), codec->dump_order.end(), [&codec](size_t a, size_t b) {
            return codec->members[a].key < codec->members[b].key;
        });
        PyObject* capsule = PyCapsule_New(codec.get(), CODEC_CAPSULE, codec_free);
        if (capsule == nullptr) throw Failed{};
        codec.release();
        return steal(capsule);
    } catch (const Failed&) {
        throw py::error_already_set();
    }
}

// -- dump: the attributes straight to deterministic CBOR ------------------------------------------

// A plain int of the exact type in [lo, hi] (and in ``only``): its value, else NotPlain.
uint64_t plain_uint(PyObject* v, uint64_t lo, uint64_t hi) {
    if (!PyLong_CheckExact(v)) throw NotPlain{};
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();  // negative or >= 2**64
        throw NotPlain{};
    }
    if (x < lo || x > hi) throw NotPlain{};
    return x;
}

bool in_only(const MemberSpec& m, uint64_t x) {
    return !m.has_only || std::find(m.only.begin(), m.only.end(), x) != m.only.end();
}

void dump_message(const MessageCodec& codec, PyObject* obj, Out& out, int depth);

void dump_member(const MemberSpec& m, PyObject* v, Out& out, int depth) {
    switch (m.kind) {
        case K_UINT: {
            const uint64_t x = plain_uint(v, m.lo, m.hi);
            if (!in_only(m, x)) throw NotPlain{};
            put_head(out, UINT, x);
            return;
        }
        case K_BSTR:
            if (!PyBytes_CheckExact(v) || (m.size >= 0 && PyBytes_GET_SIZE(v) != m.size)) throw NotPlain{};
            put_bytes(out, BSTR, PyBytes_AS_STRING(v), (size_t)PyBytes_GET_SIZE(v));
            return;
        case K_TSTR: {
            if (!PyUnicode_CheckExact(v)) throw NotPlain{};
            Py_ssize_t n = 0;
            const char* s = PyUnicode_AsUTF8AndSize(v, &n);
            if (s == nullptr) {  // lone surrogates: the Python path raises the encoder's problem
                PyErr_Clear();
                throw NotPlain{};
            }
            put_bytes(out, TSTR, s, (size_t)n);
            return;
        }
        case K_BOOL:
            if (v == Py_True) out.push_back((char)0xf5);
            else if (v == Py_False) out.push_back((char)0xf4);
            else throw NotPlain{};
            return;
        case K_UINTS: {
            // As the generated dump: a tuple (a list is the walk's to take).
            if (!PyTuple_CheckExact(v)) throw NotPlain{};
            const Py_ssize_t n = PyTuple_GET_SIZE(v);
            if (m.nonempty && n == 0) throw NotPlain{};
            put_head(out, ARRAY, (uint64_t)n);
            for (Py_ssize_t i = 0; i < n; ++i) put_head(out, UINT, plain_uint(PyTuple_GET_ITEM(v, i), 0, UINT64_MAX));
            return;
        }
        case K_NESTED:
            if ((PyObject*)Py_TYPE(v) != m.nested->cls) throw NotPlain{};
            dump_message(*m.nested, v, out, depth);
            return;
        default: {
            PyObject* dumped = PyObject_CallMethodOneArg(m.kind_obj, g_dump_name, v);
            if (dumped == nullptr) {
                PyErr_Clear();
                throw NotPlain{};
            }
            Ref held(dumped);
            try {
                encode(held.p, out, depth);
            } catch (const Failed&) {
                PyErr_Clear();
                throw NotPlain{};
            }
        }
    }
}

void dump_message(const MessageCodec& codec, PyObject* obj, Out& out, int depth) {
    const size_t head_at = out.size();
    out.push_back((char)(MAP << 5));  // the count is filled in below: at most 23 members
    int count = 0;
    for (size_t i : codec.dump_order) {
        const MemberSpec& m = codec.members[i];
        PyObject* v = PyObject_GetAttr(obj, m.attr);
        if (v == nullptr) {
            PyErr_Clear();
            throw NotPlain{};
        }
        Ref held(v);
        if (v == Py_None) {
            if (m.optional) continue;
            throw NotPlain{};
        }
        out.append(m.key.data(), m.key.size());
        dump_member(m, v, out, depth + 1);
        ++count;
    }
    out.data()[head_at] = (char)((MAP << 5) | count);
}

PyObject* dump_entry(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "dump_message(codec, message)");
        return nullptr;
    }
    auto* codec = static_cast<MessageCodec*>(PyCapsule_GetPointer(args[0], CODEC_CAPSULE));
    if (codec == nullptr) return nullptr;
    try {
        Out out;
        try {
            dump_message(*codec, args[1], out, 0);
        } catch (const NotPlain&) {
            Py_RETURN_NONE;
        }
        return out.finish();
    } catch (const Failed&) {
        return nullptr;
    }
}

// -- parse: the bytes straight to the message ------------------------------------------------------

// Reads a proposal's bytes as Reader and the generated parse together would, taking only
// definite lengths and text keys; what Reader would refuse, and what only the walk takes, is
// NotPlain.
struct Plain {
    const unsigned char* buf;
    size_t len, pos;

    Head head() {
        if (pos >= len) throw NotPlain{};
        const unsigned char initial = buf[pos++];
        Head h{initial >> 5, initial & 0x1f, 0, false};
        if (h.info < 24) {
            h.arg = (uint64_t)h.info;
        } else if (h.info <= 27) {
            const size_t n = (size_t)1 << (h.info - 24);
            if (n > len - pos) throw NotPlain{};
            for (size_t i = 0; i < n; ++i) h.arg = h.arg << 8 | buf[pos + i];
            pos += n;
        } else {
            throw NotPlain{};  // indefinite lengths and reserved values: Reader's to judge
        }
        return h;
    }

    Head head_of(int major) {
        const Head h = head();
        if (h.major != major) throw NotPlain{};
        return h;
    }

    const unsigned char* take(uint64_t n) {
        if (n > len - pos) throw NotPlain{};
        const unsigned char* at = buf + pos;
        pos += (size_t)n;
        return at;
    }

    uint64_t uint(uint64_t lo, uint64_t hi) {
        const Head h = head_of(UINT);
        if (h.arg < lo || h.arg > hi) throw NotPlain{};
        return h.arg;
    }

    PyObject* value(const MemberSpec& m, int depth) {
        switch (m.kind) {
            case K_UINT: {
                const uint64_t x = uint(m.lo, m.hi);
                if (!in_only(m, x)) throw NotPlain{};
                return Reader::check(PyLong_FromUnsignedLongLong(x));
            }
            case K_BSTR: {
                const Head h = head_of(BSTR);
                if (m.size >= 0 && h.arg != (uint64_t)m.size) throw NotPlain{};
                const unsigned char* s = take(h.arg);
                return Reader::check(PyBytes_FromStringAndSize((const char*)s, (Py_ssize_t)h.arg));
            }
            case K_TSTR: {
                const Head h = head_of(TSTR);
                const unsigned char* s = take(h.arg);
                PyObject* text = PyUnicode_DecodeUTF8((const char*)s, (Py_ssize_t)h.arg, "strict");
                if (text == nullptr) {
                    PyErr_Clear();
                    throw NotPlain{};
                }
                return text;
            }
            case K_BOOL:
                if (pos < len && buf[pos] == 0xf4) {
                    ++pos;
                    Py_RETURN_FALSE;
                }
                if (pos < len && buf[pos] == 0xf5) {
                    ++pos;
                    Py_RETURN_TRUE;
                }
                throw NotPlain{};
            case K_UINTS: {
                const Head h = head_of(ARRAY);
                if (h.arg > len - pos || (m.nonempty && h.arg == 0)) throw NotPlain{};
                Ref items(PyTuple_New((Py_ssize_t)h.arg));
                for (uint64_t i = 0; i < h.arg; ++i) {
                    PyObject* x;
                    if (pos < len && buf[pos] < 24) {  // token lists: small uints skip the head
                        x = Reader::check(PyLong_FromLong(buf[pos++]));
                    } else {
                        x = Reader::check(PyLong_FromUnsignedLongLong(uint(0, UINT64_MAX)));
                    }
                    PyTuple_SET_ITEM(items.p, (Py_ssize_t)i, x);
                }
                return items.release();
            }
            case K_NESTED:
                return message(*m.nested, m.nested_strict, depth);
            default: {
                PyObject* raw;
                Reader reader{buf, len, pos};
                try {
                    raw = reader.item(depth);
                } catch (const Failed&) {
                    PyErr_Clear();
                    throw NotPlain{};
                }
                pos = reader.pos;
                Ref held(raw);
                PyObject* parsed = PyObject_CallMethodOneArg(m.kind_obj, g_parse_name, raw);
                if (parsed == nullptr) {
                    PyErr_Clear();
                    throw NotPlain{};
                }
                return parsed;
            }
        }
    }

    // The values of a member table, freed on unwinding.
    struct Values {
        PyObject* v[23] = {};
        size_t n;
        explicit Values(size_t count) : n(count) {}
        ~Values() {
            for (size_t i = 0; i < n; ++i) Py_XDECREF(v[i]);
        }
    };

    PyObject* message(const MessageCodec& codec, bool strict, int depth) {
        const Head h = head_of(MAP);
        if (h.arg > (len - pos) / 2) throw NotPlain{};
        const size_t n = codec.members.size();
        Values values(n);
        uint32_t seen = 0;
        std::vector<std::pair<const unsigned char*, uint64_t>> unknown;
        for (uint64_t e = 0; e < h.arg; ++e) {
            const Head k = head_of(TSTR);
            const unsigned char* key = take(k.arg);
            size_t i = 0;
            while (i < n && !(codec.members[i].wire.size() == k.arg &&
                              std::memcmp(codec.members[i].wire.data(), key, (size_t)k.arg) == 0))
                ++i;
            if (i < n) {
                if (seen & (1u << i)) throw NotPlain{};  // a duplicate key: Reader's to refuse
                seen |= 1u << i;
                values.v[i] = value(codec.members[i], depth + 1);
                continue;
            }
            // A key the class does not define: checked as Reader would, never built.
            if (strict || !valid_utf8(key, (size_t)k.arg)) throw NotPlain{};
            for (const auto& [at, size] : unknown)
                if (size == k.arg && std::memcmp(at, key, (size_t)size) == 0) throw NotPlain{};
            unknown.emplace_back(key, k.arg);
            Checker checker{buf, len, pos};
            try {
                checker.item(depth + 1);
            } catch (const Invalid&) {
                throw NotPlain{};
            }
            pos = checker.pos;
        }
        for (size_t i = 0; i < n; ++i) {
            if (values.v[i] != nullptr) continue;
            if (!codec.members[i].optional) throw NotPlain{};
            values.v[i] = Py_NewRef(Py_None);
        }
        if (codec.make_new) {
            Ref obj(PyBaseObject_Type.tp_new((PyTypeObject*)codec.cls, g_empty_tuple, nullptr));
            Ref dict(PyObject_GenericGetDict(obj.p, nullptr));
            for (size_t i = 0; i < n; ++i)
                if (PyDict_SetItem(dict.p, codec.members[i].attr, values.v[i]) < 0) throw Failed{};
            return obj.release();
        }
        Ref kwargs(PyDict_New());
        for (size_t i = 0; i < n; ++i)
            if (PyDict_SetItem(kwargs.p, codec.members[i].attr, values.v[i]) < 0) throw Failed{};
        return Reader::check(PyObject_Call(codec.cls, g_empty_tuple, kwargs.p));
    }
};

PyObject* parse_entry(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "parse_message(codec, data)");
        return nullptr;
    }
    auto* codec = static_cast<MessageCodec*>(PyCapsule_GetPointer(args[0], CODEC_CAPSULE));
    if (codec == nullptr) return nullptr;
    if (!PyBytes_CheckExact(args[1])) Py_RETURN_NONE;
    Plain plain{(const unsigned char*)PyBytes_AS_STRING(args[1]), (size_t)PyBytes_GET_SIZE(args[1]), 0};
    try {
        Ref obj(plain.message(*codec, codec->strict, 0));
        if (plain.pos != plain.len) Py_RETURN_NONE;
        return obj.release();
    } catch (const NotPlain&) {
        Py_RETURN_NONE;
    } catch (const Failed&) {
        return nullptr;
    }
}

PyMethodDef g_message_methods[] = {
    {"dump_message", (PyCFunction)(void (*)(void))dump_entry, METH_FASTCALL,
     "dump_message(codec, message): the message's deterministic CBOR, or None where it is not plainly valid."},
    {"parse_message", (PyCFunction)(void (*)(void))parse_entry, METH_FASTCALL,
     "parse_message(codec, data): the message in data, or None where it is not plainly valid."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

PYBIND11_MODULE(_cbor_native, m) {
    m.doc() = "SDCP's strict CBOR codec (sdcp_fast/protocol/cbor.py) in C++";
    py::object mapping = py::module_::import("collections.abc").attr("Mapping");
    g_mapping = mapping.release().ptr();
    // The protocol's problem for bad input; loaded by then (protocol/cbor.py imports it first).
    g_bad_request = py::object(py::module_::import("sdcp_fast.protocol.problems").attr("BadRequest")).release().ptr();
    m.attr("MAX_DEPTH") = MAX_DEPTH;
    m.def("encode", &py_encode, py::arg("value"), "Deterministic CBOR of value (RFC 8949 §4.2.1).");
    m.def("decode", &py_decode, py::arg("data"), "The single CBOR data item in data.");
    m.def("decode_at", &py_decode_at, py::arg("data"), py::arg("pos"),
          "(item, end): the CBOR data item starting at pos.");
    m.def("decode_members", &py_decode_members, py::arg("data"), py::arg("keys"), py::arg("max_items"),
          "The map in data checked whole, with only the members named in keys built.");
    m.def("all_uints", &py_all_uints, py::arg("values"),
          "True when values is a list or tuple of plain ints in [0, 2**64).");
    g_empty_tuple = PyTuple_New(0);
    g_parse_name = PyUnicode_InternFromString("parse");
    g_dump_name = PyUnicode_InternFromString("dump");
    if (g_empty_tuple == nullptr || g_parse_name == nullptr || g_dump_name == nullptr) throw py::error_already_set();
    m.def("compile_message", &py_compile_message, py::arg("cls"), py::arg("strict"), py::arg("make_new"),
          py::arg("members"), "A message class's member table, compiled for dump_message and parse_message.");
    if (PyModule_AddFunctions(m.ptr(), g_message_methods) < 0) throw py::error_already_set();
}
