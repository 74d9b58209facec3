// `toy eval -m M --tokens 1,2,3 [--dump-logits FILE]`: one forward pass over the given ids,
// used exactly as given (no BOS added). --dump-logits writes the raw logits: little-endian
// float32, [n_tokens, vocab], row-major, no header. Without it, the most likely next token
// at each position is printed.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "toy/autograd/grad_mode.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/cli/lora_flags.h"
#include "toy/core/text.h"
#include "toy/core/runtime.h"
#include "toy/io/model_file.h"
#include "toy/ops/ops.h"

namespace toy::cli {

namespace {

struct EvalFlags {
  LoraFlags lora;
  Device device = Device::CPU;
  std::string model, tokens, dump;
  int threads = 0;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    int64_t v = 0;
    const std::string item = s.substr(start, end - start);
    TOY_CHECK(parse_int64(item, v) && v >= 0 && v <= INT32_MAX, "comma-separated token ids are expected, got '{}'",
              printable(item));
    ids.push_back(int32_t(v));
    start = end + 1;
  }
  return ids;
}

int run_eval(const EvalFlags& f) {
  const std::vector<int32_t> ids = parse_ids(f.tokens);
  LoadedModel lm = load_model(f.model);
  apply_lora_flags(f.lora, lm);
  lm.model->params().move_to(f.device);
  DecoderLM& m = *lm.model;
  const int64_t V = m.config().vocab, T = int64_t(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    TOY_CHECK(ids[i] < V, "[eval] token {} at position {} is out of the vocabulary [0, {})", ids[i], i, V);
  NoGradGuard ng;
  // Through the cache, in the model's context-sized chunks: any length the positions allow.
  nn::KVCache cache = m.new_cache(1, T);
  Tensor logits = contiguous(m.logits(from_vector(ids, Shape{1, T}), false, nullptr, &cache));
  const std::vector<float> v = logits.to_f32_vector();
  if (!f.dump.empty()) {
    std::FILE* out = std::fopen(f.dump.c_str(), "wb");
    TOY_CHECK(out != nullptr, "[eval] cannot write '{}': {}", printable(f.dump), std::strerror(errno));
    const bool ok = std::fwrite(v.data(), sizeof(float), v.size(), out) == v.size();
    TOY_CHECK(std::fclose(out) == 0 && ok, "[eval] cannot write '{}' (disk full?)", printable(f.dump));
    std::fprintf(stderr, "toy eval: %lld x %lld logits written to %s\n", (long long)T, (long long)V,
                 printable(f.dump).c_str());
    return 0;
  }
  for (int64_t t = 0; t < T; ++t) {
    int64_t best = 0;
    for (int64_t j = 1; j < V; ++j)
      if (v[size_t(t * V + j)] > v[size_t(t * V + best)]) best = j;
    std::printf("%lld\t%d\t%lld\t%.6f\n", (long long)t, ids[size_t(t)], (long long)best, v[size_t(t * V + best)]);
  }
  return 0;
}

}  // namespace

Run add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Logits of a model for given token ids (no BOS added)");
  auto f = std::make_shared<EvalFlags>();
  cmd->add_option("-m,--model", f->model, "Model file (GGUF)")->required();
  add_lora_flags(cmd, f->lora);
  cmd->add_option("--tokens", f->tokens, "Comma-separated token ids, e.g. 1,2,3")
      ->required()
      ->check([](const std::string& s) {  // a usage error, like every other bad flag value
        try {
          parse_ids(s);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
  cmd->add_option("--dump-logits", f->dump, "Write raw little-endian float32 logits [n_tokens, vocab] to this file");
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)")->default_str("");
  add_device(cmd, f->device);
  return [f]() {
    if (f->threads) set_num_threads(f->threads);
    return run_eval(*f);
  };
}

}  // namespace toy::cli
