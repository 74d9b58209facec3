// Element types. F32/F16/BF16/I32 are plain element types; the Q* types are GGUF block
// types, stored as whole rows of blocks (a 2-D weight [rows, cols] with cols a multiple of
// the block size). New types are appended so existing ordinals never change.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace toy {

enum class DType : uint8_t { F32, F16, BF16, I32, Q8_0, Q4_0, Q4_K, Q6_K, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K };
inline constexpr int kNumDTypes = 14;

struct DTypeInfo {
  std::string_view name;
  int block_size;   // elements per block (1 for plain types)
  int block_bytes;  // bytes per block
  bool is_float;    // F32/F16/BF16: usable by float kernels
  int ggml_type;    // GGUF tensor type code
};

const DTypeInfo& dtype_info(DType t);
inline std::string_view name(DType t) { return dtype_info(t).name; }
inline bool is_float(DType t) { return dtype_info(t).is_float; }
inline bool is_block(DType t) { return dtype_info(t).block_size > 1; }
// Size of one element; throws for block types (use row_bytes).
size_t element_size(DType t);
// Bytes for n consecutive elements; n must be a multiple of the block size.
size_t row_bytes(DType t, int64_t n);
// Parses "f32", "F16", "bf16", "i32", "q8_0", ... ; throws toy::Error on anything else.
DType dtype_from_name(std::string_view s);
// Maps a GGUF type code; throws for codes toy does not store.
DType dtype_from_ggml(int code);

// --- 16-bit floats: storage types with portable conversions -------------------------

struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 <-> binary32, round to nearest even, subnormals and NaN/Inf preserved.
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return f32_from_bits(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or nan
    return uint16_t(sign | 0x7c00 | (x > 0x7f800000u ? (0x200 | ((x >> 13) & 0x3ff)) : 0));
  }
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: overflow
  if (x < 0x38800000u) {                                  // below 2^-14: subnormal or zero
    // value / 2^-24, rounded to nearest even
    float v = f32_from_bits(x) * 16777216.0f;
    uint32_t r = uint32_t(v);
    float frac = v - float(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t exp = (x >> 23) - 112;
  uint32_t man = x & 0x7fffff;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // may carry into exponent: fine
  return uint16_t(sign | h);
}

inline float bf16_to_f32(uint16_t b) { return f32_from_bits(uint32_t(b) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 64);  // quiet nan
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

inline float to_f32(float v) { return v; }
inline float to_f32(f16 v) { return f16_to_f32(v.bits); }
inline float to_f32(bf16 v) { return bf16_to_f32(v.bits); }
template <class T>
inline T from_f32(float v);
template <>
inline float from_f32<float>(float v) { return v; }
template <>
inline f16 from_f32<f16>(float v) { return f16{f32_to_f16(v)}; }
template <>
inline bf16 from_f32<bf16>(float v) { return bf16{f32_to_bf16(v)}; }

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::F32; }
template <>
constexpr DType dtype_of<f16>() { return DType::F16; }
template <>
constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <>
constexpr DType dtype_of<int32_t>() { return DType::I32; }

}  // namespace toy
