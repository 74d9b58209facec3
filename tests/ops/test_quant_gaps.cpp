// Quantized products (backend/cpu/gemv_blocks.h, quant_products.h) where the other op tests
// leave gaps:
//   - Q8_0 / Q4_0 / Q5_0: the AVX2 form and, on a CPU that has it, the VNNI forms, for any
//     number of rows, all equal bit for bit a scalar reference written here from the
//     documented arithmetic — so the check runs on every CPU (Forward.Q8_0Products... skips
//     without VNNI) and also pins the AVX2 path on its own.
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

// Value j (0..31) of a block of a 32-value type, as stored (gguf's layouts).
int block_value(DType t, const uint8_t* blk, int j) {
  switch (t) {
    case DType::Q8_0: return int(int8_t(blk[2 + j]));
    case DType::Q4_0: return (j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4) - 8;
    default: {  // Q5_0: f16 scale, 32 fifth bits, 16 bytes of nibbles
      uint32_t qh;
      std::memcpy(&qh, blk + 2, 4);
      const int nibble = j < 16 ? blk[6 + j] & 15 : blk[6 + j - 16] >> 4;
      return (nibble | int((qh >> j) & 1) << 4) - 16;
    }
  }
}

// y [rows, out] = x [rows, K] @ w^T for a Q8_0/Q4_0/Q5_0 weight, computed one scalar at a
// time the way the kernels compute it (backend/cpu/quant_products.cpp):
//   - the activations rounded by quantize_activations (Q8_0: f16-rounded scale d_x, q in -127..127);
//   - per block of 32: 8 lanes, lane l the exact integer sum of w[4l..4l+3] * q[4l..4l+3]
//     (weight values as stored: Q8_0 bytes -128 included);
//   - each lane accumulates fma(d_w * d_x, lane sum, acc) in f32 over the blocks in order, d_w
//     the block's f16 scale widened, d_w * d_x one f32 product (one set of 8 accumulators);
//   - the result: (v0 + v4) + (v2 + v6) plus (v1 + v5) + (v3 + v7) — the horizontal sum's order.
std::vector<float> block_reference(const Tensor& w, const std::vector<float>& x, int64_t rows, int64_t K) {
  const int64_t out = w.size(0), nb = K / 32;
  const size_t rb = row_bytes(w.dtype(), K), bb = rb / size_t(nb);
  const auto* raw = static_cast<const uint8_t*>(w.raw_data());
  std::vector<float> y(static_cast<size_t>(rows * out));
  std::vector<float> d(static_cast<size_t>(nb));
  std::vector<int8_t> q(static_cast<size_t>(K));
  std::vector<int16_t> s16(static_cast<size_t>(K / 16));
  for (int64_t n = 0; n < rows; ++n) {
    cpu::quantize_activations(DType::Q8_0, x.data() + n * K, K, d.data(), q.data(), s16.data());
    for (int64_t r = 0; r < out; ++r) {
      float v[8] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = raw + size_t(r) * rb + size_t(b) * bb;
        uint16_t h;
        std::memcpy(&h, blk, 2);
        const float scale = f16_to_f32(h) * d[size_t(b)];
        for (int l = 0; l < 8; ++l) {
          int32_t s = 0;
          for (int j = 0; j < 4; ++j)
            s += int32_t(block_value(w.dtype(), blk, 4 * l + j)) * int32_t(q[size_t(32 * b + 4 * l + j)]);
          v[l] = std::fma(scale, float(s), v[l]);
        }
      }
      const float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
      const float t0 = s0 + s2, t1 = s1 + s3;
      y[size_t(n * out + r)] = t0 + t1;
    }
  }
  return y;
}

}  // namespace

// Every form of the Q8_0/Q4_0/Q5_0 products this CPU can run against the scalar reference,
// bit for bit: the AVX2 form for 1..8 rows (decoding) always; where the CPU has it, the VNNI
// form of the kernel variant in use (AVX-VNNI, or AVX512-VNNI: one row on 256 bits, pairs on
// 512) for those and for prompt-sized row counts (odd and even, more than one tile of
// activation rows) — so all forms agree, and with VNNI a prompt's rows get decoding's numbers.
// An odd block count (K = 544), weight bytes of -128 and activations at +-127; never skipped.
TEST(QuantGaps, BlockProductsEqualAScalarReferenceInEveryFormAndRowCount) {
  VnniRestore restore;
  const bool has_vnni = cpu::gemv_vnni_available();
  RecordProperty("vnni", has_vnni ? "checked" : "absent: AVX2 against the reference only");
  const int64_t K = 544, out = 29;
  for (DType dt : {DType::Q8_0, DType::Q4_0, DType::Q5_0}) {
    SCOPED_TRACE(std::string(name(dt)));
    Tensor w = cast(randn_t(Shape{out, K}, 18, 0.2f), dt);
    if (dt == DType::Q8_0) {
      auto* raw = static_cast<uint8_t*>(const_cast<void*>(w.raw_data()));
      const size_t rb = size_t(K / 32) * 34;
      for (int64_t r = 0; r < out; r += 3)
        for (int64_t b = 0; b < K / 32; b += 2) raw[size_t(r) * rb + size_t(b) * 34 + 2 + size_t((r + b) % 32)] = 0x80;
    }
    for (int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 23}) {
      SCOPED_TRACE(std::to_string(rows) + " rows");
      std::vector<float> xv = randn_t(Shape{rows, K}, 40 + uint64_t(rows), 1.5f).to_f32_vector();
      for (size_t i = 0; i < xv.size(); i += 37) xv[i] = (i % 2 ? 40.0f : -40.0f);  // a block's largest: q = +-127
      const Tensor x = from_vector(xv, Shape{rows, K});
      const std::vector<float> want = block_reference(w, xv, rows, K);
      size_t nonzero = 0;
      for (float v : want) nonzero += v != 0.0f && std::isfinite(v);
      ASSERT_GT(nonzero, want.size() / 2) << "the reference computes something";
      if (rows <= cpu::kGemvMaxRows) {  // (AVX2 alone multiplies prompts through SGEMM: faster there)
        cpu::gemv_use_vnni(false);
        const std::vector<float> avx2 = linear(x, w).to_f32_vector();
        ASSERT_EQ(avx2.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(avx2[i], want[i]) << "AVX2, value " << i;
      }
      if (has_vnni) {
        cpu::gemv_use_vnni(true);
        const std::vector<float> vnni = linear(x, w).to_f32_vector();
        for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(vnni[i], want[i]) << "VNNI, value " << i;
      }
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
