// The op registry: the op table (name, primitive or composite, has a backward rule, the test
// that checks its gradient) and the kernels backends register, keyed by (kernel name, device).
// Ops dispatch through KernelRef, which resolves a kernel once per device and caches it.
// A fused op (attention, the norms, softmax, swiglu) is a primitive with a composite form:
// on a device whose backend lacks its kernels it runs the composite there (MLX's
// fast::Custom fallback); any other primitive without a kernel is a clear error naming the
// kernel and the device.
// The registry fills itself on first use from toy/install.cpp, which lists the op tables
// and the backends (core does not include either).
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "toy/core/device.h"
#include "toy/core/error.h"

namespace toy {

struct OpInfo {
  std::string name;
  bool primitive = true;            // has kernels of its own (views: none needed)
  bool backward = true;             // has a backward rule
  std::string grad_test;            // ctest name of the test that checks its gradient
  std::vector<std::string> uses;    // kernels it runs (its own, or for composites those of its parts)
  std::string summary;
  // A fused op: the kernels its composite form runs where its own are missing (empty: none).
  std::vector<std::string> fallback_uses;
};

// Bumped whenever kernels are withheld or given back: KernelRef's caches follow it.
extern std::atomic<uint64_t> g_kernel_generation;

class Registry {
 public:
  void define_op(OpInfo info);
  const std::vector<OpInfo>& ops() const { return ops_; }
  const OpInfo* find_op(std::string_view name) const;

  void register_kernel(std::string_view kernel, Device d, void* fn, const std::type_info& sig);
  bool has_kernel(std::string_view kernel, Device d) const;
  // The kernel, or a toy::Error naming it and the device when d has none.
  void* kernel(std::string_view kernel, Device d, const std::type_info& sig) const;
  // The kernel, or null when d has none.
  void* find_kernel(std::string_view kernel, Device d, const std::type_info& sig) const;
  // Whether `op` runs on d: the device's backend is installed and has every kernel it uses,
  // or (a fused op) every kernel of its composite form.
  bool supports(const OpInfo& op, Device d) const;
  // Whether it runs there with kernels of its own (not through a composite form).
  bool has_own_kernels(const OpInfo& op, Device d) const;
  // For tests: makes a kernel missing on d (or present again), as on a device whose backend
  // lacks it.
  void withhold(std::string_view kernel, Device d, bool withheld);
  void mark_backend(Device d) { backends_[int(d)] = true; }
  bool has_backend(Device d) const { return backends_[int(d)]; }

  template <class Fn>
  void add(std::string_view kernel, Device d, Fn* fn) {
    register_kernel(kernel, d, reinterpret_cast<void*>(fn), typeid(Fn));
  }

 private:
  struct Entry {
    void* fn = nullptr;
    const std::type_info* sig = nullptr;
    bool withheld = false;
  };
  std::vector<OpInfo> ops_;
  std::array<bool, kNumDevices> backends_{};
  std::map<std::string, std::array<Entry, kNumDevices>, std::less<>> kernels_;
};

Registry& registry();

// Defined in toy/install.cpp: fills the registry (op tables, CPU backend, CUDA if built).
void install_all(Registry& r);

// For tests: while alive, the kernels are missing on d (a fused op runs its composite form).
class WithheldKernels {
 public:
  WithheldKernels(std::vector<std::string> kernels, Device d);
  ~WithheldKernels();
  WithheldKernels(const WithheldKernels&) = delete;
  WithheldKernels& operator=(const WithheldKernels&) = delete;

 private:
  std::vector<std::string> kernels_;
  Device d_;
};

// A typed, cached handle to a kernel: `static KernelRef<RmsNormFwd> k("rms_norm"); k(dev)(...)`.
template <class Fn>
class KernelRef {
 public:
  explicit constexpr KernelRef(const char* name) : name_(name) {}
  // The kernel for d; a toy::Error naming the kernel and the device when d has none.
  Fn* operator()(Device d) const {
    Fn* f = find(d);
    if (!f) f = reinterpret_cast<Fn*>(registry().kernel(name_, d, typeid(Fn)));  // throws
    return f;
  }
  // Whether d has it (a fused op asks, and runs its composite form where not).
  bool available(Device d) const { return find(d) != nullptr; }

 private:
  Fn* find(Device d) const {
    const uint64_t now = g_kernel_generation.load(std::memory_order_relaxed);
    if (generation_[int(d)].load(std::memory_order_relaxed) != now) {
      cache_[int(d)].store(reinterpret_cast<Fn*>(registry().find_kernel(name_, d, typeid(Fn))),
                           std::memory_order_relaxed);
      generation_[int(d)].store(now, std::memory_order_relaxed);
    }
    return cache_[int(d)].load(std::memory_order_relaxed);
  }
  const char* name_;
  mutable std::array<std::atomic<Fn*>, kNumDevices> cache_{};
  mutable std::array<std::atomic<uint64_t>, kNumDevices> generation_{};
};

}  // namespace toy
