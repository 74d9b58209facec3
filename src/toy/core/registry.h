// The op registry: the op table (name, primitive or composite, has a backward rule, the test
// that checks its gradient) and the kernels backends register, keyed by (kernel name, device).
// Ops dispatch through KernelRef, which resolves a kernel once per device and caches it.
// The registry fills itself on first use from toy/install.cpp, which lists the op tables
// and the backends (core does not include either).
#pragma once
#include <array>
#include <atomic>
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
};

class Registry {
 public:
  void define_op(OpInfo info);
  const std::vector<OpInfo>& ops() const { return ops_; }
  const OpInfo* find_op(std::string_view name) const;

  void register_kernel(std::string_view kernel, Device d, void* fn, const std::type_info& sig);
  bool has_kernel(std::string_view kernel, Device d) const;
  void* kernel(std::string_view kernel, Device d, const std::type_info& sig) const;
  // Whether `op` runs on d: the device's backend is installed and has every kernel it uses.
  bool supports(const OpInfo& op, Device d) const;
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
  };
  std::vector<OpInfo> ops_;
  std::array<bool, kNumDevices> backends_{};
  std::map<std::string, std::array<Entry, kNumDevices>, std::less<>> kernels_;
};

Registry& registry();

// Defined in toy/install.cpp: fills the registry (op tables, CPU backend, CUDA if built).
void install_all(Registry& r);

// A typed, cached handle to a kernel: `static KernelRef<RmsNormFwd> k("rms_norm"); k(dev)(...)`.
template <class Fn>
class KernelRef {
 public:
  explicit constexpr KernelRef(const char* name) : name_(name) {}
  Fn* operator()(Device d) const {
    Fn* f = cache_[int(d)].load(std::memory_order_relaxed);
    if (!f) {
      f = reinterpret_cast<Fn*>(registry().kernel(name_, d, typeid(Fn)));
      cache_[int(d)].store(f, std::memory_order_relaxed);
    }
    return f;
  }

 private:
  const char* name_;
  mutable std::array<std::atomic<Fn*>, kNumDevices> cache_{};
};

}  // namespace toy
