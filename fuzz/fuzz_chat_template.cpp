// Chat templates from a model file: an arbitrary tokenizer.chat_template (run by toy's Jinja
// engine) rendering arbitrary messages into a prompt. Either a clean error, or text whose
// plain spans (the messages' control-token text) lie inside it in order, whose tokens are in
// the vocabulary, and which decodes back to itself (the spans' text included: nothing lost).
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "toy/chat/render.h"
#include "toy/infer/chat.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  jinja::render_limits().loop_steps = 20'000;  // sanitizers: each step ~25 us
  // Layout: template \0 role \0 content \0 role \0 content ...
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) parts.emplace_back();
    else parts.back() += char(data[i]);
  }
  static const std::unique_ptr<Tokenizer> tok = Tokenizer::train_fixed_size(
      "the chat template renders messages; <|im_start|> is special", "qwen2", 300);
  std::vector<ChatMessage> messages;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) messages.push_back({parts[i], parts[i + 1]});
  ChatText text;
  try {
    const ChatTemplate t = ChatTemplate::from_text(parts[0], "fuzz", *tok);
    text = t.render(messages, size % 2 == 0);
  } catch (const Error&) {
    return 0;
  }
  size_t at = 0;
  for (const Tokenizer::Span& s : text.plain) {
    FUZZ_ASSERT(s.begin >= at && s.begin < s.end && s.end <= text.text.size());
    at = s.end;
  }
  const std::vector<int32_t> ids = tok->encode_special(text.text, text.plain);
  for (int32_t id : ids) FUZZ_ASSERT(id >= 0 && id < tok->vocab_size());
  FUZZ_ASSERT(tok->decode(ids) == text.text);
  return 0;
}
