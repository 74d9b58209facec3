// `toy bench structured -m MODEL [--vocab VOCAB.gguf]`: what constrained decoding costs —
// tokens per second with a grammar (any JSON object, a schema, a required tool call; sampled at
// temperature 1) against the same
// engine unconstrained, alternating runs in one process. `--vocab` swaps in a real vocabulary
// (GPT-2's 50k tokens from ../shared/data/vocab) for a random-weight model whose own is mostly
// placeholder tokens: the mask walks every token, so its size is what matters.
#include <chrono>
#include <cstdio>
#include <memory>
#include <utility>

#include "toy/cli/bench_util.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/core/runtime.h"
#include "toy/infer/grammar.h"
#include "toy/infer/grammar_mask.h"
#include "toy/infer/json_schema.h"
#include "toy/infer/tool_grammar.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/models/decoder_lm.h"
#include "toy/serve/engine.h"

namespace toy::cli {

Run add_bench_structured_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("structured", "Constrained decoding (a JSON grammar) against unconstrained, tokens/s");
  struct Flags {
    std::string model, vocab;
    int threads = 0, reps = 6;
    int64_t tokens = 128;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("-m,--model", f->model, "Model file (GGUF)")->required();
  cmd->add_option("--vocab", f->vocab, "Take the tokenizer from this GGUF instead (ids past the model's vocabulary unused)");
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  add_int(cmd, "--reps", f->reps, 1, 100, "Runs of each kind, alternating (default 6)");
  add_int(cmd, "-n,--n-gen", f->tokens, 1, 1 << 16, "Most tokens per run (default 128)");
  cmd->add_flag("--json", f->json, "One JSON object");
  return [f]() {
    if (f->threads) set_num_threads(f->threads);
    LoadedModel lm = load_model(f->model);
    std::unique_ptr<Tokenizer> other;
    if (!f->vocab.empty()) other = Tokenizer::load(gguf::Reader(f->vocab));
    const Tokenizer& tok = other ? *other : *lm.tokenizer;
    const int64_t V = lm.model->config().vocab;
    serve::Engine engine(*lm.model, tok, {.parallel = 1, .ctx = f->tokens + 16});
    // Any JSON object (states repeat: the masks come from the cache), and a schema whose
    // bounded string makes every position a state of its own (a mask walked per token).
    // And a required tool call in Hermes's format (tool_choice "required"; strings kept free of
    // the format's markers, which makes their states automata of their own).
    ChatSyntax hermes;
    hermes.tools = ToolCallFormat::Hermes;
    const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer",
        "minimum": 1, "maximum": 14}}, "required": ["city"]}}}])");
    const std::pair<const char*, std::shared_ptr<const Grammar>> cases[] = {
        {"structured-json", Grammar::parse(json_object_gbnf())},
        {"structured-schema", Grammar::parse(json_schema_to_gbnf(nlohmann::ordered_json::parse(
                                  R"({"type": "object", "properties": {"text": {"type": "string", "maxLength": 400}},
                                      "required": ["text"], "additionalProperties": false})")))},
        {"structured-tool-call", Grammar::parse(tool_call_gbnf(hermes, tools, "", true, tok), grammar_vocab(tok))}};
    for (const auto& [name, grammar] : cases) {
      double seconds[2] = {0, 0};
      int64_t tokens[2] = {0, 0};
      for (int r = 0; r < f->reps; ++r)
        for (int constrained = 0; constrained < 2; ++constrained) {
          serve::GenParams p;
          p.prompt = {int32_t(1 % V), int32_t(2 % V), int32_t(3 % V)};
          p.max_tokens = f->tokens;
          p.sampling.temperature = 1;
          p.seed = uint64_t(r);
          p.ignore_eos = !constrained;  // unconstrained: every run the full length
          if (constrained) p.grammar = grammar;
          const auto t0 = std::chrono::steady_clock::now();
          auto job = engine.submit(p);
          job->wait_all();
          seconds[constrained] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          tokens[constrained] += job->completion_tokens;
        }
      BenchResult res;
      res.name = name;
      res.value = double(tokens[1]) / seconds[1];
      res.unit = "tok/s";
      res.baseline = double(tokens[0]) / seconds[0];
      res.baseline_what = "the same engine unconstrained";
      res.ratio = res.value / res.baseline;
      res.target = 0.9;
      print_result(res, f->json);
      if (!f->json)
        std::printf("(%lld constrained tokens, %lld unconstrained, vocabulary %d, %s)\n",
                    static_cast<long long>(tokens[1]), static_cast<long long>(tokens[0]), tok.vocab_size(),
                    cpu_label().c_str());
    }
    engine.shutdown("done");
    return 0;
  };
}

}  // namespace toy::cli
