// cuda-emu: the test program's main. It puts the emulated CUDA kernels on the sim device in
// place of the CPU kernels there, and runs the converted tests/gpu tests (Device::CUDA ->
// Device::SIM), which then compare the CPU against the emulated kernels.
//
//   - toy::install_cuda_backend is defined here, so the program takes neither the real CUDA
//     backend nor its stub from libtoy.a. install_all calls it after the CPU kernels are
//     registered for cpu and sim; it registers the converted glue (emulated_glue.cpp, written by
//     emulate.py: every glue_*.cpp that built, calling the converted .cu launchers) into a
//     scratch registry, and moves its sim kernels over the CPU's. The kernels of glue that did
//     not build are replaced by ones that fail naming the kernel, so their tests fail instead of
//     comparing the CPU with itself. It returns false: the cuda device stays absent.
//   - Every sim allocation is filled with 0xFF bytes (NaN in every float type, -1 as an
//     integer), as TOY_CUDA_POISON=1 does on the GPU: an output element a kernel leaves
//     unwritten fails its parity test.
//   - At the end it prints the launches per kernel, the emulator's warnings, and the tests
//     that launched no emulated kernel (registration and refusal checks, or a test that does
//     not reach the kernels it means to).
//
// Environment, read at run time (and emu_cuda.h's CUDA_EMU_ORDER)
//   CUDA_EMU_GUARD_PAGES=1  each sim block on pages of its own, its end against an inaccessible
//                           page and its start after one: an out-of-bounds access faults, a
//                           small overrun within the last 64 bytes is found at the free, a use
//                           after free faults. (No cache: system_allocs counts the most blocks
//                           alive at once, as a warm caching allocator would.)
//   CUDA_EMU_SKIP=k1,k2     leave those kernels (registry names) to the CPU on sim.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "toy/core/device.h"
#include "toy/core/error.h"
// (the one way in to the registry's kernel table, to replace the CPU's sim kernels: the
// registry refuses a second registration; the headers it includes are included above)
#define private public
#include "toy/core/registry.h"
#undef private

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "emu_report.h"
#include "toy/core/allocator.h"

namespace toy::cuda {
// emulated_glue.cpp (generated): the register_* functions of the glue that built, and the
// kernels of the glue that did not, registered for sim as ones that fail naming themselves.
void register_emulated(Registry& r);
void register_refused(Registry& r);
}  // namespace toy::cuda

namespace {

std::set<std::string> skipped_kernels() {
  std::set<std::string> skip;
  const char* s = std::getenv("CUDA_EMU_SKIP");
  std::string v = s ? s : "";
  for (size_t i = 0; i < v.size();) {
    size_t j = v.find(',', i);
    if (j == std::string::npos) j = v.size();
    if (j > i) skip.insert(v.substr(i, j - i));
    i = j + 1;
  }
  return skip;
}

std::string emulated_names;  // for the log

class PoisonAllocator final : public toy::Allocator {
 public:
  explicit PoisonAllocator(toy::Allocator& base) : base_(base) {}
  void* allocate(size_t bytes, size_t* capacity) override {
    void* p = base_.allocate(bytes, capacity);
    std::memset(p, 0xFF, *capacity);
    return p;
  }
  void deallocate(void* p, size_t capacity, uint64_t other) override { base_.deallocate(p, capacity, other); }
  toy::AllocatorStats stats() const override { return base_.stats(); }
  void empty_cache() override { base_.empty_cache(); }

 private:
  toy::Allocator& base_;
};

class GuardPageAllocator final : public toy::Allocator {
 public:
  void* allocate(size_t bytes, size_t* capacity) override {
    const size_t page = size_t(sysconf(_SC_PAGESIZE)), size = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    const size_t pages = (size + page - 1) / page;
    char* base = static_cast<char*>(
        mmap(nullptr, (pages + 2) * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base == MAP_FAILED) {
      std::fprintf(stderr, "cuda-emu guard pages: mmap of %zu bytes failed\n", bytes);
      std::abort();
    }
    mprotect(base, page, PROT_NONE);
    mprotect(base + (pages + 1) * page, page, PROT_NONE);
    char* p = base + (pages + 1) * page - size;
    std::memset(p, 0xFF, size);
    *capacity = bytes;
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[p] = Block{base, pages, bytes, size};
    stats_.bytes_in_use += int64_t(bytes);
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
    stats_.system_allocs = std::max<int64_t>(stats_.system_allocs, int64_t(blocks_.size()));
    return p;
  }
  void deallocate(void* q, size_t, uint64_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(static_cast<char*>(q));
    if (it == blocks_.end()) {
      std::fprintf(stderr, "cuda-emu guard pages: freeing a block it did not hand out\n");
      std::abort();
    }
    const Block b = it->second;
    const unsigned char* p = static_cast<const unsigned char*>(q);
    for (size_t i = b.bytes; i < b.size; ++i)
      if (p[i] != 0xFF) {
        std::fprintf(stderr, "cuda-emu guard pages: a write %zu bytes past the end of a block of %zu bytes\n",
                     i - b.bytes, b.bytes);
        std::abort();
      }
    munmap(b.base, (b.pages + 2) * size_t(sysconf(_SC_PAGESIZE)));
    stats_.bytes_in_use -= int64_t(b.bytes);
    blocks_.erase(it);
  }
  toy::AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void empty_cache() override {}

 private:
  struct Block {
    char* base;
    size_t pages, bytes, size;
  };
  mutable std::mutex mu_;
  std::map<char*, Block> blocks_;
  toy::AllocatorStats stats_;
};

// Notes the tests during which no emulated kernel was launched.
class LaunchWatcher final : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo&) override { before_ = emu::total_launches(); }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (emu::total_launches() == before_) idle_ += std::string(" ") + t.test_suite_name() + "." + t.name();
  }
  const std::string& idle() const { return idle_; }

 private:
  long before_ = 0;
  std::string idle_;
};

}  // namespace

namespace toy {

bool install_cuda_backend(Registry& r) {
  Registry scratch;
  cuda::register_emulated(scratch);
  cuda::register_refused(scratch);
  const std::set<std::string> skip = skipped_kernels();
  for (auto& [name, entries] : scratch.kernels_) {
    const auto& entry = entries[int(Device::SIM)];
    if (!entry.fn || skip.count(name)) continue;
    r.kernels_[name][int(Device::SIM)] = entry;
    emulated_names += " " + name;
  }
  return false;
}

}  // namespace toy

int main(int argc, char** argv) {
  const char* guard = std::getenv("CUDA_EMU_GUARD_PAGES");
  if (guard && std::string(guard) == "1")
    toy::set_allocator(toy::Device::SIM, new GuardPageAllocator());
  else
    toy::set_allocator(toy::Device::SIM, new PoisonAllocator(toy::allocator(toy::Device::SIM)));
  (void)toy::registry();  // (fills it: install_cuda_backend above)
  std::fprintf(stderr, "cuda-emu: kernels on sim:%s\n", emulated_names.c_str());
  ::testing::InitGoogleTest(&argc, argv);
  auto* watcher = new LaunchWatcher;
  ::testing::UnitTest::GetInstance()->listeners().Append(watcher);  // (gtest owns it)
  const int rc = RUN_ALL_TESTS();
  emu::write_report(stderr);
  if (!watcher->idle().empty())
    std::fprintf(stderr, "cuda-emu: tests that launched no emulated kernel:%s\n", watcher->idle().c_str());
  return rc;
}
