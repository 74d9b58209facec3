// The sim device's kernels are the CPU's, each run inside a KernelScope(Device::SIM): only
// while one runs may sim memory be touched (core/device_access.h). `AsSim<Fn, &f>` is the
// wrapper the CPU backend registers beside each kernel, so the two stay one list. Both pass
// the kernel gate first (core/kernel_gate.h: data-parallel messages in flight).
#pragma once
#include <utility>

#include "toy/core/device_access.h"
#include "toy/core/kernel_gate.h"
#include "toy/core/registry.h"

namespace toy::sim {

template <class Fn, Fn* F>
struct AsSim;

template <class R, class... A, R (*F)(A...)>
struct AsSim<R(A...), F> {
  static R call(A... a) {
    pass_kernel_gate(a...);
    KernelScope scope(Device::SIM);
    return F(std::forward<A>(a)...);
  }
};

template <class Fn, Fn* F>
struct AsGatedCpu;

template <class R, class... A, R (*F)(A...)>
struct AsGatedCpu<R(A...), F> {
  static R call(A... a) {
    pass_kernel_gate(a...);
    return F(std::forward<A>(a)...);
  }
};

// Registers kernel F for the CPU and for sim, each behind the kernel gate.
template <class Fn, Fn* F>
void add_cpu_and_sim(Registry& r, const char* name) {
  r.add<Fn>(name, Device::CPU, &AsGatedCpu<Fn, F>::call);
  r.add<Fn>(name, Device::SIM, &AsSim<Fn, F>::call);
}

}  // namespace toy::sim
