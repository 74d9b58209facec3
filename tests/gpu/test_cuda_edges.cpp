// Edge cases of the CUDA kernels, beyond the other tests/gpu files (first written for the
// emulator, scripts/gpu-emulate.sh, which runs them too): head sizes on every slot branch (E = 1..16,
// partial lanes), Dv > D, strided (permuted) q/k/v, a custom scale, non-causal cross attention
// (S > T), a window over a cache, segments with GQA and a window, segments without causality,
// BF16 inputs; I32 binary; unary on a broadcast view; I32 copies and fills; optimizers past the
// capped grid (grid-stride loops); rope with large positions.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "toy/core/rng.h"
#include "toy/ops/ops.h"
#include "toy/autograd/grad_mode.h"

using namespace toy;
using namespace toy::gpu_test;

namespace {
void parity(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs, double rel,
            const std::string& what) {
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& x : inputs) {
    cpu.push_back(x.detach().requires_grad_(true));
    gpu.push_back(on_gpu(x).requires_grad_(true));
  }
  Tensor yc = f(cpu), yg = f(gpu);
  ASSERT_EQ(yg.device(), Device::CUDA) << what;
  expect_close(back(yg), yc.to_f32_vector(), rel, what.c_str());
  Generator g(99);
  Tensor up = cast(randn(yc.shape(), g), yc.dtype());
  yc.backward(up);
  yg.backward(on_gpu(up));
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(gpu[i].grad().defined()) << what << " input " << i;
    expect_close(back(gpu[i].grad()), cpu[i].grad().to_f32_vector(), rel, (what + " grad " + std::to_string(i)).c_str());
  }
}
}  // namespace

TEST(CudaEdges, AttentionEdgeCases) {
  REQUIRE_GPU();
  Generator g(5);
  struct Case {
    int64_t B, T, S, H, Hkv, D, Dv;
    bool causal;
    int64_t window;
    bool segments;
    float scale;
    const char* what;
  };
  const Case cases[] = {
      {1, 5, 5, 2, 1, 300, 300, true, 0, false, 0, "head 300 (E 16, partial)"},
      {1, 3, 3, 2, 2, 512, 512, true, 0, false, 0, "head 512"},
      {1, 4, 4, 2, 2, 256, 200, true, 0, false, 0, "head 256 / Dv 200 (E 8)"},
      {2, 6, 6, 2, 1, 8, 100, true, 0, false, 0, "D 8, Dv 100"},
      {1, 6, 6, 1, 1, 1, 1, true, 0, false, 0, "D 1"},
      {2, 4, 9, 4, 2, 40, 24, false, 0, false, 0, "non-causal cross, S > T, Dv < D"},
      {1, 5, 12, 2, 1, 32, 32, true, 4, false, 0, "window 4 over a cache"},
      {1, 5, 12, 2, 1, 32, 32, true, 1, false, 0, "window 1"},
      {2, 20, 20, 6, 3, 24, 24, true, 3, true, 0, "segments + window + gqa"},
      {2, 20, 20, 2, 2, 16, 16, false, 0, true, 0, "segments, non-causal"},
      {1, 9, 9, 3, 1, 48, 48, true, 0, false, 0.37f, "scale 0.37"},
      {1, 1, 1, 1, 1, 64, 64, true, 0, false, 0, "one query, one key"},
      {3, 33, 33, 1, 1, 32, 32, true, 0, false, 0, "rows not a multiple of 4 warps"},
      // Rows spanning several of the tiled kernels' 32-key tiles (the online softmax rescales
      // between tiles; dk/dv walk query tiles of every head in a group).
      {2, 100, 100, 4, 2, 64, 64, true, 0, false, 0, "100 rows, gqa, tiles"},
      {1, 70, 150, 2, 1, 40, 24, true, 45, false, 0, "a prompt after a cache, a window across tiles"},
      {1, 90, 90, 2, 2, 16, 16, true, 0, true, 0, "segments across tiles"},
      {1, 65, 97, 3, 3, 64, 64, false, 0, false, 0, "non-causal cross attention, tiles"},
  };
  for (const Case& c : cases) {
    Tensor q = randn(Shape{c.B, c.T, c.H, c.D}, g), k = randn(Shape{c.B, c.S, c.Hkv, c.D}, g);
    Tensor v = randn(Shape{c.B, c.S, c.Hkv, c.Dv}, g);
    std::vector<int32_t> seg;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.T; ++t) seg.push_back(int32_t(b == 0 ? (t < 7 ? 0 : t < 15 ? 1 : 2) : t / 6));
    Tensor segments = from_vector(seg, Shape{c.B, c.T});
    parity(
        [&](const std::vector<Tensor>& x) {
          AttentionOptions o;
          o.causal = c.causal;
          o.window = c.window;
          o.scale = c.scale;
          if (c.segments) o.segments = x[0].device() == Device::CUDA ? on_gpu(segments) : segments;
          return attention(x[0], x[1], x[2], o);
        },
        {q, k, v}, 1e-5, c.what);
  }
}

TEST(CudaEdges, AttentionOfPermutedInputsAndBf16) {
  REQUIRE_GPU();
  Generator g(6);
  // q, k, v stored [B, H, T, D]: seen [B, T, H, D] with strides in dims 0..2.
  Tensor q = randn(Shape{2, 3, 7, 32}, g), k = randn(Shape{2, 3, 7, 32}, g), v = randn(Shape{2, 3, 7, 20}, g);
  parity(
      [](const std::vector<Tensor>& x) {
        return attention(permute(x[0], {0, 2, 1, 3}), permute(x[1], {0, 2, 1, 3}), permute(x[2], {0, 2, 1, 3}));
      },
      {q, k, v}, 1e-5, "permuted");
  Tensor qb = cast(q, DType::BF16), kb = cast(k, DType::BF16), vb = cast(v, DType::BF16);
  parity(
      [](const std::vector<Tensor>& x) {
        return attention(permute(x[0], {0, 2, 1, 3}), permute(x[1], {0, 2, 1, 3}), permute(x[2], {0, 2, 1, 3}));
      },
      {qb, kb, vb}, 1.0 / 128, "bf16");
  Tensor qkv = randn(Shape{1, 9, 6 + 2 * 3, 80}, g);
  parity([](const std::vector<Tensor>& x) {
    AttentionOptions o;
    o.window = 3;
    return attention_qkv(x[0], 6, 3, o);
  }, {qkv}, 1e-5, "qkv window, head 80");
}

TEST(CudaEdges, BinaryOnI32IsRefusedAsOnTheCpu) {
  REQUIRE_GPU();
  Tensor a = from_vector(std::vector<int32_t>{1, 2, 3}, Shape{3});
  std::string cpu_error, sim_error;
  try { (void)add(a, a); } catch (const Error& e) { cpu_error = e.what(); }
  std::vector<int32_t> got;
  try {
    got = transfer(add(on_gpu(a), on_gpu(a)), Device::CPU).to_i32_vector();
  } catch (const Error& e) { sim_error = e.what(); }
  EXPECT_FALSE(cpu_error.empty()) << "the cpu accepted an I32 add";
  EXPECT_FALSE(sim_error.empty()) << "the emulated GPU accepted an I32 add (cpu: " << cpu_error << ") and gave "
                                  << ::testing::PrintToString(got);
}

TEST(CudaEdges, UnaryOnABroadcastViewAndCopiesOfIntegers) {
  REQUIRE_GPU();
  Generator g(7);
  Tensor row = randn(Shape{1, 45}, g);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    Tensor x = cast(row, t);
    expect_close(back(contiguous(gelu(expand(on_gpu(x), Shape{6, 45})))),
                 contiguous(gelu(expand(x, Shape{6, 45}))).to_f32_vector(), 1e-2, "gelu of an expanded row");
  }
  std::vector<int32_t> iv{0, 1, -1, 255, 256, 257, 2049, -70000, 16777217, 65519, 65520};
  Tensor ints = from_vector(iv, Shape{11});
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    EXPECT_EQ(back(cast(on_gpu(ints), t)), cast(ints, t).to_f32_vector()) << name(t);
  std::vector<float> fv{0.0f, 0.5f, -0.5f, 2.7f, -2.7f, 1e6f, -1e6f, 16777216.0f};
  Tensor fl = from_vector(fv, Shape{8});
  EXPECT_EQ(transfer(cast(on_gpu(fl), DType::I32), Device::CPU).to_i32_vector(), cast(fl, DType::I32).to_i32_vector());
  EXPECT_EQ(transfer(full(Shape{5}, -7.0, DType::I32, Device::CUDA), Device::CPU).to_i32_vector(),
            std::vector<int32_t>(5, -7));
  // A strided destination: a column slice filled in place.
  Tensor wide = on_gpu(zeros(Shape{4, 6}));
  Tensor col = slice(wide, 1, 2, 4);
  NoGradGuard ng;
  copy_(col, on_gpu(full(Shape{4, 2}, 3.0)));
  std::vector<float> want(24, 0.0f);
  for (int r = 0; r < 4; ++r) want[size_t(r * 6 + 2)] = want[size_t(r * 6 + 3)] = 3.0f;
  EXPECT_EQ(back(wide), want);
}

// The flat four-a-thread forms of copy and binary: contiguous casts between every type, a row
// broadcast down an output (a bias; rows of 44 and of 45, which takes the general form), a
// source one element off its alignment (general form), and binary ops on contiguous operands.
TEST(CudaEdges, FlatCopiesCastsBroadcastRowsAndBinaryOps) {
  REQUIRE_GPU();
  Generator g(8);
  const DType types[] = {DType::F32, DType::F16, DType::BF16};
  for (DType from : types)
    for (DType to : types) {
      const Tensor x = cast(randn(Shape{6, 44}, g), from);
      EXPECT_EQ(back(cast(on_gpu(x), to)), cast(x, to).to_f32_vector()) << name(from) << " -> " << name(to);
      for (int64_t width : {int64_t(44), int64_t(45)}) {
        const Tensor row = cast(randn(Shape{1, width}, g), from);
        EXPECT_EQ(back(cast(contiguous(expand(on_gpu(row), Shape{7, width})), to)),
                  cast(contiguous(expand(row, Shape{7, width})), to).to_f32_vector())
            << "row of " << width << " " << name(from) << " -> " << name(to);
      }
    }
  const Tensor long_row = randn(Shape{97}, g);
  const Tensor off = slice(on_gpu(long_row), 0, 1, 97);  // (96 elements, 4 bytes past an aligned start)
  EXPECT_EQ(back(contiguous_copy(off)), contiguous_copy(slice(long_row, 0, 1, 97)).to_f32_vector());
  for (DType t : types) {
    const Tensor a = cast(randn(Shape{5, 36}, g), t), b = cast(randn(Shape{5, 36}, g, 1.0f, 0.5f), t);
    EXPECT_EQ(back(add(on_gpu(a), on_gpu(b))), add(a, b).to_f32_vector()) << name(t);
    EXPECT_EQ(back(mul(on_gpu(a), on_gpu(b))), mul(a, b).to_f32_vector()) << name(t);
    EXPECT_EQ(back(div(on_gpu(a), on_gpu(b))), div(a, b).to_f32_vector()) << name(t);
    EXPECT_EQ(back(sub(on_gpu(a), on_gpu(b))), sub(a, b).to_f32_vector()) << name(t);
  }
}

TEST(CudaEdges, OptimizersPastTheCappedGrid) {
  REQUIRE_GPU();
  Generator g(8);
  const int64_t n = (int64_t(1) << 20) + 3;  // 4096 blocks of 256 cover 2^20: the loop takes the rest
  Tensor pc = randn(Shape{n}, g), mc = zeros(Shape{n}), vc = zeros(Shape{n});
  Tensor pg = on_gpu(pc), mg = on_gpu(mc), vg = on_gpu(vc);
  const AdamWOptions o{0.9f, 0.95f, 1e-8f, 0.1f};
  const Tensor grad = randn(Shape{n}, g), lr = full(Shape{}, 1e-3), st = full(Shape{}, 3.0);
  adamw_step(pc, grad, mc, vc, lr, st, o);
  adamw_step(pg, on_gpu(grad), mg, vg, on_gpu(lr), on_gpu(st), o);
  expect_close(back(pg), pc.to_f32_vector(), 1e-6, "adamw 2^20 + 3");
  const std::vector<ArenaRange> ranges{{5, 10, true}, {100, n, false}};
  adamw_step_ranges(pc, grad, mc, vc, lr, st, o, ranges);
  adamw_step_ranges(pg, on_gpu(grad), mg, vg, on_gpu(lr), on_gpu(st), o, ranges);
  expect_close(back(pg), pc.to_f32_vector(), 1e-6, "adamw ranges past the grid");
  Tensor bc = zeros(Shape{n}), bg = on_gpu(bc);
  SgdOptions so{0.9f, 0.01f, true};
  sgd_step(pc, grad, bc, lr, so);
  sgd_step(pg, on_gpu(grad), bg, on_gpu(lr), so);
  expect_close(back(pg), pc.to_f32_vector(), 1e-6, "sgd 2^20 + 3");
}

TEST(CudaEdges, RopeWithLargePositionsAndWideHeads) {
  REQUIRE_GPU();
  Generator g(9);
  const int64_t B = 1, T = 5, H = 3, D = 128;
  std::vector<int32_t> pos{0, 1, 4095, 131071, 1000000};
  const Tensor pc = from_vector(pos, Shape{T});
  for (bool neox : {false, true}) {
    RopeOptions o;
    o.neox = neox;
    const Tensor x = randn(Shape{B, T, H, D}, g);
    expect_close(back(rope(on_gpu(x), on_gpu(pc), o)), rope(x, pc, o).to_f32_vector(), 1e-6, "rope D 128");
  }
}
