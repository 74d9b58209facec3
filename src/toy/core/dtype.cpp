#include "toy/core/dtype.h"

#include <cctype>
#include <string>

#include "toy/core/error.h"

namespace toy {

namespace {
// Order matches enum DType.
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {"f32", 1, 4, true, 0},     {"f16", 1, 2, true, 1},    {"bf16", 1, 2, true, 30},
    {"i32", 1, 4, false, 26},   {"q8_0", 32, 34, false, 8}, {"q4_0", 32, 18, false, 2},
    {"q4_k", 256, 144, false, 12}, {"q6_k", 256, 210, false, 14},
};
}  // namespace

const DTypeInfo& dtype_info(DType t) { return kInfo[static_cast<int>(t)]; }

size_t element_size(DType t) {
  const auto& i = dtype_info(t);
  TOY_CHECK(i.block_size == 1, "[dtype] {} is a block type: it has no element size", i.name);
  return size_t(i.block_bytes);
}

size_t row_bytes(DType t, int64_t n) {
  const auto& i = dtype_info(t);
  TOY_CHECK(n % i.block_size == 0, "[dtype] {} rows need a multiple of {} elements, got {}",
            i.name, i.block_size, n);
  return size_t(n / i.block_size) * size_t(i.block_bytes);
}

DType dtype_from_name(std::string_view s) {
  std::string lower(s);
  for (auto& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (int i = 0; i < kNumDTypes; ++i)
    if (kInfo[i].name == lower) return static_cast<DType>(i);
  fail("[dtype] unknown dtype '{}' (expected one of f32 f16 bf16 i32 q8_0 q4_0 q4_k q6_k)", s);
}

DType dtype_from_ggml(int code) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kInfo[i].ggml_type == code) return static_cast<DType>(i);
  fail("[dtype] GGUF tensor type {} is not supported by toy", code);
}

}  // namespace toy
