// `toy init --arch A --shape S --type T --seed N --out M.gguf`: a random-weight model of a
// published model's exact shape (no real weights can be downloaded on the machines toy is
// tested on; users bring theirs). The tokenizer is a byte-level BPE learned from the license
// texts and padded with control tokens to the real vocabulary size, with the real model's
// pre-tokenizer and a ChatML chat template. Written with the standard keys only, as
// llama.cpp's converter writes files, then converted to --type as llama-quantize would
// (1-D tensors stay F32; rows a block type cannot divide fall back as llama.cpp's do), one
// tensor at a time.
//
// `toy quantize IN.gguf OUT.gguf TYPE`: any model file converted the same way.
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include <fmt/core.h>

#include "toy/autograd/grad_mode.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/core/files.h"
#include "toy/core/machine.h"
#include "toy/core/rng.h"
#include "toy/core/text.h"
#include "toy/data/corpus.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/io/quantize.h"
#include "toy/models/shapes.h"
#include "toy/ops/ops.h"

namespace toy::cli {

namespace {

// ChatML, as Qwen2.5 and SmolLM2 write it (toy chat renders it with its Jinja engine).
constexpr const char* kChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Random weights that exercise every tensor: norm weights near 1 and biases near 0 rather
// than exactly 1 and 0, so a loader that skipped one would show in the logits.
void perturb_vector(Tensor& p, uint64_t seed, uint64_t stream) {
  if (p.ndim() != 1 || p.name().starts_with("rope_")) return;  // (RoPE tables are constants)
  Generator g(seed ^ 0x9e3779b97f4a7c15ull, stream);
  const bool is_norm = p.name().find("norm") != std::string::npos;
  Tensor noise = randn(p.shape(), g, 0.0f, is_norm ? 0.1f : 0.02f);
  copy_(p, add(p, noise));
}

// The file, one tensor at a time: parameter i drawn as DecoderLM::init draws it (stream i + 1)
// and perturbed, then converted as llama-quantize plans it, only when the writer reaches it —
// a 30B model is written holding one tensor (its F32 draw and its conversion), never the model.
void write_random_model(const std::string& path, const ModelConfig& cfg, const Tokenizer& tok, uint64_t seed,
                        const QuantKind& kind, const std::string& name) {
  gguf::Writer w;
  ModelWriteOptions options;
  options.toy_config = false;
  options.chat_template = kChatML;
  options.quant = &kind;
  add_model_keys(w, cfg, tok, name, options, true);
  std::vector<TensorPlan> plan;
  std::map<std::string, uint64_t> stream_of;
  for (const auto& [pname, shape] : DecoderLM::parameter_shapes(cfg)) {
    plan.push_back({pname, shape, DType::F32, DType::F32, false});
    stream_of[pname] = plan.size();
  }
  plan = plan_quantization(kind, std::move(plan), cfg.layers, cfg.moe.experts);
  for (const TensorPlan& t : plan) {
    const uint64_t stream = stream_of.at(t.name);
    w.add_tensor(t.name, t.shape, t.to, [t, stream, seed, scale = cfg.init_scale]() {
      NoGradGuard ng;
      Tensor p = zeros(t.shape);
      p.set_name(t.name);
      DecoderLM::init_parameter(p, seed, stream, scale);
      perturb_vector(p, seed, stream);
      return t.to == DType::F32 ? p : cast(p, t.to);
    });
  }
  w.write(path);
}

}  // namespace

Run add_init_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("init", "Write a random-weight model of a published model's exact shape");
  struct Flags {
    std::string arch, shape, type = "f32", out;
    uint64_t seed = 1;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--arch", f->arch, "llama, qwen2, qwen3, qwen35, gpt2, smollm3, phi3, gemma3, qwen3moe, olmoe, "
                  "granitemoe or lfm2")->required();
  cmd->add_option("--shape", f->shape, "tiny or a published model's shape (the pairs below)")->required();
  cmd->add_option("--type", f->type, "Weight type: " + quant_kind_names() + " (default f32)");
  add_u64(cmd, "--seed", f->seed, "Seed of the random weights (default 1)");
  cmd->add_option("--out", f->out, "The model file to write")->required();
  cmd->footer("Valid architecture and shape pairs:\n" + model_shape_pairs());
  return [f]() {
    const auto t0 = std::chrono::steady_clock::now();
    const QuantKind& kind = quant_kind(f->type);
    ModelConfig cfg = shape_config(f->arch, f->shape);
    check_output_file(f->out, "init");
    // Memory: the largest tensor in F32 plus its converted copy (one tensor exists at a time).
    int64_t n_params = 0, largest = 0;
    for (const auto& [name, shape] : DecoderLM::parameter_shapes(cfg))
      n_params += shape.numel(), largest = std::max(largest, shape.numel());
    const double need = double(largest) * 4.0 * 2.0;
    const uint64_t avail = available_memory_bytes();
    TOY_CHECK(need <= double(avail), "[init] a {} {} model needs about {} to write, more than the {} available",
              f->arch, f->shape, format_bytes(need), format_bytes(double(avail)));
    Corpus corpus = read_corpus(std::vector<std::string>{});
    // (llama.cpp looks up SentencePiece's <unk>, <s> and </s> in a Phi-3's vocabulary by name.)
    const std::vector<std::string> controls =
        f->arch == "phi3" ? std::vector<std::string>{"<unk>", "<s>", "</s>"} : std::vector<std::string>{};
    auto tok = Tokenizer::train_fixed_size(corpus.text, shape_pretokenizer(f->arch, f->shape), cfg.vocab, controls);
    write_random_model(f->out, cfg, *tok, f->seed, kind, fmt::format("toy-init {} {} {}", f->arch, f->shape, kind.name));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "toy: wrote %s (%s %s, %s, %lld parameters) in %.1f s\n", printable(f->out).c_str(),
                 f->arch.c_str(), f->shape.c_str(), std::string(kind.name).c_str(),
                 static_cast<long long>(n_params), secs);
    return 0;
  };
}

Run add_quantize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("quantize", "Convert a model file's weights to another type, as llama-quantize does");
  struct Flags {
    std::string in, out, type;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("in", f->in, "The model file to read")->required();
  cmd->add_option("out", f->out, "The model file to write")->required();
  cmd->add_option("type", f->type, "Target: " + quant_kind_names())->required();
  return [f]() {
    const QuantKind& kind = quant_kind(f->type);
    check_output_file(f->out, "quantize");
    gguf::Reader r(f->in);
    TOY_CHECK(std::filesystem::weakly_canonical(f->in) != std::filesystem::weakly_canonical(f->out),
              "[quantize] the output '{}' is the input file", printable(f->out));
    const auto t0 = std::chrono::steady_clock::now();
    const QuantizeReport rep = quantize_model_file(r, f->out, kind);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "toy: %s -> %s (%s): %lld of %lld tensors converted (%lld fell back to a 32-block type), %s -> %s, %.1f s\n",
                 printable(f->in).c_str(), printable(f->out).c_str(), std::string(kind.name).c_str(),
                 static_cast<long long>(rep.converted), static_cast<long long>(rep.tensors),
                 static_cast<long long>(rep.fallbacks), format_bytes(double(rep.bytes_in)).c_str(),
                 format_bytes(double(rep.bytes_out)).c_str(), secs);
    return 0;
  };
}

}  // namespace toy::cli
