// Convolutions. im2col is a primitive (backward: col2im); conv2d is im2col + matmul;
// conv1d (depthwise, causal over time) is a left pad + ssm_conv.
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::Im2Col> k_im2col("im2col");
const KernelRef<kern::Col2Im> k_col2im("col2im");
const KernelRef<kern::SsmConv> k_ssm_conv("ssm_conv");
const KernelRef<kern::SsmConvBackward> k_ssm_conv_bwd("ssm_conv_backward");
}  // namespace

Tensor im2col(const Tensor& x_in, int kh, int kw, const Conv2dOptions& o) {
  OpSpan span("im2col", {&x_in});
  check_float(x_in, "im2col", "x");
  TOY_CHECK(x_in.ndim() == 4, "[im2col] x must be [N, C, H, W], got {}", x_in.shape().str());
  TOY_CHECK(kh > 0 && kw > 0 && o.stride_h > 0 && o.stride_w > 0 && o.dilation_h > 0 && o.dilation_w > 0 &&
                o.pad_h >= 0 && o.pad_w >= 0,
            "[im2col] kernel, stride and dilation must be positive and padding non-negative");
  kern::Im2ColArgs a{kh, kw, o.stride_h, o.stride_w, o.pad_h, o.pad_w, o.dilation_h, o.dilation_w};
  const int64_t N = x_in.size(0), C = x_in.size(1), H = x_in.size(2), W = x_in.size(3);
  const int64_t OH = (H + 2 * a.ph - a.dh * (a.kh - 1) - 1) / a.sh + 1;
  const int64_t OW = (W + 2 * a.pw - a.dw * (a.kw - 1) - 1) / a.sw + 1;
  TOY_CHECK(H + 2 * a.ph >= a.dh * (a.kh - 1) + 1 && W + 2 * a.pw >= a.dw * (a.kw - 1) + 1,
            "[im2col] kernel {}x{} (dilation {}x{}) is larger than the padded input {}x{}", kh, kw, a.dh, a.dw,
            H + 2 * a.ph, W + 2 * a.pw);
  Tensor x = contiguous_nograd(x_in);
  Tensor cols = empty(Shape{N, OH * OW, C * kh * kw}, x.dtype(), x.device());
  k_im2col(x.device())(x, a, cols);
  if (needs_grad({&x_in})) {
    record("im2col", cols, {x_in}, [xs = x.shape(), a, dt = x.dtype()](const Tensor& g) -> Grads {
      Tensor dx = empty(xs, dt, g.device());
      k_col2im(g.device())(g, a, dx);
      return {dx};
    });
  }
  return cols;
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& o) {
  check_float(x, "conv2d", "x");
  check_float(w, "conv2d", "weight");
  TOY_CHECK(x.ndim() == 4 && w.ndim() == 4 && w.size(1) == x.size(1),
            "[conv2d] needs x [N, C, H, W] and weight [OC, C, KH, KW] with the same C, got {} and {}",
            x.shape().str(), w.shape().str());
  const int64_t N = x.size(0), OC = w.size(0);
  const int kh = int(w.size(2)), kw = int(w.size(3));
  Tensor cols = im2col(x, kh, kw, o);  // [N, OH*OW, C*KH*KW]
  const int64_t H = x.size(2), W = x.size(3);
  const int64_t OH = (H + 2 * o.pad_h - o.dilation_h * (kh - 1) - 1) / o.stride_h + 1;
  const int64_t OW = (W + 2 * o.pad_w - o.dilation_w * (kw - 1) - 1) / o.stride_w + 1;
  Tensor y = linear(cols, reshape(w, Shape{OC, -1}), b);  // [N, OH*OW, OC]
  return contiguous(permute(reshape(y, Shape{N, OH, OW, OC}), {0, 3, 1, 2}));
}

Tensor ssm_conv(const Tensor& x_in, const Tensor& w_in) {
  OpSpan span("ssm_conv", {&x_in, &w_in});
  check_float(x_in, "ssm_conv", "x");
  check_float(w_in, "ssm_conv", "weight");
  check_same_dtype(x_in, w_in, "ssm_conv");
  TOY_CHECK(x_in.ndim() == 3 && w_in.ndim() == 2 && w_in.size(0) == x_in.size(2) && w_in.size(1) >= 1 &&
                x_in.size(1) >= w_in.size(1) - 1,
            "[ssm_conv] needs x [B, T+K-1, C] and weight [C, K], got {} and {}", x_in.shape().str(),
            w_in.shape().str());
  const int64_t B = x_in.size(0), C = x_in.size(2), K = w_in.size(1), T = x_in.size(1) - K + 1;
  Tensor x = contiguous_nograd(x_in), w = contiguous_nograd(w_in);
  Tensor y = empty(Shape{B, T, C}, x.dtype(), x.device());
  k_ssm_conv(x.device())(x, w, y);
  if (needs_grad({&x_in, &w_in})) {
    record("ssm_conv", y, {x_in, w_in}, [x, w](const Tensor& g) -> Grads {
      Tensor dx = empty(x.shape(), x.dtype(), x.device());
      Tensor dw = wants_grad(w) ? zeros(w.shape(), w.dtype(), w.device()) : Tensor();
      k_ssm_conv_bwd(x.device())(x, w, g, dx, dw);
      return {dx, dw};
    });
  }
  return y;
}

Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_float(x, "conv1d", "x");
  check_float(w, "conv1d", "weight");
  TOY_CHECK(x.ndim() == 3 && w.ndim() == 2 && w.size(0) == x.size(2),
            "[conv1d] needs x [B, T, C] and weight [C, K], got {} and {}", x.shape().str(), w.shape().str());
  const int64_t K = w.size(1);
  Tensor y = ssm_conv(pad(x, {{K - 1, 0}, {0, 0}}), w);
  return b.defined() ? add(y, b) : y;
}

namespace detail {
void define_conv_ops(Registry& r) {
  r.define_op(primitive_op("im2col", {"im2col", "col2im"}, "image patches to rows: [N, OH*OW, C*KH*KW]"));
  r.define_op(composite_op("conv2d", {"im2col", "col2im", "matmul", "copy", "reduce"}, "2-D convolution (im2col + matmul)"));
  r.define_op(composite_op("conv1d", {"ssm_conv", "ssm_conv_backward", "copy", "fill", "binary"},
                           "depthwise causal conv over time (pad + ssm_conv)"));
}
}  // namespace detail

}  // namespace toy
