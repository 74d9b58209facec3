// Shape: a small fixed-capacity list of dimensions (no heap), used for both sizes and
// element strides. Row-major like PyTorch: the last dimension is the innermost.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace toy {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims) : Shape(std::span<const int64_t>(dims)) {}

  int ndim() const { return n_; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  // Python-style index: -1 is the last dimension. Throws for out of range.
  int64_t at(int i) const;
  int64_t numel() const;
  void push_back(int64_t v);
  void pop_back() { --n_; }
  void insert(int pos, int64_t v);
  void erase(int pos);
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + n_; }
  int64_t* begin() { return d_.data(); }
  int64_t* end() { return d_.data() + n_; }
  bool empty() const { return n_ == 0; }
  int64_t back() const { return d_[n_ - 1]; }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  std::string str() const;  // "[2, 3, 4]"

  friend bool operator==(const Shape& a, const Shape& b);
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::array<int64_t, kMaxDims> d_{};
  int n_ = 0;
};

using Strides = Shape;

// Row-major contiguous strides for a shape.
Strides contiguous_strides(const Shape& s);
// Normalizes a possibly negative axis for ndim dims; throws naming op on out of range.
int normalize_axis(int axis, int ndim, const char* op);
// NumPy broadcasting of two shapes; throws naming op when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace toy

#include <fmt/core.h>
template <>
struct fmt::formatter<toy::Shape> : fmt::formatter<std::string> {
  auto format(const toy::Shape& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.str(), ctx);
  }
};
