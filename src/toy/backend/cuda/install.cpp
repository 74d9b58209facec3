// The CUDA backend's glue (compiled by the C++ compiler, linked with cudart): whether a GPU is
// here, the caching allocator for device memory, copies across the host/device line, and the
// kernels it registers (their launchers are in the .cu files, cuda_launch.h). The probe runs
// on first use, not at start-up: a machine without a GPU pays nothing until it asks for one.
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include <fmt/core.h>

#include "toy/backend/cuda/cuda_glue.h"
#include "toy/core/allocator.h"
#include "toy/core/block_cache.h"
#include "toy/core/device_access.h"
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
    if (void* p = cache_.take(cls)) return poisoned(p, cls);
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
    return poisoned(p, cls);
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
  // Under TOY_CUDA_POISON=1 (the GPU tests set it) every block handed out is all ones: NaN in
  // every float type and -1 as an integer, so a kernel that leaves an output element unwritten
  // fails its parity test instead of passing on a lucky zero.
  static void* poisoned(void* p, size_t bytes) {
    static const bool poison = [] {
      const char* v = std::getenv("TOY_CUDA_POISON");
      return v && std::string(v) == "1";
    }();
    if (poison) check(cudaMemsetAsync(p, 0xFF, bytes, static_cast<cudaStream_t>(cuda::compute_stream())), "poisoning");
    return p;
  }
  mutable std::mutex mu_;
  BlockCache cache_;
};

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
  cuda::register_elementwise(r);
  cuda::register_unary(r);
  cuda::register_reduce(r);
  cuda::register_matmul(r);
  cuda::register_attention(r);
  cuda::register_train(r);
  cuda::register_misc(r);
  cuda::register_scan(r);
  return true;
}

}  // namespace toy
