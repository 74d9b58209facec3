#include "toy/ops/common.h"

namespace toy::detail {

void check_defined(const Tensor& t, const char* op, const char* what) {
  TOY_CHECK(t.defined(), "[{}] {} is an undefined tensor", op, what);
}

void check_float(const Tensor& t, const char* op, const char* what) {
  check_defined(t, op, what);
  TOY_CHECK(is_float(t.dtype()), "[{}] {} must be f32, f16 or bf16, got {}", op, what, name(t.dtype()));
}

void check_dtype(const Tensor& t, DType d, const char* op, const char* what) {
  check_defined(t, op, what);
  TOY_CHECK(t.dtype() == d, "[{}] {} must be {}, got {}", op, what, name(d), name(t.dtype()));
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  TOY_CHECK(a.dtype() == b.dtype(), "[{}] dtype mismatch: {} vs {}", op, describe(a), describe(b));
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  TOY_CHECK(a.device() == b.device(), "[{}] device mismatch: {} on {} vs {} on {}", op, describe(a),
            name(a.device()), describe(b), name(b.device()));
}

void check_ndim(const Tensor& t, int n, const char* op, const char* what) {
  check_defined(t, op, what);
  TOY_CHECK(t.ndim() == n, "[{}] {} must be {}-d, got shape {}", op, what, n, t.shape().str());
}

void check_shape(const Tensor& t, const Shape& s, const char* op, const char* what) {
  check_defined(t, op, what);
  TOY_CHECK(t.shape() == s, "[{}] {} must have shape {}, got {}", op, what, s.str(), t.shape().str());
}

void check_ids(const Tensor& ids, int64_t limit, const char* op, const char* what) {
  check_dtype(ids, DType::I32, op, what);
  if (ids_known_in_range(ids, limit)) return;  // checked on the host before it was uploaded
  // (On a device: read back once, counted. A device-side check is issue 22's next step.)
  Tensor c = transfer(contiguous_nograd(ids), Device::CPU);
  const int32_t* p = c.data<int32_t>();
  for (int64_t i = 0; i < c.numel(); ++i)
    TOY_CHECK(p[i] >= 0 && p[i] < limit, "[{}] {} [{}] = {} is out of range [0, {})", op, what, i, p[i], limit);
}

Tensor expand_view(const Tensor& x, const Shape& s) {
  if (x.shape() == s) return x;
  Strides st;
  const int off = s.ndim() - x.ndim();
  TOY_CHECK(off >= 0, "[expand] cannot expand {} to {}", x.shape().str(), s.str());
  for (int i = 0; i < s.ndim(); ++i) {
    int j = i - off;
    if (j < 0) {
      st.push_back(0);
    } else if (x.size(j) == s[i]) {
      st.push_back(x.stride(j));
    } else {
      TOY_CHECK(x.size(j) == 1, "[expand] cannot expand {} to {}", x.shape().str(), s.str());
      st.push_back(0);
    }
  }
  return make_view(x, s, st, x.offset());
}

Tensor contiguous_nograd(const Tensor& x) {
  if (x.is_contiguous()) return x;
  NoGradGuard ng;
  return contiguous_copy(x);
}

Tensor contiguous_f32_nograd(const Tensor& x) {
  NoGradGuard ng;
  return contiguous_nograd(x.dtype() == DType::F32 ? x : cast(x, DType::F32));
}

OpSpan::OpSpan(const char* op, std::initializer_list<const Tensor*> inputs) : scope_(op, false), span_(op) {
  if (!span_.active()) return;
  std::string args = "\"inputs\": \"";
  bool first = true;
  for (const Tensor* t : inputs) {
    if (!t || !t->defined()) continue;
    if (!first) args += ", ";
    first = false;
    args += describe(*t);
  }
  args += "\"";
  span_.set_args(std::move(args));
}

OpInfo primitive_op(const char* name, std::vector<std::string> kernels, const char* summary, bool backward) {
  OpInfo o;
  o.name = name;
  o.primitive = true;
  o.backward = backward;
  o.grad_test = std::string("OpGrad.") + name;
  o.uses = std::move(kernels);
  o.summary = summary;
  return o;
}

OpInfo fused_op(const char* name, std::vector<std::string> kernels, std::vector<std::string> fallback_uses,
                const char* summary) {
  OpInfo o = primitive_op(name, std::move(kernels), summary, true);
  o.fallback_uses = std::move(fallback_uses);
  return o;
}

OpInfo composite_op(const char* name, std::vector<std::string> uses, const char* summary, bool backward) {
  OpInfo o = primitive_op(name, std::move(uses), summary, backward);
  o.primitive = false;
  return o;
}

}  // namespace toy::detail

namespace toy {

Tensor upload_checked_ids(const Tensor& ids, Device d, int64_t below, const char* op, const char* what,
                          const int32_t* ignore) {
  TOY_CHECK(ids.dtype() == DType::I32 && is_host(ids.device()), "[{}] {} must be i32 on the host to be checked",
            op, what);
  const std::vector<int32_t> v = ids.to_i32_vector();
  for (size_t i = 0; i < v.size(); ++i)
    TOY_CHECK((ignore && v[i] == *ignore) || (v[i] >= 0 && v[i] < below), "[{}] {} [{}] = {} is out of range [0, {}){}",
              op, what, i, v[i], below, ignore ? fmt::format(" and is not the ignore index {}", *ignore) : "");
  Tensor up = transfer(contiguous(ids), d);
  if (up.is_same(ids)) up = contiguous_copy(ids);  // (d is the host: mark a copy, not the caller's tensor)
  TensorImpl* t = up.impl();
  t->ids_checked_below = below;
  t->ids_checked_ignore_set = ignore != nullptr;
  t->ids_checked_ignore = ignore ? *ignore : 0;
  return up;
}

namespace detail {
void clear_ids_mark(Tensor& t) {
  TensorImpl* i = t.impl();
  i->ids_checked_below = 0, i->ids_checked_ignore_set = false, i->ids_checked_ignore = 0;
}
}  // namespace detail

namespace detail {
bool ids_known_in_range(const Tensor& ids, int64_t limit, const int32_t* ignore) {
  const TensorImpl* i = ids.impl();
  if (i->ids_checked_below <= 0 || i->ids_checked_below > limit) return false;
  return !i->ids_checked_ignore_set || (ignore && i->ids_checked_ignore == *ignore);
}
}  // namespace detail

}  // namespace toy
