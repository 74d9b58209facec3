// Mixture-of-experts primitives: per-token expert matmul and per-expert bias add.
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::MulMatId> k_mmid("mul_mat_id");
const KernelRef<kern::MulMatId> k_mmid_weight("mul_mat_id_weight");
const KernelRef<kern::MulMatIdBackward> k_mmid_bwd("mul_mat_id_backward");
const KernelRef<kern::AddId> k_add_id("add_id");
}  // namespace

namespace {

// Expert e's matrix of w [E, N, K]: a [N, K] view (block types slice whole rows).
Tensor expert_matrix(const Tensor& w, int64_t e) { return view(slice(w, 0, e, e + 1), Shape{w.size(1), w.size(2)}); }

// mul_mat_id with experts in a stored dtype, as the composite of what it stands for: the pairs
// grouped by expert, each expert's rows of x gathered and multiplied by its matrix with linear
// (differentiable to x, and to an F16/BF16 w that carries a gradient), the results put back in
// pair order. Runs under autograd and where the fused kernel is missing.
Tensor mul_mat_id_grouped(const Tensor& w, const Tensor& x, const Tensor& ids) {
  const int64_t E = w.size(0), T = ids.size(0), U = ids.size(1), X = x.size(1);
  if (T * U == 0) return zeros(Shape{T, U, w.size(1)}, DType::F32, x.device());  // no pairs: nothing to concatenate
  const Tensor host_ids = contiguous(to(ids, Device::CPU));
  const int32_t* id = host_ids.data<int32_t>();
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(E)), pairs(static_cast<size_t>(E));
  for (int64_t p = 0; p < T * U; ++p) {
    rows[size_t(id[p])].push_back(int32_t(p / U * X + (X == 1 ? 0 : p % U)));
    pairs[size_t(id[p])].push_back(int32_t(p));
  }
  auto on_device = [&](const std::vector<int32_t>& v) {
    return to(from_vector(v, Shape{int64_t(v.size())}), x.device());
  };
  std::vector<int32_t> where(size_t(T * U));  // pair -> its row in the concatenated outputs
  int32_t next = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int32_t p : pairs[size_t(e)]) where[size_t(p)] = next++;
  const Tensor x2 = reshape(x, Shape{T * X, x.size(2)});
  std::vector<Tensor> outs;
  for (int64_t e = 0; e < E; ++e)
    if (!rows[size_t(e)].empty()) outs.push_back(linear(get_rows(x2, on_device(rows[size_t(e)])), expert_matrix(w, e)));
  const Tensor y = get_rows(outs.size() == 1 ? outs[0] : concat(outs, 0), on_device(where));
  return reshape(y, Shape{T, U, w.size(1)});
}

}  // namespace

Tensor mul_mat_id(const Tensor& w, const Tensor& x, const Tensor& ids) {
  OpSpan span("mul_mat_id", {&w, &x, &ids});
  const char* op = "mul_mat_id";
  check_defined(w, op, "experts");
  TOY_CHECK(is_float(w.dtype()) || is_block(w.dtype()), "[mul_mat_id] experts must be float or a GGUF block type, got {}",
            name(w.dtype()));
  check_float(x, op, "x");
  check_same_device(x, w, op);
  TOY_CHECK(w.ndim() == 3, "[mul_mat_id] experts must be [E, N, K], got {}", w.shape().str());
  TOY_CHECK(ids.ndim() == 2, "[mul_mat_id] ids must be [T, U], got {}", ids.shape().str());
  const int64_t E = w.size(0), N = w.size(1), K = w.size(2), T = ids.size(0), U = ids.size(1);
  TOY_CHECK(x.ndim() == 3 && x.size(0) == T && (x.size(1) == 1 || x.size(1) == U) && x.size(2) == K,
            "[mul_mat_id] x must be [{}, 1 or {}, {}], got {}", T, U, K, x.shape().str());
  check_ids(ids, E, op, "ids");
  if (w.dtype() != x.dtype()) {
    // Experts in a stored dtype (F16, BF16, GGUF blocks): as linear multiplies such a weight.
    TOY_CHECK(x.dtype() == DType::F32, "[mul_mat_id] {} experts need f32 activations, got {}", name(w.dtype()),
              name(x.dtype()));
    TOY_CHECK(w.is_contiguous(), "[mul_mat_id] {} experts must be contiguous", name(w.dtype()));
    if (needs_grad({&w, &x}) || !k_mmid_weight.available(x.device())) return mul_mat_id_grouped(w, x, ids);
    Tensor out = empty(Shape{T, U, N}, DType::F32, x.device());
    k_mmid_weight(x.device())(w, contiguous_nograd(x), contiguous_nograd(ids), out);
    return out;
  }
  check_float(w, op, "experts");
  Tensor wf = contiguous_f32_nograd(w), xf = contiguous_f32_nograd(x), idc = contiguous_nograd(ids);
  Tensor out = empty(Shape{T, U, N}, DType::F32, x.device());
  k_mmid(x.device())(wf, xf, idc, out);
  Tensor result = out;
  if (x.dtype() != DType::F32) {
    NoGradGuard ng;
    result = cast(out, x.dtype());
  }
  if (needs_grad({&w, &x})) {
    record(op, result, {w, x}, [wf, xf, idc, w, x](const Tensor& g) -> Grads {
      Tensor gf = g.dtype() == DType::F32 ? g : cast(g, DType::F32);
      Tensor dx = empty(xf.shape(), DType::F32, xf.device());
      Tensor dw = wants_grad(w) ? zeros(wf.shape(), DType::F32, wf.device()) : Tensor();
      k_mmid_bwd(xf.device())(wf, xf, idc, gf, dx, dw);
      Grads r(2);
      if (wants_grad(w)) r[0] = w.dtype() == DType::F32 ? dw : cast(dw, w.dtype());
      if (wants_grad(x)) r[1] = x.dtype() == DType::F32 ? dx : cast(dx, x.dtype());
      return r;
    });
  }
  return result;
}

Tensor add_id(const Tensor& x, const Tensor& b, const Tensor& ids) {
  OpSpan span("add_id", {&x, &b, &ids});
  const char* op = "add_id";
  check_dtype(x, DType::F32, op, "x");
  check_dtype(b, DType::F32, op, "bias");
  TOY_CHECK(x.ndim() == 3 && ids.ndim() == 2 && ids.size(0) == x.size(0) && ids.size(1) == x.size(1),
            "[add_id] needs x [T, U, N] and ids [T, U], got {} and {}", x.shape().str(), ids.shape().str());
  TOY_CHECK(b.ndim() == 2 && b.size(1) == x.size(2), "[add_id] bias must be [E, {}], got {}", x.size(2),
            b.shape().str());
  check_ids(ids, b.size(0), op, "ids");
  Tensor xc = contiguous_nograd(x), bc = contiguous_nograd(b), idc = contiguous_nograd(ids);
  Tensor out = empty(x.shape(), DType::F32, x.device());
  k_add_id(x.device())(xc, bc, idc, out);
  if (needs_grad({&x, &b})) {
    record(op, out, {x, b}, [idc, bs = b.shape(), b](const Tensor& g) -> Grads {
      Grads r(2);
      r[0] = g;
      if (wants_grad(b)) {
        Tensor db = zeros(bs, DType::F32, g.device());
        const int64_t pairs = idc.numel(), N = bs[1];
        k_scatter_add_rows(g.device())(make_view(g, Shape{pairs, N}, Strides{N, 1}, g.offset()),
                              make_view(idc, Shape{pairs}, Strides{1}, idc.offset()), db);
        r[1] = db;
      }
      return r;
    });
  }
  return out;
}

namespace detail {
void define_moe_ops(Registry& r) {
  // Stored-dtype experts: the mul_mat_id_weight kernel, or where it is missing (and under
  // autograd) the composite grouped through linear.
  r.define_op(fused_op("mul_mat_id", {"mul_mat_id", "mul_mat_id_backward", "mul_mat_id_weight"},
                       {"mul_mat_id", "mul_mat_id_backward", "matmul_weight", "matmul_weight_t", "get_rows",
                        "get_rows_backward", "copy"},
                       "per-token expert matmul: out[t, u] = W[ids[t, u]] x[t, u]; W in any stored dtype "
                       "(F16, BF16, GGUF blocks: as linear multiplies it)"));
  r.define_op(primitive_op("add_id", {"add_id", "get_rows_backward"}, "adds the bias row of each token's expert"));
}
}  // namespace detail

}  // namespace toy
