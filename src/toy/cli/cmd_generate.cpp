// `toy generate`: stream text from a model file. Exactly the generated text goes to stdout
// (a final newline only on a terminal), diagnostics and the timing line to stderr, so the
// output can be piped.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/cli/lora_flags.h"
#include "toy/cli/sampler_flags.h"
#include "toy/infer/generate.h"
#include "toy/infer/sampler.h"
#include "toy/core/runtime.h"
#include "toy/io/model_file.h"
#include "toy/nn/kv_cache.h"

#include <algorithm>

namespace toy::cli {

namespace {
struct GenerateFlags {
  LoraFlags lora;
  Device device = Device::CPU;
  std::string model, prompt;
  int64_t n = 200;
  SamplingFlags sampling;
  std::vector<std::string> stop;
  int threads = 0;
  int64_t ctx = 0;
  bool echo = false, quiet = false;
};

int run_generate(const GenerateFlags& f) {
  Sampler sampler(f.sampling.config, f.sampling.seed);
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel lm = load_model(f.model);
  apply_lora_flags(f.lora, lm);
  lm.model->params().move_to(f.device);  // the weights (the file stays their source), copied once
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  DecoderLM& m = *lm.model;
  const Tokenizer& tok = *lm.tokenizer;
  // The cache: --ctx, else the model's context up to 4096 (as llama.cpp: a long-context model's
  // full window would take gigabytes).
  const int64_t capacity = f.ctx ? f.ctx : std::min<int64_t>(m.config().ctx, 4096);
  std::vector<int32_t> ids;
  if (tok.adds_bos()) ids.push_back(tok.bos_id());  // exactly when the file's vocabulary says so
  if (!f.prompt.empty()) {
    const std::vector<int32_t> body = tok.encode(f.prompt);
    ids.insert(ids.end(), body.begin(), body.end());
  }
  if (ids.empty()) {
    // No prompt: start from end-of-text if the vocabulary has it, else from token 0.
    ids.push_back(tok.eos_id() >= 0 ? tok.eos_id() : 0);
  }
  // (generate keeps the prompt's last capacity - 1 tokens, leaving room for one new token)
  if (int64_t(ids.size()) > std::max<int64_t>(1, capacity - 1))
    std::fprintf(stderr, "toy generate: warning: the prompt is %lld tokens, more than --ctx %lld holds with room to "
                 "generate; only its last %lld are used\n", (long long)ids.size(), (long long)capacity,
                 (long long)std::max<int64_t>(1, capacity - 1));
  if (f.echo) std::fputs(f.prompt.c_str(), stdout);
  const GenerateStats st = generate(m, tok, sampler, std::move(ids), f.n, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  }, capacity, f.stop);
  if (isatty(fileno(stdout))) std::fputc('\n', stdout);
  if (!f.quiet)
    std::fprintf(stderr, "toy generate: load %.0f ms; prompt %lld tokens, %.1f tok/s; generation %lld tokens, %.1f tok/s\n",
                 load_ms, (long long)st.prompt_tokens, st.prompt_tokens / std::max(st.prompt_seconds, 1e-9),
                 (long long)st.generated_tokens, st.generated_tokens / std::max(st.generate_seconds, 1e-9));
  return 0;
}
}  // namespace

Run add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a model file");
  auto f = std::make_shared<GenerateFlags>();
  cmd->add_option("-m,--model", f->model, "Model file (model.gguf)")->required();
  add_lora_flags(cmd, f->lora);
  cmd->add_option("-p,--prompt", f->prompt, "Prompt text");
  add_int(cmd, "-n,--tokens", f->n, 0, int64_t(1) << 30, "Tokens to generate");
  add_sampling_flags(cmd, f->sampling);
  cmd->add_option("--stop", f->stop, "Stop where the text contains this string (may be given several times)");
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  add_device(cmd, f->device);
  add_int(cmd, "--ctx", f->ctx, 1, int64_t(1) << 24, "KV cache size in tokens (default: the model's context, at most 4096)")
      ->default_str("");
  cmd->add_flag("--echo", f->echo, "Print the prompt before the generated text");
  cmd->add_flag("--quiet", f->quiet, "No timing line on stderr");
  return [f]() {
    if (f->threads) set_num_threads(f->threads);
    return run_generate(*f);
  };
}

}  // namespace toy::cli
