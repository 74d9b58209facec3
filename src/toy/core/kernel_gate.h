// A hook run before every kernel with the tensors the kernel is passed. The data-parallel
// trainer installs one while its messages are in flight: it moves them along between kernels
// (MPI moves data only while the process calls into it), and it holds back a kernel that
// would read a parameter whose new value has not arrived yet, so that sharing the updated
// parameters overlaps the next forward pass. Nothing is installed otherwise (one relaxed load
// per kernel).
#pragma once
#include <atomic>
#include <cstddef>
#include <type_traits>

namespace toy {

class Tensor;

// `tensors[i]` is the kernel's i-th argument when it is a tensor, else nullptr.
using KernelGate = void (*)(const Tensor* const* tensors, size_t n);

namespace detail {
extern std::atomic<KernelGate> g_kernel_gate;
}

inline KernelGate kernel_gate() { return detail::g_kernel_gate.load(std::memory_order_relaxed); }
// Installs `gate` (nullptr removes it). One at a time: the data-parallel trainer's.
void set_kernel_gate(KernelGate gate);

// Runs the installed gate, if any, over a kernel's arguments.
template <class... A>
inline void pass_kernel_gate(const A&... a) {
  if (KernelGate g = kernel_gate()) {
    const Tensor* tensors[] = {[](const auto& x) -> const Tensor* {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(x)>, Tensor>)
        return &x;
      else
        return nullptr;
    }(a)..., nullptr};
    g(tensors, sizeof...(A));
  }
}

}  // namespace toy
