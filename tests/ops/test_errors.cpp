// Every error path a caller can hit throws toy::Error naming the op, what was expected and
// what was found — never a crash.
#include <gtest/gtest.h>

#include "helpers.h"

using namespace toy;
using namespace toy::test;

namespace {
// Runs f, expects toy::Error whose message contains every needle.
void expect_error(const std::function<void()>& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "no error thrown (expected one mentioning " << *needles.begin() << ")";
  } catch (const Error& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}
Tensor f32(const Shape& s) { return zeros(s); }
Tensor i32(const Shape& s) { return zeros(s, DType::I32); }
}  // namespace

TEST(OpErrors, Elementwise) {
  expect_error([] { add(f32({2, 3}), f32({4})); }, {"[add]", "[2, 3]", "[4]"});
  expect_error([] { mul(f32({2}), zeros(Shape{2}, DType::BF16)); }, {"[mul]", "dtype"});
  expect_error([] { exp(i32({2})); }, {"[exp]", "i32"});
  expect_error([] { clamp(f32({2}), 1, 0); }, {"[clamp]"});
  expect_error([] { swiglu(f32({2, 3})); }, {"[swiglu]", "even"});
  expect_error([] { swiglu(f32({2, 4}), f32({2, 3})); }, {"[swiglu]", "[2, 4]", "[2, 3]"});
  expect_error([] { dropout(f32({2}), 1.5f); }, {"[dropout]", "1.5"});
  expect_error([] { exp(Tensor()); }, {"[exp]", "undefined"});
}

TEST(OpErrors, MatmulAndLinear) {
  expect_error([] { matmul(f32({4, 64, 768}), f32({512, 768})); }, {"[matmul]", "inner", "[4, 64, 768]", "[512, 768]"});
  expect_error([] { matmul(f32({2, 3, 4}), f32({5, 4, 2})); }, {"[matmul]", "broadcast"});
  expect_error([] { matmul(f32({}), f32({3})); }, {"[matmul]"});
  expect_error([] { linear(f32({2, 8}), f32({4, 7})); }, {"[linear]", "8", "7"});
  expect_error([] { linear(f32({2, 8}), f32({4, 8}), f32({5})); }, {"[linear]", "bias"});
  expect_error([] { out_prod(f32({3, 2}), f32({4, 2})); }, {"[out_prod]"});
}

TEST(OpErrors, ReductionsAndSorting) {
  expect_error([] { sum(f32({2, 3}), 2); }, {"[sum]", "axis 2"});
  expect_error([] { max(f32({0})); }, {"[max]"});
  expect_error([] { top_k(f32({2, 3}), 4); }, {"[top_k]", "4"});
  expect_error([] { mean(f32({0, 2}), 0); }, {"[mean]"});
}

TEST(OpErrors, NormsSoftmaxRope) {
  expect_error([] { rms_norm(f32({2, 8}), f32({7})); }, {"[rms_norm]", "weight", "[8]"});
  expect_error([] { layer_norm(f32({2, 8}), f32({8}), f32({8, 1})); }, {"[layer_norm]", "bias"});
  expect_error([] { l2_norm(f32({2, 8}), 0.0f); }, {"[l2_norm]", "eps"});
  expect_error([] { softmax(f32({2, 8}), 1.0f, f32({3, 8})); }, {"[softmax]", "[3, 8]"});
  expect_error([] { diag_mask_inf(f32({8})); }, {"[diag_mask_inf]"});
  expect_error([] { rope(f32({2, 3, 8}), i32({3})); }, {"[rope]", "[B, T, H, D]"});
  expect_error([] { rope(f32({1, 3, 2, 8}), i32({4})); }, {"[rope]", "positions"});
  expect_error([] { rope(f32({1, 3, 2, 8}), f32({3})); }, {"[rope]", "i32"});
  expect_error([] { rope(f32({1, 3, 2, 8}), i32({3}), {.n_dims = 5}); }, {"[rope]", "n_dims"});
  expect_error([] { rope(f32({1, 3, 2, 8}), i32({3}), {.ext_factor = 1.0f}); }, {"[rope]", "n_ctx_orig"});
}

TEST(OpErrors, Attention) {
  expect_error([] { attention(f32({1, 4, 3, 8}), f32({1, 4, 2, 8}), f32({1, 4, 2, 8})); }, {"[attention]", "multiple"});
  expect_error([] { attention(f32({1, 4, 2, 8}), f32({1, 4, 2, 4}), f32({1, 4, 2, 8})); }, {"[attention]", "head dims"});
  expect_error([] { attention(f32({1, 5, 2, 8}), f32({1, 4, 2, 8}), f32({1, 4, 2, 8})); }, {"[attention]", "causal"});
  expect_error([] { attention(f32({4, 2, 8}), f32({4, 2, 8}), f32({4, 2, 8})); }, {"[attention]", "[B, T, H, D]"});
  // Packed form: 3 query heads cannot share 2 kv heads, nor 1 query head 2 (used to divide by zero).
  expect_error([] { attention_qkv(f32({1, 4, 7, 8}), 3, 2); }, {"[attention]", "multiple"});
  expect_error([] { attention_qkv(f32({1, 4, 5, 8}), 1, 2); }, {"[attention]", "multiple"});
  expect_error([] { attention_qkv(f32({1, 4, 5, 8}), 2, 2); }, {"[attention]", "H + 2*Hkv"});
  AttentionOptions o;
  o.segments = i32({1, 3});
  expect_error([o] { attention(f32({1, 4, 2, 8}), f32({1, 4, 2, 8}), f32({1, 4, 2, 8}), o); }, {"[attention]", "segments"});
}

TEST(OpErrors, AttentionDecode) {
  const std::vector<Tensor> k1 = {f32({1, 4, 2, 8})}, v1 = {f32({1, 4, 2, 8})};
  const std::vector<Tensor> k2 = {f32({1, 4, 2, 8}), f32({1, 3, 2, 8})}, v2 = {f32({1, 4, 2, 8}), f32({1, 3, 2, 8})};
  expect_error([&] { attention_decode(f32({2, 1, 4, 8}), k1, v1); }, {"[attention_decode]", "2 query rows"});
  expect_error([&] { attention_decode(f32({1, 2, 4, 8}), k1, v1); }, {"[attention_decode]", "[N, 1, H, D]"});
  expect_error([&] { attention_decode(f32({2, 1, 3, 8}), k2, v2); }, {"[attention_decode]", "multiple"});
  const std::vector<Tensor> kd = {f32({1, 4, 2, 4}), f32({1, 3, 2, 8})};
  expect_error([&] { attention_decode(f32({2, 1, 4, 8}), kd, v2); }, {"[attention_decode]", "sequence 0"});
  const std::vector<Tensor> kh = {f32({1, 4, 2, 8}), f32({1, 3, 1, 8})}, vh = {f32({1, 4, 2, 8}), f32({1, 3, 1, 8})};
  expect_error([&] { attention_decode(f32({2, 1, 4, 8}), kh, vh); }, {"[attention_decode]", "sequence 1"});
  const std::vector<Tensor> kmix = {f32({1, 4, 2, 8}), cast(f32({1, 3, 2, 8}), DType::F16)};
  const std::vector<Tensor> vmix = {f32({1, 4, 2, 8}), cast(f32({1, 3, 2, 8}), DType::F16)};
  expect_error([&] { attention_decode(f32({2, 1, 4, 8}), kmix, vmix); }, {"[attention_decode]", "sequence 1 keys are"});
  const std::vector<Tensor> none;
  expect_error([&] { attention_decode(f32({0, 1, 4, 8}), none, none); }, {"[attention_decode]", "at least one"});
  AttentionOptions o;
  o.segments = i32({1, 1});
  expect_error([&] { attention_decode(f32({1, 1, 4, 8}), k1, v1, o); }, {"[attention_decode]", "segment"});
}

TEST(OpErrors, ShapeOps) {
  expect_error([] { view(transpose(f32({2, 3})), Shape{6}); }, {"[view]", "reshape"});
  expect_error([] { reshape(f32({2, 3}), Shape{4, -1}); }, {"[reshape]", "6"});
  expect_error([] { reshape(f32({2, 3}), Shape{-1, -1}); }, {"[reshape]", "-1"});
  expect_error([] { permute(f32({2, 3}), {0, 0}); }, {"[permute]", "repeated"});
  expect_error([] { concat({f32({2, 3}), f32({3, 3})}, 1); }, {"[concat]", "[3, 3]"});
  expect_error([] { concat({}, 0); }, {"[concat]"});
  expect_error([] { slice(f32({2, 3}), 1, 0, 2, 0); }, {"[slice]", "step"});
  expect_error([] { pad(f32({2}), {{1, 1}, {1, 1}}); }, {"[pad]"});
  expect_error([] { repeat(f32({2, 3}), {2}); }, {"[repeat]"});
  expect_error([] { squeeze(f32({2, 3}), 0); }, {"[squeeze]", "size 2"});
  expect_error([] { cast(param(f32({2})), DType::I32); }, {"[cast]", "gradient"});
  expect_error([] { cast(f32({2, 33}), DType::Q8_0); }, {"q8_0", "32"});
}

TEST(OpErrors, RowsAndLoss) {
  expect_error([] { get_rows(f32({4, 3}), from_vector(std::vector<int32_t>{1, 4}, Shape{2})); },
               {"[get_rows]", "[1] = 4", "[0, 4)"});
  expect_error([] { get_rows(f32({4, 3}), f32({2})); }, {"[get_rows]", "i32"});
  expect_error([] { get_rows(f32({4, 3, 2}), i32({2})); }, {"[get_rows]", "2-d"});
  expect_error([] { set_rows(f32({4, 3}), i32({2}), f32({2, 4})); }, {"[set_rows]", "src"});
  expect_error([] {
    Tensor d = param(f32({4, 3}));
    set_rows_(d, i32({1}), f32({1, 3}));
  }, {"[set_rows_]", "grad"});
  expect_error([] { cross_entropy(f32({2, 5}), from_vector(std::vector<int32_t>{1, 5}, Shape{2})); },
               {"[cross_entropy]", "[1] = 5", "[0, 5)"});
  expect_error([] { cross_entropy(f32({2, 5}), i32({3})); }, {"[cross_entropy]", "targets", "[2]"});
  CrossEntropyOptions o;
  o.weights = f32({3});
  expect_error([o] { cross_entropy(f32({2, 5}), i32({2}), o); }, {"[cross_entropy]", "weights"});
}

TEST(OpErrors, ConvMoeSsmOptim) {
  expect_error([] { im2col(f32({1, 1, 2, 2}), 3, 3); }, {"[im2col]", "larger"});
  expect_error([] { conv2d(f32({1, 2, 4, 4}), f32({3, 1, 3, 3})); }, {"[conv2d]"});
  expect_error([] { conv1d(f32({1, 4, 3}), f32({2, 2})); }, {"[conv1d]"});
  expect_error([] { ssm_conv(f32({1, 2, 3}), f32({3, 4})); }, {"[ssm_conv]"});
  expect_error([] { mul_mat_id(f32({2, 3, 4}), f32({2, 1, 4}), from_vector(std::vector<int32_t>{0, 2}, Shape{2, 1})); },
               {"[mul_mat_id]", "= 2", "[0, 2)"});
  // Stored-dtype experts take f32 activations (as linear does); integer experts are refused.
  expect_error([] { mul_mat_id(cast(f32({2, 3, 32}), DType::Q8_0), zeros({2, 1, 32}, DType::F16), i32({2, 1})); },
               {"[mul_mat_id]", "q8_0 experts", "f32 activations", "f16"});
  expect_error([] { mul_mat_id(i32({2, 3, 4}), f32({2, 1, 4}), i32({2, 1})); },
               {"[mul_mat_id]", "float or a GGUF block type", "i32"});
  expect_error([] { add_id(f32({2, 1, 3}), f32({2, 4}), i32({2, 1})); }, {"[add_id]", "bias"});
  expect_error([] { ssm_scan(f32({1, 2, 4, 3}), f32({1, 2, 3}), f32({4}), f32({1, 2, 3, 5}), f32({1, 2, 3, 5})); },
               {"[ssm_scan]", "dt"});
  Tensor p = f32({4}), g = f32({4}), m = f32({4}), v = f32({3});
  expect_error([&] { adamw_step(p, g, m, v, scalar(0.1), scalar(1)); }, {"[adamw]", "second moment", "[3]"});
  expect_error([&] { adamw_step(p, g, m, m, scalar(0.1), scalar(0)); }, {"[adamw]", "step"});
  expect_error([&] { adamw_step(p, g, m, m, f32({2}), scalar(1)); }, {"[adamw]", "lr"});
  Tensor none;
  expect_error([&] { sgd_step(p, g, none, scalar(0.1), {.momentum = 0.9f}); }, {"[sgd]", "momentum"});
}

TEST(OpErrors, CudaTensorsFailClearlyWithoutCuda) {
  expect_error([] { empty(Shape{2}, DType::F32, Device::CUDA); }, {"CUDA"});
}
