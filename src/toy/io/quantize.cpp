#include "toy/io/quantize.h"

#include <fmt/core.h>

#include <cstdio>
#include <set>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include "toy/ops/ops.h"

namespace toy {

namespace {

// LLAMA_FTYPE_* codes (llama.h).
constexpr QuantKind kKinds[] = {
    {"f32", DType::F32, 0, 0},      {"f16", DType::F16, 1, 0},      {"bf16", DType::BF16, 32, 0},
    {"q8_0", DType::Q8_0, 7, 0},    {"q4_0", DType::Q4_0, 2, 0},    {"q4_1", DType::Q4_1, 3, 0},
    {"q5_0", DType::Q5_0, 8, 0},    {"q5_1", DType::Q5_1, 9, 0},    {"q4_k", DType::Q4_K, 14, 'S'},
    {"q4_k_s", DType::Q4_K, 14, 'S'}, {"q4_k_m", DType::Q4_K, 15, 'M'}, {"q5_k", DType::Q5_K, 16, 'S'},
    {"q5_k_s", DType::Q5_K, 16, 'S'}, {"q5_k_m", DType::Q5_K, 17, 'M'}, {"q6_k", DType::Q6_K, 18, 0},
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// llama.cpp quantizes matrices named "...weight" except norms, position tables and token types.
bool may_quantize(const TensorPlan& t) {
  return t.shape.ndim() >= 2 && ends_with(t.name, "weight") && !contains(t.name, "_norm.weight") &&
         t.name != "position_embd.weight" && t.name != "token_types.weight" && !contains(t.name, "ssm_conv1d") &&
         !contains(t.name, "shortconv.conv.weight") &&
         !contains(t.name, "ffn_gate_inp.weight");  // (a router stays as it is)
}

// Layers 0..n/8, the last eighth, and every third layer between get more bits.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// A block type whose block does not divide the row length falls back as llama.cpp's does.
DType fallback_type(DType t, int64_t cols, bool* fell_back) {
  if (cols % dtype_info(t).block_size == 0) return t;
  *fell_back = true;
  DType r = t;
  switch (t) {
    case DType::Q2_K: case DType::Q3_K: r = DType::Q4_0; break;
    case DType::Q4_K: r = DType::Q5_0; break;
    case DType::Q5_K: r = DType::Q5_1; break;
    case DType::Q6_K: r = DType::Q8_0; break;
    default: break;  // a 32-block type has nothing smaller
  }
  return cols % dtype_info(r).block_size == 0 ? r : DType::F16;
}

}  // namespace

const QuantKind& quant_kind(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (const QuantKind& k : kKinds)
    if (k.name == lower) return k;
  fail("[quantize] unknown type '{}' (expected one of {})", printable(name), quant_kind_names());
}

std::string quant_kind_names() {
  std::string s;
  for (const QuantKind& k : kKinds) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

std::vector<TensorPlan> plan_quantization(const QuantKind& kind, std::vector<TensorPlan> tensors, int64_t n_layers,
                                          int64_t n_experts) {
  bool tied = true;
  int64_t n_attn_v = 0;
  for (const TensorPlan& t : tensors) {
    if (t.name == "output.weight") tied = false;
    if (contains(t.name, "attn_v.weight") || contains(t.name, "attn_qkv.weight")) ++n_attn_v;
  }
  const bool quantized = is_block(kind.base);
  int64_t i_attn_v = 0, i_ffn_down = 0;
  for (TensorPlan& t : tensors) {
    t.to = t.from;
    if (!may_quantize(t)) continue;
    DType type = kind.base;
    const int64_t cols = t.shape[t.shape.ndim() - 1];
    if (quantized) {
      const bool is_output = t.name == "output.weight" || (tied && t.name == "token_embd.weight");
      const bool is_attn_v = contains(t.name, "attn_v.weight") || contains(t.name, "attn_qkv.weight");
      if (is_output) {
        // The output projection keeps more precision: Q6_K, or Q8_0 when the row length is
        // not a multiple of the base type's block.
        if (cols % dtype_info(kind.base).block_size != 0) type = DType::Q8_0;
        else if (kind.base != DType::Q8_0) type = DType::Q6_K;
      } else if (is_attn_v) {
        if (kind.mix == 'M' && use_more_bits(i_attn_v, n_attn_v)) type = DType::Q6_K;
        if (kind.mix == 'S' && kind.base == DType::Q4_K && i_attn_v < 4) type = DType::Q5_K;
        if (n_experts == 8) type = DType::Q8_0;
        ++i_attn_v;
      } else if (contains(t.name, "attn_k.weight")) {
        if (n_experts == 8) type = DType::Q8_0;
      } else if (contains(t.name, "attn_output.weight")) {
        if (n_experts == 8 && kind.base == DType::Q4_K) type = DType::Q5_K;
      } else if (contains(t.name, "ffn_down")) {
        // A mixture's layer comes from the name (its ffn_down_exps and ffn_down_shexp share one).
        int64_t layer = i_ffn_down;
        if (n_experts > 1) TOY_CHECK(std::sscanf(t.name.c_str(), "blk.%ld.", &layer) == 1 && layer >= 0 &&
                                         layer < n_layers,
                                     "[quantize] no layer in tensor name '{}'", printable(t.name));
        if (kind.mix == 'M' && use_more_bits(layer, n_layers)) type = DType::Q6_K;
        if (kind.mix == 'S' && kind.base == DType::Q4_K && layer < n_layers / 8) type = DType::Q5_K;
        ++i_ffn_down;
      }
      type = fallback_type(type, cols, &t.fallback);
    }
    t.to = type;
  }
  return tensors;
}

QuantizeReport quantize_model_file(const gguf::Reader& in, const std::string& out_path, const QuantKind& kind) {
  const std::string shown = printable(in.path());
  std::vector<TensorPlan> plan;
  std::set<int64_t> blocks;
  for (const gguf::TensorInfo& ti : in.tensors()) {
    plan.push_back({ti.name, ti.shape, ti.dtype, ti.dtype, false});
    int64_t layer = 0;
    if (std::sscanf(ti.name.c_str(), "blk.%ld.", &layer) == 1) blocks.insert(layer);
  }
  int64_t n_layers = int64_t(blocks.size());
  if (in.has("general.architecture")) {
    const std::string key = in.get_str("general.architecture") + ".block_count";
    if (auto v = in.find_u32(key)) n_layers = *v;
  }
  int64_t n_experts = 0;
  if (in.has("general.architecture")) {
    if (auto v = in.find_u32(in.get_str("general.architecture") + ".expert_count")) n_experts = *v;
  }
  plan = plan_quantization(kind, std::move(plan), n_layers, n_experts);

  gguf::Writer w;
  for (const auto& [key, value] : in.metadata()) w.set(key, value);
  w.set("general.file_type", gguf::Value::u32(kind.file_type));
  w.set("general.quantization_version", gguf::Value::u32(2));
  QuantizeReport rep;
  NoGradGuard ng;
  for (const TensorPlan& t : plan) {
    Tensor src = in.tensor(t.name);
    rep.tensors++;
    rep.bytes_in += in.find_tensor(t.name)->bytes;
    if (t.to == t.from) {
      w.add_tensor(t.name, src);
      rep.bytes_out += in.find_tensor(t.name)->bytes;
      continue;
    }
    TOY_CHECK(t.from != DType::I32, "[quantize] '{}': tensor '{}' holds integers", shown, printable(t.name));
    Tensor dst = cast(src, t.to);
    rep.converted++;
    rep.fallbacks += t.fallback;
    rep.bytes_out += row_bytes(t.to, t.shape[t.shape.ndim() - 1]) * size_t(t.shape.numel() / t.shape[t.shape.ndim() - 1]);
    w.add_tensor(t.name, dst);
  }
  w.write(out_path);
  return rep;
}

}  // namespace toy
