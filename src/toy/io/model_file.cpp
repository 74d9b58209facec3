#include "toy/io/model_file.h"

#include <cmath>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/grad_mode.h"
#include "toy/core/json_fields.h"
#include "toy/core/machine.h"
#include "toy/core/text.h"
#include "toy/ops/ops.h"

namespace toy {

namespace {

// Layer l of a pre-block norm's weight or bias (attn_norm, ffn_norm, post_attention_norm), or -1.
int64_t pre_norm_layer(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return -1;
  const std::string rest = name.substr(dot + 1);
  for (const char* n : {"attn_norm.", "ffn_norm.", "post_attention_norm."})
    if (rest.rfind(n, 0) == 0) return std::stoll(name.substr(4, dot - 4));
  return -1;
}

}  // namespace

void add_model_to_gguf(gguf::Writer& w, const DecoderLM& m, const Tokenizer& tok, const std::string& name,
                       const ModelWriteOptions& options) {
  // depth_scale (layer l's pre-norm outputs times 1/sqrt(l + 1)) folded into those norms'
  // weights and biases: the same function in a layout llama.cpp runs.
  ModelConfig c = m.config();
  const bool fold = options.fold_depth_scale && c.depth_scale;
  if (fold) c.depth_scale = false;
  NoGradGuard ng;
  auto stored = [&](const std::string& pname) -> Tensor {
    const Tensor p = m.params().get(pname).detach();
    const int64_t l = fold ? pre_norm_layer(pname) : -1;
    if (l < 0) return p;
    return mul(cast(p, DType::F32), from_vector(std::vector<float>{1.0f / std::sqrt(float(l + 1))}, Shape{}));
  };
  bool all_f32 = true;
  for (const Tensor& p : m.params().values()) all_f32 = all_f32 && p.dtype() == DType::F32;
  add_model_keys(w, c, tok, name, options, all_f32);
  if (!options.quant) {
    for (const Tensor& p : m.params().values()) w.add_tensor(p.name(), stored(p.name()));
    return;
  }
  std::vector<TensorPlan> plan;
  for (const Tensor& p : m.params().values()) plan.push_back({p.name(), p.shape(), p.dtype(), p.dtype(), false});
  plan = plan_quantization(*options.quant, std::move(plan), c.layers, c.moe.experts);
  for (const TensorPlan& t : plan) {
    const Tensor p = stored(t.name);
    w.add_tensor(t.name, t.to == p.dtype() ? p : cast(p, t.to));
  }
}

void add_model_keys(gguf::Writer& w, const ModelConfig& c, const Tokenizer& tok, const std::string& name,
                    const ModelWriteOptions& options, bool all_f32) {
  const std::string arch = c.gguf_arch(tok.kind() != "char");
  using gguf::Value;
  w.set("general.architecture", Value::str(arch));
  w.set("general.name", Value::str(name));
  if (options.quant) {
    w.set("general.file_type", Value::u32(options.quant->file_type));
    if (is_block(options.quant->base)) w.set("general.quantization_version", Value::u32(2));
  } else if (all_f32) {
    w.set("general.file_type", Value::u32(0));  // LLAMA_FTYPE_ALL_F32
  }
  w.set(arch + ".vocab_size", Value::u32(uint32_t(c.vocab)));
  w.set(arch + ".context_length", Value::u32(uint32_t(c.ctx)));
  w.set(arch + ".embedding_length", Value::u32(uint32_t(c.dim)));
  w.set(arch + ".block_count", Value::u32(uint32_t(c.layers)));
  // (OLMoE's and Granite-MoE's experts are feed_forward_length wide.)
  w.set(arch + ".feed_forward_length",
        Value::u32(uint32_t(arch == "olmoe" || arch == "granitemoe" ? c.moe.ffn : c.ffn)));
  w.set(arch + ".attention.head_count", Value::u32(uint32_t(c.heads)));
  if (arch == "lfm2") {
    // LFM2's layer kinds: a short-conv layer is one with no kv heads.
    std::vector<int32_t> kv;
    for (int64_t l = 0; l < c.layers; ++l)
      kv.push_back(c.layer_kind(l) == LayerKind::ShortConv ? 0 : int32_t(c.kv_heads));
    w.set(arch + ".attention.head_count_kv", Value::i32_array(kv));
    w.set(arch + ".shortconv.l_cache", Value::u32(uint32_t(c.shortconv_kernel)));
  } else {
    w.set(arch + ".attention.head_count_kv", Value::u32(uint32_t(c.kv_heads)));
  }
  if (c.head_dim * c.heads != c.dim) {
    w.set(arch + ".attention.key_length", Value::u32(uint32_t(c.head_dim)));
    w.set(arch + ".attention.value_length", Value::u32(uint32_t(c.head_dim)));
  }
  if (c.norm == NormKind::RMS)
    w.set(arch + ".attention.layer_norm_rms_epsilon", Value::f32(c.norm_eps));
  else
    w.set(arch + ".attention.layer_norm_epsilon", Value::f32(c.norm_eps));
  if (c.pos == PosKind::RoPE) {
    w.set(arch + ".rope.dimension_count", Value::u32(uint32_t(c.rope.n_rot ? c.rope.n_rot : c.head_dim)));
    w.set(arch + ".rope.freq_base", Value::f32(c.rope.base));
    if (c.rope.scaling != RopeScaling::None) {
      w.set(arch + ".rope.scaling.type", Value::str(to_string(c.rope.scaling)));
      w.set(arch + ".rope.scaling.factor", Value::f32(c.rope.factor));
      if (c.rope.orig_ctx) w.set(arch + ".rope.scaling.original_context_length", Value::u32(uint32_t(c.rope.orig_ctx)));
    }
    if (c.rope.long_short) {
      w.set(arch + ".rope.scaling.original_context_length", Value::u32(uint32_t(c.rope.orig_ctx)));
      w.set(arch + ".rope.scaling.attn_factor", Value::f32(c.rope.attn_factor));
    }
  }
  if (c.swa.window) {
    w.set(arch + ".attention.sliding_window", Value::u32(uint32_t(c.swa.window)));
    w.set(arch + ".attention.sliding_window_pattern", Value::u32(uint32_t(c.swa.pattern)));
    w.set(arch + ".rope.freq_base_swa", Value::f32(c.swa.rope_base));
  }
  if (c.logit_softcap != 0.0f) w.set(arch + ".final_logit_softcapping", Value::f32(c.logit_softcap));
  if (c.moe.experts) {
    w.set(arch + ".expert_count", Value::u32(uint32_t(c.moe.experts)));
    w.set(arch + ".expert_used_count", Value::u32(uint32_t(c.moe.used)));
    if (arch == "qwen3moe") w.set(arch + ".expert_feed_forward_length", Value::u32(uint32_t(c.moe.ffn)));
    if (c.moe.shared_ffn)
      w.set(arch + ".expert_shared_feed_forward_length", Value::u32(uint32_t(c.moe.shared_ffn)));
  }
  if (c.logit_scale != 0.0f) w.set(arch + ".logit_scale", Value::f32(c.logit_scale));
  if (c.embedding_scale != 0.0f) w.set(arch + ".embedding_scale", Value::f32(c.embedding_scale));
  if (c.residual_scale != 0.0f) w.set(arch + ".residual_scale", Value::f32(c.residual_scale));
  if (c.attn_scale != 0.0f && arch == "granitemoe") w.set(arch + ".attention.scale", Value::f32(c.attn_scale));
  if (arch == "qwen35") {
    const GdnConfig& g = c.gdn;
    const GdnConfig gd = c.has_gdn() ? g : GdnConfig{c.heads, c.heads, c.head_dim, 4};  // (keys llama.cpp requires)
    w.set(arch + ".ssm.conv_kernel", Value::u32(uint32_t(gd.conv_kernel)));
    w.set(arch + ".ssm.state_size", Value::u32(uint32_t(gd.head_dim)));
    w.set(arch + ".ssm.group_count", Value::u32(uint32_t(gd.k_heads)));
    w.set(arch + ".ssm.time_step_rank", Value::u32(uint32_t(gd.v_heads)));
    w.set(arch + ".ssm.inner_size", Value::u32(uint32_t(gd.value_dim())));
    std::vector<bool> recurrent;
    for (int64_t l = 0; l < c.layers; ++l) recurrent.push_back(c.layer_kind(l) == LayerKind::GatedDeltaNet);
    w.set(arch + ".attention.recurrent_layers", Value::bool_array(recurrent));
    // Multi-section RoPE as Qwen3.5 splits it (three sections over the rotated pairs); for
    // text every section sees the same position.
    const int32_t pairs = int32_t((c.rope.n_rot ? c.rope.n_rot : c.head_dim) / 2);
    w.set(arch + ".rope.dimension_sections", Value::i32_array({(pairs + 2) / 3, (pairs + 1) / 3, pairs / 3, 0}));
  }
  // Only toy-only fields need toy's own key; standard keys above describe the rest.
  if (options.toy_config || arch == "toy") w.set("toy.config", Value::str(c.to_json().dump()));
  tok.save(w);
  if (!options.chat_template.empty()) w.set("tokenizer.chat_template", Value::str(options.chat_template));
}

void save_model(const std::string& path, const DecoderLM& m, const Tokenizer& tok, const std::string& name) {
  gguf::Writer w;
  add_model_to_gguf(w, m, tok, name);
  w.write(path);
}

namespace {

// An integer key of any integer GGUF type (converters differ: u32, i32, u64).
std::optional<int64_t> find_int(const gguf::Reader& r, const std::string& key) {
  const gguf::Value* v = r.find(key);
  if (!v) return std::nullopt;
  switch (v->type) {
    case gguf::Type::U8: case gguf::Type::U16: case gguf::Type::U32: case gguf::Type::U64:
      TOY_CHECK(v->u <= uint64_t(1) << 40, "[model] '{}': key '{}' = {} is implausible", printable(r.path()), key, v->u);
      return int64_t(v->u);
    case gguf::Type::I8: case gguf::Type::I16: case gguf::Type::I32: case gguf::Type::I64:
      return v->i;
    default:
      fail("[model] '{}': key '{}' has type {}, expected an integer", printable(r.path()), key, gguf::type_name(v->type));
  }
}

int64_t need_int(const gguf::Reader& r, const std::string& key) {
  const auto v = find_int(r, key);
  TOY_CHECK(v.has_value(), "[model] '{}': missing key '{}'", printable(r.path()), key);
  return *v;
}

std::optional<float> find_float(const gguf::Reader& r, const std::string& key) {
  const gguf::Value* v = r.find(key);
  if (!v) return std::nullopt;
  TOY_CHECK(v->type == gguf::Type::F32 || v->type == gguf::Type::F64, "[model] '{}': key '{}' has type {}, expected "
            "a float", printable(r.path()), key, gguf::type_name(v->type));
  return float(v->f);
}

// Qwen3.5's layers: which are Gated DeltaNet (the per-layer list, else every
// full_attention_interval-th layer attention, default 4, as llama.cpp reads them), their widths
// (ssm.* keys), and the next-token-prediction (MTP) blocks some files append after the trunk
// (counted in block_count, not run: toy decodes one token at a time).
void read_qwen35_keys(const gguf::Reader& r, ModelConfig& c) {
  const std::string shown = printable(r.path()), a = "qwen35.";
  const int64_t all_layers = c.layers;
  const int64_t nextn = find_int(r, a + "nextn_predict_layers").value_or(0);
  TOY_CHECK(nextn >= 0 && nextn < all_layers, "[model] '{}': {} next-token-prediction layers of {} blocks", shown,
            nextn, all_layers);
  if (nextn > 0) {
    c.layers = all_layers - nextn;
    std::fprintf(stderr, "toy: note: '%s' has %lld next-token-prediction (MTP) block(s) after its %lld layers; toy "
                 "does not run them (they draft tokens for speculative decoding)\n", shown.c_str(), (long long)nextn,
                 (long long)c.layers);
  }
  c.gdn.conv_kernel = need_int(r, a + "ssm.conv_kernel");
  c.gdn.head_dim = need_int(r, a + "ssm.state_size");
  c.gdn.k_heads = need_int(r, a + "ssm.group_count");
  c.gdn.v_heads = need_int(r, a + "ssm.time_step_rank");
  const int64_t inner = need_int(r, a + "ssm.inner_size");
  TOY_CHECK(inner == c.gdn.v_heads * c.gdn.head_dim, "[model] '{}': ssm.inner_size {} is not ssm.time_step_rank {} x "
            "ssm.state_size {}", shown, inner, c.gdn.v_heads, c.gdn.head_dim);
  if (const gguf::Value* v = r.find(a + "attention.recurrent_layers")) {
    const bool ints = v->elem == gguf::Type::BOOL || v->elem == gguf::Type::U8 || v->elem == gguf::Type::U32 ||
                      v->elem == gguf::Type::I32 || v->elem == gguf::Type::I8;
    TOY_CHECK(v->type == gguf::Type::ARRAY && ints, "[model] '{}': key '{}attention.recurrent_layers' must be an array "
              "of booleans", shown, a);
    const size_t n = std::max(v->au.size(), v->ai.size());
    TOY_CHECK(int64_t(n) >= c.layers, "[model] '{}': attention.recurrent_layers has {} entries for {} layers", shown,
              n, c.layers);
    c.layer_kinds.clear();
    for (int64_t l = 0; l < c.layers; ++l) {
      const bool recurrent = v->au.empty() ? v->ai[size_t(l)] != 0 : v->au[size_t(l)] != 0;
      c.layer_kinds.push_back(recurrent ? LayerKind::GatedDeltaNet : LayerKind::Attention);
    }
  } else {
    const int64_t interval = find_int(r, a + "full_attention_interval").value_or(4);
    TOY_CHECK(interval >= 1, "[model] '{}': full_attention_interval {} must be at least 1", shown, interval);
    c.layer_kinds = ModelConfig::interval_layer_kinds(interval, c.layers);
  }
  // rope.dimension_sections (multi-section RoPE): for text every section sees the same
  // position, which is NEOX RoPE over the rotated dims.
}

// attention.head_count_kv as llama.cpp reads it: a number, or one per layer (LFM2 writes 0 for
// its short-conv layers, which then become ShortConv layers). toy's attention layers share one
// kv head count.
int64_t read_kv_heads(const gguf::Reader& r, ModelConfig& c, const std::string& arch) {
  const std::string shown = printable(r.path()), key = arch + ".attention.head_count_kv";
  const gguf::Value* v = r.find(key);
  if (!v || v->type != gguf::Type::ARRAY) {
    TOY_CHECK(arch != "lfm2", "[model] '{}': lfm2 needs '{}' as one count per layer (0 for its short-conv layers)",
              shown, key);
    return find_int(r, key).value_or(c.heads);
  }
  const bool ints = v->elem == gguf::Type::I32 || v->elem == gguf::Type::U32 || v->elem == gguf::Type::I16 ||
                    v->elem == gguf::Type::U16 || v->elem == gguf::Type::I8 || v->elem == gguf::Type::U8;
  TOY_CHECK(ints, "[model] '{}': key '{}' must be an integer or an array of integers", shown, key);
  const size_t n = std::max(v->au.size(), v->ai.size());
  TOY_CHECK(int64_t(n) == c.layers, "[model] '{}': key '{}' has {} entries for {} layers", shown, key, n, c.layers);
  int64_t kv = 0;
  c.layer_kinds.clear();
  for (size_t l = 0; l < n; ++l) {
    const int64_t h = v->au.empty() ? v->ai[l] : int64_t(std::min<uint64_t>(v->au[l], uint64_t(1) << 20));
    TOY_CHECK(h >= 0 && (h > 0 || arch == "lfm2"), "[model] '{}': key '{}' has {} kv heads for layer {}", shown, key,
              h, l);
    TOY_CHECK(h == 0 || kv == 0 || h == kv, "[model] '{}': key '{}' gives layers different kv head counts ({} and {}); "
              "toy's attention layers share one", shown, key, kv, h);
    if (h > 0) kv = h;
    c.layer_kinds.push_back(h == 0 ? LayerKind::ShortConv : LayerKind::Attention);
  }
  TOY_CHECK(kv > 0, "[model] '{}': key '{}' gives no layer any kv heads", shown, key);
  if (arch != "lfm2") c.layer_kinds.clear();
  TOY_CHECK(arch != "lfm2" || c.has_shortconv(), "[model] '{}': an lfm2 file with no short-conv layer (every entry of "
            "'{}' nonzero) is not supported", shown, key);
  return kv;
}

// LFM2: the short conv's taps (shortconv.l_cache) and, when set, sliding-window attention on
// every attention layer (with the model's RoPE base, as llama.cpp's lfm2 graph rotates).
void read_lfm2_keys(const gguf::Reader& r, ModelConfig& c) {
  const std::string shown = printable(r.path()), a = "lfm2.";
  c.shortconv_kernel = need_int(r, a + "shortconv.l_cache");
  TOY_CHECK(c.shortconv_kernel >= 2 && c.shortconv_kernel <= 64, "[model] '{}': shortconv.l_cache {} must be in 2..64",
            shown, c.shortconv_kernel);
  const int64_t window = find_int(r, a + "attention.sliding_window").value_or(0);
  TOY_CHECK(window >= 0, "[model] '{}': attention.sliding_window {} is negative", shown, window);
  if (window > 0) c.swa = SwaConfig{window, 0, c.rope.base};
}

// Phi-3's LongRoPE: the long and short factor tensors (both or neither), the context they
// switch at (llama.cpp's default: the trained context) and the cos/sin scale. Its
// attention.sliding_window is ignored, as llama.cpp ignores it.
void read_phi3_keys(const gguf::Reader& r, ModelConfig& c) {
  const std::string shown = printable(r.path()), a = "phi3.";
  const bool has_long = r.find_tensor("rope_factors_long.weight") != nullptr;
  const bool has_short = r.find_tensor("rope_factors_short.weight") != nullptr;
  TOY_CHECK(has_long == has_short, "[model] '{}': it has rope_factors_{}.weight but no rope_factors_{}.weight", shown,
            has_long ? "long" : "short", has_long ? "short" : "long");
  c.rope.long_short = has_long;
  c.rope.attn_factor = find_float(r, a + "rope.scaling.attn_factor").value_or(1.0f);
  if (has_long) c.rope.orig_ctx = find_int(r, a + "rope.scaling.original_context_length").value_or(c.ctx);
}

// Mixture of experts: expert_count and expert_used_count; the experts' width from
// expert_feed_forward_length (Qwen3-MoE; default feed_forward_length / used, as llama.cpp) or
// feed_forward_length itself (OLMoE).
void read_moe_keys(const gguf::Reader& r, ModelConfig& c, const std::string& arch) {
  const std::string shown = printable(r.path()), a = arch + ".";
  c.moe.experts = need_int(r, a + "expert_count");
  c.moe.used = need_int(r, a + "expert_used_count");
  TOY_CHECK(c.moe.experts > 0 && c.moe.used > 0 && c.moe.used <= c.moe.experts, "[model] '{}': {} experts, {} used "
            "per token", shown, c.moe.experts, c.moe.used);
  if (arch == "qwen3moe")
    c.moe.ffn = find_int(r, a + "expert_feed_forward_length").value_or(c.ffn / c.moe.used);
  else
    c.moe.ffn = c.ffn;
  TOY_CHECK(c.moe.ffn > 0, "[model] '{}': the experts' width is 0 ({}expert_feed_forward_length, else "
            "feed_forward_length / expert_used_count)", shown, a);
  c.moe.shared_ffn = find_int(r, a + "expert_shared_feed_forward_length").value_or(0);
  TOY_CHECK(c.moe.shared_ffn >= 0, "[model] '{}': a negative shared expert width", shown);
}

// Granite's multipliers: logit_scale (required, as llama.cpp requires it), embedding_scale,
// residual_scale and attention_scale (the query scale) when present.
void read_granite_keys(const gguf::Reader& r, ModelConfig& c) {
  const std::string shown = printable(r.path()), a = "granitemoe.";
  const auto logit = find_float(r, a + "logit_scale");
  TOY_CHECK(logit.has_value() && *logit > 0, "[model] '{}': granitemoe needs a positive key '{}logit_scale'", shown, a);
  c.logit_scale = *logit;
  c.embedding_scale = find_float(r, a + "embedding_scale").value_or(0.0f);
  c.residual_scale = find_float(r, a + "residual_scale").value_or(0.0f);
  c.attn_scale = find_float(r, a + "attention.scale").value_or(0.0f);
}

// Gemma 3: sliding-window layers (attention.sliding_window; a scalar sliding_window_pattern,
// default 6, as llama.cpp reads it) with their own RoPE base, the final logit soft-cap, and the
// 27B model's query scale (llama.cpp: 1/sqrt(dim / heads) for 62 layers).
void read_gemma3_keys(const gguf::Reader& r, ModelConfig& c) {
  const std::string shown = printable(r.path()), a = "gemma3.";
  c.swa.window = find_int(r, a + "attention.sliding_window").value_or(0);
  TOY_CHECK(c.swa.window >= 0, "[model] '{}': attention.sliding_window {} is negative", shown, c.swa.window);
  if (c.swa.window > 0) {
    if (const gguf::Value* v = r.find(a + "attention.sliding_window_pattern"))
      TOY_CHECK(v->type != gguf::Type::ARRAY, "[model] '{}': a per-layer attention.sliding_window_pattern array is not "
                "supported for gemma3 (a number n: every n-th layer global)", shown);
    c.swa.pattern = find_int(r, a + "attention.sliding_window_pattern").value_or(6);
    c.swa.rope_base = find_float(r, a + "rope.freq_base_swa").value_or(10000.0f);
  }
  c.logit_softcap = find_float(r, a + "final_logit_softcapping").value_or(0.0f);
  if (c.layers == 62) c.attn_scale = 1.0f / std::sqrt(float(c.dim / c.heads));
}

// The hyper-parameters a GGUF file states in llama.cpp's standard keys.
ModelConfig config_from_standard_keys(const gguf::Reader& r, const std::string& arch) {
  const std::string shown = printable(r.path());
  ModelConfig c = ModelConfig::for_arch(arch);
  const std::string a = arch + ".";
  c.layers = need_int(r, a + "block_count");
  c.dim = need_int(r, a + "embedding_length");
  c.ffn = need_int(r, a + "feed_forward_length");
  c.heads = need_int(r, a + "attention.head_count");
  c.ctx = need_int(r, a + "context_length");
  TOY_CHECK(c.heads > 0, "[model] '{}': attention.head_count is 0", shown);
  TOY_CHECK(c.layers > 0 && c.layers <= 10000, "[model] '{}': block_count {} must be in 1..10000", shown, c.layers);
  c.kv_heads = read_kv_heads(r, c, arch);
  c.head_dim = find_int(r, a + "attention.key_length").value_or(c.dim / c.heads);
  const int64_t value_length = find_int(r, a + "attention.value_length").value_or(c.head_dim);
  TOY_CHECK(value_length == c.head_dim, "[model] '{}': key length {} and value length {} differ (not supported)",
            shown, c.head_dim, value_length);
  if (c.norm == NormKind::RMS)
    c.norm_eps = find_float(r, a + "attention.layer_norm_rms_epsilon").value_or(1e-5f);
  else
    c.norm_eps = find_float(r, a + "attention.layer_norm_epsilon").value_or(1e-5f);
  if (c.pos == PosKind::RoPE) {
    c.rope.base = find_float(r, a + "rope.freq_base").value_or(10000.0f);
    const int64_t n_rot = find_int(r, a + "rope.dimension_count").value_or(c.head_dim);
    c.rope.n_rot = n_rot == c.head_dim ? 0 : n_rot;
    // Multi-section RoPE: for text every section sees the same position (NEOX RoPE over the
    // rotated dims), but a key that is not up to four sections of rotated pairs is a damaged
    // file, not one to run.
    if (const gguf::Value* v = r.find(a + "rope.dimension_sections")) {
      const bool ints = v->type == gguf::Type::ARRAY && v->elem != gguf::Type::STRING &&
                        v->elem != gguf::Type::F32 && v->elem != gguf::Type::F64 && v->elem != gguf::Type::ARRAY;
      TOY_CHECK(ints, "[model] '{}': key '{}rope.dimension_sections' must be an array of integers", shown, a);
      std::vector<int64_t> sections;
      for (int64_t x : v->ai) sections.push_back(x);
      for (uint64_t x : v->au) sections.push_back(x > uint64_t(INT32_MAX) ? -1 : int64_t(x));
      int64_t sum = 0;
      bool in_range = sections.size() <= 4;
      for (int64_t x : sections) in_range = in_range && x >= 0 && x <= n_rot / 2, sum += std::max<int64_t>(x, 0);
      TOY_CHECK(in_range && sum <= n_rot / 2, "[model] '{}': key '{}rope.dimension_sections' is [{}]: it must be up to "
                "4 counts of rotated pairs adding up to at most {} (rope.dimension_count / 2)", shown, a,
                fmt::format("{}", fmt::join(sections, ", ")), n_rot / 2);
    }
    std::string type = "none";
    if (const gguf::Value* v = r.find(a + "rope.scaling.type")) {
      TOY_CHECK(v->type == gguf::Type::STRING, "[model] '{}': key '{}rope.scaling.type' must be a string", shown, a);
      type = v->s;
    }
    TOY_CHECK(type == "none" || type == "linear" || type == "yarn", "[model] '{}': RoPE scaling '{}' is not supported "
              "(none, linear or yarn)", shown, printable(type));
    c.rope.scaling = type == "none" ? RopeScaling::None : type == "linear" ? RopeScaling::Linear : RopeScaling::Yarn;
    if (c.rope.scaling != RopeScaling::None) {
      c.rope.factor = find_float(r, a + "rope.scaling.factor").value_or(1.0f);
      c.rope.orig_ctx = find_int(r, a + "rope.scaling.original_context_length").value_or(0);
    }
    if (c.rope.scaling == RopeScaling::Yarn) {
      c.rope.ext_factor = find_float(r, a + "rope.scaling.yarn_ext_factor").value_or(1.0f);
      c.rope.attn_factor = find_float(r, a + "rope.scaling.attn_factor").value_or(1.0f);
      c.rope.beta_fast = find_float(r, a + "rope.scaling.yarn_beta_fast").value_or(32.0f);
      c.rope.beta_slow = find_float(r, a + "rope.scaling.yarn_beta_slow").value_or(1.0f);
    }
    c.rope.freq_factors = r.find_tensor("rope_freqs.weight") != nullptr;
  }
  c.tied = r.find_tensor("output.weight") == nullptr;
  // One attn_qkv tensor instead of attn_q/k/v (llama.cpp takes either for these architectures;
  // GPT-2's is always fused, Qwen3.5's attn_qkv is a Gated DeltaNet layer's).
  if (arch != "gpt2" && arch != "qwen35" && r.find_tensor("blk.0.attn_qkv.weight")) c.fused_qkv = true;
  if (arch == "qwen35") read_qwen35_keys(r, c);
  if (arch == "phi3") read_phi3_keys(r, c);
  if (arch == "qwen3moe" || arch == "olmoe" || arch == "granitemoe") read_moe_keys(r, c, arch);
  if (arch == "granitemoe") read_granite_keys(r, c);
  if (arch == "gemma3") read_gemma3_keys(r, c);
  if (arch == "lfm2") read_lfm2_keys(r, c);
  if (auto v = find_int(r, a + "vocab_size")) {
    c.vocab = *v;
  } else if (const gguf::TensorInfo* emb = r.find_tensor("token_embd.weight"); emb && emb->shape.ndim() == 2) {
    c.vocab = emb->shape[0];
  } else {
    fail("[model] '{}': no {}vocab_size key and no token_embd.weight to read the vocabulary size from", shown, a);
  }
  return c;
}

}  // namespace

ModelConfig config_from_gguf(const gguf::Reader& r) {
  const std::string shown = printable(r.path());
  const std::string arch = r.has("general.architecture") ? r.get_str("general.architecture") : "";
  ModelConfig cfg;
  if (r.has("toy.config")) {
    // A model toy trained: its config exactly (it may say what standard keys cannot).
    const std::string where = fmt::format("[model] '{}' key toy.config", shown);
    cfg = ModelConfig::from_json(json_fields::parse_object(r.get_str("toy.config"), where), where);
  } else {
    TOY_CHECK(!arch.empty(), "[model] '{}' has no general.architecture key", shown);
    TOY_CHECK(arch != "toy", "[model] '{}': architecture 'toy' needs its toy.config key", shown);
    TOY_CHECK(arch != "vit", "[model] '{}' is a ViT image classifier, not a language model: use toy classify or "
              "toy vision eval", shown);
    try {
      cfg = config_from_standard_keys(r, arch);
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.find(shown) != std::string::npos) throw;
      fail("[model] '{}': {}", shown, msg);
    }
  }
  cfg.resolve();
  try {
    cfg.validate();
  } catch (const Error& e) {
    fail("[model] '{}': {}", shown, e.what());
  }
  return cfg;
}

LoadedModel load_model(const gguf::Reader& r, LoadMode mode) {
  LoadedModel out;
  const std::string shown = printable(r.path());
  out.arch = r.has("general.architecture") ? r.get_str("general.architecture") : "";
  ModelConfig cfg = config_from_gguf(r);
  // Every tensor is checked against the config before anything is allocated: a config that
  // claims a huge context or width fails here, not after allocating gigabytes.
  const auto shapes = DecoderLM::parameter_shapes(cfg);
  double copied = 0;
  for (const auto& [name, shape] : shapes) {
    const gguf::TensorInfo* ti = r.find_tensor(name);
    TOY_CHECK(ti != nullptr, "[model] '{}': missing tensor '{}'", shown, name);
    TOY_CHECK(ti->shape == shape, "[model] '{}': tensor '{}' has shape {}, the config says {}", shown, name,
              ti->shape.str(), shape.str());
    if (mode == LoadMode::Train || shape.ndim() == 1) copied += double(shape.numel()) * sizeof(float);
  }
  const uint64_t avail = available_memory_bytes();
  TOY_CHECK(copied <= double(avail), "[model] '{}': its weights need {} as F32, more than the {} available", shown,
            format_bytes(copied), format_bytes(double(avail)));
  out.tokenizer = Tokenizer::load(r);
  TOY_CHECK(out.tokenizer->vocab_size() == cfg.vocab, "[model] '{}': tokenizer has {} tokens, the model {}", shown,
            out.tokenizer->vocab_size(), cfg.vocab);
  NoGradGuard ng;
  if (mode == LoadMode::Train) {
    out.model = std::make_unique<DecoderLM>(cfg);
    for (Tensor& p : out.model->params().values()) copy_(p, r.tensor(p.name()));  // converts f16/bf16/blocks
    return out;
  }
  // Inference: the file's tensors as stored (views of the mapping); vectors (norms, biases)
  // as f32 copies, as the ops want them.
  out.model = std::make_unique<DecoderLM>(cfg, [&](const std::string& name, const Shape&) -> Tensor {
    Tensor t = r.tensor(name);
    if (t.ndim() == 1 && t.dtype() != DType::F32) return cast(t, DType::F32);
    return t;
  });
  return out;
}

LoadedModel load_model(const std::string& path, LoadMode mode) {
  gguf::Reader r(path);
  return load_model(r, mode);
}

}  // namespace toy
