// The glue of the unary kernels (unary.cu): unary and its backward, swiglu (both forms),
// dropout, random fills and arange, under the CPU backend's kernel names.
#include "toy/backend/cuda/cuda_glue.h"
#include "toy/backend/cuda/unary_launch.h"
#include "toy/backend/cuda/unary_math.h"
#include "toy/backend/kernels.h"
#include "toy/core/kernel_gate.h"

namespace toy::cuda {

namespace {

// The launchers take the op as kern::UnaryOp's number; unary_math.h's Op lists them in order.
constexpr bool same_op(kern::UnaryOp a, umath::Op b) { return int(a) == int(b); }
static_assert(same_op(kern::UnaryOp::Neg, umath::Op::Neg) && same_op(kern::UnaryOp::Exp, umath::Op::Exp) &&
              same_op(kern::UnaryOp::Log, umath::Op::Log) && same_op(kern::UnaryOp::Sqrt, umath::Op::Sqrt) &&
              same_op(kern::UnaryOp::Rsqrt, umath::Op::Rsqrt) && same_op(kern::UnaryOp::Square, umath::Op::Square) &&
              same_op(kern::UnaryOp::Abs, umath::Op::Abs) && same_op(kern::UnaryOp::Tanh, umath::Op::Tanh) &&
              same_op(kern::UnaryOp::Sigmoid, umath::Op::Sigmoid) && same_op(kern::UnaryOp::Relu, umath::Op::Relu) &&
              same_op(kern::UnaryOp::Silu, umath::Op::Silu) &&
              same_op(kern::UnaryOp::GeluTanh, umath::Op::GeluTanh) &&
              same_op(kern::UnaryOp::GeluErf, umath::Op::GeluErf) && same_op(kern::UnaryOp::Scale, umath::Op::Scale) &&
              same_op(kern::UnaryOp::Clamp, umath::Op::Clamp) &&
              same_op(kern::UnaryOp::Softplus, umath::Op::Softplus),
              "umath::Op must list kern::UnaryOp in order");

// These kernels compute in f32 from F32, F16 or BF16 tensors (the CPU's dispatch_float).
void require_float(const Tensor& t, const char* kernel) { need_float(t, kernel, "tensor"); }

PhiloxArgs philox(uint64_t seed, uint64_t stream, uint64_t counter) {
  PhiloxArgs p;
  p.seed = seed, p.stream = stream, p.counter = counter;
  return p;
}

void unary(kern::UnaryOp op, const Tensor& x, Tensor& y, const kern::UnaryArgs& a) {
  pass_kernel_gate(x, y);
  require_float(x, "unary");
  launch_unary(int(op), a.alpha, a.lo, a.hi, view_of(x), view_of(y));
  launched("unary");
}

void unary_backward(kern::UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& g, Tensor& dx,
                    const kern::UnaryArgs& a) {
  pass_kernel_gate(x, y, g, dx);
  require_float(x, "unary_backward");
  launch_unary_backward(int(op), a.alpha, a.lo, a.hi, view_of(x), view_of(y), view_of(g), view_of(dx));
  launched("unary_backward");
}

void swiglu(const Tensor& a, const Tensor& b, Tensor& out) {
  pass_kernel_gate(a, b, out);
  require_float(a, "swiglu");
  launch_swiglu(view_of(a), view_of(b), view_of(out));
  launched("swiglu");
}

void swiglu_backward(const Tensor& a, const Tensor& b, const Tensor& g, Tensor& da, Tensor& db) {
  pass_kernel_gate(a, b, g, da, db);
  require_float(a, "swiglu_backward");
  launch_swiglu_backward(view_of(a), view_of(b), view_of(g), view_of(da), view_of(db));
  launched("swiglu_backward");
}

void swiglu_packed(const Tensor& x, Tensor& out) {
  pass_kernel_gate(x, out);
  require_float(x, "swiglu_packed");
  launch_swiglu_packed(view_of(x), view_of(out), out.ndim() > 0 ? out.size(-1) : 1);
  launched("swiglu_packed");
}

void swiglu_packed_backward(const Tensor& x, const Tensor& g, Tensor& dx) {
  pass_kernel_gate(x, g, dx);
  require_float(x, "swiglu_packed_backward");
  launch_swiglu_packed_backward(view_of(x), view_of(g), view_of(dx), g.ndim() > 0 ? g.size(-1) : 1);
  launched("swiglu_packed_backward");
}

void dropout(const Tensor& x, Tensor& y, const kern::DropoutArgs& a) {
  const int32_t* step = nullptr;
  if (a.step) {
    pass_kernel_gate(x, y, *a.step);
    TOY_CHECK(a.step->device() == Device::CUDA && a.step->dtype() == DType::I32 && a.step->numel() == 1,
              "[cuda] dropout's step must be an I32 scalar on the GPU, got {}", describe(*a.step));
    step = static_cast<const int32_t*>(data_of(*a.step));  // read by the kernel, never copied back
  } else {
    pass_kernel_gate(x, y);
  }
  require_float(x, "dropout");
  launch_dropout(view_of(x), view_of(y), a.p, philox(a.seed, a.stream, a.counter), step);
  launched("dropout");
}

void random_fill(Tensor& dst, const kern::RandomFillArgs& a) {
  pass_kernel_gate(dst);
  require_float(dst, "random_fill");
  TOY_CHECK(dst.is_contiguous(), "[cuda] random_fill needs a contiguous tensor, got {}", describe(dst));
  launch_random_fill(view_of(dst), philox(a.seed, a.stream, a.counter), a.normal, a.a, a.b);
  launched("random_fill");
}

void arange(Tensor& dst) {
  pass_kernel_gate(dst);
  TOY_CHECK(dst.is_contiguous(), "[cuda] arange needs a contiguous tensor, got {}", describe(dst));
  launch_arange(view_of(dst));
  launched("arange");
}

}  // namespace

void register_unary(Registry& r) {
  r.add<kern::Unary>("unary", Device::CUDA, &unary);
  r.add<kern::UnaryBackward>("unary_backward", Device::CUDA, &unary_backward);
  r.add<kern::Swiglu>("swiglu", Device::CUDA, &swiglu);
  r.add<kern::SwigluBackward>("swiglu_backward", Device::CUDA, &swiglu_backward);
  r.add<kern::SwigluPacked>("swiglu_packed", Device::CUDA, &swiglu_packed);
  r.add<kern::SwigluPackedBackward>("swiglu_packed_backward", Device::CUDA, &swiglu_packed_backward);
  r.add<kern::Dropout>("dropout", Device::CUDA, &dropout);
  r.add<kern::RandomFill>("random_fill", Device::CUDA, &random_fill);
  r.add<kern::Arange>("arange", Device::CUDA, &arange);
}

}  // namespace toy::cuda
