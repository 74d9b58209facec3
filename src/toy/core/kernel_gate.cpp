#include "toy/core/kernel_gate.h"

namespace toy {

namespace detail {
std::atomic<KernelGate> g_kernel_gate{nullptr};
}

void set_kernel_gate(KernelGate gate) { detail::g_kernel_gate.store(gate, std::memory_order_relaxed); }

}  // namespace toy
