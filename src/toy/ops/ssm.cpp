// SSM ops: ssm_conv lives in conv.cpp; here the Mamba-2 selective scan and the gated delta
// rule (Gated DeltaNet). Each has two outputs (y and the final state) that both may carry
// gradient: they are returned as views of one packed tensor whose single tape node receives
// both gradients at once.
#include <cmath>

#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::SsmScan> k_scan("ssm_scan");
const KernelRef<kern::SsmScanBackward> k_scan_bwd("ssm_scan_backward");
const KernelRef<kern::GatedDeltaRule> k_gdr("gated_delta_rule");
const KernelRef<kern::GatedDeltaRuleBackward> k_gdr_bwd("gated_delta_rule_backward");
const KernelRef<kern::GdnSplitNorm> k_split("gdn_split_norm");
const KernelRef<kern::GdnSplitNormBackward> k_split_bwd("gdn_split_norm_backward");

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

namespace {

// The rule on contiguous F32 q, k, v, g, beta, s0: o and the final state in one packed tensor,
// and (when a backward will follow) the state before every 64th token.
struct GdrForward {
  Tensor packed, starts;
  Shape ys, ss;
};
GdrForward gdr_forward(const Tensor& qf, const Tensor& kf, const Tensor& vf, const Tensor& gf, const Tensor& bf,
                       const Tensor& s0f, GatedDeltaAlgorithm algorithm, bool grad) {
  const int64_t Bn = qf.size(0), T = qf.size(1), Dk = qf.size(3), Hv = vf.size(2), Dv = vf.size(3);
  GdrForward f{Tensor(), Tensor(), Shape{Bn, T, Hv, Dv}, Shape{Bn, Hv, Dk, Dv}};
  const int64_t ny = f.ys.numel();
  f.packed = empty(Shape{ny + f.ss.numel()}, DType::F32, qf.device());
  Tensor o = make_view(f.packed, f.ys, contiguous_strides(f.ys), 0);
  Tensor sf = make_view(f.packed, f.ss, contiguous_strides(f.ss), ny);
  const bool chunked = algorithm == GatedDeltaAlgorithm::Chunked ||
                       (algorithm == GatedDeltaAlgorithm::Auto && T >= kGatedDeltaChunk);
  // For the backward: the state before every 64th token (1/64 of what keeping them all costs).
  if (grad)
    f.starts = empty(Shape{Bn, Hv, (T + kern::kGatedDeltaStateEvery - 1) / kern::kGatedDeltaStateEvery, Dk, Dv},
                     DType::F32, qf.device());
  k_gdr(qf.device())(qf, kf, vf, gf, bf, s0f, chunked ? kGatedDeltaChunk : 1, o, sf, f.starts);
  return f;
}

// The rule's input gradients from the packed output's gradient.
struct GdrGrads {
  Tensor dq, dk, dv, dg, db, ds0;
};
GdrGrads gdr_backward(const GdrForward& f, const Tensor& qf, const Tensor& kf, const Tensor& vf, const Tensor& gf,
                      const Tensor& bf, const Tensor& s0f, const Tensor& gr) {
  Tensor go = contiguous_nograd(make_view(gr, f.ys, contiguous_strides(f.ys), gr.offset()));
  Tensor gs = contiguous_nograd(make_view(gr, f.ss, contiguous_strides(f.ss), gr.offset() + f.ys.numel()));
  const Device dev = qf.device();
  GdrGrads d{empty(qf.shape(), DType::F32, dev), empty(kf.shape(), DType::F32, dev), empty(vf.shape(), DType::F32, dev),
             empty(gf.shape(), DType::F32, dev), empty(bf.shape(), DType::F32, dev),
             s0f.defined() ? empty(s0f.shape(), DType::F32, dev) : Tensor()};
  k_gdr_bwd(dev)(qf, kf, vf, gf, bf, s0f, f.starts, go, gs, d.dq, d.dk, d.dv, d.dg, d.db, d.ds0);
  return d;
}

void check_gdr_gates(const Tensor& g, const Tensor& beta, const Tensor& s0, int64_t Bn, int64_t T, int64_t Hv,
                     int64_t Dk, int64_t Dv, const char* op) {
  check_shape(g, Shape{Bn, T, Hv}, op, "g");
  check_shape(beta, Shape{Bn, T, Hv}, op, "beta");
  if (s0.defined()) check_shape(s0, Shape{Bn, Hv, Dk, Dv}, op, "initial state");
}

}  // namespace

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
  check_gdr_gates(g, beta, s0, Bn, T, Hv, Dk, Dv, op);
  Tensor qf = contiguous_f32_nograd(q), kf = contiguous_f32_nograd(k), vf = contiguous_f32_nograd(v);
  Tensor gf = contiguous_f32_nograd(g), bf = contiguous_f32_nograd(beta);
  Tensor s0f = s0.defined() ? contiguous_f32_nograd(s0) : Tensor();
  const bool grad = needs_grad({&q, &k, &v, &g, &beta, &s0});
  GdrForward f = gdr_forward(qf, kf, vf, gf, bf, s0f, algorithm, grad);
  if (grad) {
    // (The closure keeps what the backward needs, not the output: no cycle through its node.)
    const GdrForward saved{Tensor(), f.starts, f.ys, f.ss};
    record(op, f.packed, {q, k, v, g, beta, s0}, [=](const Tensor& gr) -> Grads {
      const GdrGrads d = gdr_backward(saved, qf, kf, vf, gf, bf, s0f, gr);
      return {grad_as(d.dq, q), grad_as(d.dk, k), grad_as(d.dv, v), grad_as(d.dg, g), grad_as(d.db, beta),
              s0.defined() ? grad_as(d.ds0, s0) : Tensor()};
    });
  }
  return unpack(f.packed, f.ys, f.ss, q.dtype());
}

std::pair<Tensor, Tensor> gated_delta_rule_qkv(const Tensor& c, const Tensor& g, const Tensor& beta, int64_t k_heads,
                                               int64_t v_heads, int64_t head_dim, float eps, const Tensor& s0) {
  OpSpan span("gated_delta_rule_qkv", {&c, &g, &beta});
  const char* op = "gated_delta_rule_qkv";
  for (const Tensor* t : {&c, &g, &beta}) check_float(*t, op, "input");
  const int64_t Hk = k_heads, Hv = v_heads, D = head_dim;
  TOY_CHECK(Hk > 0 && Hv > 0 && D > 0 && Hv % Hk == 0 && c.ndim() == 3 && c.size(2) == (2 * Hk + Hv) * D,
            "[gated_delta_rule_qkv] c must be [B, T, (2 x {} + {}) x {}] with the V heads a multiple of the K heads, "
            "got {}", Hk, Hv, D, c.shape().str());
  TOY_CHECK(std::isfinite(eps) && eps > 0, "[gated_delta_rule_qkv] eps must be positive, got {}", eps);
  const int64_t Bn = c.size(0), T = c.size(1);
  check_gdr_gates(g, beta, s0, Bn, T, Hv, D, D, op);
  Tensor cf = contiguous_f32_nograd(c), gf = contiguous_f32_nograd(g), bf = contiguous_f32_nograd(beta);
  Tensor s0f = s0.defined() ? contiguous_f32_nograd(s0) : Tensor();
  const Device dev = c.device();
  const float q_scale = 1.0f / std::sqrt(float(D));
  Tensor qf = empty(Shape{Bn, T, Hk, D}, DType::F32, dev), kf = empty(Shape{Bn, T, Hk, D}, DType::F32, dev);
  Tensor vf = empty(Shape{Bn, T, Hv, D}, DType::F32, dev);
  Tensor q_inv = empty(Shape{Bn, T, Hk}, DType::F32, dev), k_inv = empty(Shape{Bn, T, Hk}, DType::F32, dev);
  k_split(dev)(cf, Hk, Hv, D, eps, q_scale, qf, kf, vf, q_inv, k_inv);
  const bool grad = needs_grad({&c, &g, &beta, &s0});
  GdrForward f = gdr_forward(qf, kf, vf, gf, bf, s0f, GatedDeltaAlgorithm::Auto, grad);
  if (grad) {
    const GdrForward saved{Tensor(), f.starts, f.ys, f.ss};
    record(op, f.packed, {c, g, beta, s0}, [=](const Tensor& gr) -> Grads {
      const GdrGrads d = gdr_backward(saved, qf, kf, vf, gf, bf, s0f, gr);
      Tensor dc = empty(cf.shape(), DType::F32, cf.device());
      k_split_bwd(cf.device())(qf, kf, q_inv, k_inv, eps, q_scale, d.dq, d.dk, d.dv, dc);
      return {grad_as(dc, c), grad_as(d.dg, g), grad_as(d.db, beta), s0.defined() ? grad_as(d.ds0, s0) : Tensor()};
    });
  }
  return unpack(f.packed, f.ys, f.ss, c.dtype());
}

namespace detail {
void define_ssm_ops(Registry& r) {
  r.define_op(primitive_op("ssm_conv", {"ssm_conv", "ssm_conv_backward"},
                           "depthwise conv over time on a state-prefixed input (Mamba)"));
  r.define_op(primitive_op("ssm_scan", {"ssm_scan", "ssm_scan_backward"}, "Mamba-2 selective scan: y and final state"));
  r.define_op(primitive_op("gated_delta_rule", {"gated_delta_rule", "gated_delta_rule_backward"},
                           "Gated DeltaNet recurrence (chunked WY form or token by token): o and final state"));
  r.define_op(primitive_op("gated_delta_rule_qkv",
                           {"gdn_split_norm", "gdn_split_norm_backward", "gated_delta_rule", "gated_delta_rule_backward"},
                           "the rule on a layer's conv output: q/k/v split, q and k L2-normalised (q / sqrt(D)), one node"));
}
}  // namespace detail

}  // namespace toy
