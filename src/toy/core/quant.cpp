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

// --- Q4_1: d, m (half), qs[16]; x = d*q + m; q in 0..15, same nibble order as Q4_0 ---
void dq_q4_1(const uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(qs[j] & 0xf) * d + m;
    y[j + 16] = float(qs[j] >> 4) * d + m;
  }
}
// The smallest and largest of 32 values (Q4_1 / Q5_1 map them to levels 0 and 15 / 31).
void block_range(const float* x, float* lo, float* hi) {
  *lo = *hi = x[0];
  for (int j = 1; j < 32; ++j) {
    *lo = std::min(*lo, x[j]);
    *hi = std::max(*hi, x[j]);
  }
}
void q_q4_1(const float* x, uint8_t* b) {
  float lo, hi;
  block_range(x, &lo, &hi);
  const float d = (hi - lo) / 15.0f;
  const float id = d ? 1.0f / d : 0.0f;
  put_half(b, d);
  put_half(b + 2, lo);
  uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(15, int(int8_t((x[j] - lo) * id + 0.5f)));
    const int q1 = std::min(15, int(int8_t((x[j + 16] - lo) * id + 0.5f)));
    qs[j] = uint8_t(q0 | (q1 << 4));
  }
}

// --- Q5_0 / Q5_1: d (+ m), qh (32 fifth bits, element j at bit j), qs[16] low nibbles ---
inline int fifth_bit(uint32_t qh, int j) { return int((qh >> j) & 1u) << 4; }
void dq_q5_0(const uint8_t* b, float* y) {
  const float d = half(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(((qs[j] & 0xf) | fifth_bit(qh, j)) - 16) * d;
    y[j + 16] = float(((qs[j] >> 4) | fifth_bit(qh, j + 16)) - 16) * d;
  }
}
// Packs 32 five-bit levels into qh and qs.
void pack_5bit(const int* q, uint8_t* qh_out, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = uint8_t((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
    qh |= uint32_t((q[j] >> 4) & 1) << j;
    qh |= uint32_t((q[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh_out, &qh, 4);
}
void q_q5_0(const float* x, uint8_t* b) {
  // As Q4_0: the element of largest magnitude maps to -16 exactly.
  float amax = 0, maxv = 0;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      maxv = x[j];
    }
  const float d = maxv / -16.0f;
  const float id = d ? 1.0f / d : 0.0f;
  put_half(b, d);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = std::min(31, int(int8_t(x[j] * id + 16.5f)));
  pack_5bit(q, b + 2, b + 6);
}
void dq_q5_1(const uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    y[j] = float((qs[j] & 0xf) | fifth_bit(qh, j)) * d + m;
    y[j + 16] = float((qs[j] >> 4) | fifth_bit(qh, j + 16)) * d + m;
  }
}
void q_q5_1(const float* x, uint8_t* b) {
  float lo, hi;
  block_range(x, &lo, &hi);
  const float d = (hi - lo) / 31.0f;
  const float id = d ? 1.0f / d : 0.0f;
  put_half(b, d);
  put_half(b + 2, lo);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = int(uint8_t((x[j] - lo) * id + 0.5f));
  pack_5bit(q, b + 4, b + 8);
}

// --- Q2_K: scales[16] (low nibble scale, high nibble min), qs[64] (2-bit), d, dmin ---
void dq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = half(b + 80), dmin = half(b + 82);
  int is = 0;
  for (int half_block = 0; half_block < 2; ++half_block, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int part = 0; part < 2; ++part) {
        const uint8_t sc = scales[is++];
        const float dl = d * float(sc & 0xf), ml = dmin * float(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * float((q[l + 16 * part] >> shift) & 3) - ml;
      }
}

// --- Q3_K: hmask[32] (third bit, set = no -4), qs[64] (2-bit), scales[12] (6-bit, -32), d ---
void dq_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const uint8_t* packed = b + 96;
  const float d = half(b + 108);
  // 16 six-bit scales: low 4 bits from packed[0..7] (nibbles), high 2 bits from packed[8..11].
  int scales[16];
  for (int i = 0; i < 16; ++i) {
    const int lo = (packed[i % 8] >> (4 * (i / 8))) & 0xf;
    const int hi = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = (lo | (hi << 4)) - 32;
  }
  int is = 0;
  uint8_t m = 1;
  for (int half_block = 0; half_block < 2; ++half_block, q += 32)
    for (int shift = 0; shift < 8; shift += 2, m = uint8_t(m << 1))
      for (int part = 0; part < 2; ++part) {
        const float dl = d * float(scales[is++]);
        for (int l = 0; l < 16; ++l) {
          const int k = l + 16 * part;
          *y++ = dl * float(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
        }
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
// ggml's reference encoders (quantize_row_q4_K_ref / q6_K_ref), reproduced operation for
// operation in float so that toy writes the same bytes as llama.cpp's quantizer: a weighted
// least-squares search over candidate scales per sub-block, then 6-bit (Q4_K) or 8-bit (Q6_K)
// quantization of the sub-block scales against one half-precision super-scale.

// Round to nearest, ties to even, as ggml's nearest_int (valid for |v| < 2^22).
inline int nearest_int(float v) {
  const float big = v + 12582912.0f;  // 1.5 * 2^23: the integer lands in the low mantissa bits
  int32_t i;
  std::memcpy(&i, &big, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// Scale and (non-positive) offset for n values quantized to 0..nmax, minimizing the weighted
// squared error over nstep candidate scales; L receives the levels, *neg_min the offset's
// magnitude.
float fit_scale_and_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin,
                        float rdelta, int nstep) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *neg_min = -lo;
    return 0.0f;
  }
  float iscale = float(nmax) / (hi - lo);
  float scale = 1.0f / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - lo));
    L[i] = uint8_t(std::max(0, std::min(nmax, l)));
    float diff = scale * float(L[i]) + lo - x[i];
    diff = diff * diff;
    best_error += w[i] * diff;
  }
  uint8_t trial[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - lo))));
      trial[i] = uint8_t(l);
      const float fl = float(l);
      sum_l += w[i] * fl;
      sum_l2 += w[i] * fl * fl;
      sum_xl += w[i] * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * float(trial[i]) + this_min - x[i];
        diff = diff * diff;
        err += w[i] * diff;
      }
      if (err < best_error) {
        std::memcpy(L, trial, size_t(n));
        best_error = err;
        scale = this_scale;
        lo = this_min;
      }
    }
  }
  *neg_min = -lo;
  return scale;
}

// Q4_K and Q5_K share the super-block scheme: 8 sub-blocks of 32 with a fitted scale and
// min each, both quantized to 6 bits; fills b's d, dmin and scales and the levels L (0..nmax).
void fit_k_scales_mins(const float* x, uint8_t* b, uint8_t* L, int nmax, float rmin, int nstep) {
  float scales[8], mins[8], w[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = fit_scale_and_min(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t* s = b + 4;
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = uint8_t(std::min(63, nearest_int(inv_scale * scales[j])));
    const uint8_t lm = uint8_t(std::min(63, nearest_int(inv_min * mins[j])));
    if (j < 4) {
      s[j] |= ls;
      s[j + 4] |= lm;
    } else {
      s[j + 4] = uint8_t((ls & 0xf) | ((lm & 0xf) << 4));
      s[j - 4] |= uint8_t((ls >> 4) << 6);
      s[j] |= uint8_t((lm >> 4) << 6);
    }
  }
  put_half(b, max_scale / 63.0f);
  put_half(b + 2, max_min / 63.0f);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(j, s, &sc, &m);
    const float d = half(b) * float(sc);
    if (d == 0.0f) continue;  // keeps the levels of the fit
    const float dm = half(b + 2) * float(m);
    for (int l = 0; l < 32; ++l)
      L[32 * j + l] = uint8_t(std::max(0, std::min(nmax, nearest_int((x[32 * j + l] + dm) / d))));
  }
}

void q_q4_k(const float* x, uint8_t* b) {
  uint8_t L[256];
  fit_k_scales_mins(x, b, L, 15, -1.0f, 20);
  uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) qs[32 * c + l] = uint8_t(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
}

void q_q5_k(const float* x, uint8_t* b) {
  uint8_t L[256];
  fit_k_scales_mins(x, b, L, 31, -0.5f, 15);
  uint8_t* qh = b + 16;
  uint8_t* ql = b + 48;
  std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[64 * c + l], q2 = L[64 * c + 32 + l];
      qh[l] = uint8_t(qh[l] | ((q1 >> 4) << (2 * c)) | ((q2 >> 4) << (2 * c + 1)));
      ql[32 * c + l] = uint8_t((q1 & 0xf) | ((q2 & 0xf) << 4));
    }
}

// --- Q5_K: d, dmin, scales[12] (as Q4_K), qh[32] (fifth bits), qs[128] (low nibbles) ---
void dq_q5_k(const uint8_t* b, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  for (int c = 0; c < 4; ++c, ql += 32) {
    int sc0, m0, sc1, m1;
    scale_min_k4(2 * c, scales, &sc0, &m0);
    scale_min_k4(2 * c + 1, scales, &sc1, &m1);
    const float d1 = d * float(sc0), n1 = dmin * float(m0), d2 = d * float(sc1), n2 = dmin * float(m1);
    const int u1 = 1 << (2 * c), u2 = 2 << (2 * c);
    for (int l = 0; l < 32; ++l) y[64 * c + l] = d1 * float((ql[l] & 0xf) + ((qh[l] & u1) ? 16 : 0)) - n1;
    for (int l = 0; l < 32; ++l) y[64 * c + 32 + l] = d2 * float((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - n2;
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
// Symmetric scale for n values quantized to -nmax..nmax-1 (stored as level + nmax in L),
// weighted by x^2, searching 18 candidate scales around nmax / max|x|.
float fit_symmetric_scale(int n, int nmax, const float* x, uint8_t* L) {
  float mx = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      mx = x[i];
    }
  }
  if (amax < 1e-15f) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  auto level = [&](float iscale, int i) { return std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))); };
  float iscale = -float(nmax) / mx;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale, i);
    L[i] = uint8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / mx;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale, i);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = uint8_t(nmax + level(iscale, i));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void q_q6_k(const float* x, uint8_t* b) {
  uint8_t L[256];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < 16; ++ib) {
    scales[ib] = fit_symmetric_scale(16, 32, x + 16 * ib, L + 16 * ib);
    const float abs_scale = std::fabs(scales[ib]);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scales[ib];
    }
  }
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  if (max_abs_scale < 1e-15f) {
    std::memset(b, 0, 210);
    return;
  }
  const float iscale = -128.0f / max_scale;
  put_half(b + 208, 1.0f / iscale);
  for (int ib = 0; ib < 16; ++ib) sc[ib] = int8_t(std::min(127, nearest_int(iscale * scales[ib])));
  for (int j = 0; j < 16; ++j) {
    const float d = half(b + 208) * float(sc[j]);
    if (d == 0.0f) continue;  // keeps the levels of the fit
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = uint8_t(std::max(-32, std::min(31, nearest_int(x[16 * j + i] / d))) + 32);
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int h = 0; h < 2; ++h) {
    const uint8_t* q = L + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[64 * h + l] = uint8_t((q[l] & 0xf) | ((q[l + 64] & 0xf) << 4));
      ql[64 * h + l + 32] = uint8_t((q[l + 32] & 0xf) | ((q[l + 96] & 0xf) << 4));
      qh[32 * h + l] = uint8_t((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) | ((q[l + 96] >> 4) << 6));
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
    case DType::Q4_1: return {dq_q4_1, q_q4_1};
    case DType::Q5_0: return {dq_q5_0, q_q5_0};
    case DType::Q5_1: return {dq_q5_1, q_q5_1};
    case DType::Q5_K: return {dq_q5_k, q_q5_k};
    // Decode only: toy reads these from files but does not write them.
    case DType::Q2_K: return {dq_q2_k, nullptr};
    case DType::Q3_K: return {dq_q3_k, nullptr};
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
  TOY_CHECK(c.q != nullptr, "[quantize] toy reads {} but does not write it (write q4_k, q5_k, q6_k or q8_0)",
            info.name);
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / info.block_size; ++i) c.q(src + i * info.block_size, b + i * info.block_bytes);
}

void row_to_f32(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::F16: {
      const uint16_t* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      const uint16_t* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    default: dequantize_row(t, src, dst, n);
  }
}

}  // namespace toy
