// The composite forms of the fused ops: what attention, the norms, softmax and swiglu run on a
// device whose backend has no kernel of theirs (a new device starts with the primitives; its
// fused kernels come one by one). Built from other ops only, so autograd comes with them;
// computed in F32 and rounded to the input's dtype as the fused kernels do. Each is tested on
// the sim device with the fused kernels withheld (tests/sim/test_fallbacks.cpp), against the
// fused result.
#include <cfloat>
#include <cmath>

#include "toy/ops/common.h"

namespace toy::detail {

namespace {
Tensor f32(const Tensor& t) { return !t.defined() || t.dtype() == DType::F32 ? t : cast(t, DType::F32); }
Tensor as(const Tensor& t, DType d) { return t.dtype() == d ? t : cast(t, d); }
int last_axis(const Tensor& t) { return t.ndim() - 1; }
}  // namespace

Tensor rms_norm_composite(const Tensor& x, const Tensor& w, float eps) {
  const Tensor xf = f32(x);
  Tensor y = mul(xf, rsqrt(add_scalar(mean(square(xf), last_axis(xf), true), eps)));
  if (w.defined()) y = mul(y, f32(w));
  return as(y, x.dtype());
}

Tensor layer_norm_composite(const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  const Tensor xf = f32(x);
  const Tensor centred = sub(xf, mean(xf, last_axis(xf), true));
  Tensor y = mul(centred, rsqrt(add_scalar(mean(square(centred), last_axis(xf), true), eps)));
  if (w.defined()) y = mul(y, f32(w));
  if (b.defined()) y = add(y, f32(b));
  return as(y, x.dtype());
}

Tensor l2_norm_composite(const Tensor& x, float eps) {
  const Tensor xf = f32(x);
  const Tensor norm = sqrt(sum(square(xf), last_axis(xf), true));
  return as(div(xf, clamp(norm, eps, FLT_MAX)), x.dtype());
}

Tensor softmax_composite(bool log_form, const Tensor& x, float s, const Tensor& mask) {
  Tensor z = f32(x);
  if (s != 1.0f) z = scale(z, s);
  if (mask.defined()) z = add(z, f32(mask));
  // Shift-invariant: the row maximum is a constant (no gradient through it).
  const Tensor shifted = sub(z, max(z.detach(), last_axis(z), true));
  const Tensor e = exp(shifted);
  const Tensor y = log_form ? sub(shifted, log(sum(e, last_axis(z), true))) : div(e, sum(e, last_axis(z), true));
  return as(y, x.dtype());
}

Tensor swiglu_composite(const Tensor& a, const Tensor& b) { return mul(silu(a), b); }

Tensor attention_composite(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t S = k.size(1), Hkv = k.size(2), group = H / Hkv;
  // Query head h reads kv head h / group: each kv head repeated `group` times in place.
  auto heads = [&](const Tensor& t) {
    Tensor f = f32(t);
    if (group > 1) {
      const int64_t d = f.size(3);
      f = reshape(expand(unsqueeze(f, 3), Shape{B, S, Hkv, group, d}), Shape{B, S, H, d});
    }
    return contiguous(permute(f, {0, 2, 1, 3}));  // [B, H, S, d]
  };
  const Tensor qh = contiguous(permute(f32(q), {0, 2, 1, 3}));  // [B, H, T, D]
  Tensor scores = matmul(qh, heads(k), false, true);             // [B, H, T, S]
  if (o.causal) scores = diag_mask_inf(scores, S - T);
  Tensor mask;
  if (o.segments.defined()) {
    // Keys of another segment: a finite -1e30 (an infinite one times 0 would be NaN).
    const Tensor seg = cast(o.segments, DType::F32);
    const Tensor apart = abs(sub(reshape(seg, Shape{B, 1, T, 1}), reshape(seg, Shape{B, 1, 1, T})));
    mask = scale(clamp(apart, 0.0f, 1.0f), -1e30f);
  }
  if (o.window > 0) {
    // Keys at or past `window` behind the query: the same finite -1e30.
    std::vector<float> far(size_t(T * S), 0.0f);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < S; ++j)
        if (i + (S - T) - j >= o.window) far[size_t(i * S + j)] = -1e30f;
    const Tensor w = to(from_vector(far, Shape{1, 1, T, S}), q.device());
    mask = mask.defined() ? add(mask, w) : w;
  }
  const float sc = o.scale != 0.0f ? o.scale : 1.0f / std::sqrt(float(D));
  const Tensor out = matmul(softmax(scores, sc, mask), heads(v));  // [B, H, T, Dv]
  return as(contiguous(permute(out, {0, 2, 1, 3})), q.dtype());     // [B, T, H, Dv]
}

}  // namespace toy::detail
