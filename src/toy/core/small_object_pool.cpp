#include "toy/core/small_object_pool.h"

#include <array>
#include <mutex>

#if defined(__has_include)
#if __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>
#endif
#endif

namespace toy::detail {

namespace {

constexpr size_t kGranule = 16;  // size classes of 16 bytes: every block stays 16-byte aligned
constexpr size_t kClasses = kMaxPooledBytes / kGranule;

struct FreeBlock {
  FreeBlock* next;
};

// One lock for all classes: a handful of objects per op, never contended in practice (ops
// create tensors on the calling thread), and freeing from any thread stays correct.
struct Pool {
  std::mutex mu;
  std::array<FreeBlock*, kClasses> free{};
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: tensors may be freed during static destruction
  return *p;
}

size_t class_of(size_t bytes) { return (bytes + kGranule - 1) / kGranule - 1; }

// Under AddressSanitizer a block on a free list is poisoned past its link, so a use after
// free of a pooled object is still reported, while the leak checker (which ignores pointers
// in poisoned memory) still sees the list. Both are no-ops in other builds.
#if defined(__SANITIZE_ADDRESS__)
#define TOY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TOY_ASAN 1
#endif
#endif
#ifdef TOY_ASAN
void poison(void* p, size_t n) { __asan_poison_memory_region(p, n); }
void unpoison(void* p, size_t n) { __asan_unpoison_memory_region(p, n); }
#else
void poison(void*, size_t) {}
void unpoison(void*, size_t) {}
#endif

}  // namespace

void* pool_allocate(size_t bytes) {
  if (bytes == 0 || bytes > kMaxPooledBytes) return ::operator new(bytes);
  const size_t c = class_of(bytes);
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (FreeBlock* b = p.free[c]) {
      unpoison(b + 1, (c + 1) * kGranule - sizeof(FreeBlock));
      p.free[c] = b->next;
      return b;
    }
  }
  return ::operator new((c + 1) * kGranule);
}

void pool_deallocate(void* ptr, size_t bytes) noexcept {
  if (!ptr) return;
  if (bytes == 0 || bytes > kMaxPooledBytes) {
    ::operator delete(ptr);
    return;
  }
  const size_t c = class_of(bytes);
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  auto* b = static_cast<FreeBlock*>(ptr);
  b->next = p.free[c];
  p.free[c] = b;
  poison(b + 1, (c + 1) * kGranule - sizeof(FreeBlock));
}

}  // namespace toy::detail
