// Row ops: get_rows (embedding gather; backward scatter-adds into the table's gradient) and
// set_rows (functional with gradient, or in place for KV caches).
#include <unordered_set>

#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::GetRows> k_get("get_rows");
const KernelRef<kern::SetRows> k_set("set_rows");

void check_table(const Tensor& t, const char* op, const char* what) {
  check_defined(t, op, what);
  TOY_CHECK(t.ndim() == 2, "[{}] {} must be 2-d [rows, D], got {}", op, what, t.shape().str());
  TOY_CHECK(t.dtype() != DType::I32, "[{}] {} must hold floats or blocks, got i32", op, what);
  TOY_CHECK(t.stride(1) == 1 || t.size(1) == 1, "[{}] {} rows must be contiguous", op, what);
  TOY_CHECK(!is_block(t.dtype()) || t.is_contiguous(), "[{}] block-typed {} must be contiguous", op, what);
}
}  // namespace

Tensor get_rows(const Tensor& table, const Tensor& ids) {
  OpSpan span("get_rows", {&table, &ids});
  check_table(table, "get_rows", "table");
  check_ids(ids, table.size(0), "get_rows", "ids");
  Tensor idc = contiguous_nograd(ids);
  Shape out = ids.shape();
  out.push_back(table.size(1));
  const DType odt = is_block(table.dtype()) ? DType::F32 : table.dtype();
  Tensor y = empty(out, odt, table.device());
  k_get(table.device())(table, make_view(idc, Shape{idc.numel()}, Strides{1}, idc.offset()), y);
  if (needs_grad({&table})) {
    record("get_rows", y, {table}, [ts = table.shape(), idc, dt = table.dtype()](const Tensor& g) -> Grads {
      Tensor dt_ = zeros(ts, dt, g.device());
      k_scatter_add_rows(g.device())(make_view(g, Shape{idc.numel(), ts[1]}, Strides{ts[1], 1}, g.offset()),
                            make_view(idc, Shape{idc.numel()}, Strides{1}, idc.offset()), dt_);
      return {dt_};
    });
  }
  return y;
}

namespace {
void check_set_rows(const Tensor& dst, const Tensor& ids, const Tensor& src, const char* op) {
  check_table(dst, op, "dst");
  check_defined(src, op, "src");
  check_ids(ids, dst.size(0), op, "ids");
  TOY_CHECK(ids.ndim() == 1, "[{}] ids must be 1-d, got {}", op, ids.shape().str());
  TOY_CHECK(src.ndim() == 2 && src.size(0) == ids.size(0) && src.size(1) == dst.size(1),
            "[{}] src must be [{}, {}], got {}", op, ids.size(0), dst.size(1), src.shape().str());
  check_same_device(dst, src, op);
}

// Positions in ids whose row a later position writes again (ids is contiguous i32, CPU).
std::vector<int32_t> overwritten_positions(const Tensor& ids) {
  const int32_t* p = ids.data<int32_t>();
  std::unordered_set<int32_t> later;
  std::vector<int32_t> dead;
  for (int64_t i = ids.numel() - 1; i >= 0; --i)
    if (!later.insert(p[i]).second) dead.push_back(int32_t(i));
  return dead;
}
}  // namespace

Tensor set_rows(const Tensor& dst, const Tensor& ids, const Tensor& src) {
  OpSpan span("set_rows", {&dst, &ids, &src});
  check_set_rows(dst, ids, src, "set_rows");
  Tensor y;
  {
    NoGradGuard ng;
    y = contiguous_copy(dst);
  }
  Tensor idc = contiguous_nograd(ids);
  k_set(dst.device())(y, idc, src);
  if (needs_grad({&dst, &src})) {
    // With repeated ids only the last write survives in y, so only that src row receives a
    // gradient: the positions overwritten later are found once, here.
    Tensor dead;
    if (wants_grad(src)) {
      const std::vector<int32_t> d = overwritten_positions(transfer(idc, Device::CPU));
      if (!d.empty()) dead = transfer(from_vector(d, Shape{int64_t(d.size())}), idc.device());
    }
    record("set_rows", y, {dst, src}, [idc, dead, dst, src](const Tensor& g) -> Grads {
      Grads r(2);
      if (wants_grad(dst)) {
        Tensor d = contiguous_copy(g);
        k_set(g.device())(d, idc, zeros(Shape{idc.numel(), g.size(1)}, g.dtype(), g.device()));
        r[0] = d;
      }
      if (wants_grad(src)) {
        Tensor s = get_rows(g, idc);  // a fresh tensor: zeroed in place
        if (dead.defined()) k_set(g.device())(s, dead, zeros(Shape{dead.numel(), s.size(1)}, s.dtype(), s.device()));
        r[1] = s.dtype() == src.dtype() ? s : cast(s, src.dtype());
      }
      return r;
    });
  }
  return y;
}

void set_rows_(Tensor& dst, const Tensor& ids, const Tensor& src) {
  check_set_rows(dst, ids, src, "set_rows_");
  TOY_CHECK(!(grad_enabled() && (dst.requires_grad() || src.requires_grad())),
            "[set_rows_] in-place update of a tensor that requires grad; use set_rows or NoGradGuard");
  OpSpan span("set_rows", {&dst, &ids, &src});
  k_set(dst.device())(dst, contiguous_nograd(ids), src);
  clear_ids_mark(dst);
}

namespace detail {
void define_rows_ops(Registry& r) {
  r.define_op(primitive_op("get_rows", {"get_rows", "get_rows_backward"},
                           "embedding gather (dequantizes block tables); backward scatter-adds"));
  r.define_op(primitive_op("set_rows", {"set_rows", "copy", "get_rows"}, "writes rows at indices (functional or in place)"));
}
}  // namespace detail

}  // namespace toy
