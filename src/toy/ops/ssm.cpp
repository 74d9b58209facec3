// SSM ops: ssm_conv lives in conv.cpp; here the Mamba-2 selective scan. The scan has two
// outputs (y and the final state) that both may carry gradient: they are returned as views
// of one packed tensor whose single tape node receives both gradients at once.
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::SsmScan> k_scan("ssm_scan");
const KernelRef<kern::SsmScanBackward> k_scan_bwd("ssm_scan_backward");
}  // namespace

std::pair<Tensor, Tensor> ssm_scan(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                                   const Tensor& C, const Tensor& s0) {
  OpSpan span("ssm_scan", {&x, &dt, &A, &B, &C});
  const char* op = "ssm_scan";
  for (const Tensor* t : {&x, &dt, &A, &B, &C}) check_float(*t, op, "input");
  TOY_CHECK(x.ndim() == 4, "[ssm_scan] x must be [B, T, H, P], got {}", x.shape().str());
  const int64_t Bn = x.size(0), T = x.size(1), H = x.size(2), P = x.size(3);
  check_shape(dt, Shape{Bn, T, H}, op, "dt");
  check_shape(A, Shape{H}, op, "A");
  TOY_CHECK(B.ndim() == 4 && B.size(0) == Bn && B.size(1) == T && B.size(2) > 0 && H % B.size(2) == 0,
            "[ssm_scan] B must be [{}, {}, G, N] with {} heads a multiple of G, got {}", Bn, T, H, B.shape().str());
  const int64_t G = B.size(2), N = B.size(3);
  check_shape(C, B.shape(), op, "C");
  if (s0.defined()) check_shape(s0, Shape{Bn, H, P, N}, op, "initial state");
  Tensor xf = contiguous_f32_nograd(x), dtf = contiguous_f32_nograd(dt), Af = contiguous_f32_nograd(A), Bf = contiguous_f32_nograd(B), Cf = contiguous_f32_nograd(C);
  Tensor s0f = s0.defined() ? contiguous_f32_nograd(s0) : Tensor();
  const int64_t ny = Bn * T * H * P, ns = Bn * H * P * N;
  Tensor packed = empty(Shape{ny + ns}, DType::F32, x.device());
  Tensor y = make_view(packed, Shape{Bn, T, H, P}, contiguous_strides(Shape{Bn, T, H, P}), 0);
  Tensor sf = make_view(packed, Shape{Bn, H, P, N}, contiguous_strides(Shape{Bn, H, P, N}), ny);
  k_scan(x.device())(xf, dtf, Af, Bf, Cf, s0f, y, sf);
  (void)G;
  if (needs_grad({&x, &dt, &A, &B, &C, &s0})) {
    record(op, packed, {x, dt, A, B, C, s0}, [=](const Tensor& g) -> Grads {
      Tensor gy = make_view(g, y.shape(), y.strides(), g.offset());
      Tensor gs = make_view(g, sf.shape(), sf.strides(), g.offset() + ny);
      Tensor dx = empty(xf.shape(), DType::F32, xf.device()), ddt = empty(dtf.shape(), DType::F32, xf.device());
      Tensor dA = empty(Af.shape(), DType::F32, xf.device()), dB = empty(Bf.shape(), DType::F32, xf.device());
      Tensor dC = empty(Cf.shape(), DType::F32, xf.device());
      Tensor ds0 = s0f.defined() ? empty(s0f.shape(), DType::F32, xf.device()) : Tensor();
      k_scan_bwd(xf.device())(xf, dtf, Af, Bf, Cf, s0f, gy, gs, dx, ddt, dA, dB, dC, ds0);
      auto back = [](const Tensor& grad, const Tensor& like) {
        return like.defined() && like.dtype() != DType::F32 ? cast(grad, like.dtype()) : grad;
      };
      return {back(dx, x), back(ddt, dt), back(dA, A), back(dB, B), back(dC, C), s0.defined() ? back(ds0, s0) : Tensor()};
    });
  }
  // Views with their own tape nodes route gradients into the packed tensor.
  Tensor flat = packed;
  Tensor yv = reshape(slice(flat, 0, 0, ny), Shape{Bn, T, H, P});
  Tensor sv = reshape(slice(flat, 0, ny, ny + ns), Shape{Bn, H, P, N});
  if (x.dtype() != DType::F32) {
    yv = cast(yv, x.dtype());
    sv = cast(sv, x.dtype());
  }
  return {yv, sv};
}

namespace detail {
void define_ssm_ops(Registry& r) {
  r.define_op(primitive_op("ssm_conv", {"ssm_conv", "ssm_conv_backward"},
                           "depthwise conv over time on a state-prefixed input (Mamba)"));
  r.define_op(primitive_op("ssm_scan", {"ssm_scan", "ssm_scan_backward"}, "Mamba-2 selective scan: y and final state"));
}
}  // namespace detail

}  // namespace toy
