// The CUDA backend's glue (compiled by the C++ compiler, linked with cudart): whether a GPU is
// here, the caching allocator for device memory, copies across the host/device line, and the
// kernels it registers (their launchers are in the .cu files, cuda_launch.h). The probe runs
// on first use, not at start-up: a machine without a GPU pays nothing until it asks for one.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include <fmt/core.h>

#include "toy/backend/cuda/cuda_launch.h"
#include "toy/backend/kernels.h"
#include "toy/core/allocator.h"
#include "toy/core/block_cache.h"
#include "toy/core/device_access.h"
#include "toy/core/kernel_gate.h"
#include "toy/core/registry.h"

namespace toy {

namespace {

// ---- the probe -----------------------------------------------------------------------------------

struct Probe {
  int devices = 0;
  std::string why;  // "" when devices > 0
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    const cudaError_t e = cudaGetDeviceCount(&r.devices);
    if (e != cudaSuccess) {
      r.devices = 0;
      r.why = fmt::format("no GPU ({})", cudaGetErrorString(e));
      cudaGetLastError();  // (clear it: later calls must not report it again)
    } else if (r.devices == 0) {
      r.why = "no GPU (the driver sees none)";
    }
    return r;
  }();
  return p;
}

std::string unavailable() { return probe().why; }
int count() { return probe().devices; }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("[cuda] {}: {}", what, cudaGetErrorString(e));
}

void select(int index) { check(cudaSetDevice(index), fmt::format("selecting GPU {}", index).c_str()); }

void copy(void* dst, Device to, const void* src, Device from, size_t bytes) {
  const cudaMemcpyKind kind = from == Device::CUDA ? (to == Device::CUDA ? cudaMemcpyDeviceToDevice
                                                                          : cudaMemcpyDeviceToHost)
                                                   : cudaMemcpyHostToDevice;
  // (the legacy default stream: the copy waits for the kernels queued before it)
  check(cudaMemcpy(dst, src, bytes, kind), "copying across the host/device line");
}

// ---- the caching allocator ---------------------------------------------------------------------

// Freed blocks wait in per-size-class lists for the next allocation of their class: a warm
// training step or decoding loop calls neither cudaMalloc nor cudaFree. Every kernel runs on
// one stream, so a block freed on the host while queued kernels still use it is safe to hand
// out again: its next user is queued after them.
class CudaCachingAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, size_t* capacity) override {
    const size_t cls = allocation_size_class(bytes);
    *capacity = cls;
    std::lock_guard<std::mutex> lock(mu_);
    if (void* p = cache_.take(cls)) return p;
    const std::string why = unavailable();
    TOY_CHECK(why.empty(), "[cuda] cannot allocate {} bytes of GPU memory: {}", bytes, why);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, cls);
    if (e != cudaSuccess) {  // give the cache back and try once more
      cudaGetLastError();
      cache_.empty([](void* q) { cudaFree(q); });
      e = cudaMalloc(&p, cls);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail("[cuda] out of GPU memory allocating {} bytes ({} in use by toy's tensors): {}", cls,
           cache_.stats().bytes_in_use, cudaGetErrorString(e));
    }
    cache_.allocated(cls);
    return p;
  }
  void deallocate(void* p, size_t capacity, uint64_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.released(capacity);
    cache_.put(p, capacity);
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.stats();
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.empty([](void* p) { cudaFree(p); });
  }

 private:
  mutable std::mutex mu_;
  BlockCache cache_;
};

// ---- kernels ---------------------------------------------------------------------------------------

cuda::View view_of(const Tensor& t) {
  cuda::View v;
  switch (t.dtype()) {
    case DType::F32: v.elem = cuda::Elem::F32; break;
    case DType::F16: v.elem = cuda::Elem::F16; break;
    case DType::BF16: v.elem = cuda::Elem::BF16; break;
    case DType::I32: v.elem = cuda::Elem::I32; break;
    default: fail("[cuda] no kernel takes {} tensors yet (block types come with the quantized kernels)", name(t.dtype()));
  }
  v.data = static_cast<char*>(t.storage()->data()) + size_t(t.offset()) * element_size(t.dtype());
  TOY_CHECK(t.ndim() <= cuda::kMaxDims, "[cuda] tensors of {} dimensions (the kernels take {})", t.ndim(),
            cuda::kMaxDims);
  v.ndim = t.ndim();
  v.numel = t.numel();
  for (int d = 0; d < t.ndim(); ++d) v.shape[d] = t.size(d), v.stride[d] = t.stride(d);
  v.contiguous = t.is_contiguous();
  return v;
}

void launched(const char* kernel) {
  const char* e = cuda::last_launch_error();
  TOY_CHECK(*e == '\0', "[cuda] the {} kernel failed to launch: {}", kernel, e);
}

void fill(Tensor& dst, double value) {
  pass_kernel_gate(dst);
  cuda::launch_fill(view_of(dst), value);
  launched("fill");
}

void copy_kernel(const Tensor& src, Tensor& dst) {
  pass_kernel_gate(src, dst);
  cuda::launch_copy(view_of(src), view_of(dst));
  launched("copy");
}

void binary(kern::BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  pass_kernel_gate(a, b, out);
  cuda::launch_binary(int(op), view_of(a), view_of(b), view_of(out));
  launched("binary");
}

}  // namespace

bool install_cuda_backend(Registry& r) {
  static CudaCachingAllocator* alloc = new CudaCachingAllocator();  // lives forever (tensors freed at exit)
  set_allocator(Device::CUDA, alloc);
  DeviceHooks h;
  h.unavailable = &unavailable;
  h.count = &count;
  h.select = &select;
  h.copy = &copy;
  set_device_hooks(Device::CUDA, h);
  r.add<kern::Fill>("fill", Device::CUDA, &fill);
  r.add<kern::Copy>("copy", Device::CUDA, &copy_kernel);
  r.add<kern::Binary>("binary", Device::CUDA, &binary);
  return true;
}

}  // namespace toy
