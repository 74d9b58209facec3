#include "toy/core/device_access.h"

#include <atomic>

#include <fmt/core.h>

#include "toy/core/error.h"
#include "toy/core/registry.h"

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
  fail("{} --device must be cpu, sim, cuda or cuda:N, got '{}'", who, text);
}

namespace {
DeviceHooks g_hooks[kNumDevices];
}

void set_device_hooks(Device d, const DeviceHooks& h) { g_hooks[int(d)] = h; }
const DeviceHooks& device_hooks(Device d) { return g_hooks[int(d)]; }

std::string device_unavailable(Device d) {
  if (d != Device::CUDA) return "";
  (void)registry();  // (the backends install their hooks with the registry)
  const DeviceHooks& h = g_hooks[int(d)];
  if (!h.unavailable) return "toy was built without CUDA (configure it where nvcc is found, or with -DTOY_CUDA=ON)";
  return h.unavailable();
}

Device select_device(const std::string& text, const char* who) {
  const Device d = parse_device(text, who);
  if (d != Device::CUDA) return d;
  const std::string why = device_unavailable(d);
  TOY_CHECK(why.empty(), "{} --device {}: {}", who, text, why);
  int index = 0;
  if (text.size() > 5) {
    const std::string n = text.substr(5);
    TOY_CHECK(!n.empty() && n.size() < 4 && n.find_first_not_of("0123456789") == std::string::npos,
              "{} --device {}: the GPU's number must be a small whole number (cuda:0, cuda:1, ...)", who, text);
    index = std::stoi(n);
  }
  const DeviceHooks& h = g_hooks[int(d)];
  const int count = h.count ? h.count() : 0;
  TOY_CHECK(index < count, "{} --device {}: this machine has {} GPU{} (cuda:0{})", who, text, count,
            count == 1 ? "" : "s", count > 1 ? fmt::format(" .. cuda:{}", count - 1) : std::string());
  if (h.select) h.select(index);
  return d;
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
