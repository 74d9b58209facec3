// gemm_half (backend/cpu/gemm_half.h): each element of c is one chain of f32 fused
// multiply-adds along k in order, so std::fma recomputes its bits exactly; checked in both
// forms (AVX-512 where the CPU has it, AVX2), for F16 and BF16 halves, every layout of b, the
// edges of its tiles, panels and k blocks, accumulation, and any thread count; then the
// products that reach it (an F16 or BF16 weight's prompt, and the backward through one); and
// gemm_weight_rows, the same tiles over block-type weights decoded as they are packed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gemm_test_helpers.h"
#include "helpers.h"
#include "toy/backend/cpu/gemm_bf16.h"
#include "toy/backend/cpu/gemm_half.h"
#include "toy/backend/cpu/gemv_blocks.h"
#include "toy/backend/cpu/variant.h"
#include "toy/core/cpu_features.h"
#include "toy/core/dtype.h"
#include "toy/core/quant.h"
#include "toy/core/thread_pool.h"

using namespace toy;
using namespace toy::test;

namespace {

float half_value(uint16_t h, DType t) { return t == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h); }
uint16_t to_half(float x, DType t) { return t == DType::F16 ? f32_to_f16(x) : f32_to_bf16(x); }

// b [K, N] of halves stored as a weight [N, K] (k contiguous), as [K, N] (columns contiguous),
// or with neither stride 1; gaps hold a NaN's bits (of the type): read one and it shows.
enum class Layout { WeightRows, KRows, Strided };
struct HalfMatrix {
  std::vector<uint16_t> bits;
  cpu::HalfOperand op;
  float at(int64_t k, int64_t j) const { return half_value(op.p[k * op.k_stride + j * op.j_stride], op.type); }
};
HalfMatrix make_b(int64_t K, int64_t N, DType t, Layout l, uint64_t seed) {
  HalfMatrix m;
  m.op.type = t;
  if (l == Layout::WeightRows) m.op.k_stride = 1, m.op.j_stride = K;
  if (l == Layout::KRows) m.op.k_stride = N, m.op.j_stride = 1;
  if (l == Layout::Strided) m.op.k_stride = 2, m.op.j_stride = 2 * K + 3;
  const int64_t size = l == Layout::Strided ? N * (2 * K + 3) : K * N;
  m.bits.assign(size_t(std::max<int64_t>(size, 1)), t == DType::F16 ? 0x7e00 : 0x7fc0);
  std::mt19937 rng{uint32_t(seed)};
  std::normal_distribution<float> normal;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j) m.bits[size_t(k * m.op.k_stride + j * m.op.j_stride)] = to_half(normal(rng), t);
  m.op.p = m.bits.data();
  return m;
}

// What gemm_half promises: c = fma(a(i, k), b(k, j), c) for k in order, from 0 or c.
std::vector<float> fma_chains(int64_t M, int64_t N, int64_t K, const std::vector<float>& a, int64_t lda,
                              const HalfMatrix& b, const std::vector<float>& c0, int64_t ldc, bool accumulate) {
  std::vector<float> c = c0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float s = accumulate ? c0[size_t(i * ldc + j)] : 0.0f;
      for (int64_t k = 0; k < K; ++k) s = std::fma(a[size_t(i * lda + k)], b.at(k, j), s);
      c[size_t(i * ldc + j)] = s;
    }
  return c;
}

// Tiles 12 x 32 (AVX-512) and 6 x 16 (AVX2), row blocks of 96, k blocks of 256, groups of 8
// panels: each shape reaches some edge of them (last panels of 1 to 31 columns included).
const Shape3 kShapes[] = {{1, 1, 1},     {5, 7, 3},      {13, 33, 9},   {12, 32, 256}, {6, 17, 257},
                          {97, 65, 300}, {25, 100, 513}, {3, 1100, 20}, {40, 48, 8},   {7, 57, 40},
                          {9, 31, 33}};

// One thread, so that a chunk holds every panel: more than one group of 8.
struct OneThread {
  int before = num_threads();
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(before); }
};
// The integer prompt products off (a CPU without VNNI), for the scope.
struct NoVnni {
  NoVnni() { cpu::gemv_use_vnni(false); }
  ~NoVnni() { cpu::gemv_use_vnni(true); }
};

}  // namespace

TEST(GemmHalf, EachElementIsOneFmaChainAlongKInEveryFormLayoutAndEdge) {
  for (bool avx512 : forms_here()) {
    FormScope form(avx512);
    for (DType t : {DType::F16, DType::BF16})
      for (Layout l : {Layout::WeightRows, Layout::KRows, Layout::Strided})
        for (const Shape3& s : kShapes)
          for (bool accumulate : {false, true}) {
            const int64_t lda = s.K + 2, ldc = s.N + 3;  // gaps in a and c
            const HalfMatrix b = make_b(s.K, s.N, t, l, 7 + s.K);
            const std::vector<float> a = random_floats(size_t(s.M * lda), 11 + s.M);
            std::vector<float> c = random_floats(size_t(s.M * ldc), 13 + s.N);
            const std::vector<float> want = fma_chains(s.M, s.N, s.K, a, lda, b, c, ldc, accumulate);
            cpu::gemm_half(s.M, s.N, s.K, a.data(), lda, b.op, c.data(), ldc, accumulate);
            EXPECT_TRUE(same_bits(c, want)) << (avx512 ? "AVX-512" : "AVX2") << " " << name(t) << " layout "
                                            << int(l) << " " << s.M << "x" << s.N << "x" << s.K << " accumulate "
                                            << accumulate;
          }
  }
}

TEST(GemmHalf, EmptyKWritesZerosOrLeavesC) {
  const HalfMatrix b = make_b(0, 5, DType::F16, Layout::KRows, 1);
  const std::vector<float> a(4, 1.0f);
  std::vector<float> c(20, 3.0f);
  cpu::gemm_half(4, 5, 0, a.data(), 1, b.op, c.data(), 5, true);
  EXPECT_EQ(c, std::vector<float>(20, 3.0f));
  cpu::gemm_half(4, 5, 0, a.data(), 1, b.op, c.data(), 5, false);
  EXPECT_EQ(c, std::vector<float>(20, 0.0f));
}

TEST(GemmHalf, WidensSubnormalInfiniteAndNanHalvesExactly) {
  // A row of a picks one k; c(0, j) = b(k, j) * 1 must be b's value itself.
  for (bool avx512 : forms_here()) {
    FormScope form(avx512);
    for (DType t : {DType::F16, DType::BF16}) {
      const std::vector<uint16_t> special = t == DType::F16
                                                ? std::vector<uint16_t>{0x0001, 0x03ff, 0x8001, 0x7c00, 0xfc00, 0x7bff, 0x8000, 0x7e00, 0xfe01}
                                                : std::vector<uint16_t>{0x0001, 0x007f, 0x8001, 0x7f80, 0xff80, 0x7f7f, 0x8000, 0x7fc0, 0xffc1};
      const int64_t N = int64_t(special.size()), K = 3;
      HalfMatrix b = make_b(K, N, t, Layout::WeightRows, 3);
      for (int64_t j = 0; j < N; ++j) b.bits[size_t(j * K + 1)] = special[size_t(j)];
      const std::vector<float> a{0.0f, 1.0f, 0.0f};
      std::vector<float> c(size_t(N), 5.0f);
      cpu::gemm_half(1, N, K, a.data(), K, b.op, c.data(), N, false);
      for (int64_t j = 0; j < N; ++j) {
        const float want = half_value(special[size_t(j)], t) + 0.0f;  // 0 * finite + 0 first
        EXPECT_EQ(std::memcmp(&c[size_t(j)], &want, 4), 0) << name(t) << " lane " << j << ": " << c[size_t(j)];
      }
    }
  }
}

TEST(GemmHalf, GivesTheSameBitsForAnyThreadCountAndBothForms) {
  const int threads = num_threads();
  const HalfMatrix b = make_b(300, 200, DType::F16, Layout::WeightRows, 21);
  const std::vector<float> a = random_floats(70 * 300, 22);
  std::vector<std::vector<float>> results;
  for (bool avx512 : forms_here()) {
    FormScope form(avx512);
    for (int n : {1, 2, 3, 8}) {
      set_num_threads(n);
      std::vector<float> c(70 * 200);
      cpu::gemm_half(70, 200, 300, a.data(), 300, b.op, c.data(), 200, false);
      results.push_back(c);
    }
  }
  set_num_threads(threads);
  for (size_t r = 1; r < results.size(); ++r) EXPECT_TRUE(same_bits(results[r], results[0])) << "run " << r;
}

TEST(GemmHalf, FewPanelsOnManyThreadsSplitTheRowsWithTheSameBits) {
  // 40 columns (2 panels) on 8 threads: the 500 rows go in parts (5 of them here, one per 96
  // rows at most); F16 through gemm_half, Q8_0 through gemm_weight_rows.
  const int threads = num_threads();
  const HalfMatrix b = make_b(300, 40, DType::F16, Layout::WeightRows, 31);
  const std::vector<float> a = random_floats(500 * 300, 32);
  const std::vector<float> want = fma_chains(500, 40, 300, a, 300, b, std::vector<float>(500 * 40), 40, false);
  std::vector<uint8_t> q(row_bytes(DType::Q8_0, 512) * 40);
  const std::vector<float> qv = random_floats(40 * 512, 33), a2 = random_floats(500 * 512, 34);
  for (int r = 0; r < 40; ++r) quantize_row(DType::Q8_0, qv.data() + r * 512, q.data() + r * row_bytes(DType::Q8_0, 512), 512);
  const cpu::WeightRows w{q.data(), DType::Q8_0, 40, 512, row_bytes(DType::Q8_0, 512)};
  std::vector<std::vector<float>> qc;
  for (int n : {1, 8}) {
    set_num_threads(n);
    std::vector<float> c(500 * 40);
    cpu::gemm_half(500, 40, 300, a.data(), 300, b.op, c.data(), 40, false);
    EXPECT_TRUE(same_bits(c, want)) << n << " threads";
    qc.emplace_back(500 * 40);
    cpu::gemm_weight_rows(500, a2.data(), 512, w, qc.back().data(), 40, false);
  }
  set_num_threads(threads);
  EXPECT_TRUE(same_bits(qc[0], qc[1]));
}

TEST(GemmHalf, OneThreadRunsSeveralGroupsOfPanelsAndKBlocks) {
  // 600 columns: 19 panels, three groups on one thread; K 700: three k blocks, the last partial.
  const OneThread one;
  for (bool avx512 : forms_here()) {
    FormScope form(avx512);
    for (DType t : {DType::F16, DType::BF16}) {
      const HalfMatrix b = make_b(700, 600, t, Layout::WeightRows, 23);
      const std::vector<float> a = random_floats(30 * 700, 24);
      std::vector<float> c = random_floats(30 * 600, 25);
      const std::vector<float> want = fma_chains(30, 600, 700, a, 700, b, c, 600, true);
      cpu::gemm_half(30, 600, 700, a.data(), 700, b.op, c.data(), 600, true);
      EXPECT_TRUE(same_bits(c, want)) << (avx512 ? "AVX-512 " : "AVX2 ") << name(t);
    }
  }
}

TEST(GemmHalf, PromptsOfHalfWeightsAreTheChainsOverTheRoundedActivations) {
  // 40 rows: the prompt path. The activations are rounded to the weight's type first (as the
  // decode path and llama.cpp round them), then multiplied by gemm_half.
  for (DType t : {DType::F16, DType::BF16}) {
    if (t == DType::BF16 && cpu::gemm_bf16_available()) continue;  // gemm_bf16's (its tests)
    const Tensor w = cast(randn_t(Shape{70, 300}, 41, 0.1f), t);
    const Tensor x = randn_t(Shape{40, 300}, 42);
    const Tensor y = linear(x, w, Tensor());
    HalfMatrix b;
    b.op = {static_cast<const uint16_t*>(w.raw_data()), t, 1, 300};
    std::vector<float> a(40 * 300);
    for (size_t i = 0; i < a.size(); ++i) a[i] = half_value(to_half(x.data<float>()[i], t), t);
    const std::vector<float> want = fma_chains(40, 70, 300, a, 300, b, std::vector<float>(40 * 70), 70, false);
    EXPECT_TRUE(same_bits(std::vector<float>(y.data<float>(), y.data<float>() + 40 * 70), want)) << name(t);
  }
}

TEST(GemmHalf, BackwardThroughAFrozenHalfWeightIsTheChainsOverItsRows) {
  // dx = g W for a weight that takes no gradient (a LoRA base): g as it is, W's rows as k.
  for (DType t : {DType::F16, DType::BF16}) {
    if (t == DType::BF16 && cpu::gemm_bf16_available()) continue;
    const Tensor w = cast(randn_t(Shape{70, 300}, 51, 0.1f), t);
    const Tensor x = param(randn_t(Shape{40, 300}, 52));
    const Tensor g = randn_t(Shape{40, 70}, 53);
    backward(linear(x, w, Tensor()), g);
    HalfMatrix b;
    b.op = {static_cast<const uint16_t*>(w.raw_data()), t, 300, 1};
    const std::vector<float> ga(g.data<float>(), g.data<float>() + 40 * 70);
    const std::vector<float> want = fma_chains(40, 300, 70, ga, 70, b, std::vector<float>(40 * 300), 300, false);
    EXPECT_TRUE(same_bits(std::vector<float>(x.grad().data<float>(), x.grad().data<float>() + 40 * 300), want))
        << name(t);
  }
}

namespace {

// A weight [N, K] of block type t: random rows quantized (Q2_K and Q3_K, which toy does not
// encode: random bytes with small f16 scales, as the formats lay them out).
std::vector<uint8_t> block_weight(DType t, int64_t N, int64_t K, uint64_t seed) {
  const size_t rb = row_bytes(t, K);
  std::vector<uint8_t> w(rb * size_t(N));
  std::mt19937 rng{uint32_t(seed)};
  if (t == DType::Q2_K || t == DType::Q3_K) {
    const size_t block = row_bytes(t, 256);
    for (auto& byte : w) byte = uint8_t(rng());
    for (size_t b = 0; b < w.size(); b += block) {
      const uint16_t d = f32_to_f16(0.01f), dmin = f32_to_f16(0.002f);
      std::memcpy(&w[b + block - (t == DType::Q2_K ? 4 : 2)], &d, 2);
      if (t == DType::Q2_K) std::memcpy(&w[b + block - 2], &dmin, 2);
    }
    return w;
  }
  const std::vector<float> v = random_floats(size_t(N * K), seed);
  for (int64_t r = 0; r < N; ++r) quantize_row(t, v.data() + r * K, w.data() + size_t(r) * rb, K);
  return w;
}

}  // namespace

TEST(GemmHalf, BlockWeightsAreFmaChainsOverTheirDecodedRowsInBothForms) {
  const DType types[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                         DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  struct Case {
    int64_t M, N, K;
  };
  // K past one k block of 256 and ending inside the next (288: 32-blocks), several panels
  // and a partial one, tile-row edges.
  // (300 columns on one thread: 10 panels of f32, two groups.)
  const Case cases[] = {{1, 1, 256}, {13, 33, 512}, {97, 70, 768}, {7, 65, 288}, {5, 300, 512}};
  const OneThread one;
  for (bool avx512 : forms_here()) {
    FormScope form(avx512);
    for (DType t : types)
      for (const Case& s : cases) {
        if (s.K % dtype_info(t).block_size != 0) continue;
        const std::vector<uint8_t> w = block_weight(t, s.N, s.K, 5 + s.K);
        const size_t rb = row_bytes(t, s.K);
        // The reference: every row decoded, as b(k, j) = row j's k-th value (an F32 b via KRows
        // would need halves: compare against the chains directly).
        std::vector<float> decoded(size_t(s.N * s.K));
        for (int64_t j = 0; j < s.N; ++j) row_to_f32(t, w.data() + size_t(j) * rb, decoded.data() + j * s.K, s.K);
        const std::vector<float> a = random_floats(size_t(s.M * s.K), 9 + s.M);
        for (bool accumulate : {false, true}) {
          std::vector<float> c = random_floats(size_t(s.M * s.N), 17);
          std::vector<float> want = c;
          for (int64_t i = 0; i < s.M; ++i)
            for (int64_t j = 0; j < s.N; ++j) {
              float sum = accumulate ? c[size_t(i * s.N + j)] : 0.0f;
              for (int64_t k = 0; k < s.K; ++k) sum = std::fma(a[size_t(i * s.K + k)], decoded[size_t(j * s.K + k)], sum);
              want[size_t(i * s.N + j)] = sum;
            }
          cpu::gemm_weight_rows(s.M, a.data(), s.K, {w.data(), t, s.N, s.K, rb}, c.data(), s.N, accumulate);
          EXPECT_TRUE(same_bits(c, want)) << (avx512 ? "AVX-512 " : "AVX2 ") << name(t) << " " << s.M << "x" << s.N
                                          << "x" << s.K << " accumulate " << accumulate;
        }
      }
  }
}

TEST(GemmHalf, AvxTwoPromptsOfBlockWeightsTakeTheTilesOverTheRoundedActivations) {
  // Forced to AVX2 without VNNI (a Zen 3): a Q8_0 or Q4_K prompt is no integer product there.
  FormScope form(false);
  const NoVnni no_vnni;
  for (DType t : {DType::Q8_0, DType::Q4_K}) {
    const int64_t N = 70, K = 512, M = 40;
    const std::vector<uint8_t> bytes = block_weight(t, N, K, 61);
    Tensor w = empty(Shape{N, K}, t);
    std::memcpy(w.raw_data(), bytes.data(), bytes.size());
    const Tensor x = randn_t(Shape{M, K}, 62);
    const Tensor y = linear(x, w, Tensor());
    std::vector<float> a(size_t(M * K)), decoded(size_t(N * K));
    for (int64_t i = 0; i < M; ++i) cpu::round_activations(t, x.data<float>() + i * K, K, a.data() + i * K);
    const size_t rb = row_bytes(t, K);
    for (int64_t j = 0; j < N; ++j) row_to_f32(t, bytes.data() + size_t(j) * rb, decoded.data() + j * K, K);
    std::vector<float> want(size_t(M * N));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float sum = 0.0f;
        for (int64_t k = 0; k < K; ++k) sum = std::fma(a[size_t(i * K + k)], decoded[size_t(j * K + k)], sum);
        want[size_t(i * N + j)] = sum;
      }
    EXPECT_TRUE(same_bits(std::vector<float>(y.data<float>(), y.data<float>() + M * N), want)) << name(t);
  }
}
