#include "toy/core/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "toy/core/error.h"

namespace toy {

namespace {

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
inline void put_half(uint8_t* p, float v) {
  uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// --- Q8_0: d (half), qs[32] int8; x = d * q ---
void dq_q8_0(const uint8_t* b, float* y) {
  float d = half(b);
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * float(q[j]);
}
void q_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  float d = amax / 127.0f;
  float id = d ? 1.0f / d : 0.0f;
  put_half(b, d);
  int8_t* q = reinterpret_cast<int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) q[j] = int8_t(std::lround(x[j] * id));
}

// --- Q4_0: d (half), qs[16]; element j low nibble of qs[j], j+16 high nibble; x = d*(q-8) ---
void dq_q4_0(const uint8_t* b, float* y) {
  float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int(qs[j] & 0xf) - 8);
    y[j + 16] = d * float(int(qs[j] >> 4) - 8);
  }
}
void q_q4_0(const float* x, uint8_t* b) {
  // As ggml: the element of largest magnitude maps to -8 exactly.
  float amax = 0, maxv = 0;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      maxv = x[j];
    }
  float d = maxv / -8.0f;
  float id = d ? 1.0f / d : 0.0f;
  put_half(b, d);
  uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    int q0 = std::min(15, int(x[j] * id + 8.5f));
    int q1 = std::min(15, int(x[j + 16] * id + 8.5f));
    qs[j] = uint8_t(std::max(0, q0) | (std::max(0, q1) << 4));
  }
}

// --- Q4_K: d, dmin (half), scales[12] (6-bit sc/m per 32-sub-block), qs[128] ---
void scale_min_k4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}
void dq_q4_k(const uint8_t* b, float* y) {
  float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    scale_min_k4(2 * c, scales, &sc0, &m0);
    scale_min_k4(2 * c + 1, scales, &sc1, &m1);
    for (int l = 0; l < 32; ++l) y[64 * c + l] = d * float(sc0) * float(qs[32 * c + l] & 0xf) - dmin * float(m0);
    for (int l = 0; l < 32; ++l) y[64 * c + 32 + l] = d * float(sc1) * float(qs[32 * c + l] >> 4) - dmin * float(m1);
  }
}
void q_q4_k(const float* x, uint8_t* b) {
  float scale[8], minv[8];
  for (int j = 0; j < 8; ++j) {
    float lo = 0, hi = 0;  // the offset is a non-negative min, so 0 is always representable
    for (int l = 0; l < 32; ++l) {
      lo = std::min(lo, x[32 * j + l]);
      hi = std::max(hi, x[32 * j + l]);
    }
    scale[j] = (hi - lo) / 15.0f;
    minv[j] = -lo;
  }
  float max_scale = *std::max_element(scale, scale + 8), max_min = *std::max_element(minv, minv + 8);
  float d = max_scale / 63.0f, dmin = max_min / 63.0f;
  put_half(b, d);
  put_half(b + 2, dmin);
  d = half(b);
  dmin = half(b + 2);
  int sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = d ? std::min(63, int(std::lround(scale[j] / d))) : 0;
    m[j] = dmin ? std::min(63, int(std::lround(minv[j] / dmin))) : 0;
  }
  uint8_t* s = b + 4;
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = uint8_t((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
  uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      int q[2];
      for (int h = 0; h < 2; ++h) {
        int j = 2 * c + h;
        float step = d * float(sc[j]);
        float v = x[32 * j + l] + dmin * float(m[j]);
        q[h] = step ? std::clamp(int(std::lround(v / step)), 0, 15) : 0;
      }
      qs[32 * c + l] = uint8_t(q[0] | (q[1] << 4));
    }
  }
}

// --- Q6_K: ql[128], qh[64], scales[16] int8, d (half) at the end ---
void dq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  float d = half(b + 208);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* l4 = ql + 64 * h;
    const uint8_t* h2 = qh + 32 * h;
    const int8_t* s = sc + 8 * h;
    float* o = y + 128 * h;
    for (int l = 0; l < 32; ++l) {
      int is = l / 16;
      int q1 = int((l4[l] & 0xf) | (((h2[l] >> 0) & 3) << 4)) - 32;
      int q2 = int((l4[l + 32] & 0xf) | (((h2[l] >> 2) & 3) << 4)) - 32;
      int q3 = int((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4)) - 32;
      int q4 = int((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4)) - 32;
      o[l] = d * float(s[is + 0]) * float(q1);
      o[l + 32] = d * float(s[is + 2]) * float(q2);
      o[l + 64] = d * float(s[is + 4]) * float(q3);
      o[l + 96] = d * float(s[is + 6]) * float(q4);
    }
  }
}
void q_q6_k(const float* x, uint8_t* b) {
  float sub[16];
  for (int j = 0; j < 16; ++j) {
    float amax = 0;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * j + l]));
    sub[j] = amax / 31.0f;
  }
  float max_sub = *std::max_element(sub, sub + 16);
  float d = max_sub / 127.0f;
  put_half(b + 208, d);
  d = half(b + 208);
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int j = 0; j < 16; ++j) sc[j] = int8_t(d ? std::min(127, int(std::lround(sub[j] / d))) : 0);
  uint8_t q[256];
  for (int i = 0; i < 256; ++i) {
    float step = d * float(sc[i / 16]);
    int v = step ? std::clamp(int(std::lround(x[i] / step)), -32, 31) : 0;
    q[i] = uint8_t(v + 32);
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  std::memset(qh, 0, 64);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* qq = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[64 * h + l] = uint8_t((qq[l] & 0xf) | ((qq[l + 64] & 0xf) << 4));
      ql[64 * h + l + 32] = uint8_t((qq[l + 32] & 0xf) | ((qq[l + 96] & 0xf) << 4));
      qh[32 * h + l] = uint8_t((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                               ((qq[l + 96] >> 4) << 6));
    }
  }
}

struct Codec {
  void (*dq)(const uint8_t*, float*);
  void (*q)(const float*, uint8_t*);
};

Codec codec(DType t) {
  switch (t) {
    case DType::Q8_0: return {dq_q8_0, q_q8_0};
    case DType::Q4_0: return {dq_q4_0, q_q4_0};
    case DType::Q4_K: return {dq_q4_k, q_q4_k};
    case DType::Q6_K: return {dq_q6_k, q_q6_k};
    default: fail("[quant] {} is not a block type", name(t));
  }
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const auto& info = dtype_info(t);
  TOY_CHECK(n % info.block_size == 0, "[dequantize] {} needs a multiple of {} elements, got {}", info.name,
            info.block_size, n);
  Codec c = codec(t);
  const uint8_t* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / info.block_size; ++i) c.dq(b + i * info.block_bytes, dst + i * info.block_size);
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const auto& info = dtype_info(t);
  TOY_CHECK(n % info.block_size == 0, "[quantize] {} needs a multiple of {} elements, got {}", info.name,
            info.block_size, n);
  Codec c = codec(t);
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / info.block_size; ++i) c.q(src + i * info.block_size, b + i * info.block_bytes);
}

}  // namespace toy
