// Shape ops. view/permute/transpose/slice/expand/squeeze return views (no copy); reshape
// copies only when the strides cannot express the new shape; concat/pad/repeat/cast and
// contiguous copy through the copy kernel. Backward rules undo the movement.
#include <numeric>

#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::Copy> k_copy("copy");
const KernelRef<kern::Fill> k_fill("fill");

Shape infer_shape(const Shape& want, int64_t numel, const char* op, const Shape& from) {
  Shape s = want;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.ndim(); ++i) {
    if (s[i] == -1) {
      TOY_CHECK(infer < 0, "[{}] only one dimension can be -1, got {}", op, want.str());
      infer = i;
    } else {
      TOY_CHECK(s[i] >= 0, "[{}] invalid dimension {} in {}", op, s[i], want.str());
      known *= s[i];
    }
  }
  if (infer >= 0) {
    TOY_CHECK(known > 0 && numel % known == 0, "[{}] cannot view {} ({} elements) as {}", op, from.str(), numel,
              want.str());
    s[infer] = numel / known;
  }
  TOY_CHECK(s.numel() == numel, "[{}] cannot view {} ({} elements) as {} ({} elements)", op, from.str(), numel,
            s.str(), s.numel());
  return s;
}

// Strides for viewing (shape, strides) as new_shape without a copy, if possible
// (PyTorch's computeStride): dims are grouped into chunks that are contiguous in memory.
bool view_strides(const Shape& shape, const Strides& strides, const Shape& ns, Strides* out) {
  Strides st = ns;
  if (shape.numel() == 0 || shape.ndim() == 0) {
    *out = contiguous_strides(ns);
    return true;
  }
  int64_t view_d = ns.ndim() - 1;
  int64_t chunk_base = strides[shape.ndim() - 1];
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = shape.ndim() - 1; d >= 0; --d) {
    tensor_numel *= shape[int(d)];
    if (d == 0 || (shape[int(d) - 1] != 1 && strides[int(d) - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || ns[int(view_d)] == 1)) {
        st[int(view_d)] = view_numel * chunk_base;
        view_numel *= ns[int(view_d)];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base = strides[int(d) - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return false;
  *out = st;
  return true;
}

Tensor record_reshape_back(Tensor y, const Tensor& x, const char* op) {
  if (needs_grad({&x})) record(op, y, {x}, [xs = x.shape()](const Tensor& g) -> Grads { return {reshape(g, xs)}; });
  return y;
}
}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  check_defined(x, "view", "x");
  Shape ns = infer_shape(shape, x.numel(), "view", x.shape());
  Strides st;
  TOY_CHECK(!is_block(x.dtype()) || x.is_contiguous(), "[view] block-typed tensors must be contiguous");
  TOY_CHECK(view_strides(x.shape(), x.strides(), ns, &st),
            "[view] a tensor of shape {} with strides {} cannot be viewed as {}; use reshape", x.shape().str(),
            x.strides().str(), ns.str());
  return record_reshape_back(make_view(x, ns, st, x.offset()), x, "view");
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined(x, "reshape", "x");
  Shape ns = infer_shape(shape, x.numel(), "reshape", x.shape());
  Strides st;
  if (view_strides(x.shape(), x.strides(), ns, &st)) {
    if (ns == x.shape() && st == x.strides()) return x;
    return record_reshape_back(make_view(x, ns, st, x.offset()), x, "reshape");
  }
  Tensor c;
  {
    NoGradGuard ng;
    c = contiguous_copy(x);
  }
  return record_reshape_back(make_view(c, ns, contiguous_strides(ns), c.offset()), x, "reshape");
}

Tensor permute(const Tensor& x, const std::vector<int>& dims) {
  check_defined(x, "permute", "x");
  TOY_CHECK(int(dims.size()) == x.ndim(), "[permute] {} dims given for a {}-d tensor", dims.size(), x.ndim());
  Shape s, st;
  std::vector<int> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    int d = normalize_axis(dims[i], x.ndim(), "permute");
    TOY_CHECK(inverse[size_t(d)] < 0, "[permute] dimension {} repeated", d);
    inverse[size_t(d)] = int(i);
    s.push_back(x.size(d));
    st.push_back(x.stride(d));
  }
  Tensor y = make_view(x, s, st, x.offset());
  if (needs_grad({&x})) record("permute", y, {x}, [inverse](const Tensor& g) -> Grads { return {permute(g, inverse)}; });
  return y;
}

Tensor transpose(const Tensor& x, int d0, int d1) {
  check_defined(x, "transpose", "x");
  const int a = normalize_axis(d0, x.ndim(), "transpose"), b = normalize_axis(d1, x.ndim(), "transpose");
  std::vector<int> dims(size_t(x.ndim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[size_t(a)], dims[size_t(b)]);
  return permute(x, dims);
}

Tensor contiguous_copy(const Tensor& x) {
  OpSpan span("contiguous", {&x});
  check_defined(x, "contiguous", "x");
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  k_copy(x.device())(x, y);
  if (needs_grad({&x})) record("contiguous", y, {x}, [](const Tensor& g) -> Grads { return {g}; });
  return y;
}

Tensor contiguous(const Tensor& x) {
  check_defined(x, "contiguous", "x");
  return x.is_contiguous() ? x : contiguous_copy(x);
}

Tensor to(const Tensor& x, Device d) {
  check_defined(x, "to", "x");
  if (x.device() == d) return x;
  OpSpan span("to", {&x});
  Tensor y = transfer(contiguous(x), d);
  const Device from = x.device();
  if (needs_grad({&x})) record("to", y, {x}, [from](const Tensor& g) -> Grads { return {to(g, from)}; });
  return y;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  check_defined(x, "expand", "x");
  Tensor y = expand_view(x, shape);
  if (y.is_same(x)) return x;
  y = make_view(y, y.shape(), y.strides(), y.offset());
  if (needs_grad({&x})) record("expand", y, {x}, [xs = x.shape()](const Tensor& g) -> Grads { return {sum_to(g, xs)}; });
  return y;
}

Tensor unsqueeze(const Tensor& x, int axis) {
  check_defined(x, "unsqueeze", "x");
  const int a = normalize_axis(axis, x.ndim() + 1, "unsqueeze");
  Shape s = x.shape();
  s.insert(a, 1);
  return reshape(x, s);
}

Tensor squeeze(const Tensor& x, int axis) {
  check_defined(x, "squeeze", "x");
  const int a = normalize_axis(axis, x.ndim(), "squeeze");
  TOY_CHECK(x.size(a) == 1, "[squeeze] dimension {} has size {}, not 1", a, x.size(a));
  Shape s = x.shape();
  s.erase(a);
  return reshape(x, s);
}

Tensor slice(const Tensor& x, int axis_in, int64_t start, int64_t end, int64_t step) {
  check_defined(x, "slice", "x");
  const int axis = normalize_axis(axis_in, x.ndim(), "slice");
  const int64_t n = x.size(axis);
  TOY_CHECK(step > 0, "[slice] step must be positive, got {}", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  TOY_CHECK(!is_block(x.dtype()) || (axis == 0 && step == 1), "[slice] block-typed tensors slice only whole rows");
  Shape s = x.shape();
  Strides st = x.strides();
  s[axis] = (end - start + step - 1) / step;
  st[axis] = x.stride(axis) * step;
  Tensor y = make_view(x, s, st, x.offset() + start * x.stride(axis));
  if (needs_grad({&x})) {
    record("slice", y, {x}, [xs = x.shape(), axis, start, step, n = s[axis]](const Tensor& g) -> Grads {
      Tensor dx = zeros(xs, g.dtype(), g.device());
      Strides dst = dx.strides();
      Shape ds = xs;
      ds[axis] = n;
      dst[axis] *= step;
      Tensor region = make_view(dx, ds, dst, start * dx.stride(axis));
      k_copy(g.device())(g, region);
      return {dx};
    });
  }
  return y;
}

Tensor concat(const std::vector<Tensor>& xs, int axis_in) {
  TOY_CHECK(!xs.empty(), "[concat] needs at least one tensor");
  const Tensor& x0 = xs[0];
  check_defined(x0, "concat", "input 0");
  const int axis = normalize_axis(axis_in, x0.ndim(), "concat");
  Shape out = x0.shape();
  out[axis] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    check_defined(x, "concat", "input");
    check_same_dtype(x0, x, "concat");
    check_same_device(x0, x, "concat");
    TOY_CHECK(x.ndim() == x0.ndim(), "[concat] input {} has {} dims, input 0 has {}", i, x.ndim(), x0.ndim());
    for (int d = 0; d < x.ndim(); ++d)
      TOY_CHECK(d == axis || x.size(d) == x0.size(d), "[concat] input {} has shape {}, input 0 has {} (axis {})", i,
                x.shape().str(), x0.shape().str(), axis);
    out[axis] += x.size(axis);
  }
  OpSpan span("concat", {&x0});
  Tensor y = empty(out, x0.dtype(), x0.device());
  int64_t at = 0;
  std::vector<int64_t> starts;
  for (const Tensor& x : xs) {
    Shape rs = y.shape();
    rs[axis] = x.size(axis);
    Tensor region = make_view(y, rs, y.strides(), at * y.stride(axis));
    k_copy(x.device())(x, region);
    starts.push_back(at);
    at += x.size(axis);
  }
  if (needs_grad(xs)) {
    record("concat", y, xs, [xs, starts, axis](const Tensor& g) -> Grads {
      Grads r(xs.size());
      for (size_t i = 0; i < xs.size(); ++i)
        if (wants_grad(xs[i])) r[i] = slice(g, axis, starts[i], starts[i] + xs[i].size(axis));
      return r;
    });
  }
  return y;
}

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, float value) {
  OpSpan span("pad", {&x});
  check_defined(x, "pad", "x");
  TOY_CHECK(int(pads.size()) <= x.ndim(), "[pad] {} pads for a {}-d tensor", pads.size(), x.ndim());
  Shape out = x.shape();
  std::vector<int64_t> before(size_t(x.ndim()), 0);
  const int first = x.ndim() - int(pads.size());
  for (size_t i = 0; i < pads.size(); ++i) {
    TOY_CHECK(pads[i].first >= 0 && pads[i].second >= 0, "[pad] negative padding {} {}", pads[i].first,
              pads[i].second);
    out[first + int(i)] += pads[i].first + pads[i].second;
    before[size_t(first) + i] = pads[i].first;
  }
  Tensor y = empty(out, x.dtype(), x.device());
  k_fill(x.device())(y, value);
  int64_t off = 0;
  for (int d = 0; d < x.ndim(); ++d) off += before[size_t(d)] * y.stride(d);
  Tensor region = make_view(y, x.shape(), y.strides(), off);
  k_copy(x.device())(x, region);
  if (needs_grad({&x})) {
    record("pad", y, {x}, [xs = x.shape(), off](const Tensor& g) -> Grads {
      return {make_view(g, xs, g.strides(), g.offset() + off)};
    });
  }
  return y;
}

Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats) {
  OpSpan span("repeat", {&x});
  check_defined(x, "repeat", "x");
  const int n = int(repeats.size());
  TOY_CHECK(n >= x.ndim(), "[repeat] needs at least {} repeat counts, got {}", x.ndim(), n);
  TOY_CHECK(2 * n <= kMaxDims, "[repeat] at most {} dimensions", kMaxDims / 2);
  // View x as [r0, s0, r1, s1, ...] with zero strides on the repeat dims, then copy.
  Shape big, out;
  Strides st;
  for (int i = 0; i < n; ++i) {
    TOY_CHECK(repeats[size_t(i)] >= 0, "[repeat] negative repeat count {}", repeats[size_t(i)]);
    const int xd = i - (n - x.ndim());
    const int64_t size = xd >= 0 ? x.size(xd) : 1, stride = xd >= 0 ? x.stride(xd) : 0;
    big.push_back(repeats[size_t(i)]);
    st.push_back(0);
    big.push_back(size);
    st.push_back(stride);
    out.push_back(repeats[size_t(i)] * size);
  }
  Tensor y = empty(big, x.dtype(), x.device());
  k_copy(x.device())(make_view(x, big, st, x.offset()), y);
  y = make_view(y, out, contiguous_strides(out), 0);
  if (needs_grad({&x})) {
    record("repeat", y, {x}, [xs = x.shape(), big](const Tensor& g) -> Grads {
      Tensor r = reshape(g, big);
      for (int i = big.ndim() - 2; i >= 0; i -= 2) r = sum(r, i, false);
      return {reshape(r, xs)};
    });
  }
  return y;
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined(x, "cast", "x");
  if (x.dtype() == dtype) return x;
  OpSpan span("cast", {&x});
  TOY_CHECK(!is_block(dtype) || x.ndim() >= 1, "[cast] block types need at least 1-d tensors");
  Tensor src = is_block(dtype) || is_block(x.dtype()) ? contiguous_nograd(x) : x;
  Tensor y = empty(x.shape(), dtype, x.device());
  k_copy(x.device())(src, y);
  if (needs_grad({&x})) {
    TOY_CHECK(is_float(dtype), "[cast] casting a tensor that requires grad to {} would lose its gradient",
              name(dtype));
    record("cast", y, {x}, [xd = x.dtype()](const Tensor& g) -> Grads { return {cast(g, xd)}; });
  }
  return y;
}

void copy_(Tensor& dst, const Tensor& src) {
  check_defined(dst, "copy_", "dst");
  check_defined(src, "copy_", "src");
  check_same_device(dst, src, "copy_");
  TOY_CHECK(dst.shape() == src.shape(), "[copy_] shapes differ: dst {} vs src {}", dst.shape().str(),
            src.shape().str());
  TOY_CHECK(!(grad_enabled() && (dst.requires_grad() || src.requires_grad())),
            "[copy_] in-place copy into or from a tensor that requires grad; use NoGradGuard");
  k_copy(dst.device())(src, dst);
  clear_ids_mark(dst);
}

void fill_(Tensor& dst, double value) {
  check_defined(dst, "fill_", "dst");
  TOY_CHECK(!(grad_enabled() && dst.requires_grad()), "[fill_] tensor requires grad; use NoGradGuard");
  k_fill(dst.device())(dst, value);
  clear_ids_mark(dst);
}

namespace detail {
void define_shape_ops(Registry& r) {
  r.define_op(primitive_op("view", {}, "new shape over the same storage (no copy)"));
  r.define_op(primitive_op("reshape", {"copy"}, "view when the strides allow, else a copy"));
  r.define_op(primitive_op("permute", {}, "reorders dimensions (view)"));
  r.define_op(composite_op("transpose", {}, "swaps two dimensions (a permute view)"));
  r.define_op(primitive_op("contiguous", {"copy"}, "row-major copy when needed"));
  r.define_op(primitive_op("to", {"copy"}, "a copy on another device (the counted host/device transfer)"));
  r.define_op(primitive_op("concat", {"copy"}, "joins tensors along an axis"));
  r.define_op(primitive_op("slice", {"copy", "fill"}, "start:end:step along an axis (view)"));
  r.define_op(primitive_op("pad", {"copy", "fill"}, "pads the last dims with a constant"));
  r.define_op(primitive_op("full", {"fill"}, "zeros / ones / full / fill_: a constant, on the tensor's device", false));
  r.define_op(primitive_op("arange", {"arange"}, "0, 1, ..., n - 1 on a device", false));
  r.define_op(primitive_op("random_fill", {"random_fill"},
                           "randn / rand / fill_normal_ / fill_uniform_: Philox by element index, on any device",
                           false));
  r.define_op(primitive_op("repeat", {"copy", "reduce"}, "tiles a tensor (torch.Tensor.repeat)"));
  r.define_op(primitive_op("cast", {"copy"}, "converts dtype, including (de)quantizing block types"));
}
}  // namespace detail

}  // namespace toy
