// Storage: a block of device memory shared by every tensor viewing it. Owned blocks come
// from the device's caching allocator; external blocks (an mmap'd GGUF file) carry their
// own release function.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "toy/core/allocator.h"
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
  // Marks the block as used by stream s (its memory is not reused until s is done with it;
  // allocator.h). Stream 0, the compute stream it was allocated for, need not be marked.
  void record_stream(StreamId s);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t capacity_ = 0;
  Device device_ = Device::CPU;
  uint64_t other_streams_ = 0;     // bit s: stream s used the block
  std::function<void()> release_;  // set for external memory
};

}  // namespace toy
