// The glue of the row-wise kernels (reduce.cu, softmax.cu, norm.cu, loss.cu): reduce,
// softmax(+backward), diag_mask_inf, the norms (+backward) and the cross-entropy kernels.
// Each function passes the kernel gate, checks what the launchers rely on (dtypes the CPU
// kernels would refuse are refused here by name; raw-pointer arguments must be contiguous),
// turns tensors into views and queues the launch. Scratch (the norm backward's partial
// gradients) comes from toy's allocator on the tensors' device.
#include <algorithm>
#include <initializer_list>
#include <utility>

#include "toy/backend/cuda/cuda_glue.h"
#include "toy/backend/cuda/reduce_launch.h"
#include "toy/backend/kernels.h"
#include "toy/core/kernel_gate.h"

namespace toy::cuda {

namespace {

// Tensors the kernel reads or writes as x's element type.
void same_type(const Tensor& t, const Tensor& x, const char* kernel, const char* what) {
  TOY_CHECK(t.dtype() == x.dtype(), "[cuda] {}: {} is {} but x is {}", kernel, what, name(t.dtype()), name(x.dtype()));
}
// Each defined tensor of `args` (name, tensor) has x's type.
void same_types(const Tensor& x, const char* kernel,
                std::initializer_list<std::pair<const char*, const Tensor*>> args) {
  for (const auto& [what, t] : args)
    if (t->defined()) same_type(*t, x, kernel, what);
}
// An optional tensor's view (data null when undefined).
View opt_view(const Tensor& t) { return t.defined() ? view_of(t) : View{}; }

// The address of a contiguous tensor of type T (null when undefined or empty).
template <class T>
T* ptr(const Tensor& t, DType d, const char* kernel, const char* what) {
  if (!t.defined()) return nullptr;
  need_type(t, d, kernel, what);
  TOY_CHECK(t.is_contiguous(), "[cuda] {}: {} must be contiguous", kernel, what);
  return t.numel() == 0 ? nullptr : static_cast<T*>(data_of(t));
}
float* f32_ptr(const Tensor& t, const char* kernel, const char* what) {
  return ptr<float>(t, DType::F32, kernel, what);
}
int32_t* i32_ptr(const Tensor& t, const char* kernel, const char* what) {
  return ptr<int32_t>(t, DType::I32, kernel, what);
}

// Scratch for a norm backward's partial weight gradients (null when the gradient is not wanted).
Tensor partial_scratch(const Tensor& x, const Tensor& grad) {
  if (!grad.defined()) return Tensor();
  const int64_t D = x.ndim() ? x.size(-1) : 1;
  const int64_t rows = x.numel() / std::max<int64_t>(D, 1);
  const int64_t groups = norm_partial_groups(rows, D);
  return empty(Shape{std::max<int64_t>(groups * D, 1)}, DType::F32, x.device());
}
float* scratch_ptr(const Tensor& s) { return s.defined() ? static_cast<float*>(data_of(s)) : nullptr; }

// ---- reductions ----------------------------------------------------------------------------------

void reduce(kern::ReduceOp op, const Tensor& x, int axis, Tensor& out, Tensor* index) {
  if (index)
    pass_kernel_gate(x, out, *index);
  else
    pass_kernel_gate(x, out);
  const char* k = "reduce";
  need_float(x, k, "x");
  same_type(out, x, k, "out");
  TOY_CHECK(axis >= 0 && axis < x.ndim(), "[cuda] reduce: axis {} of a {}-d tensor", axis, x.ndim());
  int32_t* idx = op == kern::ReduceOp::Max && index ? i32_ptr(*index, k, "index") : nullptr;
  const View xv = view_of(x);
  const int op_code = op == kern::ReduceOp::Max ? 1 : 0;
  const int64_t chunks = reduce_split_chunks(op_code, xv, axis);
  // 8-byte partials (double sums, or float-and-position maxima), as pairs of F32.
  const Tensor scratch = chunks > 0 ? empty(Shape{2 * chunks * out.numel()}, DType::F32, x.device()) : Tensor();
  launch_reduce(op_code, xv, axis, out_view(out, k, "out"), idx,
                chunks > 0 ? data_of(scratch) : nullptr);
  launched(k);
}

// ---- softmax -------------------------------------------------------------------------------------

void softmax(const Tensor& x, const Tensor& mask, float scale, bool log, Tensor& y) {
  pass_kernel_gate(x, mask, y);
  const char* k = "softmax";
  need_float(x, k, "x");
  same_type(y, x, k, "y");
  if (mask.defined()) need_type(mask, DType::F32, k, "mask");
  launch_softmax(view_of(x), opt_view(mask), scale, log, view_of(y));
  launched(k);
}

void softmax_backward(const Tensor& y, const Tensor& g, bool log, Tensor& dz) {
  pass_kernel_gate(y, g, dz);
  const char* k = "softmax_backward";
  need_float(y, k, "y");
  same_type(g, y, k, "g");
  same_type(dz, y, k, "dz");
  launch_softmax_backward(view_of(y), view_of(g), log, view_of(dz));
  launched(k);
}

void diag_mask(const Tensor& x, int64_t n_past, float value, Tensor& y) {
  pass_kernel_gate(x, y);
  const char* k = "diag_mask_inf";
  need_float(x, k, "x");
  same_type(y, x, k, "y");
  TOY_CHECK(x.ndim() >= 2, "[cuda] diag_mask_inf: x must be [..., Tq, Tk], got {}", x.shape().str());
  launch_diag_mask(view_of(x), n_past, value, out_view(y, k, "y"));
  launched(k);
}

// ---- norms ---------------------------------------------------------------------------------------

void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) {
  pass_kernel_gate(x, w, y, rstd);
  const char* k = "rms_norm";
  need_float(x, k, "x");
  same_types(x, k, {{"w", &w}, {"y", &y}});
  launch_rms_norm(view_of(x), opt_view(w), eps, view_of(y), f32_ptr(rstd, k, "rstd"));
  launched(k);
}

void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, Tensor& dx,
                       Tensor& dw) {
  pass_kernel_gate(x, w, rstd, g, dx, dw);
  const char* k = "rms_norm_backward";
  need_float(x, k, "x");
  same_types(x, k, {{"w", &w}, {"g", &g}, {"dx", &dx}, {"dw", &dw}});
  const Tensor scratch = partial_scratch(x, dw);
  launch_rms_norm_backward(view_of(x), opt_view(w), f32_ptr(rstd, k, "rstd"), view_of(g), view_of(dx), opt_view(dw),
                           scratch_ptr(scratch));
  launched(k);
}

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  pass_kernel_gate(x, w, b, y, mean, rstd);
  const char* k = "layer_norm";
  need_float(x, k, "x");
  same_types(x, k, {{"w", &w}, {"b", &b}, {"y", &y}});
  launch_layer_norm(view_of(x), opt_view(w), opt_view(b), eps, view_of(y), f32_ptr(mean, k, "mean"),
                    f32_ptr(rstd, k, "rstd"));
  launched(k);
}

void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& g,
                         Tensor& dx, Tensor& dw, Tensor& db) {
  pass_kernel_gate(x, w, mean, rstd, g, dx, dw, db);
  const char* k = "layer_norm_backward";
  need_float(x, k, "x");
  same_types(x, k, {{"w", &w}, {"g", &g}, {"dx", &dx}, {"dw", &dw}, {"db", &db}});
  const Tensor scratch_w = partial_scratch(x, dw), scratch_b = partial_scratch(x, db);
  launch_layer_norm_backward(view_of(x), opt_view(w), f32_ptr(mean, k, "mean"), f32_ptr(rstd, k, "rstd"), view_of(g),
                             view_of(dx), opt_view(dw), opt_view(db), scratch_ptr(scratch_w), scratch_ptr(scratch_b));
  launched(k);
}

void l2_norm(const Tensor& x, float eps, Tensor& y, Tensor& inv) {
  pass_kernel_gate(x, y, inv);
  const char* k = "l2_norm";
  need_float(x, k, "x");
  same_type(y, x, k, "y");
  launch_l2_norm(view_of(x), eps, view_of(y), f32_ptr(inv, k, "inv"));
  launched(k);
}

void l2_norm_backward(const Tensor& x, const Tensor& y, const Tensor& inv, float eps, const Tensor& g, Tensor& dx) {
  pass_kernel_gate(x, y, inv, g, dx);
  const char* k = "l2_norm_backward";
  need_float(y, k, "y");
  same_type(g, y, k, "g");
  same_type(dx, y, k, "dx");
  // (x is not read: the backward needs only y = x * inv)
  launch_l2_norm_backward(view_of(y), f32_ptr(inv, k, "inv"), eps, view_of(g), view_of(dx));
  launched(k);
}

// ---- cross-entropy -------------------------------------------------------------------------------

void cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& weights, int32_t ignore_index,
                   Tensor& loss, Tensor& lse) {
  pass_kernel_gate(logits, targets, weights, loss, lse);
  const char* k = "cross_entropy";
  need_float(logits, k, "logits");
  launch_cross_entropy(view_of(logits), i32_ptr(targets, k, "targets"), f32_ptr(weights, k, "weights"), ignore_index,
                       f32_ptr(loss, k, "loss"), f32_ptr(lse, k, "lse"));
  launched(k);
}

void cross_entropy_total(const Tensor& loss_rows, const Tensor& targets, const Tensor& weights, int32_t ignore_index,
                         float normalizer, Tensor& loss, Tensor& inv) {
  pass_kernel_gate(loss_rows, targets, weights, loss, inv);
  const char* k = "cross_entropy_total";
  need_float(loss, k, "loss");
  TOY_CHECK(loss.numel() == 1 && inv.numel() == 1, "[cuda] cross_entropy_total: loss and inv must be scalars");
  TOY_CHECK(targets.numel() == loss_rows.numel(), "[cuda] cross_entropy_total: {} targets for {} rows",
            targets.numel(), loss_rows.numel());
  launch_cross_entropy_total(f32_ptr(loss_rows, k, "loss_rows"), loss_rows.numel(), i32_ptr(targets, k, "targets"),
                             f32_ptr(weights, k, "weights"), ignore_index, normalizer, view_of(loss),
                             f32_ptr(inv, k, "inv"));
  launched(k);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& weights, int32_t ignore_index,
                            const Tensor& lse, const Tensor& grad, const Tensor& inv, Tensor& dlogits) {
  pass_kernel_gate(logits, targets, weights, lse, grad, inv, dlogits);
  const char* k = "cross_entropy_backward";
  need_float(logits, k, "logits");
  same_type(dlogits, logits, k, "dlogits");
  need_float(grad, k, "grad");
  TOY_CHECK(grad.numel() == 1 && inv.numel() == 1, "[cuda] cross_entropy_backward: grad and inv must be scalars");
  launch_cross_entropy_backward(view_of(logits), i32_ptr(targets, k, "targets"), f32_ptr(weights, k, "weights"),
                                ignore_index, f32_ptr(lse, k, "lse"), view_of(grad), f32_ptr(inv, k, "inv"),
                                view_of(dlogits));
  launched(k);
}

}  // namespace

void register_reduce(Registry& r) {
  r.add<kern::Reduce>("reduce", Device::CUDA, &reduce);
  r.add<kern::Softmax>("softmax", Device::CUDA, &softmax);
  r.add<kern::SoftmaxBackward>("softmax_backward", Device::CUDA, &softmax_backward);
  r.add<kern::DiagMask>("diag_mask_inf", Device::CUDA, &diag_mask);
  r.add<kern::RmsNorm>("rms_norm", Device::CUDA, &rms_norm);
  r.add<kern::RmsNormBackward>("rms_norm_backward", Device::CUDA, &rms_norm_backward);
  r.add<kern::LayerNorm>("layer_norm", Device::CUDA, &layer_norm);
  r.add<kern::LayerNormBackward>("layer_norm_backward", Device::CUDA, &layer_norm_backward);
  r.add<kern::L2Norm>("l2_norm", Device::CUDA, &l2_norm);
  r.add<kern::L2NormBackward>("l2_norm_backward", Device::CUDA, &l2_norm_backward);
  r.add<kern::CrossEntropy>("cross_entropy", Device::CUDA, &cross_entropy);
  r.add<kern::CrossEntropyTotal>("cross_entropy_total", Device::CUDA, &cross_entropy_total);
  r.add<kern::CrossEntropyBackward>("cross_entropy_backward", Device::CUDA, &cross_entropy_backward);
}

}  // namespace toy::cuda
