// Tensor: a shared handle to a TensorImpl — shape, element strides and offset into a Storage
// (views share storage without copying), dtype, device, and the autograd fields.
// Copying a Tensor copies the handle, as in PyTorch. Ops are free functions in toy/ops.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "toy/core/device.h"
#include "toy/core/dtype.h"
#include "toy/core/error.h"
#include "toy/core/shape.h"
#include "toy/core/storage.h"

namespace toy {

struct Node;  // autograd graph node (toy/autograd)

struct TensorImpl {
  Shape shape;
  Strides strides;     // in elements
  int64_t offset = 0;  // in elements from the start of storage
  DType dtype = DType::F32;
  Device device = Device::CPU;
  std::shared_ptr<Storage> storage;

  bool requires_grad = false;
  bool retains_grad = false;       // non-leaf keeps .grad after backward
  std::shared_ptr<Node> grad_fn;   // set on outputs of recorded ops
  std::shared_ptr<TensorImpl> grad;
  // Where backward() accumulates this leaf's gradient when it has one: a view of a parameter
  // arena's gradient buffer (ParamStore::pack), written in place; .grad then is that view.
  std::shared_ptr<TensorImpl> grad_home;
  std::string name;                // parameters carry their GGUF name
  // Ids checked on the host before an upload: every element is in [0, ids_checked_below) or
  // equals ids_checked_ignore (when ids_checked_ignore_set). transfer() carries it, so an op
  // on the device need not read the ids back to check them again (0: not checked).
  int64_t ids_checked_below = 0;
  int32_t ids_checked_ignore = 0;
  bool ids_checked_ignore_set = false;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  int ndim() const { return impl_->shape.ndim(); }
  int64_t size(int axis) const { return impl_->shape.at(axis); }
  int64_t stride(int axis) const { return impl_->strides.at(axis); }
  int64_t numel() const { return impl_->shape.numel(); }
  int64_t offset() const { return impl_->offset; }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->device; }
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  size_t nbytes() const;  // bytes of the elements this tensor covers, if contiguous

  bool is_contiguous() const;
  // Pointer to the first element (offset applied).
  void* raw_data() const;
  // Typed pointer to the first element; throws if T does not match the dtype.
  template <class T>
  T* data() const {
    TOY_CHECK(dtype_of<T>() == dtype(), "[tensor] data<{}>() on a {} tensor", toy::name(dtype_of<T>()),
              toy::name(dtype()));
    return static_cast<T*>(raw_data());
  }

  // --- autograd ---
  bool requires_grad() const { return impl_->requires_grad; }
  // Marks a leaf as a parameter whose gradient backward() accumulates in grad().
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  void zero_grad() { impl_->grad.reset(); }
  Tensor grad_home() const { return Tensor(impl_->grad_home); }
  void set_grad_home(const Tensor& h) { impl_->grad_home = h.impl_; }
  void retain_grad() { impl_->retains_grad = true; }
  // Reverse-mode pass from this scalar (or with an explicit output gradient).
  void backward(const Tensor& grad_output = Tensor()) const;  // toy/autograd/backward.cpp
  // Same storage, no history, no grad.
  Tensor detach() const;

  const std::string& name() const { return impl_->name; }
  Tensor& set_name(std::string n) {
    impl_->name = std::move(n);
    return *this;
  }

  // --- host access ---
  // Each of these on a tensor of a device whose memory the host may not touch (sim, cuda)
  // is a counted transfer (device_access.h); raw_data() and data() there throw outside a
  // kernel.
  // The single value of a one-element tensor, converted to double.
  double item() const;
  // All elements in row-major order, converted to f32 (float dtypes, I32, block types).
  std::vector<float> to_f32_vector() const;
  std::vector<int32_t> to_i32_vector() const;

  // Same handle?
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// A fresh handle record and storage record from the small-object pool (no operator new once
// warm): every tensor the library makes goes through these.
std::shared_ptr<TensorImpl> new_tensor_impl();
std::shared_ptr<Storage> new_storage(size_t bytes, Device device);

// --- factories (CPU unless a device is given) ---
Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = Device::CPU);
Tensor scalar(double value, DType dtype = DType::F32);  // 0-d tensor
Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::F32);
Tensor from_vector(const std::vector<int32_t>& values, const Shape& shape);
Tensor arange(int64_t n, DType dtype = DType::F32, Device device = Device::CPU);
// A view of `src` with new geometry over the same storage (no checks beyond bounds).
Tensor make_view(const Tensor& src, const Shape& shape, const Strides& strides, int64_t offset);
// A fresh contiguous tensor with the same shape/dtype/device as t.
Tensor empty_like(const Tensor& t);
// A contiguous copy of a contiguous t on device `to` (t itself when it is there already): the
// one way across the host/device line, counted (device_access.h). The autograd op is to()
// in ops.h.
Tensor transfer(const Tensor& t, Device to);
// Moves a leaf's memory to `to` in place: every handle sharing it (modules, the parameter
// store) sees the move. Model weights are made on the CPU and moved once.
void move_to_device_(Tensor& t, Device to);
// Points leaf t, in place, at `buffer`'s storage from element `offset` (t's shape, row-major;
// same dtype): every handle sharing t sees it. The parameter arena makes its views this way.
void alias_storage_(Tensor& t, const Tensor& buffer, int64_t offset);

std::string describe(const Tensor& t);  // "f32[2, 3]"

}  // namespace toy
