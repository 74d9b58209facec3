// Structured output's parsers of outside input: a request's JSON Schema compiled to GBNF, and
// a GBNF grammar itself (llama-server's `grammar` field). First byte picks which. A schema
// compiles to a grammar that parses (the compiler never writes what its parser refuses) or
// throws toy::Error; a grammar parses or throws toy::Error; a parsed grammar then follows the
// rest of the input byte by byte without crashing, its mask key always computable.
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "toy/core/error.h"
#include "toy/infer/grammar.h"
#include "toy/infer/json_schema.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view all(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t cut = all.find('\0');
  const std::string_view spec = all.substr(0, cut);
  const std::string_view text = cut == std::string_view::npos ? std::string_view() : all.substr(cut + 1);
  std::shared_ptr<const Grammar> g;
  if (data[0] % 2 == 0) {
    const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(spec, nullptr, false);
    if (schema.is_discarded()) return 0;
    std::string gbnf;
    try {
      gbnf = json_schema_to_gbnf(schema);
    } catch (const Error&) {
      return 0;
    }
    g = Grammar::parse(gbnf);  // must not throw: the compiler's output is valid GBNF
  } else {
    try {
      g = Grammar::parse(spec);
    } catch (const Error&) {
      return 0;
    }
  }
  try {
    GrammarMatcher m(g);
    for (char c : text) {
      if (!m.accept_byte(uint8_t(c))) break;
      (void)m.key(16);
    }
    (void)m.complete();
  } catch (const Error&) {
    // rules nesting too deeply for the matcher: an error, not a crash
  }
  return 0;
}
