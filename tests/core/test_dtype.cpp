// dtypes: 16-bit float conversions (exhaustive against a double reference), block codecs.
#include <gtest/gtest.h>

#include <cmath>
#include <bit>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "toy/core/dtype.h"
#include "toy/core/quant.h"
#include "toy/core/rng.h"
#include "toy/core/tensor.h"

using namespace toy;

namespace {
// Reference decode of binary16 in double.
double f16_ref(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double sign = s ? -1.0 : 1.0;
  if (e == 31) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(double(m), -24);
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}
}  // namespace

TEST(DType, F16DecodeAllBitPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    double ref = f16_ref(uint16_t(h));
    float got = f16_to_f32(uint16_t(h));
    if (std::isnan(ref))
      ASSERT_TRUE(std::isnan(got)) << h;
    else
      ASSERT_EQ(double(got), ref) << h;
  }
}

TEST(DType, F16EncodeRoundTripsAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), uint16_t(h)) << h;
  }
  // Halfway between 1 and the next f16 (1 + 2^-10): ties go to even (1.0).
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), f32_to_f16(1.0f));
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), f32_to_f16(1.0f + std::ldexp(1.0f, -9)));
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);  // overflow to inf
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);  // rounds to zero
}

TEST(DType, BF16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to even -> 1.0
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(DType, NamesAndGgufCodes) {
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_EQ(dtype_from_name("q4_k"), DType::Q4_K);
  EXPECT_THROW(dtype_from_name("f64"), Error);
  EXPECT_EQ(dtype_info(DType::Q6_K).block_bytes, 210);
  EXPECT_EQ(dtype_info(DType::Q4_K).ggml_type, 12);
  EXPECT_EQ(dtype_from_ggml(8), DType::Q8_0);
  EXPECT_EQ(dtype_from_ggml(3), DType::Q4_1);
  EXPECT_EQ(dtype_from_ggml(13), DType::Q5_K);
  EXPECT_THROW(dtype_from_ggml(16), Error);  // IQ2_XXS: not read by toy
  EXPECT_EQ(row_bytes(DType::Q3_K, 512), 220u);
  EXPECT_EQ(row_bytes(DType::Q8_0, 64), 68u);
  EXPECT_THROW(row_bytes(DType::Q8_0, 33), Error);
}

class BlockCodec : public ::testing::TestWithParam<DType> {};

TEST_P(BlockCodec, RoundTripErrorIsWithinTheFormatsResolution) {
  const DType t = GetParam();
  const int64_t n = 512;
  Generator g(7);
  Tensor x = randn(Shape{n}, g);
  std::vector<float> xv = x.to_f32_vector();
  std::vector<uint8_t> blocks(row_bytes(t, n));
  quantize_row(t, xv.data(), blocks.data(), n);
  std::vector<float> back(static_cast<size_t>(n));
  dequantize_row(t, blocks.data(), back.data(), n);
  double amax = 0, err = 0;
  for (int64_t i = 0; i < n; ++i) {
    amax = std::max(amax, double(std::fabs(xv[size_t(i)])));
    err = std::max(err, double(std::fabs(xv[size_t(i)] - back[size_t(i)])));
  }
  // 8-bit formats resolve amax/127, 6-bit ~amax/31, 4-bit ~amax/8 (per block; loose bound).
  const double bound = t == DType::Q8_0 ? amax / 100 : t == DType::Q6_K ? amax / 20 : amax / 5;
  EXPECT_LT(err, bound) << name(t);
}

INSTANTIATE_TEST_SUITE_P(All, BlockCodec,
                         ::testing::Values(DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q4_K,
                                           DType::Q5_K, DType::Q6_K),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(name(i.param)); });

TEST(BlockCodec, Q8_0LayoutIsScaleThenInt8) {
  // One block: d = 2 (half), q[j] = j - 16 -> value 2 * (j - 16).
  uint8_t b[34];
  uint16_t d = f32_to_f16(2.0f);
  std::memcpy(b, &d, 2);
  for (int j = 0; j < 32; ++j) b[2 + j] = uint8_t(int8_t(j - 16));
  float out[32];
  dequantize_row(DType::Q8_0, b, out, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 2.0f * float(j - 16));
}

TEST(BlockCodec, Q4_0NibbleOrderFollowsGgml) {
  // Byte j: low nibble = element j, high nibble = element j + 16; value = d * (q - 8).
  uint8_t b[18];
  uint16_t d = f32_to_f16(0.5f);
  std::memcpy(b, &d, 2);
  for (int j = 0; j < 16; ++j) b[2 + j] = uint8_t((j & 15) | ((15 - j) << 4));
  float out[32];
  dequantize_row(DType::Q4_0, b, out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * float(j - 8));
    EXPECT_EQ(out[j + 16], 0.5f * float(15 - j - 8));
  }
}

TEST(BlockCodec, Q4_KDecodesScalesAndMins) {
  // d = 1, dmin = 1; sub-block j has scale j+1 and min j; all quants = 3.
  uint8_t b[144] = {};
  uint16_t one = f32_to_f16(1.0f);
  std::memcpy(b, &one, 2);
  std::memcpy(b + 2, &one, 2);
  int sc[8], m[8];
  for (int j = 0; j < 8; ++j) sc[j] = j + 1, m[j] = j;
  uint8_t* s = b + 4;
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = uint8_t(m[j] | ((m[j + 4] >> 4) << 6));
    s[j + 8] = uint8_t((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
  for (int i = 0; i < 128; ++i) b[16 + i] = 0x33;
  float out[256];
  dequantize_row(DType::Q4_K, b, out, 256);
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l) EXPECT_EQ(out[32 * j + l], float(sc[j] * 3 - m[j])) << j;
}

TEST(BlockCodec, TensorCastDequantizesRows) {
  Generator g(3);
  Tensor x = randn(Shape{4, 64}, g);
  std::vector<float> xv = x.to_f32_vector();
  Tensor q = empty(Shape{4, 64}, DType::Q8_0);
  for (int r = 0; r < 4; ++r)
    quantize_row(DType::Q8_0, xv.data() + r * 64, static_cast<char*>(q.raw_data()) + r * 68, 64);
  std::vector<float> back = q.to_f32_vector();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(back[i], xv[i], 0.05);
}

// Blocks made by llama.cpp itself (tests/fixtures/ggml_quant_blocks.bin, written by
// tools/llamacpp/make_quant_fixture.py from ggml's quantize_row_*_ref / dequantize_row_* in
// node-llama-cpp's libggml-base.so): rows of varied scale and sign, zero and tiny rows, with
// every nibble position and the high bits of Q4_K's 6-bit scales and mins exercised. toy must
// decode each block to exactly ggml's floats and encode each row to exactly ggml's bytes.
TEST(BlockCodec, MatchesGgmlBitForBit) {
  std::ifstream in(std::string(TOY_FIXTURE_DIR) + "/ggml_quant_blocks.bin", std::ios::binary);
  ASSERT_TRUE(in.good());
  char magic[8];
  uint32_t cases = 0;
  in.read(magic, 8).read(reinterpret_cast<char*>(&cases), 4);
  ASSERT_EQ(std::string(magic, 8), "GGQBLK01");
  ASSERT_GE(cases, 90u);
  std::map<DType, int> seen;
  for (uint32_t c = 0; c < cases; ++c) {
    uint32_t type = 0, n = 0;
    char name_buf[16];
    in.read(reinterpret_cast<char*>(&type), 4).read(reinterpret_cast<char*>(&n), 4).read(name_buf, 16);
    const DType t = dtype_from_ggml(int32_t(type));
    const std::string label = std::string(name(t)) + "/" + std::string(name_buf, strnlen(name_buf, 16));
    std::vector<float> input(n), ggml_out(n);
    std::vector<uint8_t> ggml_blocks(row_bytes(t, n));
    in.read(reinterpret_cast<char*>(input.data()), std::streamsize(n * 4));
    in.read(reinterpret_cast<char*>(ggml_blocks.data()), std::streamsize(ggml_blocks.size()));
    in.read(reinterpret_cast<char*>(ggml_out.data()), std::streamsize(n * 4));
    ASSERT_TRUE(in.good()) << label;
    ++seen[t];
    std::vector<float> ours(n);
    dequantize_row(t, ggml_blocks.data(), ours.data(), n);
    for (uint32_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(ours[i]), std::bit_cast<uint32_t>(ggml_out[i]))
          << label << " decode, element " << i << ": " << ours[i] << " vs ggml " << ggml_out[i];
    std::vector<uint8_t> blocks(ggml_blocks.size());
    if (t == DType::Q2_K || t == DType::Q3_K) {  // decode only: toy does not write these
      EXPECT_THROW(quantize_row(t, input.data(), blocks.data(), n), Error) << label;
      continue;
    }
    quantize_row(t, input.data(), blocks.data(), n);
    for (size_t b = 0; b < blocks.size(); ++b)
      ASSERT_EQ(int(blocks[b]), int(ggml_blocks[b])) << label << " encode, byte " << b;
  }
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K})
    EXPECT_GE(seen[t], 5) << name(t);
}
