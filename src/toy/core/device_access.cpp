#include "toy/core/device_access.h"

#include <atomic>

#include "toy/core/error.h"

namespace toy {

namespace {
// Kernels in flight on a device whose memory the host may not touch. A count, not a
// per-thread flag: a kernel's parts run on the pool's workers.
std::atomic<int64_t> g_kernels{0};
std::atomic<int64_t> g_reads{0}, g_writes{0}, g_read_bytes{0}, g_write_bytes{0};
}  // namespace

Device parse_device(const std::string& text, const char* who) {
  if (text == "cpu") return Device::CPU;
  if (text == "sim") return Device::SIM;
  if (text == "cuda" || text.rfind("cuda:", 0) == 0) return Device::CUDA;
  fail("{} --device must be cpu or sim (or cuda when toy is built with CUDA), got '{}'", who, text);
}

KernelScope::KernelScope(Device d) : counted_(!is_host(d)) {
  if (counted_) g_kernels.fetch_add(1, std::memory_order_relaxed);
}

KernelScope::~KernelScope() {
  if (counted_) g_kernels.fetch_sub(1, std::memory_order_relaxed);
}

bool inside_kernel() { return g_kernels.load(std::memory_order_relaxed) > 0; }

void check_host_access(Device d, const char* what) {
  if (is_host(d) || inside_kernel()) return;
  fail("[device] host code touched the memory of a {} tensor ({}): only kernels and transfers (to(t, cpu)) may; "
       "this is a host/device line violation", name(d), what);
}

DeviceTraffic device_traffic() {
  return {g_reads.load(), g_writes.load(), g_read_bytes.load(), g_write_bytes.load()};
}

void reset_device_traffic() { g_reads = 0, g_writes = 0, g_read_bytes = 0, g_write_bytes = 0; }

void count_transfer(Device from, Device to, int64_t bytes) {
  if (!is_host(from) && is_host(to)) g_reads.fetch_add(1), g_read_bytes.fetch_add(bytes);
  if (is_host(from) && !is_host(to)) g_writes.fetch_add(1), g_write_bytes.fetch_add(bytes);
}

}  // namespace toy
