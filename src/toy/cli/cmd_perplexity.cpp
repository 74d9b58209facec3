// `toy perplexity -m M -f TEXT --ctx N [--json]`: perplexity as llama.cpp's llama-perplexity
// computes it, so the numbers compare: the text is tokenized whole (BOS first when the
// vocabulary adds one), cut into floor(n / N) chunks of N tokens, the first token of each
// chunk replaced by BOS when the model adds one, each chunk run as one sequence, and only
// the second half of each chunk scored (tokens N/2 + 1 .. N - 1, each with at least N/2 tokens
// of context). PPL = exp(mean negative log-likelihood of the scored tokens).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "toy/autograd/grad_mode.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/core/files.h"
#include "toy/core/text.h"
#include "toy/core/runtime.h"
#include "toy/io/model_file.h"
#include "toy/ops/ops.h"

namespace toy::cli {

Run add_perplexity_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("perplexity", "Perplexity of a model on a text, as llama.cpp's llama-perplexity");
  struct Flags {
    std::string model, file;
    int64_t ctx = 512, chunks = 0;
    int threads = 0;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("-m,--model", f->model, "Model file (GGUF)")->required();
  cmd->add_option("-f,--file", f->file, "Text file")->required();
  add_int(cmd, "--ctx", f->ctx, 4, int64_t(1) << 20, "Tokens per chunk (default 512)");
  add_int(cmd, "--chunks", f->chunks, 0, int64_t(1) << 30, "Score at most this many chunks (default: all)");
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  cmd->add_flag("--json", f->json, "Print {\"ppl\", \"chunks\", \"tokens\", ...}");
  return [f]() {
    if (f->threads) set_num_threads(f->threads);
    const std::string text = read_regular_file(f->file, "perplexity");
    LoadedModel lm = load_model(f->model);
    DecoderLM& m = *lm.model;
    const Tokenizer& tok = *lm.tokenizer;
    const int64_t N = f->ctx;
    TOY_CHECK(N <= m.config().ctx || m.config().pos == PosKind::RoPE,
              "[perplexity] --ctx {} is longer than the {} learned positions of '{}'", N, m.config().ctx,
              printable(f->model));
    std::vector<int32_t> ids;
    if (tok.adds_bos()) ids.push_back(tok.bos_id());
    const std::vector<int32_t> body = tok.encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
    TOY_CHECK(int64_t(ids.size()) >= 2 * N,
              "[perplexity] '{}' tokenizes to {} tokens; a context of {} needs at least {} (two chunks)",
              printable(f->file), ids.size(), N, 2 * N);
    int64_t n_chunks = int64_t(ids.size()) / N;
    if (f->chunks) n_chunks = std::min(n_chunks, f->chunks);
    const int64_t first = N / 2, V = m.config().vocab;
    NoGradGuard ng;
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t c = 0; c < n_chunks; ++c) {
      std::vector<int32_t> chunk(ids.begin() + c * N, ids.begin() + (c + 1) * N);
      if (tok.adds_bos()) chunk[0] = tok.bos_id();
      const Tensor logits = m.logits(from_vector(chunk, Shape{1, N}));  // [1, N, V]
      const float* lp = logits.data<float>();
      for (int64_t j = first; j < N - 1; ++j) {
        const float* row = lp + j * V;
        double mx = row[0];
        for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
        double se = 0;
        for (int64_t v = 0; v < V; ++v) se += std::exp(double(row[v]) - mx);
        const double l = -(double(row[chunk[size_t(j + 1)]]) - mx - std::log(se));
        nll += l, nll2 += l * l, ++count;
      }
      if (!f->json)
        std::fprintf(stderr, "[%lld/%lld] running ppl %.4f\n", static_cast<long long>(c + 1),
                     static_cast<long long>(n_chunks), std::exp(nll / double(count)));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double mean = nll / double(count), ppl = std::exp(mean);
    const double var = count > 1 ? std::max(0.0, nll2 / double(count) - mean * mean) : 0.0;
    const double stderr_ppl = count > 1 ? std::sqrt(var / double(count - 1)) * ppl : 0.0;
    if (f->json) {
      nlohmann::json j = {{"ppl", ppl},       {"chunks", n_chunks}, {"tokens", count}, {"nll", mean},
                          {"ppl_stderr", stderr_ppl}, {"ctx", N}, {"seconds", secs}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("PPL = %.4f +/- %.5f (%lld chunks of %lld tokens, %lld scored, %.1f s)\n", ppl, stderr_ppl,
                  static_cast<long long>(n_chunks), static_cast<long long>(N), static_cast<long long>(count), secs);
    }
    return 0;
  };
}

}  // namespace toy::cli
