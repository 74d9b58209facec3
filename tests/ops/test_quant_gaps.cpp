// Quantized decode products (backend/cpu/gemv_blocks.h) where the other op tests leave gaps:
//   - Q8_0: the AVX2 kernels (one row: dot_q8_0; several rows: the packed kernels) and, on a
//     CPU that has it, the VNNI kernels, all equal bit for bit a scalar reference written here
//     from the documented arithmetic — so the check runs on every CPU (Forward.Q8_0Products...
//     skips without VNNI) and also pins the AVX2 path on its own.
//   - Q4_K / Q6_K (activations in Q8_K blocks of 256): a NaN or an infinity in the activations
//     of a decoded row poisons that row's outputs instead of vanishing in the 8-bit rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "helpers.h"
#include "toy/backend/cpu/gemv_blocks.h"
#include "toy/core/dtype.h"

using namespace toy;
using namespace toy::test;

namespace {

// Turns VNNI back on (the default) however the test leaves.
struct VnniRestore {
  ~VnniRestore() { cpu::gemv_use_vnni(true); }
};

// y [rows, out] = x [rows, K] @ w^T for a Q8_0 weight, computed one scalar at a time the way
// the kernels compute it (gemv_blocks.cpp, dot_q8_0 and TOY_DOT_ROWS_Q8_0):
//   - the activations rounded by quantize_activations (Q8_0: f16-rounded scale d_x, q in -127..127);
//   - per block of 32: 8 lanes, lane l the exact integer sum of w[4l..4l+3] * q[4l..4l+3]
//     (weight bytes as int8, -128 included);
//   - each lane accumulates fma(d_w * d_x, lane sum, acc) in f32, d_w the block's f16 scale
//     widened, d_w * d_x one f32 product; even blocks in one set of 8 accumulators, odd in another;
//   - the result: the two sets added lane by lane, then (v0 + v4) + (v2 + v6) plus
//     (v1 + v5) + (v3 + v7) — the horizontal sum's order.
std::vector<float> q8_0_reference(const Tensor& w, const std::vector<float>& x, int64_t rows, int64_t K) {
  const int64_t out = w.size(0), nb = K / 32;
  const size_t rb = size_t(nb) * 34;
  const auto* raw = static_cast<const uint8_t*>(w.raw_data());
  std::vector<float> y(static_cast<size_t>(rows * out));
  std::vector<float> d(static_cast<size_t>(nb));
  std::vector<int8_t> q(static_cast<size_t>(K));
  std::vector<int16_t> s16(static_cast<size_t>(K / 16));
  for (int64_t n = 0; n < rows; ++n) {
    cpu::quantize_activations(DType::Q8_0, x.data() + n * K, K, d.data(), q.data(), s16.data());
    for (int64_t r = 0; r < out; ++r) {
      float acc[2][8] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = raw + size_t(r) * rb + size_t(b) * 34;
        uint16_t h;
        std::memcpy(&h, blk, 2);
        const float scale = f16_to_f32(h) * d[size_t(b)];
        for (int l = 0; l < 8; ++l) {
          int32_t s = 0;
          for (int j = 0; j < 4; ++j)
            s += int32_t(int8_t(blk[2 + 4 * l + j])) * int32_t(q[size_t(32 * b + 4 * l + j)]);
          acc[b % 2][l] = std::fma(scale, float(s), acc[b % 2][l]);
        }
      }
      float v[8];
      for (int l = 0; l < 8; ++l) v[l] = acc[0][l] + acc[1][l];
      const float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
      const float t0 = s0 + s2, t1 = s1 + s3;
      y[size_t(n * out + r)] = t0 + t1;
    }
  }
  return y;
}

}  // namespace

// Every Q8_0 decode kernel this CPU can run against the scalar reference, bit for bit: AVX2
// (one row alone and 2..8 rows packed) always, VNNI (VEX or EVEX form) where the CPU has it —
// so the AVX2 and VNNI paths also agree with each other. An odd block count (K = 544), weight
// bytes of -128 and activations at +-127 as in Forward.Q8_0ProductsWithVnni...; never skipped.
TEST(QuantGaps, Q8_0DecodeProductsEqualAScalarReferenceWithAndWithoutVnni) {
  VnniRestore restore;
  const bool has_vnni = cpu::gemv_vnni_available();
  RecordProperty("vnni", has_vnni ? "checked" : "absent: AVX2 against the reference only");
  const int64_t K = 544, out = 29;
  Tensor w = cast(randn_t(Shape{out, K}, 18, 0.2f), DType::Q8_0);
  auto* raw = static_cast<uint8_t*>(const_cast<void*>(w.raw_data()));
  const size_t rb = size_t(K / 32) * 34;
  for (int64_t r = 0; r < out; r += 3)
    for (int64_t b = 0; b < K / 32; b += 2) raw[size_t(r) * rb + size_t(b) * 34 + 2 + size_t((r + b) % 32)] = 0x80;
  for (int64_t rows = 1; rows <= cpu::kGemvMaxRows; ++rows) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    std::vector<float> xv = randn_t(Shape{rows, K}, 40 + uint64_t(rows), 1.5f).to_f32_vector();
    for (size_t i = 0; i < xv.size(); i += 37) xv[i] = (i % 2 ? 40.0f : -40.0f);  // a block's largest: q = +-127
    const Tensor x = from_vector(xv, Shape{rows, K});
    const std::vector<float> want = q8_0_reference(w, xv, rows, K);
    size_t nonzero = 0;
    for (float v : want) nonzero += v != 0.0f && std::isfinite(v);
    ASSERT_GT(nonzero, want.size() / 2) << "the reference computes something";
    cpu::gemv_use_vnni(false);
    const std::vector<float> avx2 = linear(x, w).to_f32_vector();
    ASSERT_EQ(avx2.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(avx2[i], want[i]) << "AVX2, value " << i;
    if (has_vnni) {
      cpu::gemv_use_vnni(true);
      const std::vector<float> vnni = linear(x, w).to_f32_vector();
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(vnni[i], want[i]) << "VNNI, value " << i;
    }
  }
}

// A NaN or an infinity in the activations of a decoded row (one row, and one row of two) with
// Q4_K and Q6_K weights: the Q8_K rounding must not turn it into a finite number. NaN gives
// NaN in every output of that row (as Q8_0 does); an infinity gives no finite output (f32
// would give +-inf, or NaN where infinities meet). The other row of the pair stays finite
// and equal to its product alone; a finite row gives finite outputs.
TEST(QuantGaps, NonFiniteActivationsPoisonQ8KDecodeProducts) {
  const int64_t K = 512, out = 7;  // two blocks of 256
  for (DType dt : {DType::Q4_K, DType::Q6_K}) {
    SCOPED_TRACE(std::string(name(dt)));
    ASSERT_TRUE(cpu::gemv_blocks_supports(dt));
    ASSERT_TRUE(cpu::activations_in_256s(dt));
    Tensor w = cast(randn_t(Shape{out, K}, 61, 0.2f), dt);
    const std::vector<float> good = randn_t(Shape{1, K}, 62, 1.5f).to_f32_vector();
    const std::vector<float> y_good = linear(from_vector(good, Shape{1, K}), w).to_f32_vector();
    for (float v : y_good) ASSERT_TRUE(std::isfinite(v));
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      for (size_t at : {size_t(3), size_t(300), size_t(511)}) {
        SCOPED_TRACE("activation " + std::to_string(at) + " = " + std::to_string(bad));
        std::vector<float> xv = good;
        xv[at] = bad;
        const std::vector<float> y = linear(from_vector(xv, Shape{1, K}), w).to_f32_vector();
        ASSERT_EQ(y.size(), size_t(out));
        for (int64_t r = 0; r < out; ++r) {
          if (std::isnan(bad))
            EXPECT_TRUE(std::isnan(y[size_t(r)])) << "output " << r << " is " << y[size_t(r)];
          else
            EXPECT_FALSE(std::isfinite(y[size_t(r)])) << "output " << r << " is " << y[size_t(r)];
        }
        // Two rows decoding together: the bad row poisons only its own outputs.
        std::vector<float> two = good;
        two.insert(two.end(), xv.begin(), xv.end());
        const std::vector<float> y2 = linear(from_vector(two, Shape{2, K}), w).to_f32_vector();
        for (int64_t r = 0; r < out; ++r) {
          EXPECT_EQ(y2[size_t(r)], y_good[size_t(r)]) << "the good row, output " << r;
          if (std::isnan(bad))
            EXPECT_TRUE(std::isnan(y2[size_t(out + r)])) << "the bad row, output " << r;
          else
            EXPECT_FALSE(std::isfinite(y2[size_t(out + r)])) << "the bad row, output " << r;
        }
      }
    }
  }
}
