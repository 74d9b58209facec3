// FNV-1a (64-bit): a fast, stable hash for cache keys and change detection (not security).
#pragma once
#include <cstdint>
#include <string_view>

namespace toy {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;

inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnvOffset) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace toy
