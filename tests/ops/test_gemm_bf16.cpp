// gemm_bf16 (backend/cpu/gemm_bf16.h), in each form this CPU has (AMX, vdpbf16ps), against sums
// of the rounded operands' products in double, over the shapes that reach every edge of its
// tiles and blocks and every way it reads an operand; its bits for any split of c and any
// thread count; and the ops that reach it (mixed-precision linear, BF16 matmul, a BF16
// weight's prompt) against the f32 path. On a CPU without either form (or under TOY_CPU=avx2,
// for the ops) these skip: nothing calls the kernel there.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "helpers.h"
#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/gemm_bf16.h"
#include "toy/core/cpu_features.h"
#include "toy/core/dtype.h"
#include "toy/core/rng.h"
#include "toy/core/thread_pool.h"

using namespace toy;
using namespace toy::test;

namespace {

// The ops' tests need the kernel in use; the kernel's own run every form this CPU has.
#define SKIP_WITHOUT_BF16() \
  if (!cpu::gemm_bf16_available()) GTEST_SKIP() << "this CPU (or TOY_CPU) has no BF16 products"
std::vector<Bf16Products> forms_here() {
  std::vector<Bf16Products> f;
  if (cpu_has_amx_bf16()) f.push_back(Bf16Products::Amx);
  if (cpu_has_avx512_bf16()) f.push_back(Bf16Products::Avx512Dot);
  return f;
}
const char* name(Bf16Products f) { return f == Bf16Products::Amx ? "AMX" : "vdpbf16ps"; }
#define FOR_EACH_FORM(f)                                                      \
  if (forms_here().empty()) GTEST_SKIP() << "this CPU has no BF16 products"; \
  for (Bf16Products f : forms_here())

float bf16_value(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// A matrix of R x C values stored with the given layout: row-major, column-major, or
// row-major with every other element skipped (neither stride 1). As f32 or bf16 bits.
enum class Layout { RowMajor, ColMajor, Strided };
struct Stored {
  std::vector<float> f32;
  std::vector<uint16_t> bits;
  int64_t rs = 0, cs = 0;
  cpu::Bf16Operand operand(bool as_bf16) const {
    return {as_bf16 ? static_cast<const void*>(bits.data()) : f32.data(), as_bf16, rs, cs};
  }
};
Stored store(const std::vector<float>& v, int64_t R, int64_t C, Layout l) {
  Stored s;
  int64_t size = R * C;
  if (l == Layout::RowMajor) s.rs = C, s.cs = 1;
  if (l == Layout::ColMajor) s.rs = 1, s.cs = R;
  if (l == Layout::Strided) s.rs = 2 * C + 1, s.cs = 2, size = R * (2 * C + 1);
  s.f32.assign(size_t(std::max<int64_t>(size, 1)), std::nanf(""));  // gaps hold NaN: read one and it shows
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) s.f32[size_t(r * s.rs + c * s.cs)] = v[size_t(r * C + c)];
  for (float f : s.f32) s.bits.push_back(f32_to_bf16(f));
  return s;
}

std::vector<float> values(int64_t n, uint64_t seed) {
  const Tensor t = randn_t(Shape{n}, seed);
  return std::vector<float>(t.data<float>(), t.data<float>() + n);
}

// |c - exact| within f32 summation's bound over 2K terms (the products themselves are exact).
::testing::AssertionResult near_exact(const std::vector<float>& c, const std::vector<float>& c0,
                                      const std::vector<float>& a, const std::vector<float>& b, int64_t M, int64_t N,
                                      int64_t K) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double exact = c0.empty() ? 0.0 : c0[size_t(i * N + j)], magnitude = std::fabs(exact);
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(bf16_value(a[size_t(i * K + k)])) * double(bf16_value(b[size_t(k * N + j)]));
        exact += p;
        magnitude += std::fabs(p);
      }
      const double got = c[size_t(i * N + j)];
      if (!(std::fabs(got - exact) <= double(K + 1) * 0x1p-23 * magnitude + 1e-30))
        return ::testing::AssertionFailure() << "c[" << i << "," << j << "] = " << got << ", exact " << exact
                                             << " (M " << M << " N " << N << " K " << K << ")";
    }
  return ::testing::AssertionSuccess();
}

struct Shape3 {
  int64_t M, N, K;
};
// Tile edges (12 x 32, 32 x 32), pair padding (odd K), k blocks (256 and 512 k), row blocks
// (96, 128), column blocks (512, 256), the 16 x 16 transposes' edges.
const Shape3 kShapes[] = {{1, 1, 1},    {12, 32, 2},  {13, 33, 3},    {11, 17, 31}, {25, 65, 257},
                          {97, 40, 33}, {5, 530, 18}, {30, 70, 600}, {2, 3, 513},  {150, 270, 70}};

}  // namespace

TEST(GemmBf16, EqualsExactSumsOfTheRoundedOperandsForEveryLayoutAndEdge) {
  FOR_EACH_FORM(form) {
  uint64_t seed = 1;
  for (const Shape3& s : kShapes)
    for (Layout la : {Layout::RowMajor, Layout::ColMajor, Layout::Strided})
      for (Layout lb : {Layout::RowMajor, Layout::ColMajor, Layout::Strided})
        for (bool a_bf16 : {false, true}) {
          const bool b_bf16 = !a_bf16;
          const auto a = values(s.M * s.K, ++seed), b = values(s.K * s.N, ++seed);
          const Stored sa = store(a, s.M, s.K, la), sb = store(b, s.K, s.N, lb);
          // c with a row stride wider than N and a row past M, all NaN before: c's old values
          // must not count (accumulate off), and the gaps and the extra row stay NaN.
          const int64_t ldc = s.N + 3;
          std::vector<float> c(size_t((s.M + 1) * ldc), std::nanf(""));
          cpu::gemm_bf16(s.M, s.N, s.K, sa.operand(a_bf16), sb.operand(b_bf16), c.data(), ldc, false, form);
          std::vector<float> dense(size_t(s.M * s.N));
          for (int64_t i = 0; i <= s.M; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              if (i < s.M && j < s.N)
                dense[size_t(i * s.N + j)] = c[size_t(i * ldc + j)];
              else
                ASSERT_TRUE(std::isnan(c[size_t(i * ldc + j)])) << "wrote past N or M at " << i << "," << j;
            }
          ASSERT_TRUE(near_exact(dense, {}, a, b, s.M, s.N, s.K))
              << name(form) << ", layouts " << int(la) << "/" << int(lb) << ", a " << (a_bf16 ? "bf16" : "f32");
        }
  }
}

TEST(GemmBf16, AccumulatesIntoC) {
  FOR_EACH_FORM(form) for (const Shape3& s : kShapes) {
    const auto a = values(s.M * s.K, 5), b = values(s.K * s.N, 6), c0 = values(s.M * s.N, 7);
    const Stored sa = store(a, s.M, s.K, Layout::RowMajor), sb = store(b, s.K, s.N, Layout::ColMajor);
    std::vector<float> c = c0;
    cpu::gemm_bf16(s.M, s.N, s.K, sa.operand(false), sb.operand(true), c.data(), s.N, true, form);
    ASSERT_TRUE(near_exact(c, c0, a, b, s.M, s.N, s.K)) << name(form);
  }
}

TEST(GemmBf16, EmptyKWritesZerosOrLeavesC) {
  FOR_EACH_FORM(form) {
  const float none = 0;
  std::vector<float> c(6, 3.0f);
  cpu::gemm_bf16(2, 3, 0, {&none, false, 0, 1}, {&none, false, 3, 1}, c.data(), 3, true, form);
  EXPECT_EQ(c, std::vector<float>(6, 3.0f));
  cpu::gemm_bf16(2, 3, 0, {&none, false, 0, 1}, {&none, false, 3, 1}, c.data(), 3, false, form);
  EXPECT_EQ(c, std::vector<float>(6, 0.0f));
  }
}

// The f32 operands are rounded as packed exactly as f32_to_bf16 rounds (nearest even, ties
// included; NaNs stay NaN), so an f32 operand and its bf16 bits give the same c.
TEST(GemmBf16, RoundsF32OperandsAsTheCastDoes) {
  FOR_EACH_FORM(form) {
  const int64_t M = 20, N = 40, K = 37;
  auto a = values(M * K, 11), b = values(K * N, 12);
  // Ties between two bf16 values, either way to even, and a NaN and an infinity in a's last row.
  for (int64_t k = 0; k < K; ++k) {
    uint32_t u = 0x3f808000u + uint32_t(k % 2) * 0x10000u;  // 1 + 2^-8 (+ 2^-7): exact ties
    std::memcpy(&a[size_t(k)], &u, 4);
  }
  a[size_t((M - 1) * K + 3)] = std::nanf("");
  a[size_t((M - 1) * K + 4)] = INFINITY;
  // f32 subnormals: the largest round up to 2^-126 (a normal bf16, so they count), others
  // stay bf16 subnormals (which the instructions take as zero, from either operand form).
  const uint32_t tiny[] = {0x007f8000u, 0x807fffffu, 0x007fc000u, 0x00000001u, 0x80400000u, 0x00008000u};
  for (size_t t = 0; t < std::size(tiny); ++t) {
    std::memcpy(&a[size_t(2 * K + 5 + int64_t(t))], &tiny[t], 4);
    std::memcpy(&b[size_t((5 + int64_t(t)) * N + 7)], &tiny[t], 4);
  }
  // 2^120 meets a[2][5] (0x007f8000, 2^-126 once rounded): a 2^-6 share of c[2][9] that a
  // packing which flushed f32 subnormals would lose.
  b[size_t(5 * N + 9)] = 0x1p120f;
  for (Layout la : {Layout::RowMajor, Layout::ColMajor, Layout::Strided}) {
    const Stored sa = store(a, M, K, la), sb = store(b, K, N, Layout::RowMajor);
    std::vector<float> from_f32(size_t(M * N)), from_bits(size_t(M * N));
    cpu::gemm_bf16(M, N, K, sa.operand(false), sb.operand(false), from_f32.data(), N, false, form);
    cpu::gemm_bf16(M, N, K, sa.operand(true), sb.operand(true), from_bits.data(), N, false, form);
    for (size_t i = 0; i < from_f32.size(); ++i) {
      if (std::isnan(from_bits[i])) {
        EXPECT_TRUE(std::isnan(from_f32[i])) << i;
        continue;
      }
      ASSERT_EQ(std::memcmp(&from_f32[i], &from_bits[i], 4), 0) << name(form) << ", layout " << int(la) << ", element " << i;
    }
    for (int64_t j = 0; j < N; ++j) EXPECT_TRUE(std::isnan(from_f32[size_t((M - 1) * N + j)])) << j;
  }
  }
}

// Each element of c is one sum in a fixed order, whoever computes it: a part of c computed
// alone, or the whole on 1 or 2 threads, gives the same bits.
TEST(GemmBf16, GivesTheSameBitsForAnySplitOfCAndAnyThreadCount) {
  FOR_EACH_FORM(form) {
  const int64_t M = 230, N = 700, K = 1100;
  const auto a = values(M * K, 21), b = values(K * N, 22);
  const Stored sa = store(a, M, K, Layout::RowMajor), sb = store(b, K, N, Layout::RowMajor);
  const int threads = num_threads();
  std::vector<float> one(size_t(M * N)), two(size_t(M * N));
  set_num_threads(1);
  cpu::gemm_bf16(M, N, K, sa.operand(false), sb.operand(false), one.data(), N, false, form);
  set_num_threads(2);
  cpu::gemm_bf16(M, N, K, sa.operand(false), sb.operand(false), two.data(), N, false, form);
  set_num_threads(threads);
  ASSERT_EQ(std::memcmp(one.data(), two.data(), one.size() * 4), 0);
  // Rows 37..150, columns 45..600 alone (offsets that cut tiles and blocks elsewhere).
  const int64_t i0 = 37, i1 = 150, j0 = 45, j1 = 600;
  std::vector<float> part(size_t((i1 - i0) * (j1 - j0)));
  cpu::Bf16Operand pa = sa.operand(false), pb = sb.operand(false);
  pa.p = sa.f32.data() + i0 * K;
  pb.p = sb.f32.data() + j0;
  cpu::gemm_bf16(i1 - i0, j1 - j0, K, pa, pb, part.data(), j1 - j0, false, form);
  for (int64_t i = i0; i < i1; ++i)
    ASSERT_EQ(std::memcmp(&part[size_t((i - i0) * (j1 - j0))], &one[size_t(i * N + j0)], size_t(j1 - j0) * 4), 0)
        << name(form) << ", row " << i;
  }
}

// The kernel and the ops that reach it compute what the f32 path computes on the rounded values.
TEST(GemmBf16, MatmulKernelOfBf16TensorsEqualsTheF32ProductOfTheirValues) {
  SKIP_WITHOUT_BF16();
  // Batched, a broadcast along the batch (stride 0), b a transposed view.
  const Tensor a = expand(cast(randn_t(Shape{1, 37, 70}, 31), DType::BF16), Shape{3, 37, 70});
  const Tensor b = transpose(cast(randn_t(Shape{3, 50, 70}, 32), DType::BF16), 1, 2);
  Tensor got = zeros(Shape{3, 37, 50});
  cpu::matmul(a, b, got, 1.0f, 0.0f);
  const Tensor want = matmul(cast(a, DType::F32), cast(b, DType::F32));
  EXPECT_TRUE(close(got, want, 1e-4, 1e-4));
  // beta 1 adds to c.
  Tensor twice = contiguous_copy(want);
  cpu::matmul(a, b, twice, 1.0f, 1.0f);
  EXPECT_TRUE(close(twice, scale(want, 2.0f), 1e-4, 1e-4));
}

// matmul_rounded (mixed precision's backward products) rounds f32 operands as the cast does:
// the bits of matmul over the cast operands, for a transposed view too; for F16 (no F16
// products) through the casts themselves.
TEST(GemmBf16, MatmulRoundedGivesTheBitsOfMatmulOverTheCasts) {
  for (DType t : {DType::BF16, DType::F16}) {
    if (t == DType::BF16 && !cpu::gemm_bf16_available()) continue;
    const Tensor g = randn_t(Shape{45, 70}, 61), x = randn_t(Shape{45, 33}, 62);
    const Tensor w = cast(randn_t(Shape{70, 33}, 63), t);
    Tensor dx = zeros(Shape{45, 33}), dw = zeros(Shape{70, 33});
    cpu::matmul_rounded(g, w, t, dx);
    cpu::matmul_rounded(transpose(g, 0, 1), x, t, dw);
    Tensor want_dx = zeros(Shape{45, 33}), want_dw = zeros(Shape{70, 33});
    cpu::matmul(cast(g, t), w, want_dx, 1.0f, 0.0f);
    cpu::matmul(transpose(cast(g, t), 0, 1), cast(x, t), want_dw, 1.0f, 0.0f);
    EXPECT_EQ(std::memcmp(dx.data<float>(), want_dx.data<float>(), 45 * 33 * 4), 0) << name(t);
    EXPECT_EQ(std::memcmp(dw.data<float>(), want_dw.data<float>(), 70 * 33 * 4), 0) << name(t);
  }
}

TEST(GemmBf16, MixedPrecisionLinearGradientsAreTheF32ProductsOfTheRoundedValues) {
  SKIP_WITHOUT_BF16();
  // y = x round(W)^T; dx = round(g) round(W); dW = round(g)^T round(x).
  const Tensor master = param(randn_t(Shape{70, 300}, 51, 0.1f));
  const Tensor x = param(randn_t(Shape{2, 20, 300}, 52));
  const Tensor g = randn_t(Shape{2, 20, 70}, 53);
  backward(linear(x, cast(master, DType::BF16)), g);
  auto r = [](const Tensor& t) { return cast(cast(t, DType::BF16), DType::F32); };
  const Tensor x2 = reshape(x, Shape{40, 300}), g2 = reshape(g, Shape{40, 70});
  EXPECT_TRUE(close(reshape(x.grad(), Shape{40, 300}), matmul(r(g2), r(master)), 1e-4, 1e-4));
  EXPECT_TRUE(close(master.grad(), matmul(transpose(r(g2), 0, 1), r(x2)), 1e-4, 1e-4));
}

TEST(GemmBf16, PromptsOfABf16WeightEqualTheirRowsOneAtATime) {
  SKIP_WITHOUT_BF16();
  // 40 rows take the prompt path (gemm_bf16); one row alone the decode path (dot products of
  // the same rounded values): the same function, the sums in another order.
  const Tensor w = cast(randn_t(Shape{70, 300}, 41, 0.1f), DType::BF16);
  const Tensor x = randn_t(Shape{40, 300}, 42);
  const Tensor y = linear(x, w, Tensor());
  for (int64_t r : {0, 13, 39}) {
    const Tensor row = linear(slice(x, 0, r, r + 1), w, Tensor());
    EXPECT_TRUE(close(slice(y, 0, r, r + 1), row, 1e-4, 1e-4)) << "row " << r;
  }
}
