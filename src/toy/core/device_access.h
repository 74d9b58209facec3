// The checked line between host and device memory. Host code reads or writes a tensor's
// elements only through host accessors (Tensor::data, raw_data, item, to_*_vector), which
// refuse memory the host may not touch — a sim tensor outside a kernel — with an error naming
// the device and what tried. Kernels mark their run with KernelScope; transfers between
// devices count the bytes crossing the line, so a test can hold a training step to one read
// back and a generated token to one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "toy/core/device.h"

namespace toy {

// Marks a kernel's run on `d` (every thread may touch d's memory until it ends: the pool's
// workers run the kernel's parts).
class KernelScope {
 public:
  explicit KernelScope(Device d);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  bool counted_;
};

// What a device's backend tells the core (installed by backend/cuda; cpu and sim need none).
struct DeviceHooks {
  std::string (*unavailable)() = nullptr;  // why it cannot be used here ("" when it can)
  int (*count)() = nullptr;                // devices of this kind
  void (*select)(int index) = nullptr;     // the one this process uses (cuda:N)
  // `bytes` across the host/device line, in order with the device's queued work.
  void (*copy)(void* dst, Device to, const void* src, Device from, size_t bytes) = nullptr;
};
void set_device_hooks(Device d, const DeviceHooks& h);
const DeviceHooks& device_hooks(Device d);
// "" when d can be used here; else why not: no GPU (the driver's words), or toy was built
// without the backend.
std::string device_unavailable(Device d);
// Parses "cpu", "sim", "cuda", "cuda:N" and checks the device can be used (N in range):
// throws toy::Error "{who} --device cuda: no GPU (...)" otherwise, and selects GPU N.
Device select_device(const std::string& text, const char* who);

bool inside_kernel();
// Throws toy::Error when host code may not touch memory of device d now.
void check_host_access(Device d, const char* what);

// Transfers across the host/device line since the process started (or the last reset).
struct DeviceTraffic {
  int64_t reads = 0;   // device -> host copies (item(), to_*_vector(), to(t, cpu))
  int64_t writes = 0;  // host -> device copies
  int64_t read_bytes = 0, write_bytes = 0;
};
DeviceTraffic device_traffic();
void reset_device_traffic();
void count_transfer(Device from, Device to, int64_t bytes);

}  // namespace toy
