// The sim device's kernels are the CPU's, each run inside a KernelScope(Device::SIM): only
// while one runs may sim memory be touched (core/device_access.h). `as_sim<Fn, &f>` is the
// wrapper the CPU backend registers beside each kernel, so the two stay one list.
#pragma once
#include <utility>

#include "toy/core/device_access.h"
#include "toy/core/registry.h"

namespace toy::sim {

template <class Fn, Fn* F>
struct AsSim;

template <class R, class... A, R (*F)(A...)>
struct AsSim<R(A...), F> {
  static R call(A... a) {
    KernelScope scope(Device::SIM);
    return F(std::forward<A>(a)...);
  }
};

// Registers kernel F for the CPU and, wrapped, for sim.
template <class Fn, Fn* F>
void add_cpu_and_sim(Registry& r, const char* name) {
  r.add<Fn>(name, Device::CPU, F);
  r.add<Fn>(name, Device::SIM, &AsSim<Fn, F>::call);
}

}  // namespace toy::sim
