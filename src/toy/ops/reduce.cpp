// Reductions: sum / mean / max (whole tensor or along an axis), argmax, argsort, top_k, and
// sum_to (the backward of broadcasting). max's backward routes the gradient to the first
// maximum, as PyTorch's max(dim) does.
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::Reduce> k_reduce("reduce");
const KernelRef<kern::Argsort> k_argsort("argsort");
const KernelRef<kern::TopK> k_top_k("top_k");
const KernelRef<kern::SampleToken> k_sample("sample_token");

Shape reduced_shape(const Shape& s, int axis, bool keepdim) {
  Shape o = s;
  if (keepdim)
    o[axis] = 1;
  else
    o.erase(axis);
  return o;
}

// Raw reduction without tape: out has `axis` removed.
Tensor reduce_raw(kern::ReduceOp op, const Tensor& x, int axis, Tensor* index) {
  Tensor out = empty(reduced_shape(x.shape(), axis, false), x.dtype(), x.device());
  if (index) *index = empty(out.shape(), DType::I32, x.device());
  TOY_CHECK(x.size(axis) > 0 || op == kern::ReduceOp::Sum, "[max] cannot reduce an empty dimension (shape {})",
            x.shape().str());
  k_reduce(x.device())(op, x, axis, out, index);
  return out;
}
}  // namespace

Tensor sum(const Tensor& x, int axis_in, bool keepdim) {
  OpSpan span("sum", {&x});
  check_float(x, "sum");
  const int axis = normalize_axis(axis_in, x.ndim(), "sum");
  Tensor out = reduce_raw(kern::ReduceOp::Sum, x, axis, nullptr);
  if (keepdim) out = make_view(out, reduced_shape(x.shape(), axis, true), contiguous_strides(reduced_shape(x.shape(), axis, true)), 0);
  if (needs_grad({&x})) {
    record("sum", out, {x}, [xs = x.shape(), axis](const Tensor& g) -> Grads {
      Shape ks = reduced_shape(xs, axis, true);
      return {expand_view(reshape(g, ks), xs)};
    });
  }
  return out;
}

Tensor sum(const Tensor& x) {
  check_float(x, "sum");
  if (x.ndim() == 0) return reshape(x, Shape{});
  Tensor s = sum(reshape(x, Shape{x.numel()}), 0, false);
  return s;
}

Tensor mean(const Tensor& x, int axis, bool keepdim) {
  check_float(x, "mean");
  const int a = normalize_axis(axis, x.ndim(), "mean");
  TOY_CHECK(x.size(a) > 0, "[mean] cannot average an empty dimension (shape {})", x.shape().str());
  return scale(sum(x, a, keepdim), 1.0f / float(x.size(a)));
}

Tensor mean(const Tensor& x) {
  check_float(x, "mean");
  TOY_CHECK(x.numel() > 0, "[mean] cannot average an empty tensor");
  return scale(sum(x), 1.0f / float(x.numel()));
}

Tensor max(const Tensor& x, int axis_in, bool keepdim) {
  OpSpan span("max", {&x});
  check_float(x, "max");
  const int axis = normalize_axis(axis_in, x.ndim(), "max");
  Tensor index;
  Tensor out = reduce_raw(kern::ReduceOp::Max, x, axis, &index);
  const Shape ks = reduced_shape(x.shape(), axis, true);
  if (keepdim) out = make_view(out, ks, contiguous_strides(ks), 0);
  if (needs_grad({&x})) {
    record("max", out, {x}, [xs = x.shape(), axis, index, dt = x.dtype(), dev = x.device()](const Tensor& g) -> Grads {
      // Flat position of each maximum in a contiguous x, then scatter-add g there.
      int64_t L = xs[axis], inner = 1;
      for (int d = axis + 1; d < xs.ndim(); ++d) inner *= xs[d];
      std::vector<int32_t> pos(size_t(index.numel()));
      const Tensor ih = transfer(index, Device::CPU);
      const int32_t* pi = ih.data<int32_t>();
      for (int64_t t = 0; t < index.numel(); ++t) pos[size_t(t)] = int32_t((t / inner) * L * inner + pi[t] * inner + t % inner);
      Tensor dx = zeros(Shape{xs.numel(), 1}, dt, dev);
      Tensor gc = contiguous_nograd(g);
      k_scatter_add_rows(dev)(make_view(gc, Shape{gc.numel(), 1}, Strides{1, 1}, gc.offset()),
                     transfer(from_vector(pos, Shape{int64_t(pos.size())}), dev), dx);
      return {make_view(dx, xs, contiguous_strides(xs), 0)};
    });
  }
  return out;
}

Tensor max(const Tensor& x) {
  check_float(x, "max");
  TOY_CHECK(x.numel() > 0, "[max] empty tensor");
  return reshape(max(reshape(x, Shape{x.numel()}), 0, false), Shape{});
}

Tensor argmax(const Tensor& x, int axis_in, bool keepdim) {
  OpSpan span("argmax", {&x});
  check_float(x, "argmax");
  const int axis = normalize_axis(axis_in, x.ndim(), "argmax");
  Tensor index;
  reduce_raw(kern::ReduceOp::Max, x, axis, &index);
  if (keepdim) {
    Shape ks = reduced_shape(x.shape(), axis, true);
    index = make_view(index, ks, contiguous_strides(ks), 0);
  }
  return index;
}

Tensor argsort(const Tensor& x, bool descending) {
  OpSpan span("argsort", {&x});
  check_float(x, "argsort");
  TOY_CHECK(x.ndim() >= 1, "[argsort] needs at least 1 dimension");
  Tensor idx = empty(x.shape(), DType::I32, x.device());
  k_argsort(x.device())(x, descending, idx);
  return idx;
}

std::pair<Tensor, Tensor> top_k(const Tensor& x, int64_t k) {
  OpSpan span("top_k", {&x});
  check_float(x, "top_k");
  TOY_CHECK(x.ndim() >= 1, "[top_k] needs at least 1 dimension");
  TOY_CHECK(k >= 0 && k <= x.size(-1), "[top_k] k = {} out of range for last dim {}", k, x.size(-1));
  Shape s = x.shape();
  s[s.ndim() - 1] = k;
  Tensor values = empty(s, x.dtype(), x.device()), indices = empty(s, DType::I32, x.device());
  k_top_k(x.device())(x, k, values, indices);
  return {values, indices};
}

Tensor sample_token(const Tensor& logits, std::span<const int32_t> penalized, const SampleDraw& d) {
  OpSpan span("sample_token", {&logits});
  check_float(logits, "sample_token");
  const int64_t V = logits.size(-1);
  TOY_CHECK(V > 0 && V < (int64_t(1) << 31) && logits.numel() == V,
            "[sample_token] needs one row of logits [V] or [1, V], got shape {}", logits.shape().str());
  TOY_CHECK(d.temperature >= 0 && std::isfinite(d.temperature) && d.top_k >= 0 && d.top_p > 0 && d.top_p <= 1 &&
                d.min_p >= 0 && d.min_p <= 1 && d.repeat_penalty > 0 && std::isfinite(d.repeat_penalty) &&
                std::isfinite(d.presence_penalty) && std::isfinite(d.frequency_penalty) && d.r >= 0 && d.r < 1,
            "[sample_token] temperature {} top-k {} top-p {} min-p {} penalties {}/{}/{} draw {}: out of range",
            d.temperature, d.top_k, d.top_p, d.min_p, d.repeat_penalty, d.presence_penalty, d.frequency_penalty, d.r);
  TOY_CHECK(penalized.size() % 2 == 0, "[sample_token] penalized tokens come as (id, count) pairs, got {} numbers",
            penalized.size());
  for (size_t i = 0; i < penalized.size(); i += 2)
    TOY_CHECK(penalized[i] >= 0 && penalized[i] < V && penalized[i + 1] >= 0,
              "[sample_token] penalized token {} (count {}) is outside the vocabulary of {}", penalized[i],
              penalized[i + 1], V);
  Tensor pen;
  if (!penalized.empty()) {
    pen = empty(Shape{int64_t(penalized.size() / 2), 2}, DType::I32);
    std::copy(penalized.begin(), penalized.end(), pen.data<int32_t>());
    if (logits.device() != Device::CPU) pen = transfer(pen, logits.device());
  }
  Tensor row = contiguous_nograd(logits.detach());
  Tensor out = empty(Shape{}, DType::I32, logits.device());
  k_sample(logits.device())(row, pen, out, d);
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int lead = g.ndim() - shape.ndim();
  TOY_CHECK(lead >= 0, "[sum_to] cannot reduce {} to {}", g.shape().str(), shape.str());
  // Fast path: shape is a suffix of g's shape (bias gradients): one reduction over rows.
  bool suffix = true;
  for (int i = 0; i < shape.ndim(); ++i) suffix = suffix && shape[i] == g.size(lead + i);
  if (suffix) {
    Tensor r = sum(reshape(g, Shape{-1, std::max<int64_t>(shape.numel(), 1)}), 0, false);
    return reshape(r, shape);
  }
  Tensor r = g;
  for (int i = 0; i < lead; ++i) r = sum(r, 0, false);
  for (int i = 0; i < shape.ndim(); ++i)
    if (shape[i] == 1 && r.size(i) != 1) r = sum(r, i, true);
  TOY_CHECK(r.shape() == shape, "[sum_to] cannot reduce {} to {}", g.shape().str(), shape.str());
  return r;
}

namespace detail {
void define_reduce_ops(Registry& r) {
  r.define_op(primitive_op("sum", {"reduce"}, "sum, whole tensor or along an axis"));
  r.define_op(composite_op("mean", {"reduce", "unary"}, "mean = sum * 1/n"));
  r.define_op(primitive_op("max", {"reduce", "get_rows_backward"}, "max, whole or along an axis (grad to first max)"));
  r.define_op(primitive_op("argmax", {"reduce"}, "index of the first maximum (i32)", false));
  r.define_op(primitive_op("argsort", {"argsort"}, "stable sort order along the last axis (i32)", false));
  r.define_op(primitive_op("top_k", {"top_k"}, "k largest along the last axis, descending: values and indices", false));
  r.define_op(primitive_op("sample_token", {"sample_token"},
                           "one token from a row of logits: penalties, greedy or temperature/top-k/min-p/top-p, a draw",
                           false));
}
}  // namespace detail

}  // namespace toy
