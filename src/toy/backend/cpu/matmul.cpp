// Matmul on the CPU: OpenBLAS SGEMM (kept single-threaded) inside our own partitioning —
// batches first, then the larger of M and N is split across threads. F16/BF16 operands are
// widened to f32 scratch first; transposed views go to BLAS as Trans with no copy. Two BF16
// operands with an f32 result go to gemm_bf16 instead where the CPU has a BF16 dot product
// (mixed-precision training's backward products).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/backend/cpu/gemm_bf16.h"
#include "toy/backend/cpu/simd.h"
#include "toy/core/cpu_features.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {

// A 2-D operand as BLAS sees it.
struct GemmOperand {
  const float* p;
  CBLAS_TRANSPOSE trans;
  int64_t ld;
};

// Describes the last two dims (rows R, cols C, strides sr, sc) of an f32 operand.
bool blas_layout(int64_t R, int64_t C, int64_t sr, int64_t sc, CBLAS_TRANSPOSE* t, int64_t* ld) {
  if (sc == 1 || C == 1) {
    *t = CblasNoTrans;
    *ld = (R == 1) ? std::max<int64_t>(C, 1) : sr;
    if (*ld >= std::max<int64_t>(C, 1)) return true;
  }
  if (sr == 1 || R == 1) {
    *t = CblasTrans;
    *ld = (C == 1) ? std::max<int64_t>(R, 1) : sc;
    if (*ld >= std::max<int64_t>(R, 1)) return true;
  }
  return false;
}

// Returns an f32 tensor with GEMM-compatible last two dims: x itself when possible.
Tensor gemm_ready(const Tensor& x) {
  if (x.dtype() == DType::F32) {
    const int n = x.ndim();
    CBLAS_TRANSPOSE t;
    int64_t ld;
    if (blas_layout(x.size(n - 2), x.size(n - 1), x.stride(n - 2), x.stride(n - 1), &t, &ld)) return x;
  }
  Tensor c = empty(x.shape(), DType::F32);
  copy(x, c);
  return c;
}

// Element offsets into a and b of batch bi of c (batch dims already broadcast to c's).
void batch_offsets(const Tensor& a, const Tensor& b, const Tensor& c, int64_t bi, int64_t* oa, int64_t* ob) {
  *oa = 0, *ob = 0;
  for (int d = c.ndim() - 3; d >= 0; --d) {
    const int64_t i = bi % c.size(d);
    bi /= c.size(d);
    *oa += i * a.stride(d);
    *ob += i * b.stride(d);
  }
}

// c (f32) = a @ b (+ c) for bf16 a and b on gemm_bf16, batch by batch (each call threaded).
void matmul_bf16(const Tensor& a, const Tensor& b, Tensor& c, bool accumulate) {
  const int nd = c.ndim();
  const int64_t M = c.size(nd - 2), N = c.size(nd - 1), K = a.size(nd - 1);
  const bf16* pa = a.data<bf16>();
  const bf16* pb = b.data<bf16>();
  float* pc = c.data<float>();
  for (int64_t bi = 0; bi < c.numel() / (M * N); ++bi) {
    int64_t oa, ob;
    batch_offsets(a, b, c, bi, &oa, &ob);
    gemm_bf16(M, N, K, {pa + oa, true, a.stride(nd - 2), a.stride(nd - 1)},
              {pb + ob, true, b.stride(nd - 2), b.stride(nd - 1)}, pc + bi * M * N, N, accumulate);
  }
}

}  // namespace

// BF16 where gemm_bf16 runs; F16 operands are widened (no F16 dot product is used yet).
bool matmul_takes_half(DType t) { return t == DType::BF16 && gemm_bf16_available(); }

// gemm_bf16 rounds f32 operands as it packs them; elsewhere (no BF16 products, or F16) the
// rounded copies are made first and multiplied as matmul multiplies them.
void matmul_rounded(const Tensor& a, const Tensor& b, DType t, Tensor& c) {
  if (t == DType::BF16 && gemm_bf16_available()) {
    auto operand = [](const Tensor& x) {
      return Bf16Operand{x.raw_data(), x.dtype() == DType::BF16, x.stride(0), x.stride(1)};
    };
    return gemm_bf16(c.size(0), c.size(1), a.size(1), operand(a), operand(b), c.data<float>(), c.size(1), false);
  }
  auto rounded = [t](const Tensor& x) {
    if (x.dtype() == t) return x;
    Tensor r = empty(x.shape(), t, x.device());
    copy(x, r);
    return r;
  };
  matmul(rounded(a), rounded(b), c, 1.0f, 0.0f);
}

void matmul(const Tensor& a_in, const Tensor& b_in, Tensor& c_out, float alpha, float beta) {
  const int nd = c_out.ndim();
  const int64_t M = c_out.size(nd - 2), N = c_out.size(nd - 1), K = a_in.size(nd - 1);
  if (c_out.numel() == 0) return;
  if (a_in.dtype() == DType::BF16 && b_in.dtype() == DType::BF16 && c_out.dtype() == DType::F32 && alpha == 1.0f &&
      (beta == 0.0f || beta == 1.0f) && gemm_bf16_available())
    return matmul_bf16(a_in, b_in, c_out, beta == 1.0f);
  Tensor a = gemm_ready(a_in), b = gemm_ready(b_in);
  // f32 accumulator: c itself, or scratch for f16/bf16 outputs.
  Tensor c = c_out;
  if (c_out.dtype() != DType::F32) {
    c = empty(c_out.shape(), DType::F32);
    if (beta != 0.0f) copy(c_out, c);
  }
  const int64_t batches = c.numel() / (M * N);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* pc = c.data<float>();

  CBLAS_TRANSPOSE ta, tb;
  int64_t lda, ldb;
  blas_layout(M, K, a.stride(nd - 2), a.stride(nd - 1), &ta, &lda);
  blas_layout(K, N, b.stride(nd - 2), b.stride(nd - 1), &tb, &ldb);
  const int64_t sam = a.stride(nd - 2), sak = a.stride(nd - 1);
  const int64_t sbk = b.stride(nd - 2), sbn = b.stride(nd - 1);

  auto gemm = [&](int64_t bi, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    int64_t oa, ob;
    batch_offsets(a, b, c, bi, &oa, &ob);
    const float* A = pa + oa + m0 * sam;
    const float* B = pb + ob + n0 * sbn;
    float* C = pc + bi * M * N + m0 * N + n0;
    if (K == 0) {
      for (int64_t i = 0; i < m1 - m0; ++i)
        for (int64_t j = 0; j < n1 - n0; ++j) C[i * N + j] = beta == 0.0f ? 0.0f : beta * C[i * N + j];
      return;
    }
    cblas_sgemm(CblasRowMajor, ta, tb, int(m1 - m0), int(n1 - n0), int(K), alpha, A, int(lda), B, int(ldb), beta, C,
                int(N));
    (void)sak;
    (void)sbk;
  };

  const int threads = num_threads();
  const double flops = double(M) * double(N) * double(K);
  // The BLAS calls are a function of the shape alone, never of the thread count: BLAS
  // libraries pick kernels (and so summation orders) by a call's size, so a split that
  // followed the threads would give other bits on another thread count. Small products are
  // one call; many batches one call each; otherwise each batch's output is cut along its
  // longer side into parts of at least kMinPart rows or columns (at most kMaxParts), the
  // threads taking parts in turn (one thread runs the same parts in order).
  constexpr int64_t kMinPart = 128, kMaxParts = 8, kManyBatches = 8;
  const bool split_n = N >= M;
  const int64_t len = split_n ? N : M;
  // (A power of two: an even share for 2, 4 or 8 threads.)
  int64_t parts = 1;
  if (flops * double(batches) >= 2.0e5 && batches < kManyBatches)
    while (parts * 2 <= kMaxParts && len / (parts * 2) >= kMinPart) parts *= 2;
  auto run_part = [&](int64_t t) {
    const int64_t bi = t / parts, p = t % parts;
    const int64_t lo = (len * p / parts) / 16 * 16, hi = p + 1 == parts ? len : (len * (p + 1) / parts) / 16 * 16;
    if (lo >= hi) return;
    if (split_n)
      gemm(bi, 0, M, lo, hi);
    else
      gemm(bi, lo, hi, 0, N);
  };
  if (threads <= 1 || batches * parts == 1 || flops * double(batches) < 2.0e5) {
    for (int64_t t = 0; t < batches * parts; ++t) run_part(t);
  } else {
    parallel_for(0, batches * parts, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) run_part(t);
    });
  }
  if (!c.is_same(c_out)) copy(c, c_out);
}

namespace {

// GFLOP/s of one thread's independent FMA chains for `seconds`: enough chains (more than the
// FMA latency times the pipes) to keep every FMA pipe busy. Stamped per vector width, each
// compiled for its instruction set (a template over intrinsics would not be).
#define TOY_FMA_CHAINS(NAME, ATTRIBUTES, VEC, LANES, CHAINS, SET1, FMA, SUM)                     \
  ATTRIBUTES double NAME(double seconds) {                                                     \
    VEC acc[CHAINS];                                                                           \
    for (int i = 0; i < CHAINS; ++i) acc[i] = SET1(float(i) * 1e-3f);                          \
    const VEC m = SET1(0.999999f), add = SET1(1e-7f);                                          \
    int64_t iters = 0;                                                                         \
    const auto t0 = std::chrono::steady_clock::now();                                          \
    double elapsed = 0;                                                                        \
    while (elapsed < seconds) {                                                                \
      for (int r = 0; r < 4096; ++r) {                                                         \
        /* every chain in registers, one step each per round (not one chain at a time) */      \
        _Pragma("GCC unroll 32") for (int i = 0; i < CHAINS; ++i) acc[i] = FMA(acc[i], m, add); \
      }                                                                                        \
      iters += 4096;                                                                           \
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();  \
    }                                                                                          \
    float sink = 0;                                                                            \
    for (int i = 0; i < CHAINS; ++i) sink += SUM(acc[i]);                                      \
    return double(iters) * CHAINS * LANES * 2 / elapsed / 1e9 + (sink == 12345.0f ? 1e-30 : 0.0); \
  }

TOY_FMA_CHAINS(fma256_gflops, , __m256, 8, 12, _mm256_set1_ps, _mm256_fmadd_ps, hsum256)
TOY_FMA_CHAINS(fma512_gflops, __attribute__((target("avx512f"))), __m512, 16, 24, _mm512_set1_ps, _mm512_fmadd_ps,
               _mm512_reduce_add_ps)
#undef TOY_FMA_CHAINS

}  // namespace

double measure_fma_peak_gflops(int threads, double seconds) {
  // The widest FMA this CPU has (a 512-bit kernel — OpenBLAS's on AVX-512 parts — does twice
  // the work per instruction of a 256-bit one, so a 256-bit peak under-reads there: a ratio
  // above 1), each thread's best of three short runs (a run the scheduler interrupted reads
  // low), summed over the threads.
  const bool wide = cpu_has_avx512_skx();
  std::vector<double> rates(size_t(std::max(threads, 1)), 0.0);
  int saved = num_threads();
  set_num_threads(threads);
  parallel_tasks(threads, [&](int64_t t) {
    for (int run = 0; run < 3; ++run) {
      const double r = wide ? fma512_gflops(seconds / 3) : fma256_gflops(seconds / 3);
      rates[size_t(t)] = std::max(rates[size_t(t)], r);
    }
  });
  set_num_threads(saved);
  double total = 0;
  for (double r : rates) total += r;
  return total;
}

}  // namespace toy::cpu
