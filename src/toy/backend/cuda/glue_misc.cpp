// The glue of conv.cu and misc.cu: im2col / col2im, ssm_conv (+backward), add_id, argsort,
// top_k and gdn_split_norm (+backward), under the CPU backend's kernel names. Each function
// passes the kernel gate, refuses what the CPU kernel refuses (its dtypes, by name), checks
// that the outputs the kernels index directly are contiguous, and queues the launch. The sort
// scratch for long rows comes from toy's allocator on the tensors' device.
#include <climits>
#include <utility>

#include "toy/backend/cuda/cuda_glue.h"
#include "toy/backend/cuda/misc_launch.h"
#include "toy/backend/kernels.h"
#include "toy/core/kernel_gate.h"

namespace toy::cuda {

namespace {

// ---- conv ----------------------------------------------------------------------------------------

// x's shape [N, C, H, W] with the op's arguments (OH, OW as the CPU's conv_geom).
ConvShape conv_shape(const Shape& x, const kern::Im2ColArgs& a) {
  ConvShape s{};
  s.N = x[0], s.C = x[1], s.H = x[2], s.W = x[3];
  s.kh = a.kh, s.kw = a.kw, s.sh = a.sh, s.sw = a.sw, s.ph = a.ph, s.pw = a.pw, s.dh = a.dh, s.dw = a.dw;
  s.OH = (s.H + 2 * int64_t(a.ph) - int64_t(a.dh) * (a.kh - 1) - 1) / a.sh + 1;
  s.OW = (s.W + 2 * int64_t(a.pw) - int64_t(a.dw) * (a.kw - 1) - 1) / a.sw + 1;
  return s;
}

void im2col(const Tensor& x, const kern::Im2ColArgs& a, Tensor& cols) {
  pass_kernel_gate(x, cols);
  need_float(x, "im2col", "x");
  need_type(cols, x.dtype(), "im2col", "cols");
  launch_im2col(view_of(x), conv_shape(x.shape(), a), out_view(cols, "im2col", "cols"));
  launched("im2col");
}

void col2im(const Tensor& cols, const kern::Im2ColArgs& a, Tensor& dx) {
  pass_kernel_gate(cols, dx);
  need_float(dx, "col2im", "dx");
  need_type(cols, dx.dtype(), "col2im", "cols");
  launch_col2im(view_of(cols), conv_shape(dx.shape(), a), out_view(dx, "col2im", "dx"));
  launched("col2im");
}

void ssm_conv(const Tensor& x, const Tensor& w, Tensor& y) {
  pass_kernel_gate(x, w, y);
  need_float(x, "ssm_conv", "x");
  need_type(w, x.dtype(), "ssm_conv", "weight");
  need_type(y, x.dtype(), "ssm_conv", "y");
  launch_ssm_conv(view_of(x), view_of(w), out_view(y, "ssm_conv", "y"));
  launched("ssm_conv");
}

void ssm_conv_backward(const Tensor& x, const Tensor& w, const Tensor& g, Tensor& dx, Tensor& dw) {
  pass_kernel_gate(x, w, g, dx, dw);
  const char* k = "ssm_conv_backward";
  need_float(x, k, "x");
  for (const auto& [what, t] : {std::pair<const char*, const Tensor*>{"weight", &w}, {"gradient", &g}, {"dx", &dx}})
    need_type(*t, x.dtype(), k, what);
  View dwv;  // (data null: the weight's gradient is not wanted)
  if (dw.defined()) {
    need_type(dw, x.dtype(), k, "dw");
    dwv = out_view(dw, k, "dw");
  }
  launch_ssm_conv_backward(view_of(x), view_of(w), view_of(g), out_view(dx, k, "dx"), dwv);
  launched(k);
}

// ---- add_id, argsort, top_k ----------------------------------------------------------------------

// The CPU's add_id reads F32 x and b and I32 ids.
void add_id(const Tensor& x, const Tensor& b, const Tensor& ids, Tensor& out) {
  pass_kernel_gate(x, b, ids, out);
  const char* k = "add_id";
  need_type(x, DType::F32, k, "x");
  need_type(b, DType::F32, k, "bias");
  need_type(ids, DType::I32, k, "ids");
  need_type(out, DType::F32, k, "out");
  launch_add_id(view_of(x), view_of(b), view_of(ids), out_view(out, k, "out"));
  launched(k);
}

// Scratch for sorting rows longer than shared memory holds (undefined when none is needed).
Tensor sort_scratch(const Tensor& x) {
  const int64_t L = x.ndim() ? x.size(-1) : 1;
  const int64_t words = sort_scratch_words(L ? x.numel() / L : 0, L);
  return words > 0 ? empty(Shape{words}, DType::I32, x.device()) : Tensor();
}
void* scratch_ptr(const Tensor& s) { return s.defined() ? data_of(s) : nullptr; }

void argsort(const Tensor& x, bool descending, Tensor& indices) {
  pass_kernel_gate(x, indices);
  need_float(x, "argsort", "x");
  need_type(indices, DType::I32, "argsort", "indices");
  const int64_t L = x.ndim() ? x.size(-1) : 1;
  TOY_CHECK(L <= INT32_MAX, "[cuda] argsort: rows of {} elements (I32 positions)", L);
  const Tensor scratch = sort_scratch(x);
  launch_argsort(view_of(x), descending, out_view(indices, "argsort", "indices"), scratch_ptr(scratch));
  launched("argsort");
}

void top_k(const Tensor& x, int64_t k, Tensor& values, Tensor& indices) {
  pass_kernel_gate(x, values, indices);
  need_float(x, "top_k", "x");
  need_type(values, x.dtype(), "top_k", "values");
  need_type(indices, DType::I32, "top_k", "indices");
  const int64_t L = x.ndim() ? x.size(-1) : 1;
  TOY_CHECK(L <= INT32_MAX, "[cuda] top_k: rows of {} elements (I32 positions)", L);
  const Tensor scratch = sort_scratch(x);
  launch_top_k(view_of(x), k, out_view(values, "top_k", "values"), out_view(indices, "top_k", "indices"),
               scratch_ptr(scratch));
  launched("top_k");
}

// ---- Gated DeltaNet split ------------------------------------------------------------------------

// The CPU's split reads and writes F32 only.
void gdn_split_norm(const Tensor& c, int64_t Hk, int64_t Hv, int64_t D, float eps, float q_scale, Tensor& q,
                    Tensor& k, Tensor& v, Tensor& q_inv, Tensor& k_inv) {
  pass_kernel_gate(c, q, k, v, q_inv, k_inv);
  const char* kn = "gdn_split_norm";
  need_type(c, DType::F32, kn, "c");
  for (const auto& [what, t] : {std::pair<const char*, const Tensor*>{"q", &q}, {"k", &k}, {"v", &v},
                                {"q_inv", &q_inv}, {"k_inv", &k_inv}})
    need_type(*t, DType::F32, kn, what);
  launch_gdn_split_norm(view_of(c), Hk, Hv, D, eps, q_scale, out_view(q, kn, "q"), out_view(k, kn, "k"),
                        out_view(v, kn, "v"), out_view(q_inv, kn, "q_inv"), out_view(k_inv, kn, "k_inv"));
  launched(kn);
}

void gdn_split_norm_backward(const Tensor& q, const Tensor& k, const Tensor& q_inv, const Tensor& k_inv, float eps,
                             float q_scale, const Tensor& dq, const Tensor& dk, const Tensor& dv, Tensor& dc) {
  pass_kernel_gate(q, k, q_inv, k_inv, dq, dk, dv, dc);
  const char* kn = "gdn_split_norm_backward";
  for (const auto& [what, t] : {std::pair<const char*, const Tensor*>{"q", &q}, {"k", &k}, {"q_inv", &q_inv},
                                {"k_inv", &k_inv}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dc", &dc}})
    need_type(*t, DType::F32, kn, what);
  launch_gdn_split_norm_backward(view_of(q), view_of(k), view_of(q_inv), view_of(k_inv), eps, q_scale, view_of(dq),
                                 view_of(dk), view_of(dv), out_view(dc, kn, "dc"));
  launched(kn);
}

}  // namespace

void register_misc(Registry& r) {
  r.add<kern::Im2Col>("im2col", Device::CUDA, &im2col);
  r.add<kern::Col2Im>("col2im", Device::CUDA, &col2im);
  r.add<kern::SsmConv>("ssm_conv", Device::CUDA, &ssm_conv);
  r.add<kern::SsmConvBackward>("ssm_conv_backward", Device::CUDA, &ssm_conv_backward);
  r.add<kern::AddId>("add_id", Device::CUDA, &add_id);
  r.add<kern::Argsort>("argsort", Device::CUDA, &argsort);
  r.add<kern::TopK>("top_k", Device::CUDA, &top_k);
  r.add<kern::GdnSplitNorm>("gdn_split_norm", Device::CUDA, &gdn_split_norm);
  r.add<kern::GdnSplitNormBackward>("gdn_split_norm_backward", Device::CUDA, &gdn_split_norm_backward);
}

}  // namespace toy::cuda
