// The devices a tensor's memory may live on.
//   cpu   host memory; the CPU kernels (backend/cpu)
//   cuda  an NVIDIA GPU (backend/cuda, when built with CUDA)
//   sim   a simulated device compiled into every build: host memory that host code may not
//         touch — only kernels (the CPU kernels, run as sim's) and counted transfers may
//         (device_access.h). A run on sim proves that code above the backends keeps to the
//         host/device line; it is slower than cpu and gives bit-identical results.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace toy {

enum class Device : uint8_t { CPU, CUDA, SIM };
inline constexpr int kNumDevices = 3;

inline std::string_view name(Device d) { return d == Device::CPU ? "cpu" : d == Device::CUDA ? "cuda" : "sim"; }
// Whether host code may read and write the device's memory directly.
inline bool is_host(Device d) { return d == Device::CPU; }
// "cpu", "sim", "cuda" (or "cuda:0"); throws toy::Error naming the text otherwise.
Device parse_device(const std::string& text, const char* who);

}  // namespace toy
