// The glue of the elementwise kernels (elementwise.cu): fill, copy, binary; and the view and
// launch-check helpers every glue file uses (cuda_glue.h).
#include "toy/backend/cuda/cuda_glue.h"
#include "toy/backend/kernels.h"
#include "toy/core/kernel_gate.h"

namespace toy::cuda {

View view_of(const Tensor& t) {
  View v;
  switch (t.dtype()) {
    case DType::F32: v.elem = Elem::F32; break;
    case DType::F16: v.elem = Elem::F16; break;
    case DType::BF16: v.elem = Elem::BF16; break;
    case DType::I32: v.elem = Elem::I32; break;
    default: fail("[cuda] no kernel takes {} tensors yet (block types come with the quantized kernels)", name(t.dtype()));
  }
  v.data = static_cast<char*>(t.storage()->data()) + size_t(t.offset()) * element_size(t.dtype());
  TOY_CHECK(t.ndim() <= kMaxDims, "[cuda] tensors of {} dimensions (the kernels take {})", t.ndim(), kMaxDims);
  v.ndim = t.ndim();
  v.numel = t.numel();
  for (int d = 0; d < t.ndim(); ++d) v.shape[d] = t.size(d), v.stride[d] = t.stride(d);
  v.contiguous = t.is_contiguous();
  return v;
}

void* data_of(const Tensor& t) {
  return static_cast<char*>(t.storage()->data()) + size_t(t.offset()) * element_size(t.dtype());
}

void launched(const char* kernel) {
  const char* e = last_launch_error();
  TOY_CHECK(*e == '\0', "[cuda] the {} kernel failed to launch: {}", kernel, e);
  profile_mark(kernel);
}

void need_float(const Tensor& t, const char* kernel, const char* what) {
  TOY_CHECK(is_float(t.dtype()), "[cuda] {} needs a float {} (f32, f16, bf16), got {}", kernel, what,
            name(t.dtype()));
}

void need_type(const Tensor& t, DType d, const char* kernel, const char* what) {
  TOY_CHECK(t.dtype() == d, "[cuda] {}: {} must be {}, got {}", kernel, what, name(d), name(t.dtype()));
}

View out_view(const Tensor& t, const char* kernel, const char* what) {
  TOY_CHECK(t.is_contiguous(), "[cuda] {}: the output {} must be contiguous", kernel, what);
  return view_of(t);
}

namespace {

void fill(Tensor& dst, double value) {
  pass_kernel_gate(dst);
  launch_fill(view_of(dst), value);
  launched("fill");
}

void copy_kernel(const Tensor& src, Tensor& dst) {
  pass_kernel_gate(src, dst);
  launch_copy(view_of(src), view_of(dst));
  launched("copy");
}

void binary(kern::BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  pass_kernel_gate(a, b, out);
  launch_binary(int(op), view_of(a), view_of(b), view_of(out));
  launched("binary");
}

}  // namespace

void register_elementwise(Registry& r) {
  r.add<kern::Fill>("fill", Device::CUDA, &fill);
  r.add<kern::Copy>("copy", Device::CUDA, &copy_kernel);
  r.add<kern::Binary>("binary", Device::CUDA, &binary);
}

}  // namespace toy::cuda
