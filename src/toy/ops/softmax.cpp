// softmax / log_softmax with scale and additive mask, and the causal diag mask.
// Backward: dz from the saved output (y * (g - sum(g y)), or g - exp(y) sum(g) for log),
// then dx = scale * dz and dmask = dz summed to the mask's shape.
#include <cmath>

#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::Softmax> k_softmax("softmax");
const KernelRef<kern::SoftmaxBackward> k_softmax_bwd("softmax_backward");
const KernelRef<kern::DiagMask> k_diag("diag_mask_inf");

Tensor softmax_impl(const char* name, bool log, const Tensor& x_in, float scale_, const Tensor& mask) {
  OpSpan span(name, {&x_in, &mask});
  check_float(x_in, name, "x");
  TOY_CHECK(x_in.ndim() >= 1, "[{}] x must have at least 1 dimension", name);
  Tensor maskf;
  if (mask.defined()) {
    check_float(mask, name, "mask");
    check_same_device(x_in, mask, name);
    Shape bs = broadcast_shapes(x_in.shape(), mask.shape(), name);
    TOY_CHECK(bs == x_in.shape(), "[{}] mask {} must broadcast to x {}", name, mask.shape().str(), x_in.shape().str());
    maskf = mask.dtype() == DType::F32 ? mask : cast(mask, DType::F32);
    maskf = expand_view(maskf, x_in.shape());
  }
  if (!k_softmax.available(x_in.device()) || !k_softmax_bwd.available(x_in.device()))
    return softmax_composite(log, x_in, scale_, mask);
  Tensor x = contiguous_nograd(x_in);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  k_softmax(x.device())(x, maskf, scale_, log, y);
  if (needs_grad({&x_in, &mask})) {
    record(name, y, {x_in, mask}, [name, log, ys = y.detach(), scale_, mask](const Tensor& g) -> Grads {
      Tensor dz = empty(ys.shape(), ys.dtype(), ys.device());
      k_softmax_bwd(ys.device())(ys, g, log, dz);
      Grads r(2);
      r[0] = scale_ == 1.0f ? dz : scale(dz, scale_);
      if (wants_grad(mask)) {
        Tensor dm = sum_to(dz, mask.shape());
        r[1] = dm.dtype() == mask.dtype() ? dm : cast(dm, mask.dtype());
      }
      (void)name;
      return r;
    });
  }
  return y;
}
}  // namespace

Tensor softmax(const Tensor& x, float s, const Tensor& mask) { return softmax_impl("softmax", false, x, s, mask); }
Tensor log_softmax(const Tensor& x, float s, const Tensor& mask) {
  return softmax_impl("log_softmax", true, x, s, mask);
}

Tensor diag_mask_inf(const Tensor& x_in, int64_t n_past) {
  OpSpan span("diag_mask_inf", {&x_in});
  check_float(x_in, "diag_mask_inf", "x");
  TOY_CHECK(x_in.ndim() >= 2, "[diag_mask_inf] x must be [..., Tq, Tk], got {}", x_in.shape().str());
  Tensor x = contiguous_nograd(x_in);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  k_diag(x.device())(x, n_past, -INFINITY, y);
  if (needs_grad({&x_in})) {
    record("diag_mask_inf", y, {x_in}, [n_past](const Tensor& g) -> Grads {
      Tensor dx = empty(g.shape(), g.dtype(), g.device());
      k_diag(g.device())(g, n_past, 0.0f, dx);  // masked positions get no gradient
      return {dx};
    });
  }
  return y;
}

namespace detail {
void define_softmax_ops(Registry& r) {
  r.define_op(fused_op("softmax", {"softmax", "softmax_backward", "unary"}, kCompositeKernels,
                       "softmax(x * scale + mask) over the last axis"));
  r.define_op(fused_op("log_softmax", {"softmax", "softmax_backward", "unary"}, kCompositeKernels,
                       "log_softmax(x * scale + mask) over the last axis"));
  r.define_op(primitive_op("diag_mask_inf", {"diag_mask_inf"}, "causal mask: -inf above diagonal n_past"));
}
}  // namespace detail

}  // namespace toy
