#include "toy/models/lora.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include "toy/ops/ops.h"

namespace toy {

namespace {

// The projections adapters can attach to: attention's, the MLP's, GPT-2's fused attn_qkv, and a
// Gated DeltaNet layer's (its attn_qkv, attn_gate, ssm_alpha, ssm_beta, ssm_out), an expert
// block's router and shared expert, LFM2's short conv's in and out projections.
const char* const kKinds[] = {"attn_q",   "attn_k",    "attn_v",    "attn_output", "ffn_gate", "ffn_up",
                              "ffn_down", "attn_qkv",  "attn_gate", "ssm_alpha",   "ssm_beta", "ssm_out",
                              "ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
                              "shortconv.in_proj", "shortconv.out_proj"};

// "blk.3.attn_q.weight" -> "attn_q"
std::string kind_of(const std::string& weight_name) {
  const size_t a = weight_name.find('.', 4);  // after "blk.N"
  const size_t b = weight_name.rfind('.');
  if (a == std::string::npos || b == std::string::npos || b <= a) return weight_name;
  return weight_name.substr(a + 1, b - a - 1);
}

bool targeted(const std::vector<std::string>& targets, const std::string& kind) {
  return std::find(targets.begin(), targets.end(), kind) != targets.end();
}

}  // namespace

std::vector<std::string> parse_lora_targets(const std::string& list) {
  static const std::map<std::string, std::string> aliases = {{"q", "attn_q"},     {"k", "attn_k"},
                                                             {"v", "attn_v"},     {"o", "attn_output"},
                                                             {"gate", "ffn_gate"}, {"up", "ffn_up"},
                                                             {"down", "ffn_down"}, {"qkv", "attn_qkv"}};
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    std::string item = list.substr(start, end - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    TOY_CHECK(!item.empty(), "[lora] --lora-targets '{}': an empty name", printable(list));
    if (auto it = aliases.find(item); it != aliases.end()) item = it->second;
    const bool known = std::any_of(std::begin(kKinds), std::end(kKinds), [&](const char* k) { return item == k; });
    TOY_CHECK(known,
              "[lora] --lora-targets: unknown projection '{}' (use q, k, v, o, gate, up, down, qkv or attn_q, "
              "attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down, attn_qkv, attn_gate, ssm_alpha, ssm_beta, "
              "ssm_out, ffn_gate_inp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp, shortconv.in_proj, "
              "shortconv.out_proj)",
              printable(item));
    if (!targeted(out, item)) out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::vector<std::string> lora_target_kinds(DecoderLM& m) {
  std::vector<std::string> out;
  for (const auto& [name, lin] : m.projections())
    if (!targeted(out, kind_of(name))) out.push_back(kind_of(name));
  return out;
}

std::vector<std::string> default_lora_targets(DecoderLM& m) {
  // A Gated DeltaNet layer's ssm_alpha/ssm_beta give one value per head (a few outputs), a
  // router one per expert: an adapter there is about as wide as the weight (named, they adapt).
  std::vector<std::string> out;
  for (const std::string& kind : lora_target_kinds(m))
    if (kind != "ssm_alpha" && kind != "ssm_beta" && kind != "ffn_gate_inp") out.push_back(kind);
  return out;
}

void add_lora(DecoderLM& m, const LoraOptions& o) {
  TOY_CHECK(o.rank >= 1, "[lora] rank must be at least 1, got {}", o.rank);
  TOY_CHECK(std::isfinite(o.alpha), "[lora] alpha must be finite, got {}", o.alpha);
  TOY_CHECK(o.dropout >= 0 && o.dropout < 1, "[lora] dropout must be in [0, 1), got {}", o.dropout);
  const std::vector<std::string> targets = o.targets.empty() ? default_lora_targets(m) : o.targets;
  std::vector<std::string> found;
  NoGradGuard ng;
  uint64_t stream = 0;
  for (const auto& [name, lin] : m.projections()) {
    ++stream;
    const std::string kind = kind_of(name);
    if (!targeted(targets, kind)) continue;
    TOY_CHECK(!lin->lora.defined(), "[lora] '{}' already has an adapter", name);
    if (!targeted(found, kind)) found.push_back(kind);
    const int64_t in = lin->in_features(), out = lin->out_features();
    TOY_CHECK(o.rank <= std::min(in, out), "[lora] rank {} is larger than '{}' ({} x {})", o.rank, name, out, in);
    Generator g(o.seed, stream);
    Tensor a = randn(Shape{o.rank, in}, g, 0.0f, 1.0f / std::sqrt(float(in)));
    lin->lora.a = m.params().add(name + ".lora_a", a, true);
    lin->lora.b = m.params().add(name + ".lora_b", zeros(Shape{out, o.rank}), true);
    lin->lora.scale = o.alpha / float(o.rank);
    lin->lora.dropout = o.dropout;
  }
  for (const std::string& t : targets)
    TOY_CHECK(targeted(found, t), "[lora] the model has no '{}' projection to adapt (it has: {})", t,
              fmt::format("{}", fmt::join(lora_target_kinds(m), ", ")));
}

std::vector<std::pair<std::string, const nn::Lora*>> lora_adapters(DecoderLM& m) {
  std::vector<std::pair<std::string, const nn::Lora*>> out;
  for (const auto& [name, lin] : m.projections())
    if (lin->lora.defined()) out.emplace_back(name, &lin->lora);
  return out;
}

void save_lora_adapter(const std::string& path, DecoderLM& m, const std::string& arch, float alpha) {
  const auto adapters = lora_adapters(m);
  TOY_CHECK(!adapters.empty(), "[lora] the model has no adapters to save");
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str(arch));
  w.set("general.type", gguf::Value::str("adapter"));
  w.set("general.name", gguf::Value::str("toy LoRA adapter"));
  w.set("adapter.type", gguf::Value::str("lora"));
  w.set("adapter.lora.alpha", gguf::Value::f32(alpha));
  NoGradGuard ng;
  for (const auto& [name, lora] : adapters) {
    w.add_tensor(name + ".lora_a", cast(lora->a.detach(), DType::F32));
    w.add_tensor(name + ".lora_b", cast(lora->b.detach(), DType::F32));
  }
  w.write(path);
}

void load_lora_adapter(DecoderLM& m, const std::string& arch, const std::string& path, float user_scale) {
  gguf::Reader r(path);
  const std::string shown = printable(path);
  auto str_key = [&](const char* key) -> std::string {
    const gguf::Value* v = r.find(key);
    TOY_CHECK(v && v->type == gguf::Type::STRING, "[lora] '{}': no string key {} (not a LoRA adapter file?)", shown,
              key);
    return r.get_str(key);
  };
  TOY_CHECK(str_key("general.type") == "adapter", "[lora] '{}': general.type is '{}', not 'adapter'", shown,
            printable(r.get_str("general.type")));
  TOY_CHECK(str_key("adapter.type") == "lora", "[lora] '{}': adapter.type is '{}', not 'lora'", shown,
            printable(r.get_str("adapter.type")));
  const std::string file_arch = str_key("general.architecture");
  TOY_CHECK(file_arch == arch, "[lora] '{}': the adapter is for architecture '{}', the model is '{}'", shown,
            printable(file_arch), printable(arch));
  const float alpha = r.has("adapter.lora.alpha") ? r.get_f32("adapter.lora.alpha") : 0.0f;
  TOY_CHECK(std::isfinite(alpha), "[lora] '{}': adapter.lora.alpha is {}", shown, alpha);
  TOY_CHECK(std::isfinite(user_scale), "[lora] --lora-scale must be finite, got {}", user_scale);

  std::map<std::string, std::pair<const gguf::TensorInfo*, const gguf::TensorInfo*>> pairs;
  for (const gguf::TensorInfo& t : r.tensors()) {
    if (t.name.ends_with(".lora_a") && t.name.size() > 7) {
      pairs[t.name.substr(0, t.name.size() - 7)].first = &t;
    } else if (t.name.ends_with(".lora_b") && t.name.size() > 7) {
      pairs[t.name.substr(0, t.name.size() - 7)].second = &t;
    } else {
      fail("[lora] '{}': tensor '{}' is neither a .lora_a nor a .lora_b", shown, printable(t.name));
    }
  }
  TOY_CHECK(!pairs.empty(), "[lora] '{}' holds no adapter tensors", shown);
  std::map<std::string, nn::Linear*> by_name;
  for (const auto& [name, lin] : m.projections()) by_name[name] = lin;
  NoGradGuard ng;
  for (const auto& [name, ab] : pairs) {
    const auto [a, b] = ab;
    TOY_CHECK(a && b, "[lora] '{}': '{}' has a {} but no {}", shown, printable(name), a ? "lora_a" : "lora_b",
              a ? "lora_b" : "lora_a");
    auto it = by_name.find(name);
    TOY_CHECK(it != by_name.end(), "[lora] '{}': '{}' is not a projection of the model's blocks", shown,
              printable(name));
    nn::Linear& lin = *it->second;
    TOY_CHECK(!lin.lora.defined(), "[lora] '{}': '{}' already has an adapter", shown, name);
    TOY_CHECK(a->shape.ndim() == 2 && b->shape.ndim() == 2 && a->shape[0] == b->shape[1] && a->shape[0] >= 1,
              "[lora] '{}': '{}' has lora_a {} and lora_b {}: expected [rank, in] and [out, rank]", shown, name,
              a->shape.str(), b->shape.str());
    TOY_CHECK(a->shape[1] == lin.in_features() && b->shape[0] == lin.out_features(),
              "[lora] '{}': '{}' is [{}, {}], its adapter [{}, {}] x [{}, {}]", shown, name, lin.out_features(),
              lin.in_features(), b->shape[0], b->shape[1], a->shape[0], a->shape[1]);
    const int64_t rank = a->shape[0];
    auto f32 = [&](const gguf::TensorInfo* t) {
      Tensor x = r.tensor(t->name);
      return x.dtype() == DType::F32 ? x : cast(x, DType::F32);
    };
    lin.lora.a = f32(a);
    lin.lora.b = f32(b);
    lin.lora.scale = alpha != 0.0f ? user_scale * alpha / float(rank) : user_scale;
    lin.lora.dropout = 0;
  }
}

void merge_lora(DecoderLM& m, DType out) {
  TOY_CHECK(out == DType::F32 || out == DType::F16 || out == DType::BF16, "[lora] merging into {} is not supported",
            name(out));
  NoGradGuard ng;
  for (const auto& [name, lin] : m.projections()) {
    if (!lin->lora.defined()) continue;
    const nn::Lora& l = lin->lora;
    Tensor w = cast(lin->weight.detach(), DType::F32);
    Tensor delta = matmul(l.b.detach(), l.a.detach());  // [out, in]
    Tensor merged = add(w, l.scale == 1.0f ? delta : scale(delta, l.scale));
    lin->weight = m.params().replace(name, out == DType::F32 ? merged : cast(merged, out));
    lin->lora = nn::Lora{};
    for (const char* suffix : {".lora_a", ".lora_b"})
      if (m.params().has(name + suffix)) m.params().remove(name + suffix);
  }
}

}  // namespace toy
