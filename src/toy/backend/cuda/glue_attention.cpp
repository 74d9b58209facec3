// The glue of the attention kernels (attention.cu): the geometry read from the tensors, the
// row-term scratch of the backward.
#include "toy/backend/cuda/attention_launch.h"
#include "toy/backend/cuda/cuda_glue.h"
#include "toy/backend/kernels.h"
#include "toy/core/kernel_gate.h"

namespace toy::cuda {

namespace {

const float* floats(const Tensor& t, const char* what) {
  TOY_CHECK(t.dtype() == DType::F32, "[cuda] attention takes f32 {}, got {}", what, name(t.dtype()));
  TOY_CHECK(t.ndim() == 0 || t.stride(t.ndim() - 1) == 1 || t.size(t.ndim() - 1) == 1,
            "[cuda] attention: {} needs a unit last stride", what);
  return static_cast<const float*>(data_of(t));
}

AttentionGeometry geometry(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seg,
                           const kern::AttentionArgs& a) {
  AttentionGeometry g;
  g.B = q.size(0), g.T = q.size(1), g.H = q.size(2), g.D = q.size(3);
  g.S = k.size(1), g.Hkv = k.size(2), g.Dv = v.size(3);
  TOY_CHECK(g.D <= kAttentionMaxHead && g.Dv <= kAttentionMaxHead,
            "[cuda] attention with heads of {} and {} elements (the GPU kernel takes up to {})", g.D, g.Dv,
            kAttentionMaxHead);
  g.q = floats(q, "queries"), g.k = floats(k, "keys"), g.v = floats(v, "values");
  for (int d = 0; d < 3; ++d) g.qs[d] = q.stride(d), g.ks[d] = k.stride(d), g.vs[d] = v.stride(d);
  if (seg.defined()) {
    TOY_CHECK(seg.dtype() == DType::I32 && seg.is_contiguous(), "[cuda] attention: segments must be contiguous i32");
    g.seg = static_cast<const int32_t*>(data_of(seg));
  }
  g.scale = a.scale;
  g.causal = a.causal;
  g.window = a.causal ? a.window : 0;
  return g;
}

void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seg, const kern::AttentionArgs& a,
               Tensor& out, Tensor& lse) {
  pass_kernel_gate(q, k, v, seg, out, lse);
  const AttentionGeometry g = geometry(q, k, v, seg, a);
  launch_attention(g, static_cast<float*>(data_of(out)), static_cast<float*>(data_of(lse)));
  launched("attention");
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seg, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, const kern::AttentionArgs& a, Tensor& dq, Tensor& dk,
                        Tensor& dv) {
  pass_kernel_gate(q, k, v, seg, out, lse, dout, dq, dk, dv);
  const AttentionGeometry g = geometry(q, k, v, seg, a);
  TOY_CHECK(out.is_contiguous() && dout.is_contiguous() && lse.is_contiguous(),
            "[cuda] attention_backward: out, dout and lse must be contiguous");
  Tensor delta = empty(Shape{g.B * g.H * g.T}, DType::F32, Device::CUDA);
  int64_t sq[3], sk[3], sv[3];
  for (int d = 0; d < 3; ++d) sq[d] = dq.stride(d), sk[d] = dk.stride(d), sv[d] = dv.stride(d);
  launch_attention_backward(g, static_cast<const float*>(data_of(out)), static_cast<const float*>(data_of(lse)),
                            static_cast<const float*>(data_of(dout)), static_cast<float*>(data_of(delta)),
                            static_cast<float*>(data_of(dq)), sq, static_cast<float*>(data_of(dk)), sk,
                            static_cast<float*>(data_of(dv)), sv);
  launched("attention_backward");
}

}  // namespace

void register_attention(Registry& r) {
  r.add<kern::Attention>("attention", Device::CUDA, &attention);
  r.add<kern::AttentionBackward>("attention_backward", Device::CUDA, &attention_backward);
}

}  // namespace toy::cuda
