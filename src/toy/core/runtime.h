// The host runtime as the code above the backends sees it (device-neutral): how many threads
// the CPU backend runs, the start-up checks of the machine, and the host measurements the
// benchmarks compare against. The CPU backend's own headers (core/thread_pool.h,
// core/cpu_features.h, core/blas_core.h, backend/cpu/*) are for backend/ and core/ only: a
// test checks that nothing above them includes one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace toy {

inline constexpr int kMaxThreads = 1024;

// The CPU backend's threads (core/thread_pool.h runs them).
int num_threads();
// 0 picks the default: TOY_THREADS if set, else the hardware concurrency. Throws toy::Error
// when the system cannot start that many threads (none is left running).
void set_num_threads(int n);
// TOY_THREADS, parsed strictly (0 when unset); throws toy::Error naming it when it is not an
// integer in 1..kMaxThreads.
int env_threads();
// The thread count used when neither --threads nor TOY_THREADS says one (0: the hardware's);
// a data-parallel rank's share of its CPUs.
void set_default_threads(int n);

// Empty when the CPU has everything the kernels use, else the names of what is missing.
std::string missing_cpu_features();
// The CPU kernel variant in use, "avx2" or "avx512" (TOY_CPU or this CPU's best; see
// core/cpu_features.h); every benchmark line names it. Throws toy::Error for a bad TOY_CPU.
std::string kernel_variant_name();
// How products of two BF16 operands run here: "AMX-BF16 tiles", "AVX512-BF16 (vdpbf16ps)" or
// "widened to f32 (SGEMM)" (cpu_features.h, Bf16Products).
std::string bf16_products_form();
// The core OpenBLAS runs ("Haswell", "Zen", "SkylakeX", "Prescott", ...).
std::string openblas_core();
// When OpenBLAS fell back to kernels older than this CPU: sets OPENBLAS_CORETYPE and
// re-executes this program with argv (core/blas_core.h says why). Returns only when there is
// nothing to do or the exec failed.
void reexec_with_openblas_core(char** argv);

// Host measurements for benchmark baselines, split over the threads as kernels split work.
namespace host {
// Copies `bytes` from src to dst.
void parallel_copy(void* dst, const void* src, size_t bytes);
// The sum of n 64-bit words (read bandwidth).
uint64_t parallel_sum(const uint64_t* words, size_t n);
// Peak single-precision FMA throughput (GFLOP/s) on `threads` threads, from a register-only
// FMA loop of the widest vectors the CPU has.
double fma_peak_gflops(int threads, double seconds);
}  // namespace host

}  // namespace toy
