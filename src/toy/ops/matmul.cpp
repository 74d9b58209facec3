// matmul (batched, broadcasting, either side transposed as a view), linear, out_prod.
// Backward of c = a b: da = g b^T, db = a^T g, computed with the transposes as views so no
// operand is copied; broadcast batch dims are summed back.
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::Matmul> k_matmul("matmul");
const KernelRef<kern::MatmulBias> k_matmul_bias("matmul_bias");
const KernelRef<kern::MatmulRowSums> k_matmul_row_sums("matmul_row_sums");
const KernelRef<kern::MatmulWeight> k_matmul_weight("matmul_weight");
const KernelRef<kern::MatmulWeightT> k_matmul_weight_t("matmul_weight_t");
const KernelRef<kern::MatmulTakesHalf> k_matmul_takes_half("matmul_takes_half");
const KernelRef<kern::MatmulRounded> k_matmul_rounded("matmul_rounded");

Tensor t_view(const Tensor& x) {
  // Transposed view of the last two dims, no tape record.
  Shape s = x.shape();
  Strides st = x.strides();
  const int n = x.ndim();
  std::swap(s[n - 1], s[n - 2]);
  std::swap(st[n - 1], st[n - 2]);
  return make_view(x, s, st, x.offset());
}

// c = a @ b for operands that are already >= 2-d with broadcast-compatible batch dims.
Tensor matmul_nd(const Tensor& a, const Tensor& b) {
  const int na = a.ndim(), nb = b.ndim();
  const int64_t M = a.size(na - 2), K = a.size(na - 1), N = b.size(nb - 1);
  TOY_CHECK(b.size(nb - 2) == K, "[matmul] inner dims differ: a {} vs b {}", a.shape().str(), b.shape().str());
  Shape ba(std::span<const int64_t>(a.shape().begin(), size_t(na - 2)));
  Shape bb(std::span<const int64_t>(b.shape().begin(), size_t(nb - 2)));
  Shape batch = broadcast_shapes(ba, bb, "matmul");
  Shape sa = batch, sb = batch, sc = batch;
  sa.push_back(M), sa.push_back(K);
  sb.push_back(K), sb.push_back(N);
  sc.push_back(M), sc.push_back(N);
  Tensor c = empty(sc, a.dtype(), a.device());
  k_matmul(a.device())(expand_view(a, sa), expand_view(b, sb), c, 1.0f, 0.0f);
  return c;
}
}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool transpose_a, bool transpose_b) {
  OpSpan span("matmul", {&a_in, &b_in});
  check_float(a_in, "matmul", "a");
  check_float(b_in, "matmul", "b");
  check_same_dtype(a_in, b_in, "matmul");
  check_same_device(a_in, b_in, "matmul");
  TOY_CHECK(a_in.ndim() >= 1 && b_in.ndim() >= 1, "[matmul] operands must be at least 1-d, got {} and {}",
            a_in.shape().str(), b_in.shape().str());
  TOY_CHECK(!(transpose_a && a_in.ndim() < 2) && !(transpose_b && b_in.ndim() < 2),
            "[matmul] cannot transpose a 1-d operand");
  // NumPy promotion of 1-d operands; the added dim is removed from the result.
  const bool a_vec = a_in.ndim() == 1, b_vec = b_in.ndim() == 1;
  Tensor a = a_vec ? make_view(a_in, Shape{1, a_in.size(0)}, Strides{0, a_in.stride(0)}, a_in.offset()) : a_in;
  Tensor b = b_vec ? make_view(b_in, Shape{b_in.size(0), 1}, Strides{b_in.stride(0), 0}, b_in.offset()) : b_in;
  if (transpose_a) a = t_view(a);
  if (transpose_b) b = t_view(b);
  Tensor c = matmul_nd(a, b);
  Shape out_shape = c.shape();
  if (a_vec) out_shape.erase(out_shape.ndim() - 2);
  if (b_vec) out_shape.erase(out_shape.ndim() - 1);
  if (a_vec || b_vec) c = make_view(c, out_shape, contiguous_strides(out_shape), 0);
  if (needs_grad({&a_in, &b_in})) {
    record("matmul", c, {a_in, b_in}, [a, b, a_in, b_in, transpose_a, transpose_b, a_vec, b_vec](const Tensor& g_in) -> Grads {
      Grads r(2);
      // Restore the promoted dims so g is [..., M, N].
      Tensor g = g_in;
      if (a_vec || b_vec) {
        Shape gs = g_in.shape();
        if (a_vec) gs.insert(gs.ndim() - (b_vec ? 0 : 1), 1);
        if (b_vec) gs.push_back(1);
        g = reshape(g_in, gs);
      }
      if (wants_grad(a_in)) {
        // d(a_eff) = g b_eff^T; with transpose_a, da = b_eff g^T.
        Tensor da = transpose_a ? matmul_nd(b, t_view(g)) : matmul_nd(g, t_view(b));
        da = sum_to(da, a_vec ? Shape{1, a_in.size(0)} : a_in.shape());
        r[0] = a_vec ? reshape(da, a_in.shape()) : da;
      }
      if (wants_grad(b_in)) {
        // d(b_eff) = a_eff^T g; with transpose_b, db = g^T a_eff.
        Tensor db = transpose_b ? matmul_nd(t_view(g), a) : matmul_nd(t_view(a), g);
        db = sum_to(db, b_vec ? Shape{b_in.size(0), 1} : b_in.shape());
        r[1] = b_vec ? reshape(db, b_in.shape()) : db;
      }
      return r;
    });
  }
  return c;
}

namespace {
// linear with a weight kept in its file's dtype (F16, BF16, a GGUF block type) and f32
// activations: the weight is widened tile by tile inside the kernel, never as a whole.
// Gradients flow to x and the bias; such a weight is frozen (only f32 weights train).
Tensor linear_stored(const Tensor& x, const Tensor& w, const Tensor& b) {
  TOY_CHECK(x.dtype() == DType::F32, "[linear] a {} weight needs f32 activations, got {}", name(w.dtype()),
            name(x.dtype()));
  TOY_CHECK(w.is_contiguous(), "[linear] a {} weight must be contiguous", name(w.dtype()));
  // An F16/BF16 weight may carry a gradient (mixed precision: the rounding of an F32 master,
  // made in the graph, so the gradient reaches the master); a block weight never does.
  TOY_CHECK(!w.requires_grad() || w.dtype() == DType::F16 || w.dtype() == DType::BF16,
            "[linear] a {} weight cannot be trained: only f32, f16 and bf16 weights have gradients", name(w.dtype()));
  const int64_t in = w.size(1), out = w.size(0);
  Tensor x2;
  {
    NoGradGuard ng;
    x2 = contiguous(reshape(x, Shape{-1, in}));
  }
  Tensor y = empty(Shape{x2.size(0), out}, DType::F32, x.device());
  if (b.defined()) {
    NoGradGuard ng;
    copy_(y, expand_view(b, y.shape()));
  }
  k_matmul_weight(x.device())(x2, w, y, b.defined());
  Shape ys = x.shape();
  ys[ys.ndim() - 1] = out;
  y = make_view(y, ys, contiguous_strides(ys), 0);
  if (needs_grad({&x, &w, &b})) {
    record("linear", y, {x, w, b}, [x, x2, w, b](const Tensor& g_in) -> Grads {
      Grads r(3);
      Tensor g = contiguous_nograd(reshape(g_in, Shape{-1, w.size(0)}));
      if (w.requires_grad()) {
        // Mixed precision (w the rounding of an F32 master): both backward products take
        // operands rounded to the weight's type with an f32 accumulator and f32 results, as
        // the forward's did (PyTorch's autocast rounds the same way): dx = round(g) W and
        // dW = round(g)^T round(x). On a GPU all three products run on the tensor cores.
        // The rounded operands in the form the device multiplies fastest — the weight's type
        // for a GPU's tensor cores or a CPU's BF16 dot product, else its f32 widening for
        // BLAS (the same values; only the order of the sums differs, as it does between
        // devices anyway).
        NoGradGuard ng;
        const bool half_operands =
            k_matmul_takes_half.available(g.device()) && k_matmul_takes_half(g.device())(w.dtype());
        auto rounded = [&](const Tensor& t) {
          return half_operands ? cast(t, w.dtype()) : cast(cast(t, w.dtype()), DType::F32);
        };
        // Where the device rounds as it multiplies (matmul_rounded), g and x go as they are.
        if (half_operands && k_matmul_rounded.available(g.device())) {
          const auto product = k_matmul_rounded(g.device());
          if (wants_grad(x)) {
            Tensor dx = empty(Shape{g.size(0), w.size(1)}, DType::F32, g.device());
            product(g, w, w.dtype(), dx);  // [N, out] @ [out, in]
            r[0] = reshape(dx, x.shape());
          }
          if (wants_grad(w)) {
            Tensor dw = empty(w.shape(), DType::F32, g.device());
            product(t_view(g), x2, w.dtype(), dw);  // [out, N] @ [N, in]
            r[1] = dw;
          }
        } else {
          const Tensor gr = rounded(g);
          if (wants_grad(x)) {
            Tensor dx = empty(Shape{g.size(0), w.size(1)}, DType::F32, g.device());
            if (half_operands)
              k_matmul(g.device())(gr, w, dx, 1.0f, 0.0f);  // [N, out] @ [out, in]
            else
              k_matmul_weight_t(g.device())(gr, w, dx);  // (the weight widened tile by tile)
            r[0] = reshape(dx, x.shape());
          }
          if (wants_grad(w)) {
            Tensor dw = empty(w.shape(), DType::F32, g.device());
            k_matmul(g.device())(t_view(gr), rounded(x2), dw, 1.0f, 0.0f);  // [out, N] @ [N, in]
            r[1] = dw;
          }
        }
      } else if (wants_grad(x)) {
        // A frozen stored weight (a LoRA base): widened tile by tile, never as a whole.
        Tensor dx = empty(Shape{g.size(0), w.size(1)}, DType::F32, g.device());
        k_matmul_weight_t(g.device())(g, w, dx);
        r[0] = reshape(dx, x.shape());
      }
      if (wants_grad(b)) r[2] = sum(g, 0);
      return r;
    });
  }
  return y;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  OpSpan span("linear", {&x, &w, &b});
  check_float(x, "linear", "x");
  check_defined(w, "linear", "weight");
  check_same_device(x, w, "linear");
  TOY_CHECK(w.ndim() == 2, "[linear] weight must be [out, in], got {}", w.shape().str());
  TOY_CHECK(x.ndim() >= 1 && x.size(-1) == w.size(1), "[linear] x {} has {} features, weight {} expects {}",
            x.shape().str(), x.ndim() ? x.size(-1) : 0, w.shape().str(), w.size(1));
  if (b.defined()) {
    check_float(b, "linear", "bias");
    check_same_dtype(x, b, "linear");
    TOY_CHECK(b.ndim() == 1 && b.size(0) == w.size(0), "[linear] bias must be [{}], got {}", w.size(0),
              b.shape().str());
  }
  if (w.dtype() != x.dtype()) return linear_stored(x, w, b);
  check_float(w, "linear", "weight");
  const int64_t in = w.size(1), out = w.size(0);
  Tensor x2;
  {
    NoGradGuard ng;
    x2 = reshape(x, Shape{-1, in});
  }
  const int64_t N = x2.size(0);
  Tensor y = empty(Shape{N, out}, x.dtype(), x.device());
  if (b.defined() && x.dtype() == DType::F32 && k_matmul_bias.available(x.device())) {
    // (the bias as the sums' start: the same bits as the copy below, one pass over y fewer)
    k_matmul_bias(x.device())(x2, t_view(w), contiguous_nograd(b), y);
  } else {
    float beta = 0.0f;
    if (b.defined()) {
      NoGradGuard ng;
      copy_(y, expand_view(b, y.shape()));
      beta = 1.0f;
    }
    k_matmul(x.device())(x2, t_view(w), y, 1.0f, beta);
  }
  Shape ys = x.shape();
  ys[ys.ndim() - 1] = out;
  y = make_view(y, ys, contiguous_strides(ys), 0);
  if (needs_grad({&x, &w, &b})) {
    record("linear", y, {x, w, b}, [x, x2, w, b](const Tensor& g_in) -> Grads {
      Grads r(3);
      Tensor g = contiguous_nograd(reshape(g_in, Shape{-1, w.size(0)}));
      if (wants_grad(x)) r[0] = reshape(matmul_nd(g, w), x.shape());  // [N, out] @ [out, in]
      if (wants_grad(w) && wants_grad(b) && g.dtype() == DType::F32 && k_matmul_row_sums.available(g.device())) {
        // (the bias's gradient summed as the weight's product reads g: the bits of sum(g, 0))
        Tensor dw = empty(w.shape(), DType::F32, g.device()), db = empty(Shape{w.size(0)}, DType::F32, g.device());
        k_matmul_row_sums(g.device())(t_view(g), x2, dw, db);
        r[1] = dw, r[2] = db;
      } else {
        if (wants_grad(w)) r[1] = matmul_nd(t_view(g), x2);  // [out, N] @ [N, in]
        if (wants_grad(b)) r[2] = sum(g, 0);
      }
      return r;
    });
  }
  return y;
}

Tensor out_prod(const Tensor& a, const Tensor& b) {
  check_float(a, "out_prod", "a");
  check_float(b, "out_prod", "b");
  if (a.ndim() == 1 && b.ndim() == 1) {
    return matmul(reshape(a, Shape{1, a.size(0)}), reshape(b, Shape{1, b.size(0)}), true, false);
  }
  TOY_CHECK(a.ndim() >= 2 && b.ndim() >= 2 && a.size(-2) == b.size(-2),
            "[out_prod] needs a [..., N, M] and b [..., N, P] with the same N, got {} and {}", a.shape().str(),
            b.shape().str());
  return matmul(a, b, true, false);
}

namespace detail {
void define_matmul_ops(Registry& r) {
  r.define_op(primitive_op("matmul", {"matmul", "reduce"}, "batched a @ b, broadcasting, transposes as views"));
  r.define_op(composite_op("linear", {"matmul", "matmul_weight", "matmul_weight_t", "copy", "reduce"},
                           "x @ W^T + b (one tape node); W in any stored dtype (F16, BF16, GGUF blocks)"));
  r.define_op(composite_op("out_prod", {"matmul", "reduce"}, "a^T b: sum of outer products of rows"));
}
}  // namespace detail

}  // namespace toy
