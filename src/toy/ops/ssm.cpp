// SSM ops: ssm_conv lives in conv.cpp; here the Mamba-2 selective scan and the gated delta
// rule (Gated DeltaNet). Each has two outputs (y and the final state) that both may carry
// gradient: they are returned as views of one packed tensor whose single tape node receives
// both gradients at once.
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::SsmScan> k_scan("ssm_scan");
const KernelRef<kern::SsmScanBackward> k_scan_bwd("ssm_scan_backward");
const KernelRef<kern::GatedDeltaRule> k_gdr("gated_delta_rule");
const KernelRef<kern::GatedDeltaRuleBackward> k_gdr_bwd("gated_delta_rule_backward");

// Returns views y [ny] and s [ns] of `packed` that route gradients into its one tape node.
std::pair<Tensor, Tensor> unpack(const Tensor& packed, const Shape& ys, const Shape& ss, DType dtype) {
  const int64_t ny = ys.numel(), ns = ss.numel();
  Tensor yv = reshape(slice(packed, 0, 0, ny), ys);
  Tensor sv = reshape(slice(packed, 0, ny, ny + ns), ss);
  if (dtype != DType::F32) {
    yv = cast(yv, dtype);
    sv = cast(sv, dtype);
  }
  return {yv, sv};
}

Tensor grad_as(const Tensor& grad, const Tensor& like) {
  return like.defined() && like.dtype() != DType::F32 ? cast(grad, like.dtype()) : grad;
}
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
      return {grad_as(dx, x), grad_as(ddt, dt), grad_as(dA, A), grad_as(dB, B), grad_as(dC, C),
              s0.defined() ? grad_as(ds0, s0) : Tensor()};
    });
  }
  // Views with their own tape nodes route gradients into the packed tensor.
  return unpack(packed, Shape{Bn, T, H, P}, Shape{Bn, H, P, N}, x.dtype());
}

std::pair<Tensor, Tensor> gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                           const Tensor& beta, const Tensor& s0, GatedDeltaAlgorithm algorithm) {
  OpSpan span("gated_delta_rule", {&q, &k, &v, &g, &beta});
  const char* op = "gated_delta_rule";
  for (const Tensor* t : {&q, &k, &v, &g, &beta}) check_float(*t, op, "input");
  TOY_CHECK(q.ndim() == 4 && v.ndim() == 4, "[gated_delta_rule] q must be [B, T, Hk, Dk] and v [B, T, Hv, Dv], got "
            "{} and {}", q.shape().str(), v.shape().str());
  const int64_t Bn = q.size(0), T = q.size(1), Hk = q.size(2), Dk = q.size(3), Hv = v.size(2), Dv = v.size(3);
  check_shape(k, q.shape(), op, "k");
  TOY_CHECK(v.size(0) == Bn && v.size(1) == T && Hk > 0 && Hv % Hk == 0,
            "[gated_delta_rule] v must be [{}, {}, Hv, Dv] with Hv a multiple of the {} K heads, got {}", Bn, T, Hk,
            v.shape().str());
  check_shape(g, Shape{Bn, T, Hv}, op, "g");
  check_shape(beta, Shape{Bn, T, Hv}, op, "beta");
  if (s0.defined()) check_shape(s0, Shape{Bn, Hv, Dk, Dv}, op, "initial state");
  Tensor qf = contiguous_f32_nograd(q), kf = contiguous_f32_nograd(k), vf = contiguous_f32_nograd(v);
  Tensor gf = contiguous_f32_nograd(g), bf = contiguous_f32_nograd(beta);
  Tensor s0f = s0.defined() ? contiguous_f32_nograd(s0) : Tensor();
  const Shape ys{Bn, T, Hv, Dv}, ss{Bn, Hv, Dk, Dv};
  const int64_t ny = ys.numel();
  Tensor packed = empty(Shape{ny + ss.numel()}, DType::F32, q.device());
  Tensor o = make_view(packed, ys, contiguous_strides(ys), 0);
  Tensor sf = make_view(packed, ss, contiguous_strides(ss), ny);
  const bool chunked = algorithm == GatedDeltaAlgorithm::Chunked ||
                       (algorithm == GatedDeltaAlgorithm::Auto && T >= kGatedDeltaChunk);
  const bool grad = needs_grad({&q, &k, &v, &g, &beta, &s0});
  // For the backward: the state before every 64th token (1/64 of what keeping them all costs).
  Tensor starts = grad ? empty(Shape{Bn, Hv, (T + kern::kGatedDeltaStateEvery - 1) / kern::kGatedDeltaStateEvery, Dk,
                                     Dv}, DType::F32, q.device())
                       : Tensor();
  k_gdr(q.device())(qf, kf, vf, gf, bf, s0f, chunked ? kGatedDeltaChunk : 1, o, sf, starts);
  if (grad) {
    record(op, packed, {q, k, v, g, beta, s0}, [=](const Tensor& gr) -> Grads {
      Tensor go = contiguous_nograd(make_view(gr, ys, contiguous_strides(ys), gr.offset()));
      Tensor gs = contiguous_nograd(make_view(gr, ss, contiguous_strides(ss), gr.offset() + ny));
      const Device dev = qf.device();
      Tensor dq = empty(qf.shape(), DType::F32, dev), dk = empty(kf.shape(), DType::F32, dev);
      Tensor dv = empty(vf.shape(), DType::F32, dev), dg = empty(gf.shape(), DType::F32, dev);
      Tensor db = empty(bf.shape(), DType::F32, dev);
      Tensor ds0 = s0f.defined() ? empty(s0f.shape(), DType::F32, dev) : Tensor();
      k_gdr_bwd(dev)(qf, kf, vf, gf, bf, s0f, starts, go, gs, dq, dk, dv, dg, db, ds0);
      return {grad_as(dq, q), grad_as(dk, k), grad_as(dv, v), grad_as(dg, g), grad_as(db, beta),
              s0.defined() ? grad_as(ds0, s0) : Tensor()};
    });
  }
  return unpack(packed, ys, ss, q.dtype());
}

namespace detail {
void define_ssm_ops(Registry& r) {
  r.define_op(primitive_op("ssm_conv", {"ssm_conv", "ssm_conv_backward"},
                           "depthwise conv over time on a state-prefixed input (Mamba)"));
  r.define_op(primitive_op("ssm_scan", {"ssm_scan", "ssm_scan_backward"}, "Mamba-2 selective scan: y and final state"));
  r.define_op(primitive_op("gated_delta_rule", {"gated_delta_rule", "gated_delta_rule_backward"},
                           "Gated DeltaNet recurrence (chunked WY form or token by token): o and final state"));
}
}  // namespace detail

}  // namespace toy
