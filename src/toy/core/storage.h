// Storage: a block of device memory shared by every tensor viewing it. Owned blocks come
// from the device's caching allocator; external blocks (an mmap'd GGUF file) carry their
// own release function.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "toy/core/device.h"

namespace toy {

class Storage {
 public:
  Storage(size_t bytes, Device device);
  Storage(void* external, size_t bytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t capacity_ = 0;
  Device device_ = Device::CPU;
  std::function<void()> release_;  // set for external memory
};

}  // namespace toy
