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
                              "shortconv.in_proj", "shortconv.out_proj", "ffn_gate_exps", "ffn_up_exps",
                              "ffn_down_exps"};

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

// A weight an adapter can attach to: a block's projection [out, in], or a mixture's expert
// tensor [E, out, in] (its adapter then [E, rank, in] and [E, out, rank]).
struct Adaptable {
  std::string name;
  Tensor* weight;
  nn::Lora* lora;
  bool experts;
  int64_t in() const { return weight->size(-1); }
  int64_t out() const { return weight->size(-2); }
};

// The projections, then the expert tensors, in parameter order.
std::vector<Adaptable> adaptable(DecoderLM& m) {
  std::vector<Adaptable> out;
  for (const auto& [name, lin] : m.projections()) out.push_back({name, &lin->weight, &lin->lora, false});
  for (const auto& [name, e] : m.expert_weights()) out.push_back({name, e.weight, e.lora, true});
  return out;
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
              "shortconv.out_proj, ffn_gate_exps, ffn_up_exps, ffn_down_exps)",
              printable(item));
    if (!targeted(out, item)) out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::vector<std::string> lora_target_kinds(DecoderLM& m) {
  std::vector<std::string> out;
  for (const Adaptable& t : adaptable(m))
    if (!targeted(out, kind_of(t.name))) out.push_back(kind_of(t.name));
  return out;
}

std::vector<std::string> default_lora_targets(DecoderLM& m) {
  // A Gated DeltaNet layer's ssm_alpha/ssm_beta give one value per head (a few outputs), a
  // router one per expert: an adapter there is about as wide as the weight. An adapter on the
  // experts is one per expert (Qwen3-30B-A3B's at rank 8: 0.4 B parameters). Named, they adapt.
  std::vector<std::string> out;
  for (const std::string& kind : lora_target_kinds(m))
    if (kind != "ssm_alpha" && kind != "ssm_beta" && kind != "ffn_gate_inp" && !kind.ends_with("_exps"))
      out.push_back(kind);
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
  for (const Adaptable& t : adaptable(m)) {
    ++stream;
    const std::string kind = kind_of(t.name);
    if (!targeted(targets, kind)) continue;
    TOY_CHECK(!t.lora->defined(), "[lora] '{}' already has an adapter", t.name);
    if (!targeted(found, kind)) found.push_back(kind);
    const int64_t in = t.in(), out = t.out();
    TOY_CHECK(o.rank <= std::min(in, out), "[lora] rank {} is larger than '{}' ({} x {})", o.rank, t.name, out, in);
    Generator g(o.seed, stream);
    // (An expert tensor's adapter is one per expert: the same rule for each.)
    const std::vector<int64_t> lead = t.experts ? std::vector<int64_t>{t.weight->size(0)} : std::vector<int64_t>{};
    auto dims = [&](int64_t r, int64_t c) {
      std::vector<int64_t> d = lead;
      d.push_back(r), d.push_back(c);
      return Shape(d);
    };
    Tensor a = randn(dims(o.rank, in), g, 0.0f, 1.0f / std::sqrt(float(in)));
    t.lora->a = m.params().add(t.name + ".lora_a", a, true);
    t.lora->b = m.params().add(t.name + ".lora_b", zeros(dims(out, o.rank)), true);
    t.lora->scale = o.alpha / float(o.rank);
    t.lora->dropout = o.dropout;
  }
  for (const std::string& t : targets)
    TOY_CHECK(targeted(found, t), "[lora] the model has no '{}' projection to adapt (it has: {})", t,
              fmt::format("{}", fmt::join(lora_target_kinds(m), ", ")));
}

std::vector<std::pair<std::string, const nn::Lora*>> lora_adapters(DecoderLM& m) {
  std::vector<std::pair<std::string, const nn::Lora*>> out;
  for (const Adaptable& t : adaptable(m))
    if (t.lora->defined()) out.emplace_back(t.name, t.lora);
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
  std::map<std::string, Adaptable> by_name;
  for (const Adaptable& t : adaptable(m)) by_name.emplace(t.name, t);
  NoGradGuard ng;
  for (const auto& [name, ab] : pairs) {
    const auto [a, b] = ab;
    TOY_CHECK(a && b, "[lora] '{}': '{}' has a {} but no {}", shown, printable(name), a ? "lora_a" : "lora_b",
              a ? "lora_b" : "lora_a");
    auto it = by_name.find(name);
    TOY_CHECK(it != by_name.end(), "[lora] '{}': '{}' is not a projection of the model's blocks", shown,
              printable(name));
    const Adaptable& t = it->second;
    TOY_CHECK(!t.lora->defined(), "[lora] '{}': '{}' already has an adapter", shown, name);
    // [rank, in] and [out, rank]; an expert tensor's with its expert count in front.
    const int nd = t.experts ? 3 : 2;
    const int64_t E = t.experts ? t.weight->size(0) : 1;
    const bool shaped = a->shape.ndim() == nd && b->shape.ndim() == nd && a->shape[nd - 2] == b->shape[nd - 1] &&
                        a->shape[nd - 2] >= 1 && (!t.experts || (a->shape[0] == E && b->shape[0] == E));
    TOY_CHECK(shaped, "[lora] '{}': '{}' has lora_a {} and lora_b {}: expected {}", shown, name, a->shape.str(),
              b->shape.str(), t.experts ? fmt::format("[{}, rank, in] and [{}, out, rank]", E, E)
                                        : std::string("[rank, in] and [out, rank]"));
    TOY_CHECK(a->shape[nd - 1] == t.in() && b->shape[nd - 2] == t.out(),
              "[lora] '{}': '{}' is {}, its adapter {} x {}", shown, name, t.weight->shape().str(), b->shape.str(),
              a->shape.str());
    const int64_t rank = a->shape[nd - 2];
    auto f32 = [&](const gguf::TensorInfo* ti) {
      Tensor x = r.tensor(ti->name);
      return x.dtype() == DType::F32 ? x : cast(x, DType::F32);
    };
    t.lora->a = f32(a);
    t.lora->b = f32(b);
    t.lora->scale = alpha != 0.0f ? user_scale * alpha / float(rank) : user_scale;
    t.lora->dropout = 0;
  }
}

void merge_lora(DecoderLM& m, DType out) {
  TOY_CHECK(out == DType::F32 || out == DType::F16 || out == DType::BF16, "[lora] merging into {} is not supported",
            name(out));
  NoGradGuard ng;
  for (const Adaptable& t : adaptable(m)) {
    if (!t.lora->defined()) continue;
    const nn::Lora& l = *t.lora;
    Tensor w = cast(t.weight->detach(), DType::F32);
    Tensor delta = matmul(l.b.detach(), l.a.detach());  // [out, in] (per expert: [E, out, in])
    Tensor merged = add(w, l.scale == 1.0f ? delta : scale(delta, l.scale));
    *t.weight = m.params().replace(t.name, out == DType::F32 ? merged : cast(merged, out));
    *t.lora = nn::Lora{};
    const std::string& name = t.name;
    for (const char* suffix : {".lora_a", ".lora_b"})
      if (m.params().has(name + suffix)) m.params().remove(name + suffix);
  }
}

}  // namespace toy
