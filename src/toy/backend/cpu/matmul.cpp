// Matmul on the CPU: f32 products on toy's own tiles (gemm_f32.h: each result one FMA chain
// along k, so the same bits for any thread count or batch schedule), transposed views read
// where they lie; F16/BF16 operands are widened to f32 first. One exception: in the AVX2 forms
// a product whose a is a transposed view (g^T in a weight's gradient g^T x) goes to OpenBLAS
// SGEMM, whose AVX2 kernels read g^T faster than toy's tiles pack it (sgemm_by_shape). Two
// BF16 operands with an f32 result go to gemm_bf16 instead where the CPU has a BF16 dot
// product (mixed-precision training's backward products). Batches go one per thread where
// there are enough of them for the threads, otherwise each product's c is split across the
// threads.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/backend/cpu/gemm_bf16.h"
#include "toy/backend/cpu/gemm_f32.h"
#include "toy/backend/cpu/simd.h"
#include "toy/backend/cpu/variant.h"
#include "toy/core/cpu_features.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {

// x itself when f32, else an f32 copy (F16/BF16 operands widened).
Tensor as_f32(const Tensor& x) {
  if (x.dtype() == DType::F32) return x;
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

// OpenBLAS for a product whose a is transposed (a(i, k) at p[k * col_stride + i]) in the AVX2
// forms: its Haswell kernels ran cpu-medium's weight gradients (g^T x, 2048 tokens) at 188
// GFLOP/s against toy's tiles' 147 (Xeon SPR forced to AVX2: the packing of g^T is the cost;
// cpu-small's were level, and on AVX-512 toy's tiles are faster). The calls are a function of
// the shape alone, never of the thread count (BLAS picks its kernels, so its sums' order, by a
// call's size): c is cut along its longer side into parts of at least 128 rows or columns, at
// most 8, the threads taking parts in turn. Returns false (nothing done) where this does not
// apply.
bool sgemm_by_shape(int64_t M, int64_t N, int64_t K, const F32Matrix& a, const F32Matrix& b, float* c, int64_t ldc,
                    bool accumulate) {
  if (avx512_forms() || M < 2 || K < 2 || a.row_stride != 1 || a.col_stride < M) return false;
  CBLAS_TRANSPOSE tb;
  int64_t ldb;
  if ((b.col_stride == 1 || N == 1) && (N == 1 || b.row_stride >= N))
    tb = CblasNoTrans, ldb = N == 1 ? std::max<int64_t>(b.row_stride, 1) : b.row_stride;
  else if (b.row_stride == 1 && b.col_stride >= K)
    tb = CblasTrans, ldb = b.col_stride;
  else
    return false;
  constexpr int64_t kMinPart = 128, kMaxParts = 8;
  const bool split_n = N >= M;
  const int64_t len = split_n ? N : M;
  int64_t parts = 1;  // (a power of two: an even share for 2, 4 or 8 threads)
  while (parts * 2 <= kMaxParts && len / (parts * 2) >= kMinPart) parts *= 2;
  auto part = [&](int64_t p) {
    const int64_t lo = (len * p / parts) / 16 * 16, hi = p + 1 == parts ? len : (len * (p + 1) / parts) / 16 * 16;
    if (lo >= hi) return;
    const int64_t m0 = split_n ? 0 : lo, m1 = split_n ? M : hi, n0 = split_n ? lo : 0, n1 = split_n ? hi : N;
    const float* bp = b.p + n0 * (tb == CblasNoTrans ? 1 : ldb);
    cblas_sgemm(CblasRowMajor, CblasTrans, tb, int(m1 - m0), int(n1 - n0), int(K), 1.0f, a.p + m0, int(a.col_stride),
                bp, int(ldb), accumulate ? 1.0f : 0.0f, c + m0 * ldc + n0, int(ldc));
  };
  parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) part(p);
  });
  return true;
}

// c = a @ b (+ c when accumulate) for f32 a, b and contiguous f32 c, batch by batch.
void matmul_f32(const Tensor& a, const Tensor& b, float* pc, const Tensor& c, bool accumulate) {
  const int nd = c.ndim();
  const int64_t M = c.size(nd - 2), N = c.size(nd - 1), K = a.size(nd - 1);
  const int64_t batches = c.numel() / (M * N);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  auto product = [&](int64_t bi) {
    int64_t oa, ob;
    batch_offsets(a, b, c, bi, &oa, &ob);
    const F32Matrix am{pa + oa, a.stride(nd - 2), a.stride(nd - 1)}, bm{pb + ob, b.stride(nd - 2), b.stride(nd - 1)};
    if (!sgemm_by_shape(M, N, K, am, bm, pc + bi * M * N, N, accumulate))
      gemm_f32(M, N, K, am, bm, pc + bi * M * N, N, accumulate);
  };
  if (batches > 1 && batches >= num_threads()) {
    parallel_for(0, batches, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t bi = b0; bi < b1; ++bi) product(bi);
    });
  } else {
    for (int64_t bi = 0; bi < batches; ++bi) product(bi);
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
  if (c_out.numel() == 0) return;
  if (a_in.dtype() == DType::BF16 && b_in.dtype() == DType::BF16 && c_out.dtype() == DType::F32 && alpha == 1.0f &&
      (beta == 0.0f || beta == 1.0f) && gemm_bf16_available())
    return matmul_bf16(a_in, b_in, c_out, beta == 1.0f);
  const Tensor a = as_f32(a_in), b = as_f32(b_in);
  // f32 accumulator: c itself, or scratch for f16/bf16 outputs.
  Tensor c = c_out;
  if (c_out.dtype() != DType::F32) {
    c = empty(c_out.shape(), DType::F32);
    if (beta != 0.0f) copy(c_out, c);
  }
  float* pc = c.data<float>();
  if (alpha == 1.0f && (beta == 0.0f || beta == 1.0f)) {
    matmul_f32(a, b, pc, c, beta == 1.0f);
  } else {  // c = alpha (a @ b) + beta c, c not read when beta is 0 (as BLAS)
    std::vector<float> t(size_t(c.numel()));
    matmul_f32(a, b, t.data(), c, false);
    for (size_t i = 0; i < t.size(); ++i) pc[i] = alpha * t[i] + (beta == 0.0f ? 0.0f : beta * pc[i]);
  }
  if (!c.is_same(c_out)) copy(c, c_out);
}

void matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& c) {
  // (Never OpenBLAS: it would need c preset to the bias, the pass this kernel is for.)
  gemm_f32(c.size(0), c.size(1), a.size(1), {a.data<float>(), a.stride(0), a.stride(1)},
           {b.data<float>(), b.stride(0), b.stride(1)}, c.data<float>(), c.size(1), false, bias.data<float>());
}

void matmul_row_sums(const Tensor& a, const Tensor& b, Tensor& c, Tensor& sums) {
  const int64_t M = c.size(0), N = c.size(1), K = a.size(1);
  const F32Matrix am{a.data<float>(), a.stride(0), a.stride(1)}, bm{b.data<float>(), b.stride(0), b.stride(1)};
  // Summed as the product packs aᵀ, except where Reduce sums a single column in another order
  // (M 1) or OpenBLAS runs the product (the AVX2 forms): there Reduce itself, on the view aᵀ.
  if (M > 1 && !sgemm_by_shape(M, N, K, am, bm, c.data<float>(), N, false)) {
    gemm_f32(M, N, K, am, bm, c.data<float>(), N, false, nullptr, sums.data<float>());
    return;
  }
  if (M <= 1) gemm_f32(M, N, K, am, bm, c.data<float>(), N, false);
  const Tensor at = make_view(a, Shape{K, M}, Strides{a.stride(1), a.stride(0)}, a.offset());
  reduce(kern::ReduceOp::Sum, at, 0, sums, nullptr);
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
