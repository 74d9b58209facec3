// Elementwise ops: broadcasting binary ops, unary math, swiglu, dropout.
// Binary backward sums the gradient back over broadcast dims (sum_to). Unary backward is one
// fused kernel per op (unary_backward), checked against gradcheck and PyTorch.
#include <cmath>

#include "toy/ops/common.h"

namespace toy {

using kern::BinaryOp;
using kern::UnaryArgs;
using kern::UnaryOp;
using namespace detail;

namespace {

const KernelRef<kern::Unary> k_unary("unary");
const KernelRef<kern::UnaryBackward> k_unary_bwd("unary_backward");
const KernelRef<kern::Binary> k_binary("binary");
const KernelRef<kern::Swiglu> k_swiglu("swiglu");
const KernelRef<kern::SwigluBackward> k_swiglu_bwd("swiglu_backward");
const KernelRef<kern::Dropout> k_dropout("dropout");
const KernelRef<kern::SwigluPacked> k_swiglu_packed("swiglu_packed");
const KernelRef<kern::SwigluPackedBackward> k_swiglu_packed_bwd("swiglu_packed_backward");

Tensor unary_op(UnaryOp op, const char* name, const Tensor& x, UnaryArgs a = {}) {
  OpSpan span(name, {&x});
  check_float(x, name);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  k_unary(x.device())(op, x, y, a);
  if (needs_grad({&x})) {
    record(name, y, {x}, [op, x, ys = y.detach(), a](const Tensor& g) -> Grads {
      Tensor dx = empty(x.shape(), x.dtype(), x.device());
      k_unary_bwd(x.device())(op, x, ys, contiguous_nograd(g), dx, a);
      return {dx};
    });
  }
  return y;
}

Tensor binary_op(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  OpSpan span(name, {&a, &b});
  check_float(a, name, "a");
  check_float(b, name, "b");
  check_same_dtype(a, b, name);
  check_same_device(a, b, name);
  const Shape s = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(s, a.dtype(), a.device());
  k_binary(a.device())(op, expand_view(a, s), expand_view(b, s), out);
  if (needs_grad({&a, &b})) {
    record(name, out, {a, b}, [op, a, b](const Tensor& g) -> Grads {
      Grads r(2);
      const bool ga = wants_grad(a), gb = wants_grad(b);
      switch (op) {
        case BinaryOp::Add:
          if (ga) r[0] = sum_to(g, a.shape());
          if (gb) r[1] = sum_to(g, b.shape());
          break;
        case BinaryOp::Sub:
          if (ga) r[0] = sum_to(g, a.shape());
          if (gb) r[1] = sum_to(neg(g), b.shape());
          break;
        case BinaryOp::Mul:
          if (ga) r[0] = sum_to(mul(g, b), a.shape());
          if (gb) r[1] = sum_to(mul(g, a), b.shape());
          break;
        case BinaryOp::Div: {
          Tensor gb_ = div(g, b);  // d/da = 1/b ; d/db = -a/b^2 = -(g/b) * (a/b)
          if (ga) r[0] = sum_to(gb_, a.shape());
          if (gb) r[1] = sum_to(neg(mul(gb_, div(a, b))), b.shape());
          break;
        }
      }
      return r;
    });
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Add, "add", a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Sub, "sub", a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Mul, "mul", a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Div, "div", a, b); }

Tensor scale(const Tensor& x, float s) {
  UnaryArgs a;
  a.alpha = s;
  return unary_op(UnaryOp::Scale, "scale", x, a);
}
namespace {
void check_in_place(const Tensor& dst, const char* op) {
  check_defined(dst, op, "dst");
  check_float(dst, op, "dst");
  TOY_CHECK(dst.is_contiguous(), "[{}] dst must be contiguous", op);
  TOY_CHECK(!(grad_enabled() && dst.requires_grad()), "[{}] tensor requires grad; use NoGradGuard", op);
}
}  // namespace

// The elementwise kernels read element i of their inputs before writing element i of the
// output, so an output that is its first input, same layout, is safe.
void add_(Tensor& dst, const Tensor& src) {
  OpSpan span("add_", {&dst, &src});
  check_in_place(dst, "add_");
  check_defined(src, "add_", "src");
  check_same_dtype(dst, src, "add_");
  check_same_device(dst, src, "add_");
  TOY_CHECK(dst.shape() == src.shape(), "[add_] shapes differ: dst {} vs src {}", dst.shape().str(),
            src.shape().str());
  k_binary(dst.device())(BinaryOp::Add, dst, src, dst);
  clear_ids_mark(dst);
}

void scale_(Tensor& dst, float s) {
  OpSpan span("scale_", {&dst});
  check_in_place(dst, "scale_");
  UnaryArgs a;
  a.alpha = s;
  k_unary(dst.device())(UnaryOp::Scale, dst, dst, a);
  clear_ids_mark(dst);
}

Tensor add_scalar(const Tensor& x, float s) { return add(x, full(Shape{}, s, x.dtype(), x.device())); }
Tensor neg(const Tensor& x) { return unary_op(UnaryOp::Neg, "neg", x); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::Exp, "exp", x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::Log, "log", x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::Sqrt, "sqrt", x); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::Rsqrt, "rsqrt", x); }
Tensor square(const Tensor& x) { return unary_op(UnaryOp::Square, "square", x); }
Tensor abs(const Tensor& x) { return unary_op(UnaryOp::Abs, "abs", x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::Tanh, "tanh", x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::Sigmoid, "sigmoid", x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::Relu, "relu", x); }
Tensor silu(const Tensor& x) { return unary_op(UnaryOp::Silu, "silu", x); }
Tensor softplus(const Tensor& x) { return unary_op(UnaryOp::Softplus, "softplus", x); }
Tensor gelu(const Tensor& x, GeluApprox approx) {
  return unary_op(approx == GeluApprox::Tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf, "gelu", x);
}
Tensor clamp(const Tensor& x, float lo, float hi) {
  TOY_CHECK(!(lo > hi), "[clamp] lower bound {} is above upper bound {}", lo, hi);
  UnaryArgs a;
  a.lo = lo;
  a.hi = hi;
  return unary_op(UnaryOp::Clamp, "clamp", x, a);
}

Tensor swiglu(const Tensor& a, const Tensor& b) {
  OpSpan span("swiglu", {&a, &b});
  check_float(a, "swiglu", "gate");
  check_float(b, "swiglu", "up");
  check_same_dtype(a, b, "swiglu");
  check_same_device(a, b, "swiglu");
  TOY_CHECK(a.shape() == b.shape(), "[swiglu] gate and up shapes differ: {} vs {}", a.shape().str(), b.shape().str());
  if (!k_swiglu.available(a.device()) || !k_swiglu_bwd.available(a.device())) return swiglu_composite(a, b);
  Tensor out = empty(a.shape(), a.dtype(), a.device());
  k_swiglu(a.device())(a, b, out);
  if (needs_grad({&a, &b})) {
    record("swiglu", out, {a, b}, [a, b](const Tensor& g) -> Grads {
      Tensor da = empty(a.shape(), a.dtype(), a.device()), db = empty(b.shape(), b.dtype(), b.device());
      k_swiglu_bwd(a.device())(a, b, contiguous_nograd(g), da, db);
      return {wants_grad(a) ? da : Tensor(), wants_grad(b) ? db : Tensor()};
    });
  }
  return out;
}

Tensor swiglu(const Tensor& x_in) {
  // The split form reads both halves of each row in place and writes the gradient of both
  // halves in one buffer: no slices, so no zero-filled scatter of each half's gradient.
  OpSpan span("swiglu", {&x_in});
  check_float(x_in, "swiglu");
  TOY_CHECK(x_in.ndim() >= 1 && x_in.size(-1) % 2 == 0, "[swiglu] split form needs an even last dim, got shape {}",
            x_in.shape().str());
  if (!k_swiglu_packed.available(x_in.device()) || !k_swiglu_packed_bwd.available(x_in.device())) {
    const int axis = x_in.ndim() - 1;
    const int64_t F = x_in.size(axis) / 2;
    return swiglu(slice(x_in, axis, 0, F), slice(x_in, axis, F, 2 * F));
  }
  Tensor x = contiguous_nograd(x_in);
  Shape os = x.shape();
  os[os.ndim() - 1] /= 2;
  Tensor out = empty(os, x.dtype(), x.device());
  k_swiglu_packed(x.device())(x, out);
  if (needs_grad({&x_in})) {
    record("swiglu", out, {x_in}, [x](const Tensor& g) -> Grads {
      Tensor dx = empty(x.shape(), x.dtype(), x.device());
      k_swiglu_packed_bwd(x.device())(x, g, dx);
      return {dx};
    });
  }
  return out;
}

Tensor dropout(const Tensor& x, float p, bool training, Generator& gen) {
  check_float(x, "dropout");
  TOY_CHECK(p >= 0.0f && p <= 1.0f, "[dropout] probability must be in [0, 1], got {}", p);
  if (!training || p == 0.0f) return x;
  if (p == 1.0f) return mul(x, zeros(Shape{}, x.dtype(), x.device()));
  OpSpan span("dropout", {&x});
  // A generator addressed by a device step: the kernel adds the step (read there) to the
  // counter; the backward holds the scalar, whose value stays until the step ends.
  Tensor step;
  if (const Tensor* s = gen.device_step()) {
    step = *s;
    check_same_device(x, step, "dropout");
  }
  kern::DropoutArgs a{p, gen.seed(), gen.stream(), gen.reserve(uint64_t(x.numel() + 3) / 4)};
  a.step = step.defined() ? &step : nullptr;
  Tensor xc = contiguous_nograd(x);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  k_dropout(x.device())(xc, y, a);
  if (needs_grad({&x})) {
    record("dropout", y, {x}, [a, step, dev = x.device()](const Tensor& g) -> Grads {
      Tensor gc = contiguous_nograd(g);
      Tensor dx = empty(g.shape(), g.dtype(), dev);
      kern::DropoutArgs b = a;
      b.step = step.defined() ? &step : nullptr;
      k_dropout(dev)(gc, dx, b);  // same counter: same mask
      return {dx};
    });
  }
  return y;
}

namespace detail {
void define_elementwise_ops(Registry& r) {
  const std::vector<std::string> bin = {"binary", "reduce"}, un = {"unary", "unary_backward"};
  r.define_op(primitive_op("add", bin, "a + b, broadcasting"));
  r.define_op(primitive_op("sub", bin, "a - b, broadcasting"));
  r.define_op(primitive_op("mul", bin, "a * b, broadcasting"));
  r.define_op(primitive_op("div", bin, "a / b, broadcasting"));
  r.define_op(primitive_op("scale", un, "x * s for a scalar s"));
  r.define_op(primitive_op("neg", un, "-x"));
  r.define_op(primitive_op("exp", un, "e^x"));
  r.define_op(primitive_op("log", un, "natural log"));
  r.define_op(primitive_op("sqrt", un, "square root"));
  r.define_op(primitive_op("rsqrt", un, "1 / sqrt(x)"));
  r.define_op(primitive_op("square", un, "x^2"));
  r.define_op(primitive_op("abs", un, "|x|"));
  r.define_op(primitive_op("tanh", un, "hyperbolic tangent"));
  r.define_op(primitive_op("sigmoid", un, "1 / (1 + e^-x)"));
  r.define_op(primitive_op("relu", un, "max(x, 0)"));
  r.define_op(primitive_op("silu", un, "x * sigmoid(x)"));
  r.define_op(primitive_op("softplus", un, "log(1 + e^x); x above 20"));
  r.define_op(primitive_op("gelu", un, "GELU, tanh approximation or exact (erf)"));
  r.define_op(primitive_op("clamp", un, "min(max(x, lo), hi)"));
  r.define_op(fused_op("swiglu", {"swiglu", "swiglu_backward", "swiglu_packed", "swiglu_packed_backward"},
                       kCompositeKernels, "silu(a) * b; split form on one tensor"));
  r.define_op(primitive_op("dropout", {"dropout"}, "inverted dropout from a counter-based RNG (mask recomputed)"));
}
}  // namespace detail

}  // namespace toy
