#include "toy/core/tensor.h"

#include <cstring>

#include "toy/backend/kernels.h"
#include "toy/core/device_access.h"
#include "toy/core/registry.h"
#include "toy/core/quant.h"
#include "toy/core/small_object_pool.h"
#include "toy/core/strided.h"

namespace toy {

namespace {
size_t byte_offset(DType t, int64_t elems) {
  return is_block(t) ? row_bytes(t, elems) : size_t(elems) * element_size(t);
}

template <class T>
float load_f32(const void* base, int64_t i) {
  if constexpr (std::is_same_v<T, int32_t>)
    return float(static_cast<const int32_t*>(base)[i]);
  else
    return to_f32(static_cast<const T*>(base)[i]);
}

template <class T>
void gather_f32(const Tensor& t, float* out) {
  const void* base = t.raw_data();
  int64_t j = 0;
  for_each_strided_run<1>(t.shape(), {&t.strides()}, [&](auto off, int64_t n, auto inner) {
    for (int64_t i = 0; i < n; ++i) out[j++] = load_f32<T>(base, off[0] + i * inner[0]);
  });
}
}  // namespace

size_t Tensor::nbytes() const { return byte_offset(dtype(), numel()); }

bool Tensor::is_contiguous() const {
  int64_t expect = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expect) return false;
    expect *= shape()[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  TOY_CHECK(defined(), "[tensor] use of an undefined tensor");
  if (!is_host(impl_->device)) check_host_access(impl_->device, "a host pointer to its elements");
  return static_cast<char*>(impl_->storage->data()) + byte_offset(dtype(), offset());
}

Tensor& Tensor::requires_grad_(bool on) {
  TOY_CHECK(!on || is_float(dtype()), "[requires_grad] only float tensors can require grad, got {}",
            toy::name(dtype()));
  TOY_CHECK(is_leaf(), "[requires_grad] only leaf tensors can be marked; use detach() first");
  impl_->requires_grad = on;
  return *this;
}

Tensor Tensor::detach() const {
  auto impl = new_tensor_impl();
  impl->shape = shape();
  impl->strides = strides();
  impl->offset = offset();
  impl->dtype = dtype();
  impl->device = device();
  impl->storage = storage();
  impl->name = name();
  return Tensor(std::move(impl));
}

double Tensor::item() const {
  TOY_CHECK(numel() == 1, "[item] needs a one-element tensor, got shape {}", shape().str());
  if (!is_host(device())) return transfer(*this, Device::CPU).item();  // one counted read
  switch (dtype()) {
    case DType::F32: return *data<float>();
    case DType::F16: return to_f32(*data<f16>());
    case DType::BF16: return to_f32(*data<bf16>());
    case DType::I32: return *data<int32_t>();
    default: fail("[item] not defined for {}", toy::name(dtype()));
  }
}

std::vector<float> Tensor::to_f32_vector() const {
  if (!is_host(device())) return transfer(*this, Device::CPU).to_f32_vector();  // one counted read
  std::vector<float> out(static_cast<size_t>(numel()));
  switch (dtype()) {
    case DType::F32: gather_f32<float>(*this, out.data()); break;
    case DType::F16: gather_f32<f16>(*this, out.data()); break;
    case DType::BF16: gather_f32<bf16>(*this, out.data()); break;
    case DType::I32: gather_f32<int32_t>(*this, out.data()); break;
    default: {
      TOY_CHECK(is_contiguous(), "[to_f32_vector] block tensors must be contiguous");
      dequantize_row(dtype(), raw_data(), out.data(), numel());
    }
  }
  return out;
}

std::vector<int32_t> Tensor::to_i32_vector() const {
  TOY_CHECK(dtype() == DType::I32, "[to_i32_vector] needs i32, got {}", toy::name(dtype()));
  if (!is_host(device())) return transfer(*this, Device::CPU).to_i32_vector();  // one counted read
  std::vector<int32_t> out(static_cast<size_t>(numel()));
  const int32_t* base = data<int32_t>();
  int64_t j = 0;
  for_each_strided_run<1>(shape(), {&strides()}, [&](auto off, int64_t n, auto inner) {
    for (int64_t i = 0; i < n; ++i) out[size_t(j++)] = base[off[0] + i * inner[0]];
  });
  return out;
}

std::shared_ptr<TensorImpl> new_tensor_impl() { return std::allocate_shared<TensorImpl>(PoolAllocator<TensorImpl>()); }

std::shared_ptr<Storage> new_storage(size_t bytes, Device device) {
  return std::allocate_shared<Storage>(PoolAllocator<Storage>(), bytes, device);
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape) TOY_CHECK(d >= 0, "[empty] negative dimension in shape {}", shape.str());
  auto impl = new_tensor_impl();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  if (is_block(dtype))
    TOY_CHECK(shape.ndim() >= 1 && shape.back() % dtype_info(dtype).block_size == 0,
              "[empty] {} rows need a multiple of {} elements, shape {}", name(dtype),
              dtype_info(dtype).block_size, shape.str());
  impl->storage = new_storage(byte_offset(dtype, shape.numel()), device);
  return Tensor(std::move(impl));
}

namespace {
// Factories fill on the tensor's device, through its kernels (a device without them says so).
const KernelRef<kern::Fill> k_fill("fill");
const KernelRef<kern::Arange> k_arange("arange");
}  // namespace

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (is_block(dtype)) {  // (a fill writes elements; zero blocks are zero bytes)
    KernelScope k(device);
    std::memset(t.raw_data(), 0, t.nbytes());
  } else if (t.numel() > 0) {
    k_fill(device)(t, 0.0);
  }
  return t;
}

Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  TOY_CHECK(!is_block(dtype), "[full] cannot fill a {} tensor", name(dtype));
  Tensor t = empty(shape, dtype, device);
  if (t.numel() > 0) k_fill(device)(t, value);
  return t;
}

Tensor transfer(const Tensor& t, Device to) {
  TOY_CHECK(t.defined(), "[to] undefined tensor");
  if (t.device() == to) return t;
  TOY_CHECK(t.is_contiguous(), "[to] a {} tensor crosses the host/device line contiguous (copy it on its device "
            "first), got strides of shape {}", name(t.device()), t.shape().str());
  const bool gpu = t.device() == Device::CUDA || to == Device::CUDA;
  const DeviceHooks& cuda = device_hooks(Device::CUDA);
  if (gpu) {
    const std::string why = device_unavailable(Device::CUDA);
    TOY_CHECK(why.empty() && cuda.copy, "[to] a copy {} {}: {}", t.device() == Device::CUDA ? "from" : "to", "cuda",
              why.empty() ? "the CUDA backend has no copy" : why);
  }
  Tensor out = empty(t.shape(), t.dtype(), to);
  count_transfer(t.device(), to, int64_t(t.nbytes()));
  if (gpu) {
    // (cpu and sim are host memory: the backend copies between it and the GPU; the storage
    // pointers are taken without the host accessors, which refuse device memory)
    if (t.nbytes()) {
      KernelScope from(t.device()), into(to);
      cuda.copy(static_cast<char*>(out.storage()->data()) + byte_offset(out.dtype(), out.offset()), to,
                static_cast<const char*>(t.storage()->data()) + byte_offset(t.dtype(), t.offset()), t.device(),
                t.nbytes());
    }
  } else {
    KernelScope from(t.device()), into(to);  // (cpu and sim share host memory: a copy is a memcpy)
    if (t.nbytes()) std::memcpy(out.raw_data(), t.raw_data(), t.nbytes());
  }
  out.set_name(t.name());
  out.impl()->ids_checked_below = t.impl()->ids_checked_below;
  out.impl()->ids_checked_ignore = t.impl()->ids_checked_ignore;
  out.impl()->ids_checked_ignore_set = t.impl()->ids_checked_ignore_set;
  return out;
}

void move_to_device_(Tensor& t, Device to) {
  TOY_CHECK(t.is_leaf(), "[to] only a leaf tensor (a parameter, a buffer) moves in place");
  if (t.device() == to) return;
  TOY_CHECK(t.is_contiguous(), "[to] '{}' is a strided view; only whole tensors move in place", t.name());
  Tensor moved = transfer(t, to);
  TensorImpl* impl = t.impl();
  impl->storage = moved.storage();
  impl->strides = moved.strides();
  impl->offset = 0;
  impl->device = to;
}

void alias_storage_(Tensor& t, const Tensor& buffer, int64_t offset) {
  TOY_CHECK(t.is_leaf(), "[alias] only a leaf tensor (a parameter) is re-pointed in place");
  TOY_CHECK(t.dtype() == buffer.dtype(), "[alias] '{}' is {}, the buffer {}", t.name(), name(t.dtype()),
            name(buffer.dtype()));
  TOY_CHECK(buffer.is_contiguous() && offset >= 0 && offset + t.numel() <= buffer.numel(),
            "[alias] '{}' ({} elements from {}) does not fit a buffer of {}", t.name(), t.numel(), offset,
            buffer.numel());
  TensorImpl* impl = t.impl();
  impl->storage = buffer.storage();
  impl->strides = contiguous_strides(t.shape());
  impl->offset = buffer.offset() + offset;
  impl->device = buffer.device();
}

Tensor scalar(double value, DType dtype) { return full(Shape{}, value, dtype); }

Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype) {
  TOY_CHECK(int64_t(values.size()) == shape.numel(), "[from_vector] {} values for shape {} ({} elements)",
            values.size(), shape.str(), shape.numel());
  TOY_CHECK(is_float(dtype), "[from_vector] float values need a float dtype, got {}", name(dtype));
  Tensor t = empty(shape, dtype);
  if (dtype == DType::F32) {
    if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * 4);
  } else if (dtype == DType::F16) {
    auto* d = t.data<f16>();
    for (size_t i = 0; i < values.size(); ++i) d[i] = from_f32<f16>(values[i]);
  } else {
    auto* d = t.data<bf16>();
    for (size_t i = 0; i < values.size(); ++i) d[i] = from_f32<bf16>(values[i]);
  }
  return t;
}

Tensor from_vector(const std::vector<int32_t>& values, const Shape& shape) {
  TOY_CHECK(int64_t(values.size()) == shape.numel(), "[from_vector] {} values for shape {} ({} elements)",
            values.size(), shape.str(), shape.numel());
  Tensor t = empty(shape, DType::I32);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * 4);
  return t;
}

Tensor arange(int64_t n, DType dtype, Device device) {
  TOY_CHECK(n >= 0, "[arange] n must be >= 0, got {}", n);
  TOY_CHECK(dtype == DType::I32 || is_float(dtype), "[arange] not defined for {}", name(dtype));
  Tensor t = empty(Shape{n}, dtype, device);
  if (n > 0) k_arange(device)(t);
  return t;
}

Tensor make_view(const Tensor& src, const Shape& shape, const Strides& strides, int64_t offset) {
  auto impl = new_tensor_impl();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = src.dtype();
  impl->device = src.device();
  impl->storage = src.storage();
  // A view's elements are some of src's: an id check made on src holds for it.
  impl->ids_checked_below = src.impl()->ids_checked_below;
  impl->ids_checked_ignore = src.impl()->ids_checked_ignore;
  impl->ids_checked_ignore_set = src.impl()->ids_checked_ignore_set;
  return Tensor(std::move(impl));
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return std::string(name(t.dtype())) + t.shape().str();
}

}  // namespace toy
