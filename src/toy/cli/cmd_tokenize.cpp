// `toy tokenize -m M -p TEXT [--json] [--bos] [--special]`: the ids a model's tokenizer gives
// for a text. No BOS unless --bos; special-token text (e.g. "<|im_start|>") becomes its id
// only with --special, as llama.cpp's tokenizer with parse_special.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "toy/cli/commands.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy::cli {

Run add_tokenize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text under a model's tokenizer");
  struct Flags {
    std::string model, prompt;
    bool json = false, bos = false, special = false;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("-m,--model", f->model, "Model file (GGUF) whose tokenizer to use")->required();
  cmd->add_option("-p,--prompt", f->prompt, "The text")->required();
  cmd->add_flag("--json", f->json, "Print {\"ids\": [...]}");
  cmd->add_flag("--bos", f->bos, "Put the BOS token first (when the vocabulary has one)");
  cmd->add_flag("--special", f->special, "Parse special-token text as those tokens");
  return [f]() {
    gguf::Reader r(f->model);
    auto tok = Tokenizer::load(r);
    std::vector<int32_t> ids;
    if (f->bos) {
      TOY_CHECK(tok->bos_id() >= 0, "[tokenize] '{}': the vocabulary has no BOS token", printable(f->model));
      ids.push_back(tok->bos_id());
    }
    const std::vector<int32_t> body = f->special ? tok->encode_special(f->prompt) : tok->encode(f->prompt);
    ids.insert(ids.end(), body.begin(), body.end());
    if (f->json) {
      std::printf("%s\n", nlohmann::json{{"ids", ids}}.dump().c_str());
      return 0;
    }
    for (int32_t id : ids)
      std::printf("%d\t%s\n", id, printable(tok->token_bytes(id), 64).c_str());
    return 0;
  };
}

}  // namespace toy::cli
