// `toy generate`: stream text from a model file. Only the generated text goes to stdout
// (diagnostics to stderr), so the output can be piped.
#include <cstdio>
#include <memory>

#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/infer/generate.h"
#include "toy/infer/sampler.h"
#include "toy/core/thread_pool.h"
#include "toy/io/model_file.h"

namespace toy::cli {

namespace {
struct GenerateFlags {
  std::string model, prompt;
  int64_t n = 200;
  float temperature = 0.8f, top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 1;
  int threads = 0;
  bool echo = false;
};

int run_generate(const GenerateFlags& f) {
  Sampler sampler({f.temperature, f.top_k, f.top_p}, f.seed);
  LoadedModel lm = load_model(f.model);
  DecoderLM& m = *lm.model;
  const Tokenizer& tok = *lm.tokenizer;
  std::vector<int32_t> ids = f.prompt.empty() ? std::vector<int32_t>{} : tok.encode(f.prompt);
  if (ids.empty()) {
    // No prompt: start from end-of-text if the vocabulary has it, else from token 0.
    ids.push_back(tok.eos_id() >= 0 ? tok.eos_id() : 0);
  }
  if (f.echo) std::fputs(f.prompt.c_str(), stdout);
  generate(m, tok, sampler, std::move(ids), f.n, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}
}  // namespace

Run add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a model file");
  auto f = std::make_shared<GenerateFlags>();
  cmd->add_option("-m,--model", f->model, "Model file (model.gguf)")->required();
  cmd->add_option("-p,--prompt", f->prompt, "Prompt text");
  add_int(cmd, "-n,--tokens", f->n, 0, int64_t(1) << 30, "Tokens to generate");
  add_real(cmd, "--temp,--temperature", f->temperature, {0, 100}, "Sampling temperature (0 = greedy)");
  add_int(cmd, "--top-k", f->top_k, 0, INT32_MAX, "Keep the k most likely tokens (0 = off)");
  add_real(cmd, "--top-p", f->top_p, {0, 1, true}, "Nucleus sampling mass (1 = off)");
  add_u64(cmd, "--seed", f->seed, "Sampling seed (same seed, same text)");
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  cmd->add_flag("--echo", f->echo, "Print the prompt before the generated text");
  return [f]() {
    if (f->threads) set_num_threads(f->threads);
    return run_generate(*f);
  };
}

}  // namespace toy::cli
