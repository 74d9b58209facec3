// Mixture-of-experts primitives: per-token expert matmul and per-expert bias add.
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::MulMatId> k_mmid("mul_mat_id");
const KernelRef<kern::MulMatIdBackward> k_mmid_bwd("mul_mat_id_backward");
const KernelRef<kern::AddId> k_add_id("add_id");
const KernelRef<kern::ScatterAddRows> k_scatter("get_rows_backward");
}  // namespace

Tensor mul_mat_id(const Tensor& w, const Tensor& x, const Tensor& ids) {
  OpSpan span("mul_mat_id", {&w, &x, &ids});
  const char* op = "mul_mat_id";
  check_float(w, op, "experts");
  check_float(x, op, "x");
  check_same_dtype(w, x, op);
  TOY_CHECK(w.ndim() == 3, "[mul_mat_id] experts must be [E, N, K], got {}", w.shape().str());
  TOY_CHECK(ids.ndim() == 2, "[mul_mat_id] ids must be [T, U], got {}", ids.shape().str());
  const int64_t E = w.size(0), N = w.size(1), K = w.size(2), T = ids.size(0), U = ids.size(1);
  TOY_CHECK(x.ndim() == 3 && x.size(0) == T && (x.size(1) == 1 || x.size(1) == U) && x.size(2) == K,
            "[mul_mat_id] x must be [{}, 1 or {}, {}], got {}", T, U, K, x.shape().str());
  check_ids(ids, E, op, "ids");
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
        k_scatter(g.device())(make_view(g, Shape{pairs, N}, Strides{N, 1}, g.offset()),
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
  r.define_op(primitive_op("mul_mat_id", {"mul_mat_id", "mul_mat_id_backward"},
                           "per-token expert matmul: out[t, u] = W[ids[t, u]] x[t, u]"));
  r.define_op(primitive_op("add_id", {"add_id", "get_rows_backward"}, "adds the bias row of each token's expert"));
}
}  // namespace detail

}  // namespace toy
