// The recurrent and MoE kernels on the GPU against the CPU (scan.cu, moe.cu): ssm_scan, the
// gated delta rule and mul_mat_id, forward and backward, through the public ops and autograd
// (gradients of <outputs, seeded upstream gradients> with respect to every float input), plus
// direct kernel calls for what the ops never pass (the rule's backward without recorded
// states or a final-state gradient, the recorded states themselves, F16/BF16 expert tensors
// as the kernel reads them, dW's "+=", a refused Q8_0 expert tensor). Inputs are seeded; q and
// k are unit rows and beta in (0, 1), as a Gated DeltaNet layer gives them (the recurrence
// then stays bounded).
// Tolerances (|got - want| <= rel * max(1, |want|)):
//  - ssm_scan: F32 5e-5 forward, 1e-4 gradients: the same token steps as the CPU, the sums over
//    the state (y = s.C, the row terms of the backward) in another order (lanes and a butterfly)
//    and possibly fma-contracted on one side only, expf/log1pf within their ulps of glibc's, the
//    state carrying the differences along T (the emulator, with glibc's, shows 8e-6 and 1.3e-5
//    at T = 300); dA and dB/dC sum over tokens, rows and heads;
//  - gated_delta_rule: F32 1e-4: the GPU walks tokens one by one for any chunk size, the CPU's
//    chunked (WY) form is the same function in exact arithmetic and its recurrence is a
//    contraction here, so rounding differences stay at the f32 level over these T (3e-6 at
//    T = 300 on the emulator);
//  - mul_mat_id: F32 1e-5 forward and dx (dot products of K or N terms in another order),
//    1e-4 dW (sums over every pair routed to an expert); F16/BF16 through the op: their one
//    rounding of the f32 result may land one unit apart (2e-3, 1.6e-2).
// Every test needs a GPU: without one it skips, or fails under TOY_REQUIRE_GPU=1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "toy/autograd/backward.h"
#include "toy/backend/kernels.h"
#include "toy/core/registry.h"
#include "toy/core/rng.h"
#include "toy/ops/ops.h"

using namespace toy;
using namespace toy::gpu_test;

namespace {

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

Tensor rnd(const Shape& s, uint64_t seed, float std = 1.0f) {
  Generator g(seed);
  return randn(s, g, 0.0f, std);
}
Tensor uni(const Shape& s, uint64_t seed, float lo, float hi) {
  Generator g(seed);
  return rand(s, g, lo, hi);
}
// Seeded rows of unit length along the last axis (q and k as the layer's L2 norm gives them).
Tensor unit_rows(const Shape& s, uint64_t seed) {
  std::vector<float> v = rnd(s, seed).to_f32_vector();
  const size_t d = size_t(s[s.ndim() - 1]);
  for (size_t r = 0; r < v.size(); r += d) {
    double n = 0;
    for (size_t i = 0; i < d; ++i) n += double(v[r + i]) * v[r + i];
    const float inv = float(1.0 / std::sqrt(n));
    for (size_t i = 0; i < d; ++i) v[r + i] *= inv;
  }
  return from_vector(v, s);
}

// f on CPU leaves and on their GPU copies: every output compared within rel_fwd; then the
// gradients of sum_i <out_i, up_i> (seeded up_i) with respect to every float input within rel_bwd.
void expect_parity(const Fn& f, const std::vector<Tensor>& inputs, double rel_fwd, double rel_bwd,
                   const std::string& what) {
  std::vector<Tensor> cpu, gpu, cpu_float, gpu_float;
  for (const Tensor& x : inputs) {
    const bool fl = is_float(x.dtype());
    cpu.push_back(x.detach().requires_grad_(fl));
    gpu.push_back(on_gpu(x).requires_grad_(fl));
    if (fl) cpu_float.push_back(cpu.back()), gpu_float.push_back(gpu.back());
  }
  const std::vector<Tensor> yc = f(cpu), yg = f(gpu);
  ASSERT_EQ(yc.size(), yg.size()) << what;
  Tensor lc, lg;
  for (size_t i = 0; i < yc.size(); ++i) {
    ASSERT_EQ(yg[i].device(), Device::CUDA) << what;
    const std::string out = what + ": output " + std::to_string(i);
    expect_close(back(yg[i]), contiguous(yc[i]).to_f32_vector(), rel_fwd, out.c_str());
    const Tensor up = cast(rnd(yc[i].shape(), 900 + i), yc[i].dtype());
    const Tensor c = sum(mul(yc[i], up)), g = sum(mul(yg[i], on_gpu(up)));
    lc = lc.defined() ? add(lc, c) : c;
    lg = lg.defined() ? add(lg, g) : g;
  }
  const std::vector<Tensor> gc = grad(lc, cpu_float), gg = grad(lg, gpu_float);
  for (size_t i = 0; i < gc.size(); ++i) {
    ASSERT_TRUE(gg[i].defined()) << what << ": gradient " << i;
    expect_close(back(contiguous(gg[i])), contiguous(gc[i]).to_f32_vector(), rel_bwd,
                 (what + ": gradient " + std::to_string(i)).c_str());
  }
}

std::string shape_label(const char* what, const Shape& s) { return std::string(what) + " " + s.str(); }

// ---- ssm scan ------------------------------------------------------------------------------------

struct ScanCase {
  int64_t B, T, H, P, G, N;
  bool s0, final_state;  // an initial state; the final state used (its gradient nonzero)
};

// dt with a few entries past 20 (softplus is the identity there).
Tensor scan_dt(const Shape& s, uint64_t seed) {
  std::vector<float> v = rnd(s, seed, 1.5f).to_f32_vector();
  for (size_t i = 3; i < v.size(); i += 17) v[i] = 21.0f + float(i % 5);
  return from_vector(v, s);
}

void check_scan(const ScanCase& c, uint64_t seed) {
  std::vector<Tensor> in{rnd(Shape{c.B, c.T, c.H, c.P}, seed, 0.5f), scan_dt(Shape{c.B, c.T, c.H}, seed + 1),
                         uni(Shape{c.H}, seed + 2, -1.0f, -0.2f), rnd(Shape{c.B, c.T, c.G, c.N}, seed + 3, 0.5f),
                         rnd(Shape{c.B, c.T, c.G, c.N}, seed + 4, 0.5f)};
  if (c.s0) in.push_back(rnd(Shape{c.B, c.H, c.P, c.N}, seed + 5, 0.5f));
  const bool fs = c.final_state;
  const Fn f = [fs](const std::vector<Tensor>& x) {
    auto [y, s] = ssm_scan(x[0], x[1], x[2], x[3], x[4], x.size() > 5 ? x[5] : Tensor());
    return fs ? std::vector<Tensor>{y, s} : std::vector<Tensor>{y};
  };
  expect_parity(f, in, 5e-5, 1e-4,
                shape_label("ssm_scan x", in[0].shape()) + " N " + std::to_string(c.N) + (c.s0 ? " s0" : ""));
}

// ---- gated delta rule ----------------------------------------------------------------------------

struct GdrCase {
  int64_t B, T, Hk, Hv, Dk, Dv;
  bool s0, final_state;
};

std::vector<Tensor> gdr_inputs(const GdrCase& c, uint64_t seed) {
  const Shape qk{c.B, c.T, c.Hk, c.Dk}, gb{c.B, c.T, c.Hv};
  std::vector<Tensor> in{unit_rows(qk, seed), unit_rows(qk, seed + 1), rnd(Shape{c.B, c.T, c.Hv, c.Dv}, seed + 2),
                         uni(gb, seed + 3, -0.5f, -0.01f), uni(gb, seed + 4, 0.05f, 0.95f)};
  if (c.s0) in.push_back(rnd(Shape{c.B, c.Hv, c.Dk, c.Dv}, seed + 5, 0.5f));
  return in;
}

void check_gdr(const GdrCase& c, GatedDeltaAlgorithm a, uint64_t seed) {
  const bool fs = c.final_state;
  const Fn f = [fs, a](const std::vector<Tensor>& x) {
    auto [o, s] = gated_delta_rule(x[0], x[1], x[2], x[3], x[4], x.size() > 5 ? x[5] : Tensor(), a);
    return fs ? std::vector<Tensor>{o, s} : std::vector<Tensor>{o};
  };
  const char* alg = a == GatedDeltaAlgorithm::Chunked     ? " chunked"
                    : a == GatedDeltaAlgorithm::Recurrent ? " recurrent"
                                                          : " auto";
  expect_parity(f, gdr_inputs(c, seed), 1e-4, 1e-4,
                "gated_delta_rule T " + std::to_string(c.T) + " Hk " + std::to_string(c.Hk) + " Hv " +
                    std::to_string(c.Hv) + " Dk " + std::to_string(c.Dk) + " Dv " + std::to_string(c.Dv) +
                    (c.s0 ? " s0" : "") + alg);
}

// ---- MoE -----------------------------------------------------------------------------------------

// ids [T, U]: seeded experts with repeats (some tokens pick one expert twice), expert E - 1 never.
Tensor moe_ids(int64_t T, int64_t U, int32_t E, uint64_t seed) {
  Generator g(seed);
  std::vector<float> r = rand(Shape{T * U}, g, 0.0f, float(E - 1)).to_f32_vector();
  std::vector<int32_t> ids(r.size());
  for (size_t i = 0; i < r.size(); ++i) ids[i] = std::min<int32_t>(int32_t(r[i]), E - 2);
  for (int64_t t = 0; t < T && U > 1; t += 3) ids[size_t(t * U + 1)] = ids[size_t(t * U)];
  return from_vector(ids, Shape{T, U});
}

void check_moe(int64_t T, int64_t U, int64_t X, int64_t E, int64_t N, int64_t K, DType t, uint64_t seed) {
  const Tensor w = cast(rnd(Shape{E, N, K}, seed, 0.3f), t), x = cast(rnd(Shape{T, X, K}, seed + 1), t);
  const Tensor ids = moe_ids(T, U, int32_t(E), seed + 2);
  const Fn f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{mul_mat_id(in[0], in[1], in[2])}; };
  const double fwd = t == DType::F32 ? 1e-5 : t == DType::F16 ? 2e-3 : 1.6e-2;
  const double bwd = t == DType::F32 ? 1e-4 : fwd;
  expect_parity(f, {w, x, ids}, fwd, bwd,
                "mul_mat_id " + std::string(name(t)) + " T " + std::to_string(T) + " U " + std::to_string(U) + " X " +
                    std::to_string(X) + " E " + std::to_string(E) + " N " + std::to_string(N) + " K " +
                    std::to_string(K));
}

Tensor gpu_empty(const Shape& s, DType t = DType::F32) { return empty(s, t, Device::CUDA); }

}  // namespace

TEST(CudaScan, EveryScanKernelIsRegistered) {
  REQUIRE_GPU();
  EXPECT_TRUE(KernelRef<kern::SsmScan>("ssm_scan").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::SsmScanBackward>("ssm_scan_backward").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::GatedDeltaRule>("gated_delta_rule").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::GatedDeltaRuleBackward>("gated_delta_rule_backward").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::MulMatId>("mul_mat_id").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::MulMatIdBackward>("mul_mat_id_backward").available(Device::CUDA));
}

// ---- ssm scan ------------------------------------------------------------------------------------

TEST(CudaScan, SsmScanAndItsGradientsEqualTheCpu) {
  REQUIRE_GPU();
  // Spans of 64 tokens in the backward: T past one and not a multiple; groups shared by heads;
  // N not a multiple of 32; a single token (decoding); without an initial state, y alone.
  const ScanCase cases[] = {
      {2, 150, 4, 6, 2, 16, true, true},
      {1, 70, 3, 5, 1, 40, false, false},
      {2, 1, 2, 3, 2, 8, true, true},
      {1, 65, 2, 4, 2, 33, true, false},
  };
  uint64_t seed = 100;
  for (const ScanCase& c : cases) check_scan(c, seed += 10);
}

TEST(CudaScan, SsmScanAtAModelsSizeEqualsTheCpu) {
  REQUIRE_GPU();
  // Mamba-2's head of 64 and state of 128 (a warp's lanes hold 4 state values each).
  check_scan({1, 80, 2, 64, 1, 128, true, true}, 200);
}

TEST(CudaScan, SsmScanBackwardWithoutStateGradientsEqualsTheCpu) {
  REQUIRE_GPU();
  // Direct kernel calls: no final-state gradient, no initial state (the ops always pass gs).
  const int64_t B = 2, T = 70, H = 4, P = 3, G = 2, N = 9;
  const Tensor x = rnd(Shape{B, T, H, P}, 301, 0.5f), dt = scan_dt(Shape{B, T, H}, 302),
               A = uni(Shape{H}, 303, -1.0f, -0.2f), Bm = rnd(Shape{B, T, G, N}, 304, 0.5f),
               C = rnd(Shape{B, T, G, N}, 305, 0.5f), gy = rnd(Shape{B, T, H, P}, 306);
  const KernelRef<kern::SsmScanBackward> k("ssm_scan_backward");
  Tensor dx = empty(x.shape(), DType::F32), ddt = empty(dt.shape(), DType::F32), dA = empty(A.shape(), DType::F32),
         dB = empty(Bm.shape(), DType::F32), dC = empty(C.shape(), DType::F32), none;
  k(Device::CPU)(x, dt, A, Bm, C, Tensor(), gy, Tensor(), dx, ddt, dA, dB, dC, none);
  Tensor gdx = gpu_empty(x.shape()), gddt = gpu_empty(dt.shape()), gdA = gpu_empty(A.shape()),
         gdB = gpu_empty(Bm.shape()), gdC = gpu_empty(C.shape()), gnone;
  k(Device::CUDA)(on_gpu(x), on_gpu(dt), on_gpu(A), on_gpu(Bm), on_gpu(C), Tensor(), on_gpu(gy), Tensor(), gdx, gddt,
                  gdA, gdB, gdC, gnone);
  expect_close(back(gdx), dx.to_f32_vector(), 1e-4, "dx");
  expect_close(back(gddt), ddt.to_f32_vector(), 1e-4, "ddt");
  expect_close(back(gdA), dA.to_f32_vector(), 1e-4, "dA");
  expect_close(back(gdB), dB.to_f32_vector(), 1e-4, "dB");
  expect_close(back(gdC), dC.to_f32_vector(), 1e-4, "dC");
}

// ---- gated delta rule ----------------------------------------------------------------------------

TEST(CudaScan, GatedDeltaRuleAndItsGradientsEqualTheCpu) {
  REQUIRE_GPU();
  // T past a 64-token span and not a multiple of it; 2 K heads read by 4 V heads; Dk != Dv, neither
  // a multiple of 32; with and without an initial state; the CPU token by token (chunk 1) and
  // chunked (chunk 64).
  const GdrCase cases[] = {
      {2, 150, 2, 4, 16, 24, true, true},
      {1, 100, 1, 3, 40, 33, false, false},
      {1, 70, 2, 2, 8, 8, true, false},
  };
  uint64_t seed = 400;
  for (const GdrCase& c : cases)
    for (GatedDeltaAlgorithm a : {GatedDeltaAlgorithm::Recurrent, GatedDeltaAlgorithm::Chunked})
      check_gdr(c, a, seed += 10);
}

TEST(CudaScan, GatedDeltaRuleDecodesOneTokenLikeTheCpu) {
  REQUIRE_GPU();
  check_gdr({3, 1, 2, 4, 32, 32, true, true}, GatedDeltaAlgorithm::Auto, 500);
  check_gdr({1, 5, 1, 2, 20, 12, true, true}, GatedDeltaAlgorithm::Auto, 510);
}

TEST(CudaScan, GatedDeltaRuleAtAModelsSizeEqualsTheCpu) {
  REQUIRE_GPU();
  // Qwen3-Next's heads: Dk = Dv = 128 (the backward's block holds the whole state).
  check_gdr({1, 70, 1, 2, 128, 128, true, true}, GatedDeltaAlgorithm::Chunked, 600);
}

TEST(CudaScan, GatedDeltaRuleRecordsTheCpusStates) {
  REQUIRE_GPU();
  // The state before every 64th token, as the backward reads it (the CPU's chunked forward).
  const GdrCase c{2, 130, 1, 2, 12, 20, true, true};
  const std::vector<Tensor> in = gdr_inputs(c, 700);
  const Shape ys{c.B, c.T, c.Hv, c.Dv}, ss{c.B, c.Hv, c.Dk, c.Dv}, sts{c.B, c.Hv, 3, c.Dk, c.Dv};
  const KernelRef<kern::GatedDeltaRule> k("gated_delta_rule");
  Tensor o = empty(ys, DType::F32), s = empty(ss, DType::F32), st = empty(sts, DType::F32);
  k(Device::CPU)(in[0], in[1], in[2], in[3], in[4], in[5], 64, o, s, st);
  Tensor go = gpu_empty(ys), gsf = gpu_empty(ss), gst = gpu_empty(sts);
  k(Device::CUDA)(on_gpu(in[0]), on_gpu(in[1]), on_gpu(in[2]), on_gpu(in[3]), on_gpu(in[4]), on_gpu(in[5]), 64, go,
                  gsf, gst);
  expect_close(back(go), o.to_f32_vector(), 1e-4, "o");
  expect_close(back(gsf), s.to_f32_vector(), 1e-4, "s_final");
  expect_close(back(gst), st.to_f32_vector(), 1e-4, "starts");
}

TEST(CudaScan, GatedDeltaRuleBackwardRecomputesTheStatesLikeTheCpu) {
  REQUIRE_GPU();
  // Direct kernel calls without the recorded states, the final state's gradient or ds0.
  const GdrCase c{1, 100, 2, 4, 24, 16, true, false};
  const std::vector<Tensor> in = gdr_inputs(c, 800);
  const Tensor gout = rnd(Shape{c.B, c.T, c.Hv, c.Dv}, 810);
  const KernelRef<kern::GatedDeltaRuleBackward> k("gated_delta_rule_backward");
  std::vector<Tensor> want, got;
  for (const Tensor& x : {in[0], in[1], in[2], in[3], in[4]}) {
    want.push_back(empty(x.shape(), DType::F32));
    got.push_back(gpu_empty(x.shape()));
  }
  Tensor none, gnone;
  k(Device::CPU)(in[0], in[1], in[2], in[3], in[4], in[5], Tensor(), gout, Tensor(), want[0], want[1], want[2],
                 want[3], want[4], none);
  k(Device::CUDA)(on_gpu(in[0]), on_gpu(in[1]), on_gpu(in[2]), on_gpu(in[3]), on_gpu(in[4]), on_gpu(in[5]), Tensor(),
                  on_gpu(gout), Tensor(), got[0], got[1], got[2], got[3], got[4], gnone);
  const char* names[] = {"dq", "dk", "dv", "dg", "dbeta"};
  for (size_t i = 0; i < want.size(); ++i) expect_close(back(got[i]), want[i].to_f32_vector(), 1e-4, names[i]);
}

// ---- MoE -----------------------------------------------------------------------------------------

TEST(CudaScan, MulMatIdAndItsGradientsEqualTheCpu) {
  REQUIRE_GPU();
  // x shared by every slot (X = 1) and one row per slot (X = n_used); K not a multiple of 32.
  check_moe(7, 3, 1, 5, 12, 40, DType::F32, 1000);
  check_moe(7, 3, 3, 5, 12, 40, DType::F32, 1010);
  check_moe(5, 1, 1, 3, 33, 64, DType::F32, 1020);
  // More pairs than the grouping stages at once (1024).
  check_moe(300, 4, 4, 6, 8, 16, DType::F32, 1030);
  for (DType t : {DType::F16, DType::BF16}) {
    check_moe(6, 2, 1, 4, 10, 24, t, 1040);
    check_moe(6, 2, 2, 4, 10, 24, t, 1050);
  }
}

TEST(CudaScan, MulMatIdReadsHalfExpertsAndAccumulatesDw) {
  REQUIRE_GPU();
  // The kernels read F16/BF16 experts themselves (the CPU kernel, given the same values in F32,
  // is the reference), and dW is "+=".
  const int64_t T = 9, U = 2, E = 4, N = 7, K = 36;
  const Tensor x = rnd(Shape{T, U, K}, 1100), ids = moe_ids(T, U, int32_t(E), 1101), g = rnd(Shape{T, U, N}, 1102);
  const Tensor dw0 = rnd(Shape{E, N, K}, 1103);
  const KernelRef<kern::MulMatId> fwd("mul_mat_id");
  const KernelRef<kern::MulMatIdBackward> bwd("mul_mat_id_backward");
  for (DType t : {DType::F16, DType::BF16}) {
    const Tensor w = cast(rnd(Shape{E, N, K}, 1104), t), w32 = cast(w, DType::F32);
    Tensor out = empty(Shape{T, U, N}, DType::F32), gout = gpu_empty(Shape{T, U, N});
    fwd(Device::CPU)(w32, x, ids, out);
    fwd(Device::CUDA)(on_gpu(w), on_gpu(x), on_gpu(ids), gout);
    expect_close(back(gout), out.to_f32_vector(), 1e-5, name(t).data());
    Tensor dx = empty(x.shape(), DType::F32), dw = contiguous_copy(dw0);
    Tensor gdx = gpu_empty(x.shape()), gdw = on_gpu(dw0);
    bwd(Device::CPU)(w32, x, ids, g, dx, dw);
    bwd(Device::CUDA)(on_gpu(w), on_gpu(x), on_gpu(ids), on_gpu(g), gdx, gdw);
    expect_close(back(gdx), dx.to_f32_vector(), 1e-5, name(t).data());
    expect_close(back(gdw), dw.to_f32_vector(), 1e-5, name(t).data());
  }
}

// The op with stored-dtype experts on the GPU: no mul_mat_id_weight kernel there yet, so the
// composite (each expert's rows gathered through linear) runs: F16/BF16 experts equal the
// CPU's kernel within the tensor cores' tolerance.
TEST(CudaScan, StoredExpertsRunTheirCompositeOnTheGpu) {
  REQUIRE_GPU();
  const Tensor x = rnd(Shape{3, 1, 256}, 1211);
  const Tensor ids = from_vector(std::vector<int32_t>{0, 3, 2, 3, 1, 0}, Shape{3, 2});
  for (DType dt : {DType::F16, DType::BF16}) {
    const Tensor w = cast(rnd(Shape{4, 24, 256}, 1210), dt);
    expect_close(back(mul_mat_id(on_gpu(w), on_gpu(x), on_gpu(ids))), mul_mat_id(w, x, ids).to_f32_vector(), 1e-4,
                 std::string(name(dt)).c_str());
  }
}

// Block experts reach linear's cuBLAS kernel, which refuses them by name (the GPU's quantized
// kernels are not written yet). Not emulated: on sim that kernel stays the CPU's, which takes them.
TEST(CudaMatmul, StoredBlockExpertsAreRefusedByName) {
  REQUIRE_GPU();
  const Tensor x = rnd(Shape{3, 1, 256}, 1211);
  const Tensor ids = from_vector(std::vector<int32_t>{0, 3, 2, 3, 1, 0}, Shape{3, 2});
  const Tensor q = on_gpu(cast(rnd(Shape{4, 24, 256}, 1210), DType::Q8_0));
  try {
    mul_mat_id(q, on_gpu(x), on_gpu(ids));
    FAIL() << "q8_0 experts ran on the GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
}

TEST(CudaScan, MulMatIdRefusesQuantizedExpertsByName) {
  REQUIRE_GPU();
  const Tensor w = on_gpu(cast(rnd(Shape{3, 4, 32}, 1200), DType::Q8_0));
  const Tensor x = on_gpu(rnd(Shape{2, 1, 32}, 1201));
  const Tensor ids = on_gpu(from_vector(std::vector<int32_t>{0, 2}, Shape{2, 1}));
  Tensor out = gpu_empty(Shape{2, 1, 4});
  try {
    KernelRef<kern::MulMatId>("mul_mat_id")(Device::CUDA)(w, x, ids, out);
    FAIL() << "a q8_0 expert tensor was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q8_0"), std::string::npos) << e.what();
  }
}
