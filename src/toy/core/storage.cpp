#include "toy/core/storage.h"

#include "toy/core/allocator.h"
#include "toy/core/error.h"

namespace toy {

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = allocator(device).allocate(bytes, &capacity_);
}

Storage::Storage(void* external, size_t bytes, Device device, std::function<void()> release)
    : data_(external), bytes_(bytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (release_) {
    release_();
  } else if (data_) {
    allocator(device_).deallocate(data_, capacity_, other_streams_);
  }
}

void Storage::record_stream(StreamId s) {
  TOY_CHECK(s < kMaxStreams, "[storage] stream {} is not below {}", s, kMaxStreams);
  if (s != 0) other_streams_ |= uint64_t(1) << s;
}

}  // namespace toy
