#pragma once
#include <cstdint>
#include <string_view>

namespace toy {

enum class Device : uint8_t { CPU, CUDA };
inline constexpr int kNumDevices = 2;

inline std::string_view name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

}  // namespace toy
