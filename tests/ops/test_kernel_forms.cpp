// The kernel forms of one process (backend/cpu/variant.h): the AVX-512 forms of the float
// kernels give the AVX2 forms' bits (README: a sequence gets the same bits on any of these
// CPUs), and the paths a kernel takes for large tensors (streaming stores, pipelined rows)
// give the bits of its row-by-row path. On a CPU without AVX-512 the comparison of forms has
// one side; the other checks still run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "helpers.h"
#include "toy/backend/cpu/block_gemm.h"
#include "toy/backend/cpu/variant.h"
#include "toy/core/cpu_features.h"

using namespace toy;
using namespace toy::test;

namespace {

// Back to the variant's forms however the test leaves.
struct FormsRestore {
  ~FormsRestore() { cpu::use_avx512_forms(true); }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, std::string* where) {
  if (a.size() != b.size()) {
    *where = "sizes differ";
    return false;
  }
  // Any NaN equals any NaN: which operand's NaN a product returns (and so its sign) follows
  // the operand order the compiler picked for a commutative operation, form by form.
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && !(std::isnan(a[i]) && std::isnan(b[i]))) {
      *where = "element " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
      return false;
    }
  return true;
}

// Says, once per test, when the comparison of forms has one side (a CPU without AVX-512, or
// TOY_CPU=avx2): a green run there says nothing about the AVX-512 forms.
void note_if_one_form() {
  if (kernel_variant() != KernelVariant::Avx512)
    std::printf("[   NOTE   ] the AVX-512 forms do not run here: both sides of the comparison are the AVX2 forms\n");
}

// f on the AVX2 forms and on the variant's (the AVX-512 ones where the CPU has them).
template <class F>
std::pair<std::vector<float>, std::vector<float>> both_forms(F&& f) {
  note_if_one_form();
  FormsRestore restore;
  cpu::use_avx512_forms(false);
  std::vector<float> narrow = f();
  cpu::use_avx512_forms(true);
  return {narrow, f()};
}

// Rows with what softmax must survive: a fully masked row, a row with one huge logit, rows
// of exps that underflow to zero, one crossing the point where they start to.
Tensor softmax_input(int64_t rows, int64_t D) {
  std::vector<float> v = randn_t(Shape{rows, D}, 11, 6.0f).to_f32_vector();
  for (int64_t j = 0; j < D; ++j) v[size_t(3 * D + j)] = -INFINITY;
  v[size_t(5 * D + 7)] = 1e4f;
  for (int64_t j = 0; j < D; j += 3) v[size_t(9 * D + j)] = -120.0f;
  // Shifted scores from -80 to -90 in fine steps: across exp's flush to zero below -87.34.
  for (int64_t j = 0; j < D; ++j) v[size_t(10 * D + j)] = j == 0 ? 0.0f : -80.0f - 10.0f * float(j) / float(D);
  return from_vector(v, Shape{rows, D});
}

}  // namespace

// Outputs of 16 MB and more take streaming stores through a software pipeline (row r stored
// while row r + 1's exps run): it must give the bits of one row alone, in both forms, at a
// width of 16-lane blocks and at one with an 8-lane tail, for two scales.
TEST(KernelForms, StreamingSoftmaxEqualsOneRowAloneInBothForms) {
  for (int64_t D : {int64_t(4096), int64_t(4104)}) {
    const int64_t rows = (int64_t(16) << 20) / (4 * D) + 3;  // just past the streaming threshold
    const Tensor x = softmax_input(rows, D);
    const std::vector<float> xv = x.to_f32_vector();
    for (float scale : {1.0f, 0.37f}) {
      SCOPED_TRACE("D " + std::to_string(D) + " scale " + std::to_string(scale));
      auto [narrow, wide] = both_forms([&] { return softmax(x, scale).to_f32_vector(); });
      std::string where;
      EXPECT_TRUE(same_bits(narrow, wide, &where)) << "AVX2 vs AVX-512 forms: " << where;
      for (int64_t r : {int64_t(0), int64_t(2), int64_t(3), int64_t(5), int64_t(9), int64_t(10), rows / 2, rows - 1}) {
        const std::vector<float> alone = softmax(slice(x, 0, r, r + 1), scale).to_f32_vector();
        const std::vector<float> in_big(wide.begin() + r * D, wide.begin() + (r + 1) * D);
        EXPECT_TRUE(same_bits(alone, in_big, &where)) << "row " << r << " alone vs streamed: " << where;
      }
      // And the values: a double-precision softmax, within float rounding of the exp.
      for (int64_t r : {int64_t(1), int64_t(5), int64_t(9), rows - 2}) {
        const std::vector<float> row(xv.begin() + r * D, xv.begin() + (r + 1) * D);
        double mx = -INFINITY, sum = 0;
        for (float v : row) mx = std::max(mx, double(v) * scale);
        for (float v : row) sum += std::exp(double(v) * scale - mx);
        for (int64_t j = 0; j < D; ++j) {
          const double want = std::exp(double(row[size_t(j)]) * scale - mx) / sum;
          ASSERT_NEAR(wide[size_t(r * D + j)], want, 1e-5 * want + 1e-30) << "row " << r << " column " << j;
        }
      }
      for (int64_t j = 0; j < D; ++j) ASSERT_EQ(wide[size_t(3 * D + j)], 0.0f) << "fully masked row, column " << j;
    }
  }
}

// block_gemm (fused attention's tile products): every element is one chain of FMAs over k
// from 0, scaled by alpha and added to beta * C — checked bit for bit against that chain
// written here with std::fma, in both forms, for every row and column remainder of the
// register tiles, A plain and transposed, beta 0 (C not read: NaN there must not leak), 1
// and another; the columns of C past N stay untouched.
TEST(KernelForms, BlockGemmIsOneChainOfFmasPerElementInBothForms) {
  FormsRestore restore;
  const int64_t Ks[] = {0, 1, 16, 67};
  const int64_t Ms[] = {1, 2, 3, 4, 5, 6, 7, 12, 16, 17};
  const int64_t Ns[] = {1, 7, 8, 9, 16, 17, 24, 40, 63, 64, 65, 100, 256};
  note_if_one_form();
  std::vector<float> src = randn_t(Shape{17 * 67 + 300 * 67}, 21).to_f32_vector();
  for (bool wide : {false, true}) {
    cpu::use_avx512_forms(wide);
    for (bool trans : {false, true})
      for (int64_t M : Ms)
        for (int64_t N : Ns)
          for (int64_t K : Ks)
            for (float beta : {0.0f, 1.0f, 0.3f}) {
              const float alpha = K == 16 ? 0.125f : K == 67 ? 0.37f : 1.0f;
              const int64_t lda = (trans ? M : K) + 3, ldb = N + 5, ldc = N + 2;
              const float* a = src.data();
              const float* b = src.data() + 17 * 67;
              std::vector<float> c(size_t(M * ldc)), want(c.size());
              for (size_t i = 0; i < c.size(); ++i) c[i] = want[i] = float(i % 13) - 6.0f;
              if (beta == 0.0f)
                for (int64_t i = 0; i < M; ++i)
                  for (int64_t j = 0; j < N; ++j) c[size_t(i * ldc + j)] = NAN;
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) {
                  float acc = 0.0f;
                  for (int64_t k = 0; k < K; ++k)
                    acc = std::fma(trans ? a[k * lda + i] : a[i * lda + k], b[k * ldb + j], acc);
                  float& w = want[size_t(i * ldc + j)];
                  w = beta == 0.0f ? acc * alpha : std::fma(acc, alpha, beta * w);
                }
              cpu::block_gemm(trans, M, N, K, alpha, a, lda, b, ldb, beta, c.data(), ldc);
              std::string where;
              ASSERT_TRUE(same_bits(want, c, &where))
                  << (wide ? "variant" : "AVX2") << " form, trans " << trans << " M " << M << " N " << N << " K " << K
                  << " beta " << beta << ": " << where;
            }
  }
}

// Fused attention forward and backward give the same bits in both forms: GQA, causal and not,
// a sliding window, head dims with and without a 16-lane tail, more keys than one chunk, and
// one query row (decoding's path).
TEST(KernelForms, AttentionForwardAndBackwardGiveTheSameBitsInBothForms) {
  struct Case {
    int64_t T, S, D, Dv;
    bool causal;
    int64_t window;
  };
  for (const Case& cs : {Case{37, 37, 64, 64, true, 0}, Case{300, 300, 40, 24, true, 0}, Case{21, 45, 64, 80, false, 0},
                         Case{70, 70, 64, 64, true, 19}, Case{1, 45, 36, 44, true, 0}, Case{1, 300, 64, 64, true, 0}}) {
    SCOPED_TRACE("T " + std::to_string(cs.T) + " D " + std::to_string(cs.D));
    AttentionOptions o;
    o.causal = cs.causal;
    o.window = cs.window;
    auto run = [&] {
      Tensor q = param(randn_t(Shape{2, cs.T, 4, cs.D}, 31)), k = param(randn_t(Shape{2, cs.S, 2, cs.D}, 32)),
             v = param(randn_t(Shape{2, cs.S, 2, cs.Dv}, 33));
      Tensor y = attention(q, k, v, o);
      auto g = grad(y, {q, k, v}, randn_t(y.shape(), 34));
      std::vector<float> all = y.to_f32_vector();
      for (const Tensor& t : g) {
        std::vector<float> tv = t.to_f32_vector();
        all.insert(all.end(), tv.begin(), tv.end());
      }
      return all;
    };
    auto [narrow, wide] = both_forms(run);
    std::string where;
    EXPECT_TRUE(same_bits(narrow, wide, &where)) << where;
  }
}

// AdamW (one parameter, and an arena's ranges with and without decay): the same bits in both
// forms over three steps, for lengths with a 16-lane, an 8-lane and a scalar tail, with
// moments that start at zero and gradients spanning magnitudes (tiny second moments are
// where the eps and the square root decide).
TEST(KernelForms, AdamWGivesTheSameBitsInBothForms) {
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(16), int64_t(24), int64_t(40003)}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<float> gv = randn_t(Shape{n}, 31).to_f32_vector();
    for (size_t i = 0; i < gv.size(); ++i) gv[i] *= std::ldexp(1.0f, int(i % 41) - 30);
    const Tensor g = from_vector(gv, Shape{n}), p0 = randn_t(Shape{n}, 32);
    const AdamWOptions o{0.9f, 0.95f, 1e-8f, 0.1f};
    // Two ranges with a gap (the element between stays), or one for the shortest lengths.
    const std::vector<ArenaRange> ranges =
        n < 3 ? std::vector<ArenaRange>{{0, n, true}} : std::vector<ArenaRange>{{0, n / 3, true}, {n / 3 + 1, n, false}};
    for (bool arena : {false, true}) {
      auto [narrow, wide] = both_forms([&] {
        Tensor p = contiguous_copy(p0), m = zeros(Shape{n}), v = zeros(Shape{n});
        for (int step = 1; step <= 3; ++step) {
          const Tensor lr = scalar(0.01 * step), t = scalar(double(step));
          if (arena)
            adamw_step_ranges(p, g, m, v, lr, t, o, ranges);
          else
            adamw_step(p, g, m, v, lr, t, o);
        }
        std::vector<float> all = p.to_f32_vector(), mv = m.to_f32_vector(), vv = v.to_f32_vector();
        all.insert(all.end(), mv.begin(), mv.end());
        all.insert(all.end(), vv.begin(), vv.end());
        return all;
      });
      std::string where;
      EXPECT_TRUE(same_bits(narrow, wide, &where)) << (arena ? "ranges: " : "one parameter: ") << where;
    }
  }
}

// The activations with AVX-512 forms (sigmoid, SiLU, GELU tanh, SwiGLU in both its forms),
// forward and backward: the same bits in both forms, for lengths with a 16-lane, an 8-lane
// and a padded tail, over values that reach every branch (both signs, ±0, the sigmoid's
// saturation, exp's flush to zero, ±inf, NaN).
TEST(KernelForms, ActivationsGiveTheSameBitsInBothForms) {
  const std::vector<float> special = {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.5f, 15.0f, -15.0f, 88.0f, -88.0f,
                                      100.0f, -100.0f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN, -NAN};
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(16), int64_t(17), int64_t(24), int64_t(40003)}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<float> xv = randn_t(Shape{2 * n}, 41, 4.0f).to_f32_vector();
    for (size_t i = 0; i < xv.size(); i += 7) xv[i] = special[(i / 7) % special.size()];
    const Tensor x2 = from_vector(xv, Shape{2, n}), w = randn_t(Shape{2, n}, 42);
    const Tensor half = randn_t(Shape{n}, 43);
    auto run = [&](const std::function<Tensor(const Tensor&)>& f, const Tensor& input) {
      return both_forms([&] {
        Tensor p = input.detach();
        p.requires_grad_(true);
        const Tensor y = f(p);
        Tensor wy = slice(reshape(w, Shape{2 * n}), 0, 0, y.numel());
        sum(mul(y, reshape(wy, y.shape()))).backward();
        std::vector<float> all = y.to_f32_vector(), g = p.grad().to_f32_vector();
        all.insert(all.end(), g.begin(), g.end());
        return all;
      });
    };
    const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> cases = {
        {"sigmoid", [](const Tensor& t) { return sigmoid(t); }},
        {"silu", [](const Tensor& t) { return silu(t); }},
        {"gelu", [](const Tensor& t) { return gelu(t, GeluApprox::Tanh); }},
        {"swiglu packed", [&](const Tensor& t) { return swiglu(reshape(t, Shape{1, 2 * n})); }},
        {"swiglu", [](const Tensor& t) { return swiglu(slice(t, 0, 0, 1), slice(t, 0, 1, 2)); }},
        {"swiglu (up)", [&](const Tensor& t) { return swiglu(reshape(half, Shape{1, n}), slice(t, 0, 1, 2)); }},
    };
    for (const auto& [what, f] : cases) {
      auto [narrow, wide] = run(f, x2);
      std::string where;
      EXPECT_TRUE(same_bits(narrow, wide, &where)) << what << ": " << where;
    }
  }
}

// SwiGLU of packed halves with an output of 16 MB and more takes streaming stores: the bits
// of each row alone (no streaming there), in both forms.
TEST(KernelForms, StreamingSwigluEqualsOneRowAloneInBothForms) {
  const int64_t F = 4096, rows = (int64_t(16) << 20) / (4 * F) + 3;  // just past the threshold
  const Tensor x = randn_t(Shape{rows, 2 * F}, 51, 3.0f);
  auto [narrow, wide] = both_forms([&] { return swiglu(x).to_f32_vector(); });
  std::string where;
  EXPECT_TRUE(same_bits(narrow, wide, &where)) << "AVX2 vs AVX-512 forms: " << where;
  for (int64_t r : {int64_t(0), int64_t(1), rows / 2, rows - 1}) {
    const std::vector<float> alone = swiglu(slice(x, 0, r, r + 1)).to_f32_vector();
    const std::vector<float> in_big(wide.begin() + r * F, wide.begin() + (r + 1) * F);
    EXPECT_TRUE(same_bits(alone, in_big, &where)) << "row " << r << " alone vs streamed: " << where;
  }
}

// The cast to bf16 (16 elements a step, then one at a time) rounds every class of f32 as
// f32_to_bf16 does: ties to even, values that round up to infinity, subnormals, infinities,
// NaNs quieted with their payload's top bits, at every position of a step and of the tail.
TEST(KernelForms, CastToBf16RoundsEveryClassAsTheScalarForm) {
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u, 0x3f808000u,
                              0x3f818000u, 0xbf808000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,
                              0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00000u, 0x7fbfffffu, 0x3f807fffu};
  std::vector<uint32_t> bits;
  uint64_t state = 12345;
  for (int i = 0; i < 1000 + 7; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    bits.push_back(i % 3 == 0 ? special[size_t(i / 3) % std::size(special)] : uint32_t(state >> 32));
  }
  Tensor x = empty(Shape{int64_t(bits.size())}, DType::F32);
  std::memcpy(x.data<float>(), bits.data(), bits.size() * 4);
  const Tensor y = cast(x, DType::BF16);
  for (size_t i = 0; i < bits.size(); ++i) {
    float f;
    std::memcpy(&f, &bits[i], 4);
    ASSERT_EQ(y.data<bf16>()[i].bits, f32_to_bf16(f)) << "element " << i << ", bits " << std::hex << bits[i];
  }
}
