// The training kernels' shared math (backend/cuda/train_launch.h: the lr schedule, AdamW, SGD
// and RoPE's angles and rotation), compiled for the host, against the CPU kernels: the same
// bits, element for element. The GPU runs the same functions with the same explicitly
// rounded operations; only its libm (pow, cos, sin in double) may differ in the last bit.
//
// One caveat: GCC contracts a * b + c into an FMA in C++ under -mfma even in ISO mode (its
// -std=c++20 turns contraction off for C only), and the CPU kernels are built with -mfma. When
// their scalar code fuses (probed below), it rounds once where this math, like the CPU's own
// vector code, rounds twice: then the results are only asked to agree within 1e-6 relative
// (as the GPU tests do); built with -ffp-contract=off they agree bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "toy/backend/cuda/train_launch.h"
#include "toy/core/rng.h"
#include "toy/ops/ops.h"

using namespace toy;
namespace shared = toy::cuda::tmath;

namespace {

// Whether the CPU kernels' scalar code fuses: p - lr * g with p = 1, g = 3, lr = fl(1/3) is 0
// rounded twice (lr * g rounds to 1) and -2^-25 fused.
bool cpu_kernels_fuse() {
  static const bool fuse = [] {
    Tensor p = full(Shape{1}, 1.0), g = full(Shape{1}, 3.0), none;
    sgd_step(p, g, none, full(Shape{}, double(1.0f / 3.0f)), SgdOptions{});
    return p.to_f32_vector()[0] != 0.0f;
  }();
  return fuse;
}

void expect_bits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const bool exact = !cpu_kernels_fuse();
  int shown = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = exact ? std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i])
                            : std::fabs(double(got[i]) - want[i]) <= 1e-6 * std::max(1.0, std::fabs(double(want[i])));
    if (!same && shown++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", the CPU has " << want[i]
                    << (exact ? " (bit for bit)" : " (within 1e-6: the CPU kernels fuse)");
  }
}

}  // namespace

TEST(CudaTrainMath, TheLrScheduleIsTheCpusBitForBit) {
  const LrSchedule schedules[] = {{0, 1, 1e-3f, 1e-4f}, {10, 100, 3e-4f, 3e-5f}, {7, 8, 0.1f, 0.0f},
                                  {100, 5000, 6e-4f, 6e-5f}, {3, 1000, 1.0f, 0.999f}};
  for (const LrSchedule& s : schedules)
    for (int64_t step = 0; step <= s.total + 3; step += (s.total > 200 ? 7 : 1)) {
      const float want = cosine_lr(step, s), got = shared::cosine_lr_hd(step, s.warmup, s.total, s.lr, s.min_lr);
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
          << "warmup " << s.warmup << " total " << s.total << " step " << step << ": " << got << " vs " << want;
    }
}

TEST(CudaTrainMath, AdamWElementsAreTheCpusBitForBit) {
  Generator g(31);
  const int64_t n = 1037;  // the CPU's vector body and its tail
  for (const float step : {1.0f, 2.0f, 17.0f, 1000.0f})
    for (const float wd : {0.0f, 0.1f}) {
      Tensor p = randn(Shape{n}, g), grad = randn(Shape{n}, g, 0.0f, 0.01f), m = randn(Shape{n}, g, 0.0f, 0.01f);
      Tensor v = rand(Shape{n}, g, 0.0f, 1e-4f);
      std::vector<float> hp = p.to_f32_vector(), hg = grad.to_f32_vector(), hm = m.to_f32_vector(),
                         hv = v.to_f32_vector();
      const AdamWOptions o{0.9f, 0.95f, 1e-8f, wd};
      adamw_step(p, grad, m, v, full(Shape{}, 3e-4), full(Shape{}, step), o);
      const cuda::AdamWConsts c = shared::adamw_consts(3e-4f, step, cuda::AdamWHyper{o.beta1, o.beta2, o.eps, wd});
      const float decay = shared::adamw_decay(c, wd);
      for (size_t i = 0; i < size_t(n); ++i) shared::adamw_element(hp[i], hg[i], hm[i], hv[i], c, decay);
      expect_bits(hp, p.to_f32_vector(), "param");
      expect_bits(hm, m.to_f32_vector(), "m");
      expect_bits(hv, v.to_f32_vector(), "v");
    }
}

TEST(CudaTrainMath, AdamWOverArenaRangesDecaysOnlyTheMarkedRanges) {
  Generator g(32);
  const int64_t n = 700;
  Tensor p = randn(Shape{n}, g), grad = randn(Shape{n}, g), m = zeros(Shape{n}), v = zeros(Shape{n});
  std::vector<float> hp = p.to_f32_vector(), hg = grad.to_f32_vector(), hm(size_t(n), 0.0f), hv(size_t(n), 0.0f);
  const std::vector<ArenaRange> ranges{{3, 100, true}, {100, 411, false}, {450, 451, true}, {500, 699, true}};
  const AdamWOptions o{0.9f, 0.999f, 1e-8f, 0.05f};
  adamw_step_ranges(p, grad, m, v, full(Shape{}, 1e-2), full(Shape{}, 4.0), o, ranges);
  const cuda::AdamWHyper h{o.beta1, o.beta2, o.eps, o.weight_decay};
  const cuda::AdamWConsts c = shared::adamw_consts(1e-2f, 4.0f, h);
  for (const ArenaRange& r : ranges)
    for (int64_t i = r.begin; i < r.end; ++i)
      shared::adamw_element(hp[size_t(i)], hg[size_t(i)], hm[size_t(i)], hv[size_t(i)], c,
                        shared::adamw_decay(c, r.decay ? o.weight_decay : 0.0f));
  expect_bits(hp, p.to_f32_vector(), "param");
  expect_bits(hm, m.to_f32_vector(), "m");
  expect_bits(hv, v.to_f32_vector(), "v");
}

TEST(CudaTrainMath, SgdElementsAreTheCpusBitForBit) {
  Generator g(33);
  const int64_t n = 515;
  const SgdOptions cases[] = {{0.0f, 0.0f, false}, {0.0f, 0.01f, false}, {0.9f, 0.0f, false}, {0.9f, 0.01f, true}};
  for (const SgdOptions& o : cases) {
    Tensor p = randn(Shape{n}, g), grad = randn(Shape{n}, g), buf = randn(Shape{n}, g);
    std::vector<float> hp = p.to_f32_vector(), hg = grad.to_f32_vector(), hb = buf.to_f32_vector();
    sgd_step(p, grad, buf, full(Shape{}, 0.05), o);
    for (int64_t i = 0; i < n; ++i)
      shared::sgd_element(hp[size_t(i)], hg[size_t(i)], o.momentum > 0 ? &hb[size_t(i)] : nullptr, 0.05f, o.momentum,
                      o.weight_decay, o.nesterov);
    expect_bits(hp, p.to_f32_vector(), "param");
    if (o.momentum > 0) expect_bits(hb, buf.to_f32_vector(), "momentum");
  }
}

namespace {

// The GPU kernel's loop on the host (rope.cu), from the shared functions: y [B, T, H, D].
std::vector<float> rope_from_shared_math(const std::vector<float>& x, int64_t B, int64_t T, int64_t H, int64_t D,
                                         const std::vector<int32_t>& pos, const std::vector<float>& ff,
                                         const RopeOptions& o, bool inverse) {
  const int n_dims = o.n_dims ? o.n_dims : int(D), half = n_dims / 2;
  const int64_t hb = o.heads_begin, he = o.heads_end < 0 ? H : o.heads_end;
  cuda::RopeTables tb;
  shared::rope_tables(n_dims, o.freq_base, o.freq_scale, o.ext_factor, o.attn_factor, o.beta_fast, o.beta_slow,
                  o.n_ctx_orig, tb);
  std::vector<float> y(x.size()), cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t p = pos.size() == size_t(T) ? pos[size_t(t)] : pos[size_t(b * T + t)];
      for (int i = 0; i < half; ++i) {
        const double theta = shared::rope_theta(p, tb.base_pow[i], ff.empty() ? nullptr : ff.data(), i, o.freq_scale,
                                            o.ext_factor, tb.ramp[i]);
        shared::rope_cos_sin(theta, tb.mscale, inverse ? -1.0f : 1.0f, cs[size_t(i)], sn[size_t(i)]);
      }
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const size_t row = size_t(((b * T + t) * H + h) * D);
          if (h < hb || h >= he || d >= n_dims) {
            y[row + size_t(d)] = x[row + size_t(d)];
            continue;
          }
          const int i = o.neox ? int(d < half ? d : d - half) : int(d / 2);
          const int64_t i0 = o.neox ? i : 2 * i, i1 = o.neox ? i + half : 2 * i + 1;
          const float x0 = x[row + size_t(i0)], x1 = x[row + size_t(i1)];
          y[row + size_t(d)] = d == i0 ? shared::rope_first(x0, x1, cs[size_t(i)], sn[size_t(i)])
                                       : shared::rope_second(x0, x1, cs[size_t(i)], sn[size_t(i)]);
        }
    }
  return y;
}

}  // namespace

TEST(CudaTrainMath, RopeAnglesAndRotationsAreTheCpusBitForBit) {
  Generator g(34);
  const int64_t B = 2, T = 5, H = 3, D = 24;
  struct Case {
    RopeOptions o;
    bool per_batch, factors;
    const char* what;
  };
  std::vector<Case> cases;
  cases.push_back({RopeOptions{}, false, false, "normal"});
  RopeOptions neox;
  neox.neox = true;
  neox.n_dims = 16;
  neox.freq_base = 500000.0f;
  cases.push_back({neox, true, true, "neox, partial, factors, per-batch positions"});
  RopeOptions yarn;
  yarn.freq_scale = 0.25f;
  yarn.ext_factor = 1.0f;
  yarn.attn_factor = 0.9f;
  yarn.beta_fast = 32.0f;
  yarn.beta_slow = 1.0f;
  yarn.n_ctx_orig = 4096;
  yarn.heads_begin = 1;
  yarn.heads_end = 2;
  cases.push_back({yarn, false, false, "yarn, one head rotated"});
  RopeOptions yarn_neox = yarn;
  yarn_neox.neox = true;
  yarn_neox.heads_end = -1;
  yarn_neox.n_dims = 20;
  cases.push_back({yarn_neox, true, true, "yarn neox with factors"});
  for (Case& c : cases) {
    Tensor x = randn(Shape{B, T, H, D}, g);
    std::vector<int32_t> pos;
    for (int64_t i = 0; i < (c.per_batch ? B * T : T); ++i) pos.push_back(int32_t((i * 7919) % 5000));
    Tensor pt = from_vector(pos, c.per_batch ? Shape{B, T} : Shape{T});
    std::vector<float> ff;
    if (c.factors) {
      const int half = (c.o.n_dims ? c.o.n_dims : int(D)) / 2;
      for (int i = 0; i < half; ++i) ff.push_back(1.0f + 0.37f * float(i % 5));
      c.o.freq_factors = from_vector(ff, Shape{int64_t(half)});
    }
    Tensor xg = x.detach().requires_grad_(true);
    Tensor y = rope(xg, pt, c.o);
    expect_bits(rope_from_shared_math(x.to_f32_vector(), B, T, H, D, pos, ff, c.o, false), y.to_f32_vector(), c.what);
    // The backward is the inverse rotation of the upstream gradient.
    Tensor up = randn(Shape{B, T, H, D}, g);
    y.backward(up);
    expect_bits(rope_from_shared_math(up.to_f32_vector(), B, T, H, D, pos, ff, c.o, true),
                xg.grad().to_f32_vector(), c.what);
  }
}
