// Chat templates as toy's Jinja engine renders them (a GGUF's tokenizer.chat_template is
// outside input): an arbitrary template with an arbitrary conversation either renders or
// throws toy::Error — no crash, no other exception, no hang (loops and strings are bounded).
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "toy/chat/chat_render.h"
#include "toy/chat/render.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  jinja::render_limits().loop_steps = 20'000;  // sanitizers: each step ~25 us
  // Layout: template \0 conversation JSON (when absent or not JSON: a fixed conversation).
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t cut = all.find('\0');
  const std::string_view tmpl = all.substr(0, cut);
  nlohmann::ordered_json conv = nlohmann::ordered_json::parse(
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ✓"},
          {"role": "assistant", "content": "Hello", "tool_calls": [{"type": "function",
           "function": {"name": "f", "arguments": {"x": 1}}}]}, {"role": "tool", "content": "2"}],
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
          "bos_token": "<s>", "eos_token": "</s>", "now": "2026-03-14T09:26:53"})");
  if (cut != std::string_view::npos) {
    nlohmann::ordered_json given = nlohmann::ordered_json::parse(all.substr(cut + 1), nullptr, false);
    if (!given.is_discarded()) conv = std::move(given);
  }
  try {
    (void)render_chat_template(tmpl, conv);
  } catch (const Error&) {
  }
  return 0;
}
