// pybind11 layer of the sampling kernels: checks every buffer's dtype, shape and
// contiguity (the Python launcher in sdcp_fast/kernels/cpu_backend.py checks values),
// then runs the kernel without the GIL.
#include <pybind11/pybind11.h>

#include <vector>

#include "sampling_args.h"
#include "sampling_kernels.h"

namespace py = pybind11;
using sdcp::TensorArg;
using sdcp::tensor_arg;
using sdcp::expect_dim;

namespace {

sdcp::LogitType logit_type(const TensorArg& a) {
    return a.dtype == sdcp::kF32 ? sdcp::LogitType::F32 : sdcp::LogitType::BF16;
}

struct ProfileArgs {
    const int64_t* temperature_milli;
    const int64_t* top_k;
    const int64_t* top_p_milli;
};

ProfileArgs profile_args(const py::tuple& t, const py::tuple& k, const py::tuple& p, int64_t rows) {
    TensorArg at = tensor_arg(t, "temperature_milli", {sdcp::kI64}, 1);
    TensorArg ak = tensor_arg(k, "top_k", {sdcp::kI64}, 1);
    TensorArg ap = tensor_arg(p, "top_p_milli", {sdcp::kI64}, 1);
    expect_dim(at, 0, rows, "temperature_milli");
    expect_dim(ak, 0, rows, "top_k");
    expect_dim(ap, 0, rows, "top_p_milli");
    return {static_cast<const int64_t*>(at.data), static_cast<const int64_t*>(ak.data),
            static_cast<const int64_t*>(ap.data)};
}

void apply_profile(py::tuple logits, py::tuple t, py::tuple k, py::tuple p, py::tuple probs) {
    TensorArg l = tensor_arg(logits, "logits", {sdcp::kF32, sdcp::kBF16}, 2);
    TensorArg o = tensor_arg(probs, "probs", {sdcp::kF32}, 2);
    expect_dim(o, 0, l.dim(0), "probs");
    expect_dim(o, 1, l.dim(1), "probs");
    ProfileArgs pr = profile_args(t, k, p, l.dim(0));
    py::gil_scoped_release nogil;
    sdcp::apply_sampling_profile(l.data, logit_type(l), l.dim(0), l.dim(1), pr.temperature_milli, pr.top_k,
                                 pr.top_p_milli, static_cast<float*>(o.data));
}

void sample_rows(py::tuple probs, py::tuple uniforms, py::tuple tokens) {
    TensorArg pr = tensor_arg(probs, "probs", {sdcp::kF32}, 2);
    TensorArg u = tensor_arg(uniforms, "uniforms", {sdcp::kF64}, 1);
    TensorArg o = tensor_arg(tokens, "tokens", {sdcp::kI32}, 1);
    expect_dim(u, 0, pr.dim(0), "uniforms");
    expect_dim(o, 0, pr.dim(0), "tokens");
    if (pr.dim(1) == 0) throw py::value_error("probs: empty vocabulary");
    py::gil_scoped_release nogil;
    sdcp::sample_from_probs(static_cast<const float*>(pr.data), pr.dim(0), pr.dim(1),
                            static_cast<const double*>(u.data), static_cast<int32_t*>(o.data));
}

// Checks the ragged layout shared by both rules; returns M_max + 1.
int64_t check_ragged(const TensorArg& target, const TensorArg& tokens, const TensorArg& cu,
                     const TensorArg& accepted, const TensorArg& emitted) {
    int64_t batch = cu.dim(0) - 1;
    if (batch < 1) throw py::value_error("cu_draft: need at least one session");
    const int64_t* c = static_cast<const int64_t*>(cu.data);
    const int64_t* x = static_cast<const int64_t*>(tokens.data);
    int64_t width = 1;
    if (c[0] != 0 || c[batch] != tokens.dim(0)) throw py::value_error("cu_draft: must run from 0 to D");
    for (int64_t b = 0; b < batch; ++b) {
        if (c[b + 1] < c[b]) throw py::value_error("cu_draft: must be non-decreasing");
        width = std::max(width, c[b + 1] - c[b] + 1);
    }
    for (int64_t i = 0; i < tokens.dim(0); ++i)
        if (x[i] < 0 || x[i] >= target.dim(1)) throw py::value_error("draft_tokens: id outside the vocabulary");
    expect_dim(target, 0, tokens.dim(0) + batch, "target_logits");
    expect_dim(accepted, 0, batch, "accepted");
    expect_dim(emitted, 0, batch, "emitted");
    expect_dim(emitted, 1, width, "emitted");
    return width;
}

void greedy(py::tuple target, py::tuple tokens, py::tuple cu, py::tuple accepted, py::tuple emitted) {
    TensorArg l = tensor_arg(target, "target_logits", {sdcp::kF32, sdcp::kBF16}, 2);
    TensorArg x = tensor_arg(tokens, "draft_tokens", {sdcp::kI64}, 1);
    TensorArg c = tensor_arg(cu, "cu_draft", {sdcp::kI64}, 1);
    TensorArg a = tensor_arg(accepted, "accepted", {sdcp::kI32}, 1);
    TensorArg e = tensor_arg(emitted, "emitted", {sdcp::kI32}, 2);
    int64_t width = check_ragged(l, x, c, a, e);
    py::gil_scoped_release nogil;
    sdcp::verify_greedy(l.data, logit_type(l), l.dim(1), static_cast<const int64_t*>(x.data),
                        static_cast<const int64_t*>(c.data), c.dim(0) - 1, static_cast<int32_t*>(a.data),
                        static_cast<int32_t*>(e.data), width);
}

// Where each session's q rows start: q is one [D, V] tensor, or a list of B tensors
// [M_b, V] (each session's rows where they lie, not gathered into one buffer).
std::vector<const float*> q_rounds(const py::object& q, const int64_t* c, int64_t batch, int64_t vocab) {
    std::vector<const float*> out(static_cast<size_t>(batch));
    if (py::isinstance<py::list>(q)) {
        py::list rounds = q.cast<py::list>();
        if (static_cast<int64_t>(rounds.size()) != batch)
            throw py::value_error("q_probs: expected one tensor per session");
        for (int64_t b = 0; b < batch; ++b) {
            TensorArg a = tensor_arg(rounds[b].cast<py::tuple>(), "q_probs", {sdcp::kF32}, 2);
            expect_dim(a, 0, c[b + 1] - c[b], "q_probs");
            expect_dim(a, 1, vocab, "q_probs");
            out[b] = static_cast<const float*>(a.data);
        }
        return out;
    }
    TensorArg qa = tensor_arg(q.cast<py::tuple>(), "q_probs", {sdcp::kF32}, 2);
    expect_dim(qa, 0, c[batch], "q_probs");
    expect_dim(qa, 1, vocab, "q_probs");
    for (int64_t b = 0; b < batch; ++b) out[b] = static_cast<const float*>(qa.data) + c[b] * vocab;
    return out;
}

void speculative(py::tuple target, py::tuple t, py::tuple k, py::tuple p, py::object q, py::tuple tokens,
                 py::tuple cu, py::tuple uniforms, py::tuple accepted, py::tuple emitted, py::tuple bad) {
    TensorArg l = tensor_arg(target, "target_logits", {sdcp::kF32, sdcp::kBF16}, 2);
    TensorArg x = tensor_arg(tokens, "draft_tokens", {sdcp::kI64}, 1);
    TensorArg c = tensor_arg(cu, "cu_draft", {sdcp::kI64}, 1);
    TensorArg u = tensor_arg(uniforms, "uniforms", {sdcp::kF64}, 3);
    TensorArg a = tensor_arg(accepted, "accepted", {sdcp::kI32}, 1);
    TensorArg e = tensor_arg(emitted, "emitted", {sdcp::kI32}, 2);
    TensorArg bd = tensor_arg(bad, "bad", {sdcp::kBool}, 1);
    int64_t width = check_ragged(l, x, c, a, e);
    int64_t batch = c.dim(0) - 1;
    std::vector<const float*> qr = q_rounds(q, static_cast<const int64_t*>(c.data), batch, l.dim(1));
    expect_dim(u, 0, batch, "uniforms");
    expect_dim(u, 1, width, "uniforms");
    expect_dim(u, 2, 2, "uniforms");
    expect_dim(bd, 0, batch, "bad");
    ProfileArgs pr = profile_args(t, k, p, batch);
    py::gil_scoped_release nogil;
    sdcp::verify_speculative(l.data, logit_type(l), l.dim(1), pr.temperature_milli, pr.top_k, pr.top_p_milli,
                             qr.data(), static_cast<const int64_t*>(x.data),
                             static_cast<const int64_t*>(c.data), batch, static_cast<const double*>(u.data),
                             static_cast<int32_t*>(a.data), static_cast<int32_t*>(e.data), width,
                             static_cast<bool*>(bd.data));
}

}  // namespace

void register_sampling(py::module_& m) {
    m.def("sampling_apply_profile", &apply_profile, "§4.1 profile: logits -> probs (float32)");
    m.def("sampling_sample_from_probs", &sample_rows, "inverse CDF per row");
    m.def("sampling_verify_greedy", &greedy, "rule 1 of §6.4 over a ragged batch");
    m.def("sampling_verify_speculative", &speculative, "rule 2 of §6.4 over a ragged batch");
    m.def("sampling_isas", &sdcp::available_isas, "instruction sets this CPU runs, most portable first");
    m.def("sampling_isa", &sdcp::isa, "the instruction set the sampling kernels use");
    m.def(
        "sampling_set_isa",
        [](const std::string& name) {
            if (!sdcp::set_isa(name)) throw py::value_error("instruction set not available here: " + name);
        },
        "use another instruction set (one of sampling_isas())");
}
