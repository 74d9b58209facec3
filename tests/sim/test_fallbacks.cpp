// The fused ops' composite forms (ops/fallbacks.cpp), run on the sim device with the fused
// kernels withheld — as on a device whose backend lacks them — against the fused result:
// forward and every input's gradient, within each op's stated tolerance. And a primitive
// without a kernel is a clear error naming the kernel and the device.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "helpers.h"
#include "toy/autograd/backward.h"
#include "toy/core/registry.h"
#include "toy/ops/ops.h"

using namespace toy;
using namespace toy::test;

namespace {

// A leaf on the sim device with seeded normal values (made on the host, copied once).
Tensor leaf(const Shape& s, uint64_t seed, float std = 1.0f, DType dt = DType::F32) {
  Generator g(seed, 11);
  Tensor host = randn(s, g, 0.0f, std);
  if (dt != DType::F32) host = cast(host, dt);
  Tensor t = transfer(host, Device::SIM);
  t.requires_grad_();
  return t;
}

struct Result {
  std::vector<float> out;
  std::vector<std::vector<float>> grads;
};

// The op's output and the gradients of sum(out * r) for a fixed random r.
Result run(const std::function<Tensor()>& op, const std::vector<Tensor>& inputs) {
  for (Tensor t : inputs) t.zero_grad();  // (a handle: the leaf itself)
  Tensor y = op();
  Generator g(99, 12);
  Tensor r = transfer(randn(y.shape(), g), Device::SIM);
  if (y.dtype() != DType::F32) r = cast(r, y.dtype());
  sum(mul(y, r)).backward();
  Result res{y.to_f32_vector(), {}};
  for (const Tensor& t : inputs) res.grads.push_back(t.grad().to_f32_vector());
  return res;
}

double worst_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) / (1.0 + std::abs(double(want[i]))));
  return worst;
}

// The fused result, then the composite's with `kernels` withheld on sim: equal within tol.
void expect_fallback_matches(const char* op_name, const std::vector<std::string>& kernels,
                             const std::function<Tensor()>& op, const std::vector<Tensor>& inputs, double tol) {
  const OpInfo* info = registry().find_op(op_name);
  ASSERT_NE(info, nullptr) << op_name;
  EXPECT_TRUE(registry().has_own_kernels(*info, Device::SIM)) << op_name;
  const Result fused = run(op, inputs);
  Result composite;
  {
    WithheldKernels withheld(kernels, Device::SIM);
    EXPECT_FALSE(registry().has_own_kernels(*info, Device::SIM)) << op_name;
    EXPECT_TRUE(registry().supports(*info, Device::SIM)) << op_name << " runs through its composite form";
    EXPECT_TRUE(registry().has_own_kernels(*info, Device::CPU)) << op_name << " (withheld on sim only)";
    composite = run(op, inputs);
  }
  ASSERT_EQ(composite.out.size(), fused.out.size()) << op_name;
  EXPECT_LE(worst_error(composite.out, fused.out), tol) << op_name << " forward";
  for (size_t i = 0; i < inputs.size(); ++i)
    EXPECT_LE(worst_error(composite.grads[i], fused.grads[i]), tol) << op_name << " gradient of input " << i;
  // The composite really ran: with the kernels back, the fused one gives its bits again.
  EXPECT_EQ(run(op, inputs).out, fused.out) << op_name;
}

}  // namespace

TEST(Fallbacks, NormsRunTheirCompositeFormWithoutTheirKernels) {
  const Tensor x = leaf(Shape{3, 5, 24}, 1, 2.0f), w = leaf(Shape{24}, 2), b = leaf(Shape{24}, 3);
  expect_fallback_matches("rms_norm", {"rms_norm", "rms_norm_backward"}, [&] { return rms_norm(x, w, 1e-5f); },
                          {x, w}, 1e-5);
  expect_fallback_matches("layer_norm", {"layer_norm", "layer_norm_backward"},
                          [&] { return layer_norm(x, w, b, 1e-5f); }, {x, w, b}, 1e-5);
  expect_fallback_matches("l2_norm", {"l2_norm", "l2_norm_backward"}, [&] { return l2_norm(x, 1e-6f); }, {x},
                          1e-5);
  // Half-precision input: computed in F32 and rounded, as the kernel does.
  const Tensor xh = leaf(Shape{4, 32}, 4, 1.0f, DType::BF16), wh = leaf(Shape{32}, 5, 1.0f, DType::BF16);
  expect_fallback_matches("rms_norm", {"rms_norm", "rms_norm_backward"}, [&] { return rms_norm(xh, wh, 1e-6f); },
                          {xh, wh}, 1e-2);
}

TEST(Fallbacks, SoftmaxAndLogSoftmaxWithScaleAndMask) {
  const Tensor x = leaf(Shape{2, 3, 7, 9}, 6, 3.0f), mask = leaf(Shape{1, 1, 7, 9}, 7);
  for (bool log_form : {false, true})
    expect_fallback_matches(log_form ? "log_softmax" : "softmax", {"softmax", "softmax_backward"},
                            [&] { return log_form ? log_softmax(x, 0.7f, mask) : softmax(x, 0.7f, mask); },
                            {x, mask}, 1e-5);
}

TEST(Fallbacks, SwigluBothFormsWithoutTheirKernels) {
  const Tensor a = leaf(Shape{4, 6, 20}, 8), b = leaf(Shape{4, 6, 20}, 9), packed = leaf(Shape{5, 2, 34}, 10);
  expect_fallback_matches("swiglu", {"swiglu", "swiglu_backward"}, [&] { return swiglu(a, b); }, {a, b}, 1e-6);
  expect_fallback_matches("swiglu", {"swiglu_packed", "swiglu_packed_backward"}, [&] { return swiglu(packed); },
                          {packed}, 1e-6);
}

TEST(Fallbacks, AttentionCausalGqaSegmentsAndPackedQkv) {
  // Causal with more keys than queries (a cache), grouped-query heads, a scale of its own.
  const Tensor q = leaf(Shape{2, 5, 4, 8}, 11), k = leaf(Shape{2, 7, 2, 8}, 12), v = leaf(Shape{2, 7, 2, 6}, 13);
  AttentionOptions o;
  o.scale = 0.3f;
  const std::vector<std::string> kernels = {"attention", "attention_backward"};
  expect_fallback_matches("attention", kernels, [&] { return attention(q, k, v, o); }, {q, k, v}, 1e-5);
  AttentionOptions full;
  full.causal = false;
  expect_fallback_matches("attention", kernels, [&] { return attention(q, k, v, full); }, {q, k, v}, 1e-5);
  // Packed sequences: block-causal within segment ids (made on the host, copied once).
  const Tensor qs = leaf(Shape{2, 6, 2, 8}, 14), ks = leaf(Shape{2, 6, 1, 8}, 15), vs = leaf(Shape{2, 6, 1, 8}, 16);
  AttentionOptions seg;
  seg.segments = transfer(from_vector(std::vector<int32_t>{0, 0, 0, 1, 1, 2, 5, 5, 7, 7, 7, 7}, Shape{2, 6}),
                          Device::SIM);
  expect_fallback_matches("attention", kernels, [&] { return attention(qs, ks, vs, seg); }, {qs, ks, vs}, 1e-5);
  const Tensor qkv = leaf(Shape{2, 5, 4 + 2 * 2, 8}, 17);
  expect_fallback_matches("attention", kernels, [&] { return attention_qkv(qkv, 4, 2); }, {qkv}, 1e-5);
  // A sliding window (keys 2 or more behind a query hidden), alone and with segments.
  AttentionOptions win = o;
  win.window = 2;
  expect_fallback_matches("attention", kernels, [&] { return attention(q, k, v, win); }, {q, k, v}, 1e-5);
  seg.window = 2;
  expect_fallback_matches("attention", kernels, [&] { return attention(qs, ks, vs, seg); }, {qs, ks, vs}, 1e-5);
}

// attention_decode on sim (no autograd: its own kernel, run inside the sim's kernel scope),
// and with that kernel withheld (the composite: one attention per sequence), both equal to
// the CPU's result bit for bit — sequences of different lengths, GQA, F32 and F16 caches.
TEST(Fallbacks, AttentionDecodeOnSimWithAndWithoutItsKernel) {
  const std::vector<int64_t> lengths = {3, 17, 1};
  for (DType kv : {DType::F32, DType::F16}) {
    SCOPED_TRACE(std::string(name(kv)));
    const Tensor q = randn_t(Shape{3, 1, 4, 8}, 190);
    std::vector<Tensor> ks, vs, ks_sim, vs_sim;
    for (size_t i = 0; i < lengths.size(); ++i) {
      ks.push_back(cast(randn_t(Shape{1, lengths[i], 2, 8}, 191 + i), kv));
      vs.push_back(cast(randn_t(Shape{1, lengths[i], 2, 6}, 195 + i), kv));
      ks_sim.push_back(transfer(ks.back(), Device::SIM)), vs_sim.push_back(transfer(vs.back(), Device::SIM));
    }
    const Tensor q_sim = transfer(q, Device::SIM);
    const std::vector<float> cpu = attention_decode(q, ks, vs).to_f32_vector();
    const OpInfo* info = registry().find_op("attention_decode");
    ASSERT_NE(info, nullptr);
    EXPECT_TRUE(registry().has_own_kernels(*info, Device::SIM));
    EXPECT_EQ(attention_decode(q_sim, ks_sim, vs_sim).to_f32_vector(), cpu) << "sim, its own kernel";
    WithheldKernels withheld({"attention_decode"}, Device::SIM);
    EXPECT_FALSE(registry().has_own_kernels(*info, Device::SIM));
    EXPECT_TRUE(registry().supports(*info, Device::SIM));
    EXPECT_EQ(attention_decode(q_sim, ks_sim, vs_sim).to_f32_vector(), cpu) << "sim, the composite form";
  }
}

// Stored-dtype experts on sim: through mul_mat_id_weight, and with it withheld through the
// composite (grouped through linear); both equal the CPU bit for bit.
TEST(Fallbacks, StoredExpertsOnSimWithAndWithoutTheirKernel) {
  for (DType dt : {DType::Q8_0, DType::Q4_K}) {
    SCOPED_TRACE(std::string(name(dt)));
    const Tensor w = cast(randn_t(Shape{4, 24, 256}, 200, 0.5f), dt);
    const Tensor x = randn_t(Shape{3, 1, 256}, 201);
    const Tensor ids = from_vector(std::vector<int32_t>{0, 3, 2, 3, 1, 0}, Shape{3, 2});
    const std::vector<float> cpu = mul_mat_id(w, x, ids).to_f32_vector();
    const Tensor w_sim = transfer(w, Device::SIM), x_sim = transfer(x, Device::SIM), ids_sim = transfer(ids, Device::SIM);
    const OpInfo* info = registry().find_op("mul_mat_id");
    ASSERT_NE(info, nullptr);
    EXPECT_TRUE(registry().has_own_kernels(*info, Device::SIM));
    EXPECT_EQ(mul_mat_id(w_sim, x_sim, ids_sim).to_f32_vector(), cpu) << "sim, its own kernel";
    WithheldKernels withheld({"mul_mat_id_weight"}, Device::SIM);
    EXPECT_FALSE(registry().has_own_kernels(*info, Device::SIM));
    EXPECT_TRUE(registry().supports(*info, Device::SIM));
    EXPECT_EQ(mul_mat_id(w_sim, x_sim, ids_sim).to_f32_vector(), cpu) << "sim, the composite form";
  }
}

// linear's fused bias kernels (matmul_bias forward, matmul_row_sums for the weight and bias
// gradients) and the arena's square_norms_ranges withheld on sim: the forms they replace
// (bias copied then accumulated, sum(g, 0), the ops range by range) give the CPU's bits.
TEST(Fallbacks, LinearBiasAndSquareNormsOnSimWithAndWithoutTheirKernels) {
  const Tensor x = randn_t(Shape{2, 9, 24}, 210), w = randn_t(Shape{20, 24}, 211), b = randn_t(Shape{20}, 212);
  const Tensor gout = randn_t(Shape{2, 9, 20}, 213);
  const std::vector<ArenaRange> ranges = {{0, 5}, {3, 117}, {100, 180}};
  auto grads = [&](Device d) {
    Tensor xd = transfer(x, d), wd = transfer(w, d), bd = transfer(b, d);
    for (Tensor* t : {&xd, &wd, &bd}) t->requires_grad_();
    Tensor y = linear(xd, wd, bd);
    backward(y, transfer(gout, d));
    std::vector<std::vector<float>> r = {y.to_f32_vector(), xd.grad().to_f32_vector(), wd.grad().to_f32_vector(),
                                         bd.grad().to_f32_vector()};
    r.push_back(square_norms(transfer(reshape(x, Shape{-1}), d), ranges).to_f32_vector());
    return r;
  };
  const auto cpu = grads(Device::CPU);
  EXPECT_EQ(grads(Device::SIM), cpu) << "sim, its own kernels";
  WithheldKernels withheld({"matmul_bias", "matmul_row_sums", "square_norms_ranges"}, Device::SIM);
  const auto composite = grads(Device::SIM);
  ASSERT_EQ(composite.size(), cpu.size());
  const char* what[] = {"y", "dx", "dw", "db", "square norms"};
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_EQ(composite[i], cpu[i]) << "sim, the composite form: " << what[i];
}

TEST(Fallbacks, APrimitiveWithoutAKernelIsAClearErrorNamingItAndTheDevice) {
  const Tensor x = leaf(Shape{1, 3, 2, 8}, 18);
  const Tensor pos = transfer(from_vector(std::vector<int32_t>{0, 1, 2}, Shape{3}), Device::SIM);
  const OpInfo* rope_op = registry().find_op("rope");
  ASSERT_NE(rope_op, nullptr);
  WithheldKernels withheld({"rope"}, Device::SIM);
  EXPECT_FALSE(registry().supports(*rope_op, Device::SIM));
  EXPECT_EQ(error_of([&] { rope(x, pos); }), "[rope] has no sim kernel");
}
