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
    {"q4_k", 256, 144, false, 12}, {"q6_k", 256, 210, false, 14}, {"q4_1", 32, 20, false, 3},
    {"q5_0", 32, 22, false, 6},    {"q5_1", 32, 24, false, 7},    {"q2_k", 256, 84, false, 10},
    {"q3_k", 256, 110, false, 11}, {"q5_k", 256, 176, false, 13},
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
  std::string names;
  for (int i = 0; i < kNumDTypes; ++i) names += std::string(names.empty() ? "" : " ") + std::string(kInfo[i].name);
  fail("[dtype] unknown dtype '{}' (expected one of {})", s, names);
}

DType dtype_from_ggml(int code) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kInfo[i].ggml_type == code) return static_cast<DType>(i);
  fail("[dtype] GGUF tensor type {} is not supported by toy", code);
}

}  // namespace toy
