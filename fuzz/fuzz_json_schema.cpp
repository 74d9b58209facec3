// Structured output's parsers of outside input: a request's JSON Schema compiled to GBNF, a
// GBNF grammar itself (llama-server's `grammar` field, token elements included), and a
// request's `tools` compiled to a required tool call's grammar in one of the 19 formats. The
// first byte picks which (and the format). A schema or tool list compiles to a grammar that
// parses (the compilers never write what the parser refuses) or throws toy::Error; a grammar
// parses or throws toy::Error; a parsed grammar then follows the rest of the input byte by byte
// (and token by token) without crashing, its mask key always computable.
#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "toy/core/error.h"
#include "toy/infer/grammar.h"
#include "toy/infer/grammar_mask.h"
#include "toy/infer/json_schema.h"
#include "toy/infer/tool_grammar.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;

namespace {

const Tokenizer& vocabulary() {
  static const std::unique_ptr<Tokenizer> tok = Tokenizer::train_fixed_size(
      "<tool_call> {\"name\": \"f\", \"arguments\": {}} </tool_call> [TOOL_CALLS] <think> </think> hello", "qwen2", 320);
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view all(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t cut = all.find('\0');
  const std::string_view spec = all.substr(0, cut);
  const std::string_view text = cut == std::string_view::npos ? std::string_view() : all.substr(cut + 1);
  const Tokenizer& tok = vocabulary();
  const GrammarVocab vocab = grammar_vocab(tok);
  std::shared_ptr<const Grammar> g;
  const int mode = data[0] % 3;
  if (mode == 0) {
    const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(spec, nullptr, false);
    if (schema.is_discarded()) return 0;
    std::string gbnf;
    try {
      gbnf = json_schema_to_gbnf(schema);
    } catch (const Error&) {
      return 0;
    }
    g = Grammar::parse(gbnf);  // must not throw: the compiler's output is valid GBNF
  } else if (mode == 1) {
    try {
      g = Grammar::parse(spec, vocab);
    } catch (const Error&) {
      return 0;
    }
  } else {
    const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(spec, nullptr, false);
    if (tools.is_discarded() || !tools.is_array()) return 0;
    // (the server checks each tool's shape first: the fuzzer keeps only lists that pass it)
    for (const auto& t : tools)
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string() ||
          (t["function"].contains("parameters") && !t["function"]["parameters"].is_object()))
        return 0;
    ChatSyntax syntax;
    syntax.tools = ToolCallFormat(1 + (data[0] / 3) % int(ToolCallFormat::Gemma4));
    if (data[0] & 0x80) syntax.think_open = "<think>", syntax.think_close = "</think>";
    std::string gbnf;
    try {
      gbnf = tool_call_gbnf(syntax, tools, "", (data[0] & 0x40) != 0, tok);
    } catch (const Error&) {
      return 0;
    }
    g = Grammar::parse(gbnf, vocab);  // must not throw
  }
  try {
    GrammarMatcher m(g);
    for (size_t i = 0; i < text.size(); ++i) {
      const auto c = uint8_t(text[i]);
      if (c == 0xFF && i + 1 < text.size()) {  // a whole token, by id
        const int32_t id = int32_t(uint8_t(text[++i])) % tok.vocab_size();
        if (!m.accept_token(id, tok.token_bytes(id), (id & 1) != 0)) break;
      } else if (!m.accept_byte(c)) {
        break;
      }
      (void)m.key(16);
    }
    (void)m.complete();
  } catch (const Error&) {
    // rules nesting too deeply for the matcher: an error, not a crash
  }
  return 0;
}
