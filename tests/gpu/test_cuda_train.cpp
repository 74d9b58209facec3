// The training-side kernels on the GPU (rows, rope, optimizers and clocks, sampling) against
// the CPU, through the public ops, on seeded random inputs with poisoned outputs
// (gpu_test_util.h). Tolerances:
//  - get_rows, set_rows and the embedding backward are exact: copies, conversions rounded
//    once, and each id's rows added in the CPU's order with the same rounding after each add;
//  - rope, SGD, AdamW and the lr schedule: F32 within 1e-6 relative: the same operations,
//    but the GPU's double cos/sin/pow may differ from glibc's in the last bit, and the CPU
//    kernels' scalar code may be FMA-contracted by the compiler where the GPU rounds twice
//    (tests/gpu/host_train_math.cpp); F16/BF16 rope outputs within one unit of their last
//    place (a f32 result on a rounding boundary);
//  - sampling: the same token. The GPU's softmax sums in a fixed tree order, not the CPU's
//    left to right, so the two differ only when r falls within ~1e-15 of a boundary between
//    two candidates' cumulative mass (never for these draws).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "toy/core/allocator.h"
#include "toy/core/rng.h"
#include "toy/ops/ops.h"

using namespace toy;
using namespace toy::gpu_test;

namespace {

std::vector<int32_t> random_ids(int64_t n, int32_t limit, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, limit - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = pick(rng);
  return v;
}

int32_t token(const Tensor& t) { return transfer(t, Device::CPU).to_i32_vector().at(0); }

// One unit in the last place of t, relative (for expect_close).
double ulp_of(DType t) { return t == DType::BF16 ? 1.0 / 128 : t == DType::F16 ? 1.0 / 1024 : 1e-6; }

}  // namespace

// ---- rows ------------------------------------------------------------------------------------

TEST(CudaRows, GetRowsCopiesEveryFloatTypeAndDequantizesQ8_0) {
  REQUIRE_GPU();
  Generator g(41);
  const std::vector<int32_t> idv = random_ids(21, 50, 1);
  const Tensor ids = from_vector(idv, Shape{3, 7});
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor table = cast(randn(Shape{50, 37}, g), t);
    Tensor got = get_rows(on_gpu(table), on_gpu(ids));
    ASSERT_EQ(got.shape(), (Shape{3, 7, 37}));
    EXPECT_EQ(back(got), get_rows(table, ids).to_f32_vector()) << name(t);
    // A table whose rows are strided (a column slice of a wider one).
    const Tensor wide = cast(randn(Shape{50, 64}, g), t);
    EXPECT_EQ(back(get_rows(slice(on_gpu(wide), 1, 5, 42), on_gpu(ids))),
              get_rows(slice(wide, 1, 5, 42), ids).to_f32_vector())
        << name(t) << " strided";
  }
  const Tensor q = cast(randn(Shape{50, 96}, g), DType::Q8_0);
  Tensor got = get_rows(on_gpu(q), on_gpu(ids));
  EXPECT_EQ(got.dtype(), DType::F32);
  EXPECT_EQ(back(got), get_rows(q, ids).to_f32_vector()) << "q8_0";
}

TEST(CudaRows, OtherBlockTablesAreRefusedByName) {
  REQUIRE_GPU();
  Generator g(42);
  const Tensor q = on_gpu(cast(randn(Shape{8, 256}, g), DType::Q4_K));
  try {
    (void)get_rows(q, on_gpu(from_vector(std::vector<int32_t>{1, 2}, Shape{2})));
    FAIL() << "a q4_k table was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q4_k"), std::string::npos) << e.what();
  }
}

TEST(CudaRows, EmbeddingBackwardAddsRepeatedIdsInTheCpusOrder) {
  REQUIRE_GPU();
  Generator g(43);
  struct Case {
    int64_t V, N, D;
    DType t;
  };
  // Few rows hit many times (long runs), and many rows over several blocks.
  for (const Case c : {Case{11, 64, 40, DType::F32}, Case{11, 64, 40, DType::BF16}, Case{7, 300, 9, DType::F16},
                       Case{1000, 5000, 64, DType::F32}, Case{5, 1, 33, DType::F32}}) {
    const Tensor ids = from_vector(random_ids(c.N, int32_t(c.V), uint32_t(c.V + c.N)), Shape{c.N});
    const Tensor table = cast(randn(Shape{c.V, c.D}, g), c.t), up = cast(randn(Shape{c.N, c.D}, g), c.t);
    Tensor tc = table.detach().requires_grad_(true), tg = on_gpu(table).requires_grad_(true);
    get_rows(tc, ids).backward(up);
    get_rows(tg, on_gpu(ids)).backward(on_gpu(up));
    ASSERT_TRUE(tg.grad().defined());
    EXPECT_EQ(back(tg.grad()), tc.grad().to_f32_vector()) << c.V << "x" << c.D << " " << name(c.t);
  }
}

TEST(CudaRows, SetRowsLetsTheLastWriteWinAndConverts) {
  REQUIRE_GPU();
  Generator g(44);
  const Tensor ids = from_vector(std::vector<int32_t>{3, 0, 7, 3, 19, 0, 3, 12}, Shape{8});
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor dst = cast(randn(Shape{20, 33}, g), t);
    for (DType st : {t, DType::F32}) {
      const Tensor src = cast(randn(Shape{8, 33}, g), st);
      EXPECT_EQ(back(set_rows(on_gpu(dst), on_gpu(ids), on_gpu(src))), set_rows(dst, ids, src).to_f32_vector())
          << name(t) << " from " << name(st);
    }
  }
  // In place, into a strided view (the first 33 columns of a wider cache).
  Tensor wide_c = randn(Shape{20, 48}, g), wide_g = on_gpu(wide_c);
  const Tensor src = randn(Shape{8, 33}, g);
  Tensor view_c = slice(wide_c, 1, 0, 33), view_g = slice(wide_g, 1, 0, 33);
  set_rows_(view_c, ids, src);
  set_rows_(view_g, on_gpu(ids), on_gpu(src));
  EXPECT_EQ(back(wide_g), wide_c.to_f32_vector());
}

TEST(CudaRows, SetRowsIntoABlockTableIsRefusedByName) {
  REQUIRE_GPU();
  Generator g(45);
  Tensor dst = on_gpu(cast(randn(Shape{8, 64}, g), DType::Q8_0));
  try {
    set_rows_(dst, on_gpu(from_vector(std::vector<int32_t>{1}, Shape{1})), on_gpu(randn(Shape{1, 64}, g)));
    FAIL() << "a q8_0 destination was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
}

// ---- rope ------------------------------------------------------------------------------------

TEST(CudaRope, EveryLayoutAndScalingEqualsTheCpuForwardAndBackward) {
  REQUIRE_GPU();
  Generator g(46);
  const int64_t B = 2, T = 9, H = 4, D = 32;
  struct Case {
    RopeOptions o;
    bool per_batch, factors;
    const char* what;
  };
  std::vector<Case> cases;
  cases.push_back({RopeOptions{}, false, false, "normal"});
  RopeOptions neox;
  neox.neox = true;
  neox.n_dims = 24;
  neox.freq_base = 500000.0f;
  cases.push_back({neox, true, true, "neox, partial, factors, per-batch positions"});
  RopeOptions yarn;
  yarn.freq_scale = 0.25f;
  yarn.ext_factor = 1.0f;
  yarn.attn_factor = 0.9f;
  yarn.n_ctx_orig = 4096;
  yarn.heads_begin = 1;
  yarn.heads_end = 3;
  cases.push_back({yarn, false, false, "yarn, heads 1 and 2 rotated"});
  RopeOptions yarn_neox = yarn;
  yarn_neox.neox = true;
  yarn_neox.heads_end = -1;
  yarn_neox.n_dims = 16;
  cases.push_back({yarn_neox, true, true, "yarn neox with factors"});
  for (Case& c : cases) {
    std::vector<int32_t> pos;
    for (int64_t i = 0; i < (c.per_batch ? B * T : T); ++i) pos.push_back(int32_t((i * 7919) % 30000));
    const Tensor pc = from_vector(pos, c.per_batch ? Shape{B, T} : Shape{T});
    RopeOptions og = c.o;
    if (c.factors) {
      const int half = (c.o.n_dims ? c.o.n_dims : int(D)) / 2;
      std::vector<float> ff;
      for (int i = 0; i < half; ++i) ff.push_back(1.0f + 0.37f * float(i % 5));
      c.o.freq_factors = from_vector(ff, Shape{int64_t(half)});
      og.freq_factors = on_gpu(c.o.freq_factors);
    }
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
      // A strided x: [B, H, T, D] stored, [B, T, H, D] seen.
      const Tensor stored = cast(randn(Shape{B, H, T, D}, g), t);
      const Tensor want = rope(permute(stored, {0, 2, 1, 3}), pc, c.o);
      expect_close(back(rope(permute(on_gpu(stored), {0, 2, 1, 3}), on_gpu(pc), og)), want.to_f32_vector(),
                   ulp_of(t), c.what);
    }
    // The backward: the inverse rotation of the upstream gradient.
    const Tensor x = randn(Shape{B, T, H, D}, g), up = randn(Shape{B, T, H, D}, g);
    Tensor xc = x.detach().requires_grad_(true), xg = on_gpu(x).requires_grad_(true);
    rope(xc, pc, c.o).backward(up);
    rope(xg, on_gpu(pc), og).backward(on_gpu(up));
    ASSERT_TRUE(xg.grad().defined()) << c.what;
    expect_close(back(xg.grad()), xc.grad().to_f32_vector(), 1e-6, c.what);
  }
}

// ---- optimizers ------------------------------------------------------------------------------

TEST(CudaOptim, SgdInEveryFormEqualsTheCpu) {
  REQUIRE_GPU();
  Generator g(47);
  const SgdOptions cases[] = {{0.0f, 0.0f, false}, {0.0f, 0.01f, false}, {0.9f, 0.0f, false}, {0.9f, 0.01f, true}};
  for (const SgdOptions& o : cases) {
    Tensor pc = randn(Shape{1031}, g), bc = zeros(Shape{1031});
    Tensor pg = on_gpu(pc), bg = on_gpu(bc);
    const Tensor lrc = full(Shape{}, 0.05), lrg = on_gpu(lrc);
    for (int step = 0; step < 3; ++step) {
      const Tensor grad = randn(Shape{1031}, g);
      sgd_step(pc, grad, bc, lrc, o);
      sgd_step(pg, on_gpu(grad), bg, lrg, o);
    }
    expect_close(back(pg), pc.to_f32_vector(), 1e-6, "sgd param");
    if (o.momentum > 0) expect_close(back(bg), bc.to_f32_vector(), 1e-6, "sgd momentum");
  }
}

TEST(CudaOptim, AdamWAndItsArenaRangesEqualTheCpu) {
  REQUIRE_GPU();
  Generator g(48);
  const int64_t n = 5003;
  const AdamWOptions o{0.9f, 0.95f, 1e-8f, 0.1f};
  Tensor pc = randn(Shape{n}, g), mc = zeros(Shape{n}), vc = zeros(Shape{n});
  Tensor pg = on_gpu(pc), mg = on_gpu(mc), vg = on_gpu(vc);
  Tensor ac = randn(Shape{n}, g), amc = zeros(Shape{n}), avc = zeros(Shape{n});  // an arena
  Tensor ag = on_gpu(ac), amg = on_gpu(amc), avg = on_gpu(avc);
  const std::vector<ArenaRange> ranges{{0, 1000, true}, {1000, 1200, false}, {1300, 1301, true}, {2000, 5003, true}};
  for (int step = 1; step <= 4; ++step) {
    const Tensor lrc = full(Shape{}, 3e-3 / step), stc = full(Shape{}, double(step));
    const Tensor grad = randn(Shape{n}, g, 0.0f, 0.1f);
    adamw_step(pc, grad, mc, vc, lrc, stc, o);
    adamw_step(pg, on_gpu(grad), mg, vg, on_gpu(lrc), on_gpu(stc), o);
    adamw_step_ranges(ac, grad, amc, avc, lrc, stc, o, ranges);
    adamw_step_ranges(ag, on_gpu(grad), amg, avg, on_gpu(lrc), on_gpu(stc), o, ranges);
  }
  expect_close(back(pg), pc.to_f32_vector(), 1e-6, "adamw param");
  expect_close(back(mg), mc.to_f32_vector(), 1e-6, "adamw m");
  expect_close(back(vg), vc.to_f32_vector(), 1e-6, "adamw v");
  expect_close(back(ag), ac.to_f32_vector(), 1e-6, "arena param");  // (the gaps left alone on both)
  expect_close(back(amg), amc.to_f32_vector(), 1e-6, "arena m");
  expect_close(back(avg), avc.to_f32_vector(), 1e-6, "arena v");
}

TEST(CudaOptim, AdamWOverMoreRangesThanOneLaunchTakes) {
  REQUIRE_GPU();
  Generator g(49);
  const int64_t n = 3000;
  std::vector<ArenaRange> ranges;
  for (int64_t b = 1; b + 5 <= n; b += 7) ranges.push_back({b, b + 5, (b / 7) % 2 == 0});  // 428 ranges
  const AdamWOptions o{0.9f, 0.999f, 1e-8f, 0.2f};
  Tensor pc = randn(Shape{n}, g), mc = zeros(Shape{n}), vc = zeros(Shape{n});
  Tensor pg = on_gpu(pc), mg = on_gpu(mc), vg = on_gpu(vc);
  const Tensor grad = randn(Shape{n}, g), lr = full(Shape{}, 1e-2), st = full(Shape{}, 1.0);
  adamw_step_ranges(pc, grad, mc, vc, lr, st, o, ranges);
  adamw_step_ranges(pg, on_gpu(grad), mg, vg, on_gpu(lr), on_gpu(st), o, ranges);
  expect_close(back(pg), pc.to_f32_vector(), 1e-6, "param");
  expect_close(back(vg), vc.to_f32_vector(), 1e-6, "v");
}

TEST(CudaOptim, TheClocksAdvanceOnTheDeviceAsTheScheduleSays) {
  REQUIRE_GPU();
  const LrSchedule s{5, 40, 6e-4f, 6e-5f};
  Tensor step = zeros(Shape{}, DType::F32, Device::CUDA), lr = zeros(Shape{}, DType::F32, Device::CUDA);
  Tensor position = zeros(Shape{}, DType::I32, Device::CUDA);
  for (int i = 0; i < 45; ++i) {
    advance_optimizer_clock(step, lr, position, s);
    EXPECT_EQ(back(step), std::vector<float>{float(i + 1)});
    expect_close(back(lr), {cosine_lr(i, s)}, 1e-6, "lr");
    advance_step_clock(position);
    EXPECT_EQ(token(position), i + 1);
  }
}

// ---- sampling --------------------------------------------------------------------------------

TEST(CudaSample, GreedyIsTheCpusFirstMaximum) {
  REQUIRE_GPU();
  Generator g(50);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor logits = cast(randn(Shape{50000}, g), t);
    EXPECT_EQ(token(sample_token(on_gpu(logits), {}, SampleDraw{})), token(sample_token(logits, {}, SampleDraw{})))
        << name(t);
  }
  // Ties: the first of equal maxima.
  std::vector<float> v(3000, -1.0f);
  v[2500] = v[1700] = v[2999] = 4.0f;
  EXPECT_EQ(token(sample_token(on_gpu(from_vector(v, Shape{1, 3000})), {}, SampleDraw{})), 1700);
  // Penalties first: the penalised maximum loses.
  const std::vector<int32_t> pen{1700, 2, 2500, 1, 0, 0};
  SampleDraw d;
  d.repeat_penalty = 1.3f;
  d.presence_penalty = 0.5f;
  d.frequency_penalty = 0.25f;
  EXPECT_EQ(token(sample_token(on_gpu(from_vector(v, Shape{3000})), pen, d)),
            token(sample_token(from_vector(v, Shape{3000}), pen, d)));
}

TEST(CudaSample, TheDrawPicksTheCpusTokenForEveryChain) {
  REQUIRE_GPU();
  Generator g(51);
  struct Setting {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
    bool penalties;
  };
  const Setting settings[] = {
      {0.8f, 40, 1.0f, 0.0f, false},   {1.0f, 0, 0.9f, 0.0f, false},  {0.7f, 0, 1.0f, 0.05f, false},
      {1.2f, 100, 0.95f, 0.02f, true}, {1.0f, 0, 1.0f, 0.0f, false},  {0.5f, 1, 1.0f, 0.0f, false},
      {1.5f, 5000, 0.5f, 0.0f, true},  {1.0f, 0, 0.99f, 0.01f, false},
  };
  const double draws[] = {0.0, 0.1234, 0.5, 0.87, 0.999};
  for (const int64_t V : {int64_t(32000), int64_t(256000)}) {
    const Tensor logits = scale(randn(Shape{V}, g), 3.0f), lg = on_gpu(logits);
    const std::vector<int32_t> pen{5, 3, 17, 1, 5, 1, int32_t(V - 1), 4};
    for (const Setting& s : settings)
      for (const double r : draws) {
        SampleDraw d;
        d.temperature = s.temperature;
        d.top_k = s.top_k;
        d.top_p = s.top_p;
        d.min_p = s.min_p;
        d.r = r;
        if (s.penalties) d.repeat_penalty = 1.1f, d.presence_penalty = 0.3f, d.frequency_penalty = 0.1f;
        const std::vector<int32_t> p = s.penalties ? pen : std::vector<int32_t>{};
        EXPECT_EQ(token(sample_token(lg, p, d)), token(sample_token(logits, p, d)))
            << "V " << V << " T " << s.temperature << " k " << s.top_k << " p " << s.top_p << " min-p " << s.min_p
            << " r " << r;
      }
  }
}

TEST(CudaSample, ANanLogitIsReportedAsMinusOneMinusItsIndex) {
  REQUIRE_GPU();
  Generator g(52);
  std::vector<float> v = randn(Shape{4000}, g).to_f32_vector();
  v[300] = std::numeric_limits<float>::quiet_NaN();
  v[17] = std::numeric_limits<float>::quiet_NaN();
  const Tensor lg = on_gpu(from_vector(v, Shape{4000}));
  SampleDraw sampled;
  sampled.temperature = 0.9f;
  sampled.top_k = 50;
  sampled.r = 0.3;
  EXPECT_EQ(token(sample_token(lg, {}, SampleDraw{})), -18);
  EXPECT_EQ(token(sample_token(lg, {}, sampled)), -18);
  EXPECT_EQ(token(sample_token(cast(lg, DType::BF16), {}, sampled)), -18);
}

TEST(CudaSample, AWarmSamplerAllocatesNoGpuMemory) {
  REQUIRE_GPU();
  Generator g(53);
  const Tensor lg = on_gpu(randn(Shape{32000}, g));
  SampleDraw d;
  d.temperature = 0.8f;
  d.top_p = 0.9f;
  d.r = 0.4;
  for (int i = 0; i < 3; ++i) (void)token(sample_token(lg, {}, d));
  const int64_t before = allocator(Device::CUDA).stats().system_allocs;
  for (int i = 0; i < 10; ++i) (void)token(sample_token(lg, {}, d));
  EXPECT_EQ(allocator(Device::CUDA).stats().system_allocs, before);
}
