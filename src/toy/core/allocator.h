// Caching allocator: freed blocks go back to a per-size free list and are handed out again,
// so a training step or a generated token allocates nothing from the system once warm.
// Sizes are rounded up to a size class (at most 1/8 waste) so that shapes that vary a little
// (the last batch, a growing KV view) still reuse blocks. 64-byte aligned.
//
// Streams: a device may run work on several queues (a compute stream, a communication
// stream). Blocks are allocated for stream 0, the compute stream; a block another stream
// has used (Storage::record_stream) is not handed out again until that stream's work up to
// the free is done: an event is recorded on each such stream when the block is freed, and
// the block waits in a pending list until every event is done. The CPU and sim run kernels
// synchronously (no event source: a block is free at once); a device with streams installs
// its StreamEvents.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "toy/core/device.h"

namespace toy {

struct AllocatorStats {
  int64_t system_allocs = 0;  // blocks obtained from the system (cache misses)
  int64_t cache_hits = 0;     // allocations served from the cache
  int64_t bytes_in_use = 0;
  int64_t bytes_cached = 0;   // free blocks kept for reuse
  int64_t peak_bytes_in_use = 0;
  int64_t blocks_awaiting_streams = 0;  // freed, waiting for other streams' events
};

// Streams 0..63; 0 is the compute stream every block is allocated for.
using StreamId = uint32_t;
inline constexpr StreamId kMaxStreams = 64;

// A point recorded in a stream's work: done once the work before it has run.
class StreamEvent {
 public:
  virtual ~StreamEvent() = default;
  virtual bool done() const = 0;
};
class StreamEvents {
 public:
  virtual ~StreamEvents() = default;
  virtual std::unique_ptr<StreamEvent> record(StreamId stream) = 0;
};
// Installs a device's event source (null: its kernels are synchronous).
void set_stream_events(Device d, StreamEvents* events);

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns at least `bytes` bytes; `*capacity` receives the block's real size.
  virtual void* allocate(size_t bytes, size_t* capacity) = 0;
  // `other_streams`: bit s set when stream s (other than 0) used the block.
  virtual void deallocate(void* p, size_t capacity, uint64_t other_streams = 0) = 0;
  virtual AllocatorStats stats() const = 0;
  // Returns every cached block to the system.
  virtual void empty_cache() = 0;
};

// The allocator for a device; CUDA's is installed by the CUDA backend.
Allocator& allocator(Device d);
void set_allocator(Device d, Allocator* a);

// Size class used by the caching allocators (exposed for tests).
size_t allocation_size_class(size_t bytes);

}  // namespace toy
