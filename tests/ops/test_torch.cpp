// Torch.<op>: every op's forward and backward against PyTorch autograd, from the fixture
// tests/fixtures/torch_ops.bin (made by tests/fixtures/make_torch_fixtures.py, which holds the
// torch reference of each case). Each case loads its f32 inputs, runs toy's op in f32 with
// grad-requiring leaves, back-propagates the stored upstream gradient "gout", and compares
// the output and every input gradient with torch's float64 results. A failing case prints
// OK / NOT OK and the max |diff| for each of its tensors (TOY_TORCH_VERBOSE=1 prints them
// for passing cases too).
//
// Not covered: dropout (toy draws its mask from its own counter-based generator, which
// torch's RNG cannot reproduce; OpGrad.dropout covers it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "fixture_reader.h"
#include "helpers.h"

using namespace toy;
using namespace toy::test;

namespace {

const Fixture& fx() {
  static const Fixture f(TOY_FIXTURE_DIR "/torch_ops.bin");
  return f;
}

bool verbose() {
  static const bool v = std::getenv("TOY_TORCH_VERBOSE") != nullptr;
  return v;
}

// |got - want| <= atol + rtol * |want|, elementwise.
struct Tol {
  double atol = 1e-5, rtol = 1e-4;
};
constexpr Tol kExact{0, 0};        // data movement: bit-exact
constexpr Tol kAccum{1e-4, 1e-4};  // long f32 accumulations (matmul, norms over wide rows, ...)

// One case of the fixture: builds the inputs, compares outputs and gradients, and reports.
class Case {
 public:
  explicit Case(std::string name) : name_(std::move(name)) {}

  // A float input. It requires grad when the fixture holds its gradient (grad_<input>).
  Tensor in(const std::string& input) { return leaf(input, fx().f32(key(input))); }
  // The same input as a strided (non-contiguous) view; its gradient is checked the same way.
  Tensor nc(const std::string& input) { return leaf(input, noncontig(fx().f32(key(input)))); }
  // An integer input (ids, positions, targets, segments).
  Tensor ids(const std::string& input) const { return fx().i32(key(input)); }
  // A float input that never takes a gradient (weights, frequency factors).
  Tensor constant(const std::string& input) const { return fx().f32(key(input)); }

  // A float input made into a view by fn (e.g. a permuted copy); the view is the leaf.
  Tensor leaf_view(const std::string& input, const std::function<Tensor(const Tensor&)>& fn) {
    NoGradGuard ng;
    return leaf(input, fn(fx().f32(key(input))));
  }

  // Single output "out": compares it, back-propagates "gout" when the case has one, and
  // compares every leaf's gradient (with grad_tol, by default tol).
  void check(const Tensor& out, Tol tol = {}, std::optional<Tol> grad_tol = {}) {
    check({{"out", out}}, tol, grad_tol);
  }
  // Several named outputs; their gouts ("gout_<name>") are applied together, as one
  // backward over the flattened outputs.
  void check(const std::vector<std::pair<std::string, Tensor>>& outs, Tol tol = {},
             std::optional<Tol> grad_tol = {}) {
    std::vector<Tensor> roots, gouts;
    for (const auto& [oname, t] : outs) {
      compare(oname, t, tol);
      const std::string g = oname == "out" ? "gout" : "gout_" + oname;
      if (fx().has(key(g))) {
        roots.push_back(t);
        gouts.push_back(fx().f32(key(g)));
      }
    }
    if (roots.size() == 1) {
      backward(roots[0], gouts[0]);
    } else if (!roots.empty()) {
      for (size_t i = 0; i < roots.size(); ++i) {
        roots[i] = reshape(roots[i], Shape{-1});
        gouts[i] = reshape(gouts[i], Shape{-1});
      }
      backward(concat(roots, 0), concat(gouts, 0));
    }
    for (const auto& [input, t] : leaves_) {
      const std::string g = "grad_" + input;
      if (!fx().has(key(g))) continue;
      compare(g, t.grad().defined() ? t.grad() : zeros(t.shape()), grad_tol.value_or(tol));
    }
    report();
  }

  // Compares a toy tensor with the fixture's record <case>/<what> (float or i32).
  void compare(const std::string& what, const Tensor& got, Tol tol) {
    const std::string k = key(what);
    Line line{k, true, 0, ""};
    const Fixture::Record& r = fx().get(k);
    if (got.shape() != Shape(r.dims)) {
      line.ok = false;
      line.note = "shape " + got.shape().str() + ", expected " + Shape(r.dims).str();
    } else if (r.type == Fixture::Type::I32) {
      const std::vector<int32_t> g = got.to_i32_vector(), w = fx().i32(k).to_i32_vector();
      for (size_t i = 0; i < g.size(); ++i)
        if (g[i] != w[i]) {
          if (line.ok) line.note = fmt::format("first mismatch at {}: got {} expected {}", i, g[i], w[i]);
          line.ok = false;
          line.max_diff = std::max(line.max_diff, std::fabs(double(g[i]) - w[i]));
        }
    } else {
      const std::vector<float> g = got.to_f32_vector();
      const std::vector<double> w = fx().f64(k);
      double worst_excess = -1;
      for (size_t i = 0; i < g.size(); ++i) {
        const double a = g[i], b = w[i];
        if (std::isnan(a) && std::isnan(b)) continue;  // NaN where torch has NaN
        if (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) continue;
        const double d = std::fabs(a - b);
        if (!std::isnan(line.max_diff) && !(d <= line.max_diff)) line.max_diff = d;  // a NaN sticks
        const double excess = d - (tol.atol + tol.rtol * std::fabs(b));
        if (!(excess <= 0) && (std::isnan(excess) || excess > worst_excess)) {
          line.ok = false;
          worst_excess = std::isnan(excess) ? INFINITY : excess;
          line.note = fmt::format("worst at {}: got {} expected {}", i, a, b);
        }
      }
    }
    lines_.push_back(line);
  }

  // Prints the case's lines when one failed (or always, when verbose) and fails the test.
  void report() {
    bool ok = true;
    for (const Line& l : lines_) ok = ok && l.ok;
    if (ok && !verbose()) return;
    std::ostringstream s;
    for (const Line& l : lines_)
      s << fmt::format("  {:<7} {:<44} max|diff| {:.3e}  {}\n", l.ok ? "OK" : "NOT OK", l.name, l.max_diff, l.note);
    if (ok)
      std::printf("%s", s.str().c_str());
    else
      ADD_FAILURE() << "case " << name_ << " differs from torch:\n" << s.str();
    lines_.clear();
  }

 private:
  struct Line {
    std::string name;
    bool ok;
    double max_diff;
    std::string note;
  };

  std::string key(const std::string& what) const { return name_ + "/" + what; }
  Tensor leaf(const std::string& input, Tensor t) {
    if (fx().has(key("grad_" + input))) t.requires_grad_();
    leaves_.emplace_back(input, t);
    return t;
  }

  std::string name_;
  std::vector<std::pair<std::string, Tensor>> leaves_;
  std::vector<Line> lines_;
};

// ---- elementwise ---------------------------------------------------------------------------

// Cases basic [2, 37] (vector tail), nc (strided [6, 5]), size1 ([1, 70, 1]) and, where the
// fixture has it, extreme (saturating / overflow-prone ranges).
void unary_cases(const std::string& op, const std::function<Tensor(const Tensor&)>& f, Tol tol = {}) {
  for (const char* c : {"basic", "size1", "extreme"}) {
    if (std::string(c) == "extreme" && !fx().has(op + "/extreme/x")) continue;
    Case k(op + "/" + c);
    k.check(f(k.in("x")), tol);
  }
  Case k(op + "/nc");
  k.check(f(k.nc("x")), tol);
}

// Cases: same shape, b broadcast over leading dims, both broadcast, strided a, 0-d a, a
// broadcast along the last dim over 70 rows.
void binary_cases(const std::string& op, Tensor (*f)(const Tensor&, const Tensor&)) {
  for (const char* c : {"same", "bcast_b", "bcast_both", "scalar_a", "bcast_a"}) {
    Case k(op + "/" + c);
    k.check(f(k.in("a"), k.in("b")));
  }
  Case k(op + "/nc");
  k.check(f(k.nc("a"), k.in("b")));
}

}  // namespace

TEST(Torch, add) { binary_cases("add", add); }
TEST(Torch, sub) { binary_cases("sub", sub); }
TEST(Torch, mul) { binary_cases("mul", mul); }
TEST(Torch, div) { binary_cases("div", div); }

TEST(Torch, scale) { unary_cases("scale", [](const Tensor& x) { return scale(x, -1.5f); }); }
TEST(Torch, neg) { unary_cases("neg", [](const Tensor& x) { return neg(x); }); }
TEST(Torch, exp) { unary_cases("exp", [](const Tensor& x) { return exp(x); }); }
TEST(Torch, log) { unary_cases("log", [](const Tensor& x) { return log(x); }); }    // x in [0.5, 3]
TEST(Torch, sqrt) { unary_cases("sqrt", [](const Tensor& x) { return sqrt(x); }); }
TEST(Torch, rsqrt) { unary_cases("rsqrt", [](const Tensor& x) { return rsqrt(x); }); }
TEST(Torch, square) { unary_cases("square", [](const Tensor& x) { return square(x); }); }
TEST(Torch, abs) { unary_cases("abs", [](const Tensor& x) { return abs(x); }); }     // |x| >= 0.2
TEST(Torch, tanh) { unary_cases("tanh", [](const Tensor& x) { return tanh(x); }); }
TEST(Torch, sigmoid) { unary_cases("sigmoid", [](const Tensor& x) { return sigmoid(x); }); }
TEST(Torch, relu) { unary_cases("relu", [](const Tensor& x) { return relu(x); }); }  // |x| >= 0.2
TEST(Torch, silu) { unary_cases("silu", [](const Tensor& x) { return silu(x); }); }
TEST(Torch, softplus) { unary_cases("softplus", [](const Tensor& x) { return softplus(x); }); }
// F.gelu(approximate='tanh') and the exact erf form.
TEST(Torch, gelu) {
  unary_cases("gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::Tanh); });
  unary_cases("gelu_erf", [](const Tensor& x) { return gelu(x, GeluApprox::None); });
}
// x + 0.75 (a 0-d constant broadcast in).
TEST(Torch, add_scalar) {
  Case k("add_scalar/basic");
  k.check(add_scalar(k.in("x"), 0.75f));
}
// Bounds -0.5 and 0.7, inputs kept 0.1 away from them.
TEST(Torch, clamp) { unary_cases("clamp", [](const Tensor& x) { return clamp(x, -0.5f, 0.7f); }); }

// silu(a) * b; the split form on one [..., 74] tensor (first half the gate); a strided gate.
TEST(Torch, swiglu) {
  {
    Case k("swiglu/pair");
    k.check(swiglu(k.in("a"), k.in("b")));
  }
  {
    Case k("swiglu/split");
    k.check(swiglu(k.in("x")));
  }
  Case k("swiglu/nc");
  k.check(swiglu(k.nc("a"), k.in("b")));
}

// ---- matmul ----------------------------------------------------------------------------------

// > 64 rows, broadcast batch both ways, 1-d operands (also against batched ones), strided
// operands, transposed flags (also with a broadcast batch).
TEST(Torch, matmul) {
  for (const char* c :
       {"basic", "bcast_b", "bcast_batch", "vec_mat", "mat_vec", "dot", "vec_batched", "batched_vec"}) {
    Case k(std::string("matmul/") + c);
    k.check(matmul(k.in("a"), k.in("b")), kAccum);
  }
  {
    Case k("matmul/nc");
    k.check(matmul(k.nc("a"), k.nc("b")), kAccum);
  }
  {
    Case k("matmul/tt");
    k.check(matmul(k.in("a"), k.in("b"), true, true), kAccum);
  }
  {
    Case k("matmul/tb");
    k.check(matmul(k.in("a"), k.in("b"), false, true), kAccum);
  }
  {
    Case k("matmul/ta");
    k.check(matmul(k.in("a"), k.in("b"), true, false), kAccum);
  }
  Case k("matmul/tt_bcast");  // both transposed, batch [2, 1] x [3]
  k.check(matmul(k.in("a"), k.in("b"), true, true), kAccum);
}

// With bias on [2, 3, 37]; strided x; 1-d x without bias; 70 rows.
TEST(Torch, linear) {
  for (const char* c : {"bias", "rows70"}) {
    Case k(std::string("linear/") + c);
    k.check(linear(k.in("x"), k.in("w"), k.in("b")), kAccum);
  }
  {
    Case k("linear/nc");
    k.check(linear(k.nc("x"), k.in("w"), k.in("b")), kAccum);
  }
  Case k("linear/vec_nobias");
  k.check(linear(k.in("x"), k.in("w")), kAccum);
}

// a^T b over rows: outer product of 1-d operands, 70 rows, batched, b broadcast over the batch.
TEST(Torch, out_prod) {
  for (const char* c : {"outer", "rows", "batched", "bcast"}) {
    Case k(std::string("out_prod/") + c);
    k.check(out_prod(k.in("a"), k.in("b")), kAccum);
  }
}

// ---- reductions ------------------------------------------------------------------------------

// Whole tensor, each axis (and -1), keepdim on a strided input, down 70 rows.
TEST(Torch, sum) {
  {
    Case k("sum/all");
    k.check(sum(k.in("x")), kAccum);
  }
  for (int ax : {0, 1, 2, -1}) {
    Case k("sum/axis" + std::to_string(ax));
    k.check(sum(k.in("x"), ax), kAccum);
  }
  {
    Case k("sum/keepdim_nc");
    k.check(sum(k.nc("x"), 1, true), kAccum);
  }
  {
    Case k("sum/axis1_nc3d");
    k.check(sum(k.nc("x"), 1), kAccum);
  }
  Case k("sum/rows70");
  k.check(sum(k.in("x"), 0), kAccum);
}

TEST(Torch, mean) {
  {
    Case k("mean/all");
    k.check(mean(k.in("x")), kAccum);
  }
  {
    Case k("mean/axis0_keepdim");
    k.check(mean(k.in("x"), 0, true), kAccum);
  }
  {
    Case k("mean/keepdim_nc");
    k.check(mean(k.nc("x"), 0, true), kAccum);
  }
  Case k("mean/axis_last");
  k.check(mean(k.in("x"), -1), kAccum);
}

// Distinct values (unique maxima): whole tensor, each axis, strided inputs (with keepdim).
TEST(Torch, max) {
  {
    Case k("max/all");
    k.check(max(k.in("x")), kExact);
  }
  for (int ax : {0, 1, 2}) {
    Case k("max/axis" + std::to_string(ax));
    k.check(max(k.in("x"), ax), kExact);
  }
  {
    Case k("max/axis1_nc3d");
    k.check(max(k.nc("x"), 1), kExact);
  }
  Case k("max/keepdim_nc");
  k.check(max(k.nc("x"), 1, true), kExact);
}

// Forward only. Ties go to the first maximum.
TEST(Torch, argmax) {
  {
    Case k("argmax/ties");
    k.check(argmax(k.in("x")));
  }
  Case k("argmax/axis0");
  k.check(argmax(k.in("x"), 0));
}

// Forward only: stable in both directions (many ties).
TEST(Torch, argsort) {
  {
    Case k("argsort/asc");
    k.check(argsort(k.in("x")));
  }
  Case k("argsort/desc");
  k.check(argsort(k.in("x"), true));
}

// Forward only: the 5 largest of 37, descending, with their indices; k = the whole row.
TEST(Torch, top_k) {
  {
    Case k("top_k/basic");
    auto [v, i] = top_k(k.in("x"), 5);
    k.check({{"values", v}, {"indices", i}}, kExact);
  }
  Case k("top_k/all");
  auto [v, i] = top_k(k.in("x"), 37);
  k.check({{"values", v}, {"indices", i}}, kExact);
}

// ---- norms / softmax -----------------------------------------------------------------------

// x * rsqrt(mean(x^2) + eps) * w: 37 wide, 70 rows, strided, tiny x, no weight (default eps).
TEST(Torch, rms_norm) {
  for (const char* c : {"basic", "rows70"}) {
    Case k(std::string("rms_norm/") + c);
    k.check(rms_norm(k.in("x"), k.in("w"), 1e-5f), kAccum);
  }
  {
    Case k("rms_norm/nc");
    k.check(rms_norm(k.nc("x"), k.in("w"), 1e-5f), kAccum);
  }
  {
    Case k("rms_norm/tiny");  // x ~ 1e-3: eps is a large part of mean(x^2)
    k.check(rms_norm(k.in("x"), k.in("w"), 1e-5f), kAccum);
  }
  Case k("rms_norm/noweight");
  k.check(rms_norm(k.in("x")), kAccum);
}

// 37 wide, strided, no weight and bias, D = 1, mean 1000, 70 rows with eps 1e-3.
TEST(Torch, layer_norm) {
  {
    Case k("layer_norm/basic");
    k.check(layer_norm(k.in("x"), k.in("w"), k.in("b")), kAccum);
  }
  {
    Case k("layer_norm/nc");
    k.check(layer_norm(k.nc("x"), k.in("w"), k.in("b")), kAccum);
  }
  {
    Case k("layer_norm/noparams");
    k.check(layer_norm(k.in("x")), kAccum);
  }
  {
    Case k("layer_norm/width1");  // D = 1: zero variance, the output is the bias
    k.check(layer_norm(k.in("x"), k.in("w"), k.in("b")), kAccum);
  }
  {
    Case k("layer_norm/offset");  // mean 1000, std 1: the variance must not cancel
    k.check(layer_norm(k.in("x")), {1e-3, 1e-3});
  }
  Case k("layer_norm/rows70");
  k.check(layer_norm(k.in("x"), k.in("w"), k.in("b"), 1e-3f), kAccum);
}

// F.normalize(x, dim=-1, eps): 37 wide, strided, and a row whose norm is below eps = 0.5.
TEST(Torch, l2_norm) {
  {
    Case k("l2_norm/basic");
    k.check(l2_norm(k.in("x")), kAccum);
  }
  {
    Case k("l2_norm/nc");
    k.check(l2_norm(k.nc("x")), kAccum);
  }
  Case k("l2_norm/clamped");
  k.check(l2_norm(k.in("x"), 0.5f), kAccum);
}

// softmax(x * scale + mask): plain, broadcast masks (which get a gradient), strided with a
// scale, scale 30, width 1, a mask with -inf entries over 70 columns.
TEST(Torch, softmax) {
  {
    Case k("softmax/basic");
    k.check(softmax(k.in("x")), kAccum);
  }
  {
    Case k("softmax/scale_mask");
    k.check(softmax(k.in("x"), 0.5f, k.in("mask")), kAccum);
  }
  {
    Case k("softmax/nc_scale");
    k.check(softmax(k.nc("x"), 2.0f), kAccum);
  }
  {
    Case k("softmax/mask3d");  // mask [2, 1, 9] over x [2, 3, 9]
    k.check(softmax(k.in("x"), 1.5f, k.in("mask")), kAccum);
  }
  {
    Case k("softmax/large");  // scale 30: scores up to ~300
    k.check(softmax(k.in("x"), 30.0f), kAccum);
  }
  {
    Case k("softmax/width1");
    k.check(softmax(k.in("x")), kAccum);
  }
  Case k("softmax/inf_mask");
  k.check(softmax(k.in("x"), 0.7f, k.in("mask")), kAccum);
}

// Plain, scale 0.7 with a broadcast [1, 9] mask, logits ~ +-300, strided.
TEST(Torch, log_softmax) {
  {
    Case k("log_softmax/basic");
    k.check(log_softmax(k.in("x")), kAccum);
  }
  {
    Case k("log_softmax/scale_mask");
    k.check(log_softmax(k.in("x"), 0.7f, k.in("mask")), kAccum);
  }
  {
    Case k("log_softmax/large");  // logits ~ +-300
    k.check(log_softmax(k.in("x")), kAccum);
  }
  Case k("log_softmax/nc");
  k.check(log_softmax(k.nc("x")), kAccum);
}

// Through a softmax (a -inf output has no useful gradient): n_past 1 on [4, 6], 0 on [5, 5].
TEST(Torch, diag_mask_inf) {
  {
    Case k("diag_mask_inf/npast1");
    k.check(softmax(diag_mask_inf(k.in("x"), 1)), kAccum);
  }
  Case k("diag_mask_inf/square");
  k.check(softmax(diag_mask_inf(k.in("x"), 0)), kAccum);
}

// ---- rope / attention --------------------------------------------------------------------------

// ggml rope_ext: adjacent pairs, neox halves, partial rotation on a permuted view, base 5e5
// with per-batch positions up to 4000, Llama 3 frequency factors (also neox, strided, with
// per-batch positions), YaRN (both layouts).
TEST(Torch, rope) {
  {
    Case k("rope/normal");
    k.check(rope(k.in("x"), k.ids("pos")), kAccum);
  }
  {
    Case k("rope/neox_partial");
    RopeOptions o;
    o.n_dims = 6;
    o.neox = true;
    k.check(rope(k.in("x"), k.ids("pos"), o), kAccum);
  }
  {
    Case k("rope/normal_partial_nc");
    RopeOptions o;
    o.n_dims = 4;
    // x [2, 3, 2, 8] as a permuted view of a [2, 2, 3, 8] copy (strided T and H).
    Tensor x = k.leaf_view("x", [](const Tensor& t) {
      return permute(contiguous(permute(t, {0, 2, 1, 3})), {0, 2, 1, 3});
    });
    k.check(rope(x, k.ids("pos"), o), kAccum);
  }
  {
    Case k("rope/base_batchpos");
    RopeOptions o;
    o.freq_base = 500000.0f;
    k.check(rope(k.in("x"), k.ids("pos"), o), kAccum);
  }
  {
    Case k("rope/freq_factors");
    RopeOptions o;
    o.freq_scale = 0.5f;
    o.freq_factors = k.constant("ff");
    k.check(rope(k.in("x"), k.ids("pos"), o), kAccum);
  }
  {
    Case k("rope/neox_ff_batchpos_nc");
    RopeOptions o;
    o.n_dims = 6;
    o.neox = true;
    o.freq_factors = k.constant("ff");
    k.check(rope(k.nc("x"), k.ids("pos"), o), kAccum);
  }
  RopeOptions yarn;
  yarn.freq_scale = 0.25f;
  yarn.ext_factor = 1.0f;
  yarn.attn_factor = 1.1f;
  yarn.beta_fast = 32.0f;
  yarn.beta_slow = 1.0f;
  yarn.n_ctx_orig = 4096;
  {
    Case k("rope/yarn");
    k.check(rope(k.in("x"), k.ids("pos"), yarn), kAccum);
  }
  Case k("rope/yarn_neox_partial");
  yarn.n_dims = 16;
  yarn.neox = true;
  yarn.ext_factor = 0.5f;
  k.check(rope(k.in("x"), k.ids("pos"), yarn), kAccum);
}

// Causal; GQA over 70 positions (more than one block), Dv != D, non-causal; 3 queries
// against 7 keys (causal offset) with one kv head and scale 0.3; block-causal segments;
// one query against 9 keys; large scores; q, k, v as strided slices of one fused qkv tensor.
TEST(Torch, attention) {
  {
    Case k("attention/causal");
    k.check(attention(k.in("q"), k.in("k"), k.in("v")), kAccum);
  }
  {
    Case k("attention/gqa_noncausal");
    AttentionOptions o;
    o.causal = false;
    k.check(attention(k.in("q"), k.in("k"), k.in("v"), o), kAccum);
  }
  {
    Case k("attention/kv_offset");
    AttentionOptions o;
    o.scale = 0.3f;
    k.check(attention(k.in("q"), k.in("k"), k.in("v"), o), kAccum);
  }
  {
    Case k("attention/segments");
    AttentionOptions o;
    o.segments = k.ids("seg");
    k.check(attention(k.in("q"), k.in("k"), k.in("v"), o), kAccum);
  }
  {
    Case k("attention/decode1");  // T = 1 against S = 9, GQA
    k.check(attention(k.in("q"), k.in("k"), k.in("v")), kAccum);
  }
  {
    Case k("attention/large_scores");  // |scores| up to ~100
    k.check(attention(k.in("q"), k.in("k"), k.in("v")), kAccum);
  }
  Case k("attention/fused_qkv");
  Tensor qkv = k.in("qkv");
  auto part = [&](int i) { return squeeze(slice(qkv, 2, i, i + 1), 2); };
  k.check(attention(part(0), part(1), part(2)), kAccum);
}

// ---- shape ops (pure data movement: bit-exact) ------------------------------------------------

TEST(Torch, view) {
  Case k("view/basic");
  k.check(view(k.in("x"), Shape{4, 3}), kExact);
}

// A strided input (copy) and a contiguous one (view).
TEST(Torch, reshape) {
  {
    Case k("reshape/nc_flatten");
    k.check(reshape(k.nc("x"), Shape{-1}), kExact);
  }
  Case k("reshape/split");
  k.check(reshape(k.in("x"), Shape{2, 3, 4}), kExact);
}

TEST(Torch, permute) {
  Case k("permute/basic");
  k.check(permute(k.in("x"), {2, 0, 1}), kExact);
}

TEST(Torch, transpose) {
  Case k("transpose/basic");
  k.check(transpose(k.in("x"), 0, 2), kExact);
}

TEST(Torch, contiguous) {
  Case k("contiguous/basic");
  k.check(contiguous(transpose(k.in("x"), 0, 1)), kExact);
}

// Three inputs along axis 1 (the middle one strided, width 1); two along axis 0 (also strided).
TEST(Torch, concat) {
  {
    Case k("concat/nc_axis0");
    k.check(concat({k.nc("a"), k.nc("b")}, 0), kExact);
  }
  {
    Case k("concat/axis1");
    k.check(concat({k.in("a"), k.nc("b"), k.in("c")}, 1), kExact);
  }
  Case k("concat/axis0");
  k.check(concat({k.in("a"), k.in("b")}, 0), kExact);
}

// x[:, 1:-1:2], x[:, 1:4] of a strided input, and x[-65:67:3] over 70 rows.
TEST(Torch, slice) {
  {
    Case k("slice/nc");
    k.check(slice(k.nc("x"), 1, 1, 4), kExact);
  }
  {
    Case k("slice/step");
    k.check(slice(k.in("x"), 1, 1, -1, 2), kExact);
  }
  Case k("slice/rows");
  k.check(slice(k.in("x"), 0, -65, 67, 3), kExact);
}

// Two dims padded with 0.5; a strided input padded with -1; the last dim with zeros.
TEST(Torch, pad) {
  {
    Case k("pad/nc");
    k.check(pad(k.nc("x"), {{0, 2}, {1, 0}}, -1.0f), kExact);
  }
  {
    Case k("pad/value");
    k.check(pad(k.in("x"), {{1, 2}, {0, 1}}, 0.5f), kExact);
  }
  Case k("pad/last");
  k.check(pad(k.in("x"), {{2, 3}}), kExact);
}

// torch.Tensor.repeat with an extra leading dim, at the same rank, of a strided input.
TEST(Torch, repeat) {
  {
    Case k("repeat/nc");
    k.check(repeat(k.nc("x"), {2, 2}), kExact, kAccum);
  }
  {
    Case k("repeat/extra_dim");
    k.check(repeat(k.in("x"), {2, 1, 3}), kExact, kAccum);  // the gradient sums 6 copies
  }
  Case k("repeat/same_rank");
  k.check(repeat(k.in("x"), {3, 2}), kExact, kAccum);
}

// A [3, 1] column broadcast to [2, 3, 37] (a zero-stride view; the gradient sums 74 copies).
TEST(Torch, expand) {
  Case k("expand/basic");
  k.check(expand(k.in("x"), Shape{2, 3, 37}), kExact, kAccum);
}

// [3, 1, 4] -> squeeze(1) -> unsqueeze(0) -> [1, 3, 4].
TEST(Torch, unsqueeze_squeeze) {
  Case k("unsqueeze_squeeze/basic");
  k.check(unsqueeze(squeeze(k.in("x"), 1), 0), kExact);
}

// f32 -> f16 -> f32: both round the value and the gradient to f16.
TEST(Torch, cast) {
  Case k("cast/f16_roundtrip");
  k.check(cast(cast(k.in("x"), DType::F16), DType::F32), kExact);
}

// ---- rows / loss -------------------------------------------------------------------------------

// Repeated ids (gradients add); rows of a column slice (row stride 8, length 5); a 0-d id.
TEST(Torch, get_rows) {
  {
    Case k("get_rows/scalar_id");
    k.check(get_rows(k.in("table"), k.ids("ids")), kExact);
  }
  {
    Case k("get_rows/repeated");
    k.check(get_rows(k.in("table"), k.ids("ids")), kExact, kAccum);
  }
  Case k("get_rows/strided");
  k.check(get_rows(slice(k.in("table"), 1, 0, 5), k.ids("ids")), kExact, kAccum);
}

// Functional: a copy of dst with rows 4 and 1 replaced; gradients to dst and src.
TEST(Torch, set_rows) {
  Case k("set_rows/basic");
  k.check(set_rows(k.in("dst"), k.ids("ids"), k.in("src")), kExact);
}

// Mean over counted positions with ignore_index -100; per-position weights on strided
// logits; 70 rows of 13 classes; large logits; a 1-d row; the chunked linear head.
TEST(Torch, cross_entropy) {
  {
    Case k("cross_entropy/ignore");
    k.check(cross_entropy(k.in("logits"), k.ids("targets")), kAccum);
  }
  {
    Case k("cross_entropy/weights_nc");
    CrossEntropyOptions o;
    o.weights = k.constant("weights");
    k.check(cross_entropy(k.nc("logits"), k.ids("targets"), o), kAccum);
  }
  {
    Case k("cross_entropy/vector");  // logits [V], 0-d target
    k.check(cross_entropy(k.in("logits"), k.ids("targets")), kAccum);
  }
  {
    Case k("cross_entropy/large");  // logits ~ +-150
    k.check(cross_entropy(k.in("logits"), k.ids("targets")), kAccum);
  }
  {
    Case k("cross_entropy/linear_chunked");  // linear_cross_entropy in chunks of 3 of 7 rows
    k.check(linear_cross_entropy(k.in("h"), k.in("w"), k.ids("targets"), 3), kAccum);
  }
  Case k("cross_entropy/rows70");
  k.check(cross_entropy(k.in("logits"), k.ids("targets")), kAccum);
}

// ---- conv / moe / ssm -----------------------------------------------------------------------

// F.unfold transposed: 2x2 kernel with stride (2, 1), padding (0, 1), dilation (1, 2); 3x3 same-padded.
TEST(Torch, im2col) {
  {
    Case k("im2col/stride_pad_dil");
    Conv2dOptions o;
    o.stride_h = 2;
    o.pad_w = 1;
    o.dilation_w = 2;
    k.check(im2col(k.in("x"), 2, 2, o), kExact, kAccum);
  }
  Case k("im2col/basic");
  Conv2dOptions o;
  o.pad_h = o.pad_w = 1;
  k.check(im2col(k.in("x"), 3, 3, o), kExact, kAccum);
}

// Padding 1; stride (2, 1) with padding (1, 0) and dilation (1, 2); stride 3 > kernel 2
// without bias (pixels no window reads get a zero gradient).
TEST(Torch, conv2d) {
  {
    Case k("conv2d/stride_gt_kernel");
    Conv2dOptions o;
    o.stride_h = o.stride_w = 3;
    k.check(conv2d(k.in("x"), k.in("w"), Tensor(), o), kAccum);
  }
  {
    Case k("conv2d/pad");
    Conv2dOptions o;
    o.pad_h = o.pad_w = 1;
    k.check(conv2d(k.in("x"), k.in("w"), k.in("b"), o), kAccum);
  }
  Case k("conv2d/stride_dil");
  Conv2dOptions o;
  o.stride_h = 2;
  o.pad_h = 1;
  o.dilation_w = 2;
  k.check(conv2d(k.in("x"), k.in("w"), k.in("b"), o), kAccum);
}

// Depthwise causal: K = 4 with bias; K = 3 over 37 channels without; K = 1.
TEST(Torch, conv1d) {
  {
    Case k("conv1d/k1");
    k.check(conv1d(k.in("x"), k.in("w")), kAccum);
  }
  {
    Case k("conv1d/bias");
    k.check(conv1d(k.in("x"), k.in("w"), k.in("b")), kAccum);
  }
  Case k("conv1d/nobias_wide");
  k.check(conv1d(k.in("x"), k.in("w")), kAccum);
}

// x [B, T+K-1, C] already holds the K-1 previous inputs.
TEST(Torch, ssm_conv) {
  for (const char* c : {"basic", "wide"}) {
    Case k(std::string("ssm_conv/") + c);
    k.check(ssm_conv(k.in("x"), k.in("w")), kAccum);
  }
}

// Mamba-2 scan: both outputs (y and the final state) carry a gout; with an initial state
// (B=2, T=5, H=4, P=3, G=2, N=3) and without (G=1, a dt above the softplus threshold).
TEST(Torch, ssm_scan) {
  {
    Case k("ssm_scan/state");
    auto [y, s] = ssm_scan(k.in("x"), k.in("dt"), k.in("A"), k.in("B"), k.in("C"), k.in("s0"));
    k.check({{"y", y}, {"state", s}}, kAccum);
  }
  Case k("ssm_scan/nostate");
  auto [y, s] = ssm_scan(k.in("x"), k.in("dt"), k.in("A"), k.in("B"), k.in("C"));
  k.check({{"y", y}, {"state", s}}, kAccum);
}

// Gated delta rule against PyTorch autograd of the token-by-token recurrence: 70 tokens (a
// chunk boundary), 2 K heads read by 4 V heads, Dk != Dv, an initial state — both algorithms;
// and a short case without a state.
TEST(Torch, gated_delta_rule) {
  for (GatedDeltaAlgorithm a : {GatedDeltaAlgorithm::Chunked, GatedDeltaAlgorithm::Recurrent}) {
    Case k("gated_delta_rule/state");
    auto [o, s] = gated_delta_rule(k.in("q"), k.in("k"), k.in("v"), k.in("g"), k.in("beta"), k.in("s0"), a);
    k.check({{"o", o}, {"state", s}}, kAccum);
  }
  Case k("gated_delta_rule/nostate");
  auto [o, s] = gated_delta_rule(k.in("q"), k.in("k"), k.in("v"), k.in("g"), k.in("beta"));
  k.check({{"o", o}, {"state", s}}, kAccum);
}

// Per-token expert matmul: x shared by both slots, x per slot, 37-wide K.
TEST(Torch, mul_mat_id) {
  for (const char* c : {"shared_x", "per_slot", "wide"}) {
    Case k(std::string("mul_mat_id/") + c);
    k.check(mul_mat_id(k.in("w"), k.in("x"), k.ids("ids")), kAccum);
  }
}

// x + b[ids] (expert 2 used twice: its bias gradient adds).
TEST(Torch, add_id) {
  Case k("add_id/basic");
  k.check(add_id(k.in("x"), k.in("b"), k.ids("ids")));
}

// ---- NaN propagation (forward only) ---------------------------------------------------------

namespace {
void nan_cases(const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>>& ops) {
  for (const auto& [op, f] : ops) {
    Case k("nan/" + op);
    k.check(f(k.in("x")));
  }
}
}  // namespace

// NaN inputs give NaN outputs where torch's do: elementwise ops, max and argmax (the NaN's
// index) along the last axis.
TEST(Torch, nan_propagation) {
  nan_cases({{"abs", [](const Tensor& x) { return abs(x); }},
             {"neg", [](const Tensor& x) { return neg(x); }},
             {"exp", [](const Tensor& x) { return exp(x); }},
             {"tanh", [](const Tensor& x) { return tanh(x); }},
             {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
             {"silu", [](const Tensor& x) { return silu(x); }},
             {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::Tanh); }},
             {"gelu_erf", [](const Tensor& x) { return gelu(x, GeluApprox::None); }},
             {"square", [](const Tensor& x) { return square(x); }},
             {"scale", [](const Tensor& x) { return scale(x, -1.5f); }},
             {"log", [](const Tensor& x) { return log(x); }},
             {"sqrt", [](const Tensor& x) { return sqrt(x); }},
             {"rsqrt", [](const Tensor& x) { return rsqrt(x); }},
             {"max", [](const Tensor& x) { return max(x, -1); }},
             {"argmax", [](const Tensor& x) { return argmax(x, -1); }}});
}

// relu and clamp keep NaN (a regression test: maxps/minps return their second operand when
// either is NaN, so the operand order matters).
TEST(Torch, nan_relu_clamp) {
  nan_cases({{"relu", [](const Tensor& x) { return relu(x); }},
             {"clamp", [](const Tensor& x) { return clamp(x, -0.5f, 0.7f); }}});
}

// Rows holding NaN sort as torch sorts them: NaN above every number (last ascending, first
// descending, first in top_k). A regression test: plain < / > comparators are not a strict
// weak ordering with NaN, which is undefined behaviour in std::sort.
TEST(Torch, nan_sort) {
  {
    Case k("nan/argsort_asc");
    k.check(argsort(k.in("x")));
  }
  {
    Case k("nan/argsort_desc");
    k.check(argsort(k.in("x"), true));
  }
  Case k("nan/top_k");
  auto [v, i] = top_k(k.in("x"), 4);
  k.check({{"values", v}, {"indices", i}}, kExact);
}

// ---- optimizers: 3 steps against torch.optim -------------------------------------------------

namespace {
// Runs step(p, g, t) for t = 1..3 from p0 with g1..g3; compares p3 and the named state.
void optim_case(const std::string& name, const std::function<void(Tensor&, const Tensor&, int)>& step,
                const std::vector<std::pair<std::string, Tensor*>>& state, Tol tol) {
  Case k(name);
  Tensor p = k.constant("p0");
  for (int t = 1; t <= 3; ++t) step(p, k.constant(fmt::format("g{}", t)), t);
  k.compare("p3", p, tol);
  for (const auto& [sname, t] : state) k.compare(sname, *t, tol);
  k.report();
}
}  // namespace

// torch.optim.SGD: momentum with weight decay, nesterov, plain (no momentum buffer).
TEST(Torch, sgd) {
  const Tol tol{1e-6, 1e-5};
  {
    Tensor buf = zeros(Shape{37});
    SgdOptions o{.momentum = 0.9f, .weight_decay = 0.1f};
    optim_case("sgd/momentum_wd", [&](Tensor& p, const Tensor& g, int) { sgd_step(p, g, buf, scalar(0.1), o); },
               {{"buf3", &buf}}, tol);
  }
  {
    Tensor buf = zeros(Shape{37});
    SgdOptions o{.momentum = 0.8f, .weight_decay = 0.01f, .nesterov = true};
    optim_case("sgd/nesterov", [&](Tensor& p, const Tensor& g, int) { sgd_step(p, g, buf, scalar(0.05), o); },
               {{"buf3", &buf}}, tol);
  }
  Tensor none;
  SgdOptions o{.weight_decay = 0.05f};
  optim_case("sgd/plain", [&](Tensor& p, const Tensor& g, int) { sgd_step(p, g, none, scalar(0.2), o); }, {}, tol);
}

// torch.optim.AdamW: decoupled decay, bias-corrected moments; lr and step as scalar tensors.
TEST(Torch, adamw) {
  const Tol tol{1e-6, 1e-5};
  {
    Tensor m = zeros(Shape{37}), v = zeros(Shape{37});
    AdamWOptions o{.beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.1f};
    optim_case(
        "adamw/basic", [&](Tensor& p, const Tensor& g, int t) { adamw_step(p, g, m, v, scalar(0.01), scalar(t), o); },
        {{"m3", &m}, {"v3", &v}}, tol);
  }
  Tensor m = zeros(Shape{37}), v = zeros(Shape{37});
  optim_case(
      "adamw/defaults", [&](Tensor& p, const Tensor& g, int t) { adamw_step(p, g, m, v, scalar(1e-3), scalar(t)); },
      {{"m3", &m}, {"v3", &v}}, tol);
}

// ---- the reader itself ---------------------------------------------------------------------------

// Missing, truncated and malformed files throw toy::Error naming the path and the command
// that regenerates the fixture.
TEST(Torch, fixture_reader) {
  EXPECT_GT(fx().size(), 100u);
  const std::string dir = ::testing::TempDir();
  auto expect_bad = [](const std::string& path, const char* needle) {
    try {
      Fixture f(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find(Fixture::kRegenerate), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  };
  expect_bad(dir + "/toy_no_such_fixture.bin", "cannot open");
  auto write = [&](const std::string& name, const std::string& bytes) {
    const std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  };
  expect_bad(write("toy_bad_magic.bin", "NOTAFIX!\0\0\0\0"), "magic");
  // Claims one record but ends inside its name.
  expect_bad(write("toy_truncated.bin", std::string("TOYFIX01\1\0\0\0\5\0\0\0ab", 18)), "truncated");
  // A record whose dims claim 2^80 elements (no overflow, no huge allocation).
  std::string huge("TOYFIX01\1\0\0\0\1\0\0\0x\0\2", 19);
  const int64_t dim = int64_t(1) << 40;
  huge.append(reinterpret_cast<const char*>(&dim), 8).append(reinterpret_cast<const char*>(&dim), 8);
  expect_bad(write("toy_huge_dims.bin", huge), "truncated");
  // An unknown dtype code.
  expect_bad(write("toy_bad_dtype.bin", std::string("TOYFIX01\1\0\0\0\1\0\0\0x\7\0", 19)), "dtype");
  EXPECT_THROW(fx().get("no/such/record"), Error);
  EXPECT_THROW(fx().i32("add/same/a"), Error);  // an f32 record
}
