// Fused scaled-dot-product attention (see backend/cpu/attention.cpp for the kernel).
// Inputs may be strided views of [B, T, H, D] (e.g. slices of one fused qkv projection).
// Non-f32 inputs run through f32 copies; gradients come back in the inputs' dtypes.
#include <cmath>

#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::Attention> k_attn("attention");
const KernelRef<kern::AttentionBackward> k_attn_bwd("attention_backward");
const KernelRef<kern::AttentionDecode> k_attn_decode("attention_decode");

// f32 (or, keep_f16, F16 as it is: attention_decode's caches) with unit last stride, as the
// kernel wants.
Tensor kernel_ready(const Tensor& t, bool keep_f16 = false) {
  NoGradGuard ng;
  Tensor f = t.dtype() == DType::F32 || (keep_f16 && t.dtype() == DType::F16) ? t : cast(t, DType::F32);
  // The kernels hand rows (dim 1) to their GEMMs with leading dimension stride(1), which
  // BLAS-style GEMMs (cuBLAS on the GPU) require to be at least the row length.
  const bool blas_rows = f.stride(-1) == 1 && f.stride(1) >= f.size(3);
  return blas_rows ? f : contiguous_copy(f);
}

// The segment ids of o, checked against [B, T] and made contiguous (undefined if none).
Tensor checked_segments(const AttentionOptions& o, int64_t B, int64_t T) {
  if (!o.segments.defined()) return Tensor();
  check_dtype(o.segments, DType::I32, "attention", "segments");
  TOY_CHECK(o.segments.ndim() == 2 && o.segments.size(0) == B && o.segments.size(1) == T,
            "[attention] segments must be [B, T] = [{}, {}], got {}", B, T, o.segments.shape().str());
  return contiguous_nograd(o.segments);
}

// Whether d has the fused kernels (else the composite form runs: ops/fallbacks.cpp).
bool fused_here(Device d) { return k_attn.available(d) && k_attn_bwd.available(d); }

kern::AttentionArgs kernel_args(const AttentionOptions& o, int64_t head_dim) {
  kern::AttentionArgs a;
  a.scale = o.scale != 0.0f ? o.scale : 1.0f / std::sqrt(float(head_dim));
  a.causal = o.causal;
  a.window = o.window;
  return a;
}
}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  OpSpan span("attention", {&q, &k, &v});
  const char* op = "attention";
  check_float(q, op, "q");
  check_float(k, op, "k");
  check_float(v, op, "v");
  check_same_dtype(q, k, op);
  check_same_dtype(q, v, op);
  check_same_device(q, k, op);
  check_same_device(q, v, op);
  TOY_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4,
            "[attention] q, k, v must be [B, T, H, D]; got {}, {}, {}", q.shape().str(), k.shape().str(),
            v.shape().str());
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t S = k.size(1), Hkv = k.size(2), Dv = v.size(3);
  TOY_CHECK(k.size(0) == B && v.size(0) == B, "[attention] batch sizes differ: q {}, k {}, v {}", B, k.size(0),
            v.size(0));
  TOY_CHECK(k.size(3) == D, "[attention] q and k head dims differ: {} vs {}", D, k.size(3));
  TOY_CHECK(v.size(1) == S && v.size(2) == Hkv, "[attention] k {} and v {} disagree on [S, Hkv]", k.shape().str(),
            v.shape().str());
  TOY_CHECK(Hkv > 0 && H % Hkv == 0, "[attention] query heads {} must be a multiple of kv heads {}", H, Hkv);
  TOY_CHECK(!o.causal || S >= T, "[attention] causal attention needs at least as many keys ({}) as queries ({})", S,
            T);
  TOY_CHECK(!o.segments.defined() || T == S, "[attention] segment ids need T == S, got T {} and S {}", T, S);
  TOY_CHECK(o.window >= 0 && (o.window == 0 || o.causal), "[attention] a sliding window ({}) needs causal attention",
            o.window);
  const Tensor seg = checked_segments(o, B, T);
  if (!fused_here(q.device())) return attention_composite(q, k, v, o);
  const kern::AttentionArgs a = kernel_args(o, D);
  Tensor qf = kernel_ready(q), kf = kernel_ready(k), vf = kernel_ready(v);
  Tensor out = empty(Shape{B, T, H, Dv}, DType::F32, q.device());
  Tensor lse = empty(Shape{B, H, T}, DType::F32, q.device());
  k_attn(q.device())(qf, kf, vf, seg, a, out, lse);
  Tensor result = out;
  if (q.dtype() != DType::F32) {
    NoGradGuard ng;
    result = cast(out, q.dtype());
  }
  if (needs_grad({&q, &k, &v})) {
    // out is saved detached: for f32 inputs it is the result itself, and a node holding its
    // own output would be a reference cycle (a leak when backward never runs).
    record("attention", result, {q, k, v}, [qf, kf, vf, seg, a, out = out.detach(), lse, dt = q.dtype()](const Tensor& g) -> Grads {
      Tensor gf = g.dtype() == DType::F32 ? g : cast(g, DType::F32);
      Tensor dq = empty(qf.shape(), DType::F32, qf.device());
      Tensor dk = empty(kf.shape(), DType::F32, kf.device());
      Tensor dv = empty(vf.shape(), DType::F32, vf.device());
      k_attn_bwd(qf.device())(qf, kf, vf, seg, out, lse, gf, a, dq, dk, dv);
      if (dt != DType::F32) return {cast(dq, dt), cast(dk, dt), cast(dv, dt)};
      return {dq, dk, dv};
    });
  }
  return result;
}

Tensor attention_qkv(const Tensor& qkv, int64_t heads, int64_t kv_heads, const AttentionOptions& o) {
  OpSpan span("attention", {&qkv});
  check_float(qkv, "attention", "qkv");
  TOY_CHECK(qkv.ndim() == 4, "[attention] packed qkv must be [B, T, H + 2*Hkv, D], got {}", qkv.shape().str());
  TOY_CHECK(heads > 0 && kv_heads > 0 && qkv.size(2) == heads + 2 * kv_heads,
            "[attention] packed qkv has {} heads, expected H + 2*Hkv = {} + 2*{}", qkv.size(2), heads, kv_heads);
  TOY_CHECK(heads % kv_heads == 0, "[attention] query heads {} must be a multiple of kv heads {}", heads, kv_heads);
  if (!fused_here(qkv.device())) {
    return attention(slice(qkv, 2, 0, heads), slice(qkv, 2, heads, heads + kv_heads),
                     slice(qkv, 2, heads + kv_heads, heads + 2 * kv_heads), o);
  }
  // Views of the three parts, without tape records: the node below takes qkv itself.
  auto part = [&](const Tensor& t, int64_t h0, int64_t n) {
    Shape s = t.shape();
    s[2] = n;
    return make_view(t, s, t.strides(), t.offset() + h0 * t.stride(2));
  };
  Tensor base = kernel_ready(qkv);
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(3), H = heads, Hkv = kv_heads;
  Tensor q = part(base, 0, H), k = part(base, H, Hkv), v = part(base, H + Hkv, Hkv);
  const Tensor seg = checked_segments(o, B, T);
  const kern::AttentionArgs a = kernel_args(o, D);
  Tensor outf = empty(Shape{B, T, H, D}, DType::F32, qkv.device());
  Tensor lse = empty(Shape{B, H, T}, DType::F32, qkv.device());
  k_attn(qkv.device())(q, k, v, seg, a, outf, lse);
  Tensor result = outf;
  if (qkv.dtype() != DType::F32) {
    NoGradGuard ng;
    result = cast(outf, qkv.dtype());
  }
  if (needs_grad({&qkv})) {
    // outf is saved detached (it may be the result itself: a node must not hold its output).
    record("attention", result, {qkv},
           [base, q, k, v, seg, a, outf = outf.detach(), lse, H, Hkv, part, dt = qkv.dtype()](const Tensor& g) -> Grads {
             Tensor gf = g.dtype() == DType::F32 ? g : cast(g, DType::F32);
             Tensor dqkv = empty(base.shape(), DType::F32, base.device());
             Tensor dq = part(dqkv, 0, H), dk = part(dqkv, H, Hkv), dv = part(dqkv, H + Hkv, Hkv);
             k_attn_bwd(base.device())(q, k, v, seg, outf, lse, gf, a, dq, dk, dv);
             return {dt == DType::F32 ? dqkv : cast(dqkv, dt)};
           });
  }
  return result;
}

Tensor attention_decode(const Tensor& q, std::span<const Tensor> ks, std::span<const Tensor> vs,
                        const AttentionOptions& o) {
  OpSpan span("attention_decode", {&q});
  const char* op = "attention_decode";
  check_float(q, op, "q");
  TOY_CHECK(q.ndim() == 4 && q.size(1) == 1,
            "[attention_decode] q must be [N, 1, H, D] (one query row per sequence), got {}", q.shape().str());
  const int64_t N = q.size(0), H = q.size(2), D = q.size(3);
  TOY_CHECK(N > 0, "[attention_decode] needs at least one sequence");
  TOY_CHECK(int64_t(ks.size()) == N && int64_t(vs.size()) == N,
            "[attention_decode] {} query rows need as many keys and values, got {} and {}", N, ks.size(), vs.size());
  TOY_CHECK(!o.segments.defined(), "[attention_decode] takes no segment ids (one sequence per row)");
  TOY_CHECK(o.window >= 0 && (o.window == 0 || o.causal), "[attention_decode] a sliding window ({}) needs causal attention",
            o.window);
  bool grads = needs_grad({&q});
  for (int64_t i = 0; i < N; ++i) {
    const Tensor &k = ks[size_t(i)], &v = vs[size_t(i)];
    check_float(k, op, "k");
    check_float(v, op, "v");
    // Keys and values in q's dtype, or F16 (an F16 cache, read as it is) under F32 queries.
    const bool half_cache = q.dtype() == DType::F32 && k.dtype() == DType::F16 && v.dtype() == DType::F16;
    if (!half_cache) {
      check_same_dtype(q, k, op);
      check_same_dtype(q, v, op);
    }
    TOY_CHECK(k.dtype() == ks[0].dtype(), "[attention_decode] sequence {} keys are {}, sequence 0's {}", i,
              name(k.dtype()), name(ks[0].dtype()));
    check_same_device(q, k, op);
    check_same_device(q, v, op);
    TOY_CHECK(k.ndim() == 4 && v.ndim() == 4 && k.size(0) == 1 && v.size(0) == 1 && v.size(1) == k.size(1) &&
                  v.size(2) == k.size(2) && k.size(3) == D,
              "[attention_decode] sequence {}: keys and values must be [1, S, Hkv, {}] and [1, S, Hkv, Dv], got {} and {}",
              i, D, k.shape().str(), v.shape().str());
    TOY_CHECK(k.size(2) == ks[0].size(2) && v.size(3) == vs[0].size(3),
              "[attention_decode] sequence {} has {} kv heads of {} values, sequence 0 {} of {}", i, k.size(2),
              v.size(3), ks[0].size(2), vs[0].size(3));
    TOY_CHECK(k.size(2) > 0 && H % k.size(2) == 0, "[attention_decode] query heads {} must be a multiple of kv heads {}",
              H, k.size(2));
    TOY_CHECK(!o.causal || k.size(1) >= 1, "[attention_decode] sequence {} has no keys", i);
    grads = grads || needs_grad({&k, &v});
  }
  // Under autograd, or on a device without the kernel: the N attentions it stands for.
  if (grads || !k_attn_decode.available(q.device())) {
    std::vector<Tensor> rows;
    rows.reserve(size_t(N));
    auto as_q = [&](const Tensor& t) { return t.dtype() == q.dtype() ? t : cast(t, q.dtype()); };
    for (int64_t i = 0; i < N; ++i)
      rows.push_back(attention(slice(q, 0, i, i + 1), as_q(ks[size_t(i)]), as_q(vs[size_t(i)]), o));
    return N == 1 ? rows[0] : concat(rows, 0);
  }
  // F16 keys and values stay F16 (the kernel widens them in registers).
  std::vector<Tensor> kf, vf;
  kf.reserve(size_t(N)), vf.reserve(size_t(N));
  for (int64_t i = 0; i < N; ++i)
    kf.push_back(kernel_ready(ks[size_t(i)], true)), vf.push_back(kernel_ready(vs[size_t(i)], true));
  Tensor out = empty(Shape{N, 1, H, vs[0].size(3)}, DType::F32, q.device());
  k_attn_decode(q.device())(kernel_ready(q), kf, vf, kernel_args(o, D), out);
  if (q.dtype() == DType::F32) return out;
  NoGradGuard ng;
  return cast(out, q.dtype());
}

namespace detail {
void define_attention_ops(Registry& r) {
  std::vector<std::string> composite = kCompositeKernels;
  for (const char* k : {"matmul", "diag_mask_inf"}) composite.push_back(k);
  r.define_op(fused_op("attention", {"attention", "attention_backward"}, composite,
                       "fused flash-style SDPA: causal / block-causal segments, GQA, strided [B, T, H, D]"));
  r.define_op(fused_op("attention_decode", {"attention_decode"}, {"attention", "attention_backward", "copy"},
                       "one query row per sequence over each sequence's own keys (batched decoding): one kernel call"));
}
}  // namespace detail

}  // namespace toy
