// Model quantization as llama.cpp's llama-quantize does it: which tensors change type
// (matrices whose name ends in "weight"; never norms, biases, position tables or 1-D
// tensors), the output in Q6_K, the per-tensor mixes (Q4_K_M: attn_v and ffn_down of the
// "more bits" layers in Q6_K; Q4_K_S: the first attn_v and ffn_down in Q5_K), and the fallback for rows whose length the
// block type cannot divide (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16), so toy's
// files match llama.cpp's tensor for tensor.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "toy/core/dtype.h"
#include "toy/core/shape.h"

namespace toy::gguf {
class Reader;
class Writer;
}  // namespace toy::gguf

namespace toy {

struct QuantKind {
  std::string_view name;  // "q4_k_m"
  DType base;             // the type most tensors get
  uint32_t file_type;     // llama.cpp's LLAMA_FTYPE_* (general.file_type)
  char mix;               // 'M' or 'S': llama.cpp's per-tensor choices of that mix; 0: none
};

// Parses f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k (= llama.cpp's Q4_K_S), q4_k_s,
// q4_k_m, q5_k (= Q5_K_S), q5_k_s, q5_k_m, q6_k (any case); throws naming the valid ones.
const QuantKind& quant_kind(std::string_view name);
std::string quant_kind_names();

struct TensorPlan {
  std::string name;
  Shape shape;
  DType from;
  DType to;
  bool fallback = false;  // the row length forced a 32-block type (or F16)
};

// Every tensor's target type for `kind`, in file order; n_layers is the model's block count.
// n_experts: a mixture of experts' expert_count (llama-quantize gives 8-expert models' attn_k
// and attn_v Q8_0, their attn_output Q5_K under the K mixes, and reads a MoE file's ffn_down
// layer from the tensor's name); 0 for a dense model.
std::vector<TensorPlan> plan_quantization(const QuantKind& kind, std::vector<TensorPlan> tensors, int64_t n_layers,
                                          int64_t n_experts = 0);

struct QuantizeReport {
  uint64_t bytes_in = 0, bytes_out = 0;
  int64_t tensors = 0, converted = 0, fallbacks = 0;
};

// Writes `in` to out_path with its tensors converted as planned (metadata copied, the file
// type updated); atomic like every GGUF write.
QuantizeReport quantize_model_file(const gguf::Reader& in, const std::string& out_path, const QuantKind& kind);

}  // namespace toy
