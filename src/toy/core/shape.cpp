#include "toy/core/shape.h"

#include "toy/core/error.h"

namespace toy {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  TOY_CHECK(dims.size() <= size_t(kMaxDims), "[shape] at most {} dimensions, got {}", kMaxDims,
            dims.size());
  for (auto v : dims) d_[n_++] = v;
}

int64_t Shape::at(int i) const {
  int j = i < 0 ? i + n_ : i;
  TOY_CHECK(j >= 0 && j < n_, "[shape] dimension {} out of range for {}", i, str());
  return d_[j];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < n_; ++i) n *= d_[i];
  return n;
}

void Shape::push_back(int64_t v) {
  TOY_CHECK(n_ < kMaxDims, "[shape] at most {} dimensions", kMaxDims);
  d_[n_++] = v;
}

void Shape::insert(int pos, int64_t v) {
  TOY_CHECK(n_ < kMaxDims, "[shape] at most {} dimensions", kMaxDims);
  for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
  d_[pos] = v;
  ++n_;
}

void Shape::erase(int pos) {
  for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
  --n_;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < n_; ++i) {
    if (i) s += ", ";
    s += std::to_string(d_[i]);
  }
  return s + "]";
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.n_ != b.n_) return false;
  for (int i = 0; i < a.n_; ++i)
    if (a.d_[i] != b.d_[i]) return false;
  return true;
}

Strides contiguous_strides(const Shape& s) {
  Strides st = s;
  int64_t acc = 1;
  for (int i = s.ndim() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

int normalize_axis(int axis, int ndim, const char* op) {
  int a = axis < 0 ? axis + ndim : axis;
  TOY_CHECK(a >= 0 && a < ndim, "[{}] axis {} out of range for a {}-d tensor", op, axis, ndim);
  return a;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  int n = std::max(a.ndim(), b.ndim());
  Shape out;
  for (int i = 0; i < n; ++i) {
    int ia = a.ndim() - n + i, ib = b.ndim() - n + i;
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    TOY_CHECK(da == db || da == 1 || db == 1, "[{}] shapes do not broadcast: {} vs {}", op,
              a.str(), b.str());
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

}  // namespace toy
