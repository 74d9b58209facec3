// The model `toy finetune` trains, built from its options alone (a resumed run rebuilds the
// same one), and the files it hands back.
//   What trains: full — every block weight (and with --train-embeddings the token and position
//   embeddings, the final norm and the head); LoRA — F32 adapters only. A projection lens adds
//   its projection, the untied head, the final norm and learned positions (full or LoRA); the
//   donor's table itself never trains.
//   What a parameter holds: one that trains, an F32 copy; one that does not, the file's tensor
//   as stored (a view of the mapping, any dtype; vectors as F32, as the ops want them).
#include <filesystem>

#include <fmt/core.h>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/core/machine.h"
#include "toy/core/text.h"
#include "toy/io/model_file.h"
#include "toy/io/quantize.h"
#include "toy/models/lora.h"
#include "toy/ops/ops.h"
#include "toy/train/finetune_run.h"

namespace fs = std::filesystem;

namespace toy {

namespace {

bool is_embedding_like(const std::string& name) {
  return name == "token_embd.weight" || name == "position_embd.weight" || name == "output.weight" ||
         name.rfind("output_norm.", 0) == 0 || name.rfind("token_embd_norm.", 0) == 0;  // (LFM2's final norm)
}

// The tensor `name` of a file, checked against the shape the model declares.
Tensor file_tensor(const gguf::Reader& r, const std::string& name, const Shape& shape) {
  const gguf::TensorInfo* ti = r.find_tensor(name);
  TOY_CHECK(ti != nullptr, "[finetune] '{}': missing tensor '{}'", printable(r.path()), name);
  TOY_CHECK(ti->shape == shape, "[finetune] '{}': tensor '{}' has shape {}, the model needs {}", printable(r.path()),
            name, ti->shape.str(), shape.str());
  return r.tensor(name);
}

// What a parameter holds: an F32 copy when it trains, else the stored tensor (vectors as F32).
Tensor as_parameter(const Tensor& stored, bool trains) {
  if (trains) {
    Tensor t = empty(stored.shape());
    copy_(t, stored);  // converts F16/BF16/blocks
    return t;
  }
  return stored.ndim() == 1 && stored.dtype() != DType::F32 ? cast(stored, DType::F32) : stored;
}

bool same_vocabulary(const Tokenizer& a, const Tokenizer& b) {
  if (a.kind() != b.kind() || a.vocab_size() != b.vocab_size()) return false;
  for (int32_t i = 0; i < a.vocab_size(); ++i)
    if (a.token_bytes(i) != b.token_bytes(i)) return false;
  return true;
}

// The merged model's type when none is asked: the base's float type, F16 for a quantized base.
std::string default_merge_type(const gguf::Reader* r, DecoderLM& m) {
  const auto projections = m.projections();
  if (!r || projections.empty()) return "f32";
  const gguf::TensorInfo* t = r->find_tensor(projections.front().first);
  const DType dt = t ? t->dtype : DType::F32;
  return dt == DType::F32 ? "f32" : dt == DType::BF16 ? "bf16" : "f16";
}

std::string chat_template_of(const gguf::Reader& r) {
  const gguf::Value* t = r.find("tokenizer.chat_template");
  return t && t->type == gguf::Type::STRING ? t->s : std::string();
}

}  // namespace

void build_finetune_model(FinetuneRun& r) {
  const FinetuneOptions& o = r.o;
  const bool full = o.method == "full", lens = !o.donor_embeddings.empty();
  if (!o.model.empty()) r.base = std::make_unique<gguf::Reader>(o.model);
  if (lens) r.donor = std::make_unique<gguf::Reader>(o.donor_embeddings);
  // The tokenizer (and chat template) come from the donor under a lens, else from the base.
  const gguf::Reader& vocab_file = lens ? *r.donor : *r.base;
  r.tok = Tokenizer::load(vocab_file);
  r.chat.reset();
  if (!o.chat_template.empty()) {
    r.chat = ChatTemplate::from_file(o.chat_template, *r.tok);
    r.chat_template = r.chat->source();
  } else {
    r.chat_template = chat_template_of(vocab_file);
    try {
      r.chat = ChatTemplate::from_model(vocab_file, *r.tok);
    } catch (const Error& e) {
      r.chat_error = e.what();  // only "messages" records need it: they will say this
    }
  }
  r.arch = r.base && r.base->has("general.architecture") ? r.base->get_str("general.architecture") : "";
  r.toy_config = !r.base || r.base->has("toy.config");

  ModelConfig cfg = r.base ? config_from_gguf(*r.base) : o.shape;
  const int64_t base_vocab = cfg.vocab;
  bool reuse_head = false;  // a lens over the base's own vocabulary keeps the base's head
  if (lens) {
    const ModelConfig donor = config_from_gguf(*r.donor);
    cfg.lens_dim = donor.dim;
    cfg.vocab = donor.vocab;
    TOY_CHECK(r.tok->vocab_size() == cfg.vocab, "[finetune] donor '{}': its tokenizer has {} tokens, its model {}",
              printable(o.donor_embeddings), r.tok->vocab_size(), cfg.vocab);
    if (r.base) reuse_head = base_vocab == cfg.vocab && same_vocabulary(*Tokenizer::load(*r.base), *r.tok);
    cfg.tied = false;
  } else {
    TOY_CHECK(r.tok->vocab_size() == cfg.vocab, "[finetune] '{}': the tokenizer has {} tokens, the model {}",
              printable(o.model), r.tok->vocab_size(), cfg.vocab);
  }
  cfg.resolve();
  cfg.validate();

  // What trains (before LoRA adapters, which always do).
  auto trains = [&](const std::string& name) {
    if (name == "rope_freqs.weight") return false;  // a constant of the model
    if (lens && name == "token_embd.weight") return false;
    if (lens && (name == "token_embd_proj.weight" || is_embedding_like(name))) return true;
    if (!full) return false;
    return !is_embedding_like(name) || o.train_embeddings;
  };
  // Memory: each trained F32 weight comes with its gradient and two moments.
  double trained_bytes = 0;
  for (const auto& [name, shape] : DecoderLM::parameter_shapes(cfg))
    if (trains(name)) trained_bytes += 4.0 * double(shape.numel()) * sizeof(float);
  TOY_CHECK(trained_bytes <= double(available_memory_bytes()),
            "[finetune] the weights that train need about {} with their gradients and optimizer state, more than the "
            "{} available: use --method lora", format_bytes(trained_bytes), format_bytes(double(available_memory_bytes())));

  NoGradGuard ng;
  uint64_t index = 0;  // parameter order: a fresh tensor draws from its own stream, as init() would
  std::vector<std::string> trained;
  r.model = std::make_unique<DecoderLM>(cfg, [&](const std::string& name, const Shape& shape) -> Tensor {
    ++index;
    const bool t = trains(name);
    if (t) trained.push_back(name);
    if (lens && name == "token_embd.weight") return as_parameter(file_tensor(*r.donor, name, shape), false);
    // (Only a lens gets a new head, and only when the donor's vocabulary is not the base's:
    // an untied base's own head is the base's, whatever the method.)
    const bool fresh =
        !r.base || name == "token_embd_proj.weight" || (lens && name == "output.weight" && !reuse_head);
    if (fresh) {
      Tensor p = empty(shape);
      p.set_name(name);
      DecoderLM::init_parameter(p, o.seed, kLensInitStream + index, cfg.init_scale);
      return p;
    }
    if (name == "output.weight" && !r.base->find_tensor(name))  // the base's tied head, untied
      return as_parameter(file_tensor(*r.base, "token_embd.weight", shape), t);
    return as_parameter(file_tensor(*r.base, name, shape), t);
  });
  for (const std::string& name : trained) r.model->params().set_trainable(name, true);

  DecoderLM& m = *r.model;
  if (!full) {
    LoraOptions lo;
    if (!o.lora_targets.empty()) lo.targets = parse_lora_targets(o.lora_targets);
    lo.rank = o.lora_rank, lo.alpha = o.lora_alpha, lo.dropout = o.lora_dropout, lo.seed = o.seed;
    add_lora(m, lo);
  }
  m.set_recompute(o.recompute);
  m.set_moe_aux_loss(o.moe_aux_loss);
  // Mixed precision: trainable projections multiply in BF16/F16 over their F32 masters; a
  // frozen F32 base (LoRA) is stored in that type outright (half the memory).
  const DType compute = precision_type(o.precision);
  if (compute != DType::F32) {
    for (auto& [name, lin] : m.projections()) {
      if (m.params().record(name).trainable)
        lin->compute = compute;
      else if (lin->weight.dtype() == DType::F32)
        lin->weight = m.params().replace(name, cast(lin->weight, compute));
    }
  }
  r.merge_type = o.merge_type.empty() ? default_merge_type(r.base.get(), m) : o.merge_type;
}

void write_finetune_outputs(FinetuneRun& r) {
  const fs::path dir(r.o.out);
  DecoderLM& m = *r.model;
  // A lens run's adapters adapt a model that exists only inside the run (the base under the
  // donor's table), so it hands back the merged model alone.
  if (r.o.method == "lora" && r.o.donor_embeddings.empty())
    save_lora_adapter((dir / "adapter.gguf").string(), m, r.arch.empty() ? "toy" : r.arch, r.o.lora_alpha);
  // (Merged straight into an F16/BF16 output type: the F32 sum exists one weight at a time.)
  merge_lora(m, r.merge_type == "f16" ? DType::F16 : r.merge_type == "bf16" ? DType::BF16 : DType::F32);
  m.fold_lens();
  ModelWriteOptions wo;
  wo.toy_config = r.toy_config;
  wo.chat_template = r.chat_template;
  wo.quant = &quant_kind(r.merge_type);
  gguf::Writer w;
  add_model_to_gguf(w, m, *r.tok, "toy finetune", wo);
  // The vocabulary's other keys (add_eos_token, add_space_prefix, pre-tokenizer details a
  // reader may use) as the file the tokenizer came from has them: the merged model must
  // tokenize as its base does, in toy and in llama.cpp alike.
  const gguf::Reader* vocab_file = r.donor ? r.donor.get() : r.base.get();
  if (vocab_file)
    for (const auto& [key, value] : vocab_file->metadata())
      if (key.rfind("tokenizer.", 0) == 0 && !w.has(key)) w.set(key, value);
  w.write((dir / "model.gguf").string());
}

}  // namespace toy
