// Norms over the last axis with fused backward kernels (the original system had no
// LayerNorm backward; here every norm has one). Saved for the backward: rstd (and mean),
// as llm.c saves them.
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::RmsNorm> k_rms("rms_norm");
const KernelRef<kern::RmsNormBackward> k_rms_bwd("rms_norm_backward");
const KernelRef<kern::LayerNorm> k_ln("layer_norm");
const KernelRef<kern::LayerNormBackward> k_ln_bwd("layer_norm_backward");
const KernelRef<kern::L2Norm> k_l2("l2_norm");
const KernelRef<kern::L2NormBackward> k_l2_bwd("l2_norm_backward");

Shape rows_shape(const Tensor& x) {
  Shape s = x.shape();
  s.pop_back();
  return s;
}

void check_param(const Tensor& p, const Tensor& x, const char* op, const char* what) {
  if (!p.defined()) return;
  check_float(p, op, what);
  check_same_dtype(x, p, op);
  check_same_device(x, p, op);
  TOY_CHECK(p.ndim() == 1 && p.size(0) == x.size(-1), "[{}] {} must be [{}] to match x {}, got {}", op, what,
            x.size(-1), x.shape().str(), p.shape().str());
}
}  // namespace

Tensor rms_norm(const Tensor& x_in, const Tensor& w, float eps) {
  OpSpan span("rms_norm", {&x_in, &w});
  check_float(x_in, "rms_norm", "x");
  TOY_CHECK(x_in.ndim() >= 1, "[rms_norm] x must have at least 1 dimension");
  check_param(w, x_in, "rms_norm", "weight");
  TOY_CHECK(eps >= 0.0f, "[rms_norm] eps must be >= 0, got {}", eps);
  if (!k_rms.available(x_in.device()) || !k_rms_bwd.available(x_in.device())) return rms_norm_composite(x_in, w, eps);
  Tensor x = contiguous_nograd(x_in);
  Tensor wc = w.defined() ? contiguous_nograd(w) : Tensor();
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = empty(rows_shape(x), DType::F32, x.device());
  k_rms(x.device())(x, wc, eps, y, rstd);
  if (needs_grad({&x_in, &w})) {
    record("rms_norm", y, {x_in, w}, [x, wc, rstd](const Tensor& g) -> Grads {
      Tensor dx = empty(x.shape(), x.dtype(), x.device());
      Tensor dw = wants_grad(wc) ? zeros(wc.shape(), wc.dtype(), wc.device()) : Tensor();
      k_rms_bwd(x.device())(x, wc, rstd, g, dx, dw);
      return {dx, dw};
    });
  }
  return y;
}

Tensor layer_norm(const Tensor& x_in, const Tensor& w, const Tensor& b, float eps) {
  OpSpan span("layer_norm", {&x_in, &w, &b});
  check_float(x_in, "layer_norm", "x");
  TOY_CHECK(x_in.ndim() >= 1, "[layer_norm] x must have at least 1 dimension");
  check_param(w, x_in, "layer_norm", "weight");
  check_param(b, x_in, "layer_norm", "bias");
  TOY_CHECK(eps >= 0.0f, "[layer_norm] eps must be >= 0, got {}", eps);
  if (!k_ln.available(x_in.device()) || !k_ln_bwd.available(x_in.device()))
    return layer_norm_composite(x_in, w, b, eps);
  Tensor x = contiguous_nograd(x_in);
  Tensor wc = w.defined() ? contiguous_nograd(w) : Tensor();
  Tensor bc = b.defined() ? contiguous_nograd(b) : Tensor();
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  Tensor mean = empty(rows_shape(x), DType::F32, x.device()), rstd = empty(rows_shape(x), DType::F32, x.device());
  k_ln(x.device())(x, wc, bc, eps, y, mean, rstd);
  if (needs_grad({&x_in, &w, &b})) {
    record("layer_norm", y, {x_in, w, b}, [x, wc, bc, mean, rstd](const Tensor& g) -> Grads {
      Tensor dx = empty(x.shape(), x.dtype(), x.device());
      Tensor dw = wants_grad(wc) ? zeros(wc.shape(), wc.dtype(), wc.device()) : Tensor();
      Tensor db = wants_grad(bc) ? zeros(bc.shape(), bc.dtype(), bc.device()) : Tensor();
      k_ln_bwd(x.device())(x, wc, mean, rstd, g, dx, dw, db);
      return {dx, dw, db};
    });
  }
  return y;
}

Tensor l2_norm(const Tensor& x_in, float eps) {
  OpSpan span("l2_norm", {&x_in});
  check_float(x_in, "l2_norm", "x");
  TOY_CHECK(x_in.ndim() >= 1, "[l2_norm] x must have at least 1 dimension");
  TOY_CHECK(eps > 0.0f, "[l2_norm] eps must be > 0, got {}", eps);
  if (!k_l2.available(x_in.device()) || !k_l2_bwd.available(x_in.device())) return l2_norm_composite(x_in, eps);
  Tensor x = contiguous_nograd(x_in);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  Tensor inv = empty(rows_shape(x), DType::F32, x.device());
  k_l2(x.device())(x, eps, y, inv);
  if (needs_grad({&x_in})) {
    record("l2_norm", y, {x_in}, [x, ys = y.detach(), inv, eps](const Tensor& g) -> Grads {
      Tensor dx = empty(x.shape(), x.dtype(), x.device());
      k_l2_bwd(x.device())(x, ys, inv, eps, g, dx);
      return {dx};
    });
  }
  return y;
}

namespace detail {
void define_norm_ops(Registry& r) {
  r.define_op(fused_op("rms_norm", {"rms_norm", "rms_norm_backward"}, kCompositeKernels,
                       "x / rms(x) * w over the last axis"));
  r.define_op(fused_op("layer_norm", {"layer_norm", "layer_norm_backward"}, kCompositeKernels,
                       "(x - mean) / std * w + b over the last axis"));
  r.define_op(fused_op("l2_norm", {"l2_norm", "l2_norm_backward"}, kCompositeKernels,
                       "x / max(||x||, eps) over the last axis"));
}
}  // namespace detail

}  // namespace toy
