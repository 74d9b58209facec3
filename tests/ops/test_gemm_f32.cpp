// gemm_f32 (backend/cpu/gemm_f32.h) and the CPU matmul on it: each element of c is one chain of
// f32 fused multiply-adds along k in order, so std::fma recomputes its bits exactly; checked in
// both forms (AVX-512 where the CPU has it, AVX2), for a read in place, transposed (packed by
// 8 x 8 transposes) and with neither stride 1, b's three layouts, the edges of tiles, panels,
// row and k blocks, accumulation, and any thread count; then the matmul kernel (batches,
// broadcast batch dims, transposed views, alpha and beta) and a training step's products.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gemm_test_helpers.h"
#include "helpers.h"
#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/gemm_f32.h"
#include "toy/backend/cpu/variant.h"
#include "toy/core/cpu_features.h"
#include "toy/core/thread_pool.h"

using namespace toy;
using namespace toy::test;

namespace {

struct Threads {
  int before = num_threads();
  explicit Threads(int n) { set_num_threads(n); }
  ~Threads() { set_num_threads(before); }
};

// A [R, C] matrix stored k-contiguous ("rows": col_stride 1, row stride C + 2), transposed
// (row_stride 1, col stride R + 3), or with neither stride 1; every gap holds a NaN, so an element
// read from outside the matrix shows in c.
enum class Layout { Rows, Transposed, Strided };
const char* layout_name(Layout l) { return l == Layout::Rows ? "rows" : l == Layout::Transposed ? "transposed" : "strided"; }

struct Matrix {
  std::vector<float> mem;
  cpu::F32Matrix op;
  float at(int64_t r, int64_t c) const { return op.p[r * op.row_stride + c * op.col_stride]; }
};
Matrix make_matrix(int64_t R, int64_t C, Layout l, uint64_t seed) {
  Matrix m;
  if (l == Layout::Rows) m.op.row_stride = C + 2, m.op.col_stride = 1;
  if (l == Layout::Transposed) m.op.row_stride = 1, m.op.col_stride = R + 3;
  if (l == Layout::Strided) m.op.row_stride = 2, m.op.col_stride = 2 * R + 3;
  const int64_t size = l == Layout::Rows ? R * (C + 2) : C * m.op.col_stride;
  m.mem.assign(size_t(std::max<int64_t>(size, 1)), std::nanf(""));
  std::mt19937 rng{uint32_t(seed)};
  std::normal_distribution<float> normal;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) m.mem[size_t(r * m.op.row_stride + c * m.op.col_stride)] = normal(rng);
  m.op.p = m.mem.data();
  return m;
}

// What gemm_f32 promises: c = fma(a(i, k), b(k, j), c) for k in order, from 0 or c.
std::vector<float> fma_chains(int64_t M, int64_t N, int64_t K, const Matrix& a, const Matrix& b,
                              const std::vector<float>& c0, int64_t ldc, bool accumulate) {
  std::vector<float> c = c0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float s = accumulate ? c0[size_t(i * ldc + j)] : 0.0f;
      for (int64_t k = 0; k < K; ++k) s = std::fma(a.at(i, k), b.at(k, j), s);
      c[size_t(i * ldc + j)] = s;
    }
  return c;
}

// Tiles 12 x 32 (AVX-512) and 6 x 16 (AVX2), 8 x 8 transposes, row blocks of 96, k blocks of
// up to 512 (of even sizes), groups of 8 panels: each shape reaches some edge (1 to 31 columns in
// the last panel, rows and k not multiples of 8, more than one row block, two and three k blocks).
const Shape3 kShapes[] = {{1, 1, 1},     {5, 7, 3},    {13, 33, 9},  {12, 32, 256}, {6, 17, 257},
                          {97, 65, 300}, {25, 100, 513}, {3, 300, 20}, {40, 48, 8},   {7, 57, 40},
                          {9, 31, 33},   {200, 40, 17},  {14, 40, 1100}};

}  // namespace

TEST(GemmF32, EachElementIsOneFmaChainAlongKInEveryFormLayoutAndEdge) {
  for (bool avx512 : forms_here()) {
    FormScope form(avx512);
    for (Layout la : {Layout::Rows, Layout::Transposed, Layout::Strided})
      for (Layout lb : {Layout::Rows, Layout::Transposed, Layout::Strided})
        for (const Shape3& s : kShapes)
          for (bool accumulate : {false, true}) {
            const int64_t ldc = s.N + 3;
            const Matrix a = make_matrix(s.M, s.K, la, 11 + s.M), b = make_matrix(s.K, s.N, lb, 7 + s.K);
            std::vector<float> c = random_floats(size_t(s.M * ldc), 13 + s.N);
            const std::vector<float> want = fma_chains(s.M, s.N, s.K, a, b, c, ldc, accumulate);
            cpu::gemm_f32(s.M, s.N, s.K, a.op, b.op, c.data(), ldc, accumulate);
            EXPECT_TRUE(same_bits(c, want)) << (avx512 ? "AVX-512" : "AVX2") << " a " << layout_name(la) << " b "
                                            << layout_name(lb) << " " << s.M << "x" << s.N << "x" << s.K
                                            << " accumulate " << accumulate;
          }
  }
}

TEST(GemmF32, SameBitsOnAnyThreadCount) {
  // Each way of sharing: c's rows (many rows: a read in place or packed), c's panels (fewer
  // rows), and both (3 panels on 8 threads).
  for (Layout la : {Layout::Rows, Layout::Transposed})
    for (const Shape3& s : {Shape3{300, 70, 520}, Shape3{768, 384, 128}, Shape3{100, 300, 64}}) {
      const Matrix a = make_matrix(s.M, s.K, la, 3), b = make_matrix(s.K, s.N, Layout::Transposed, 4);
      const std::vector<float> c0 = random_floats(size_t(s.M * s.N), 5);
      const std::vector<float> want = fma_chains(s.M, s.N, s.K, a, b, c0, s.N, true);
      for (int threads : {1, 2, 3, 8}) {
        Threads scope(threads);
        std::vector<float> c = c0;
        cpu::gemm_f32(s.M, s.N, s.K, a.op, b.op, c.data(), s.N, true);
        EXPECT_TRUE(same_bits(c, want)) << layout_name(la) << " a, " << threads << " threads, " << s.M << "x" << s.N
                                        << "x" << s.K;
      }
    }
}

TEST(GemmF32, EmptyKWritesZerosOrLeavesC) {
  const Matrix a = make_matrix(4, 0, Layout::Rows, 1), b = make_matrix(0, 5, Layout::Rows, 2);
  std::vector<float> c(20, 3.0f);
  cpu::gemm_f32(4, 5, 0, a.op, b.op, c.data(), 5, true);
  EXPECT_EQ(c, std::vector<float>(20, 3.0f));
  cpu::gemm_f32(4, 5, 0, a.op, b.op, c.data(), 5, false);
  EXPECT_EQ(c, std::vector<float>(20, 0.0f));
}

// The matmul kernel: batches with a broadcast batch dim, b a transposed view; each batch's c the
// FMA chains of its operands, whatever the thread count (batches per thread on 2 threads, each
// product split on 4).
TEST(GemmF32, MatmulKernelBatchesAreFmaChains) {
  const int64_t B = 3, M = 37, N = 45, K = 70;
  Tensor a = randn_t(Shape{B, M, K}, 1);
  Tensor b = expand(transpose(randn_t(Shape{1, N, K}, 2)), Shape{B, K, N});  // k not contiguous
  const std::vector<float> av = contiguous(a).to_f32_vector(), bv = contiguous(b).to_f32_vector();
  std::vector<float> want(size_t(B * M * N));
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float s = 0.0f;
        for (int64_t k = 0; k < K; ++k) s = std::fma(av[size_t((bi * M + i) * K + k)], bv[size_t((bi * K + k) * N + j)], s);
        want[size_t((bi * M + i) * N + j)] = s;
      }
  for (int threads : {1, 2, 4}) {
    Threads scope(threads);
    Tensor c = empty(Shape{B, M, N});
    cpu::matmul(a, b, c, 1.0f, 0.0f);
    EXPECT_TRUE(same_bits(c.to_f32_vector(), want)) << threads << " threads";
    // alpha and beta other than 1 and 0/1: c = alpha (a @ b) + beta c.
    Tensor c2 = full(Shape{B, M, N}, 2.0f);
    cpu::matmul(a, b, c2, 0.5f, 3.0f);
    const std::vector<float> got = c2.to_f32_vector();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 0.5f * want[i] + 3.0f * 2.0f) << i;
  }
}

// A weight's gradient g^T x (a transposed): toy's tiles in the AVX-512 forms (the FMA chains'
// bits), OpenBLAS in the AVX2 forms (its own sums: close, and the same bits on any thread count,
// its calls a function of the shape alone).
TEST(GemmF32, WeightGradientInEachForm) {
  const int64_t T = 300, out = 200, in = 70;
  const Tensor g = randn_t(Shape{T, out}, 3), x = randn_t(Shape{T, in}, 4);
  const std::vector<float> gv = g.to_f32_vector(), xv = x.to_f32_vector();
  std::vector<float> want(size_t(out * in));
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) {
      float s = 0.0f;
      for (int64_t k = 0; k < T; ++k) s = std::fma(gv[size_t(k * out + i)], xv[size_t(k * in + j)], s);
      want[size_t(i * in + j)] = s;
    }
  for (bool avx512 : forms_here()) {
    FormScope form(avx512);
    std::vector<float> first;
    for (int threads : {1, 2, 4}) {
      Threads scope(threads);
      Tensor dw = empty(Shape{out, in});
      cpu::matmul(transpose(g), x, dw, 1.0f, 0.0f);
      const std::vector<float> got = dw.to_f32_vector();
      // And accumulated (beta 1, as a gradient added to one already there): c + g^T x.
      Tensor acc = full(Shape{out, in}, 0.5f);
      cpu::matmul(transpose(g), x, acc, 1.0f, 1.0f);
      const std::vector<float> summed = acc.to_f32_vector();
      if (avx512) {
        EXPECT_TRUE(same_bits(got, want)) << threads << " threads";
        for (int64_t i = 0; i < out; ++i)
          for (int64_t j = 0; j < in; ++j) {
            float s = 0.5f;
            for (int64_t k = 0; k < T; ++k) s = std::fma(gv[size_t(k * out + i)], xv[size_t(k * in + j)], s);
            ASSERT_EQ(summed[size_t(i * in + j)], s) << i << ", " << j;
          }
      } else {
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::fabs(want[i]))) << i;
          ASSERT_NEAR(summed[i], want[i] + 0.5f, 1e-4f * (1.0f + std::fabs(want[i]))) << i;
        }
        if (first.empty()) first = got;
        EXPECT_TRUE(same_bits(got, first)) << threads << " threads";
      }
    }
  }
}

// A bias as the sums' start (a linear layer's forward): c(i, j) = the chain from bias[j], in
// both forms, both ways of reading a, every edge and any thread count; the bias ignored when
// accumulating; an empty k leaves the bias.
TEST(GemmF32, BiasStartsEveryRowsSums) {
  for (bool avx512 : forms_here()) {
    FormScope form(avx512);
    for (Layout la : {Layout::Rows, Layout::Transposed})
      for (const Shape3& s : kShapes)
        for (int threads : {1, 3}) {
          Threads scope(threads);
          const int64_t ldc = s.N + 1;
          const Matrix a = make_matrix(s.M, s.K, la, 21 + s.M), b = make_matrix(s.K, s.N, Layout::Transposed, 9 + s.K);
          const std::vector<float> bias = random_floats(size_t(s.N), 17 + s.N);
          std::vector<float> preset(size_t(s.M * ldc), std::nanf(""));
          for (int64_t i = 0; i < s.M; ++i) std::copy(bias.begin(), bias.end(), preset.begin() + i * ldc);
          const std::vector<float> want = fma_chains(s.M, s.N, s.K, a, b, preset, ldc, true);
          std::vector<float> c(preset.size(), std::nanf(""));  // (c is not read: NaNs would show)
          for (int64_t i = 0; i < s.M; ++i) std::fill(c.begin() + i * ldc + s.N, c.begin() + (i + 1) * ldc, 0.0f);
          std::vector<float> want_c = want;
          for (int64_t i = 0; i < s.M; ++i) std::fill(want_c.begin() + i * ldc + s.N, want_c.begin() + (i + 1) * ldc, 0.0f);
          cpu::gemm_f32(s.M, s.N, s.K, a.op, b.op, c.data(), ldc, false, bias.data());
          EXPECT_TRUE(same_bits(c, want_c)) << (avx512 ? "AVX-512" : "AVX2") << " a " << layout_name(la) << " "
                                            << s.M << "x" << s.N << "x" << s.K << ", " << threads << " threads";
        }
    // Accumulating: c + a @ b, the bias not added.
    const Matrix a = make_matrix(13, 40, Layout::Rows, 1), b = make_matrix(40, 33, Layout::Rows, 2);
    const std::vector<float> bias = random_floats(33, 3), c0 = random_floats(13 * 33, 4);
    std::vector<float> c = c0;
    cpu::gemm_f32(13, 33, 40, a.op, b.op, c.data(), 33, true, bias.data());
    EXPECT_TRUE(same_bits(c, fma_chains(13, 33, 40, a, b, c0, 33, true)));
  }
  const Matrix a = make_matrix(4, 0, Layout::Rows, 1), b = make_matrix(0, 5, Layout::Rows, 2);
  const std::vector<float> bias = {1, 2, 3, 4, 5};
  std::vector<float> c(20, 9.0f);
  cpu::gemm_f32(4, 5, 0, a.op, b.op, c.data(), 5, false, bias.data());
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(c[size_t(i * 5 + j)], bias[size_t(j)]);
}

// linear with a bias on the CPU (the matmul_bias kernel) gives the bits of the bias copied into
// y and the product accumulated onto it (what devices without that kernel run), forward and
// through its backward, on 1 and 2 threads.
TEST(GemmF32, LinearWithABiasEqualsTheBiasCopiedAndAccumulated) {
  const Tensor x = randn_t(Shape{3, 50, 70}, 5), w = randn_t(Shape{90, 70}, 6), b = randn_t(Shape{90}, 7);
  Tensor want = empty(Shape{150, 90});
  copy_(want, expand(b, Shape{150, 90}));
  cpu::matmul(reshape(x, Shape{150, 70}), transpose(w), want, 1.0f, 1.0f);
  for (int threads : {1, 2}) {
    Threads scope(threads);
    const Tensor y = linear(x, w, b);
    EXPECT_EQ(y.shape(), (Shape{3, 50, 90}));
    EXPECT_TRUE(same_bits(y.to_f32_vector(), want.to_f32_vector())) << threads << " threads";
  }
}

// A linear layer's weight and bias gradients in one read of g (matmul_row_sums): dW the bits of
// the matmul kernel's gᵀ x, db the bits of sum(g, 0) (Reduce's order: runs of 64 tokens in f32,
// added in double), in both forms, on any thread count, for token counts off the runs' and
// blocks' edges, rows off the 8 x 8 transposes', more than one group of panels (over 256 inputs),
// and a single output (Reduce's other order).
TEST(GemmF32, WeightAndBiasGradientsTogetherHaveTheBitsOfEachApart) {
  for (bool avx512 : forms_here()) {
    FormScope form(avx512);
    for (const Shape3& s : {Shape3{1, 7, 9}, Shape3{13, 33, 130}, Shape3{200, 70, 300}, Shape3{384, 128, 768},
                            Shape3{9, 40, 1100}, Shape3{40, 300, 100}, Shape3{5, 3, 64}, Shape3{3, 4, 0}})
      for (int threads : {1, 2, 3}) {
        Threads scope(threads);
        const int64_t out = s.M, in = s.N, T = s.K;
        const Tensor g = randn_t(Shape{T, out}, 31 + out), x = randn_t(Shape{T, in}, 32 + in);
        const Tensor want_db = sum(g, 0);
        // gᵀ as a transposed view (packed, summed as it is), and stored (read in place, summed apart).
        for (const Tensor& a : {transpose(g), contiguous(transpose(g))}) {
          Tensor want_dw = empty(Shape{out, in});
          cpu::matmul(a, x, want_dw, 1.0f, 0.0f);
          Tensor dw = full(Shape{out, in}, std::nanf("")), db = full(Shape{out}, std::nanf(""));
          cpu::matmul_row_sums(a, x, dw, db);
          const std::string where = std::string(avx512 ? "AVX-512 " : "AVX2 ") + std::to_string(out) + " outputs, " +
                                    std::to_string(in) + " inputs, " + std::to_string(T) + " tokens, " +
                                    std::to_string(threads) + " threads, gᵀ " + (a.is_contiguous() ? "stored" : "a view");
          EXPECT_TRUE(same_bits(dw.to_f32_vector(), want_dw.to_f32_vector())) << where;
          EXPECT_TRUE(same_bits(db.to_f32_vector(), want_db.to_f32_vector())) << where;
        }
      }
  }
}

// Through linear's backward: the bias's gradient is sum(g, 0) exactly, the weight's gᵀ x.
TEST(GemmF32, LinearsBiasGradientIsTheSumOfItsOutputGradients) {
  const Tensor x = randn_t(Shape{2, 150, 40}, 41), w = param(randn_t(Shape{24, 40}, 42)), b = param(randn_t(Shape{24}, 43));
  const Tensor r = randn_t(Shape{2, 150, 24}, 44);
  backward(sum(mul(linear(x, w, b), r)));
  const Tensor r2 = reshape(r, Shape{300, 24});
  EXPECT_TRUE(same_bits(b.grad().to_f32_vector(), sum(r2, 0).to_f32_vector()));
  Tensor want_dw = empty(Shape{24, 40});
  cpu::matmul(transpose(r2), reshape(x, Shape{300, 40}), want_dw, 1.0f, 0.0f);
  EXPECT_TRUE(same_bits(w.grad().to_f32_vector(), want_dw.to_f32_vector()));
}
