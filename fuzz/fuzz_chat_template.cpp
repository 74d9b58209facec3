// Chat templates from a model file: recognising the family of an arbitrary
// tokenizer.chat_template, then rendering arbitrary messages with it. Either a clean error or
// text that holds every message's content; with a vocabulary, the rendered text tokenizes
// with special tokens parsed and decodes back to itself.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "toy/infer/chat.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Layout: template \0 role \0 content \0 role \0 content ...
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) parts.emplace_back();
    else parts.back() += char(data[i]);
  }
  ChatTemplate t;
  try {
    t = ChatTemplate::recognise(parts[0]);
  } catch (const Error&) {
    return 0;
  }
  std::vector<ChatMessage> messages;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) messages.push_back({parts[i], parts[i + 1]});
  std::string text;
  try {
    text = t.render(messages, size % 2 == 0);
  } catch (const Error&) {
    return 0;  // a role that is not a plain word
  }
  for (const ChatMessage& m : messages)
    if (t.format == ChatFormat::ChatML) FUZZ_ASSERT(text.find(m.content) != std::string::npos);
  static const std::unique_ptr<Tokenizer> tok = Tokenizer::train_fixed_size(
      "the chat template renders messages; <|im_start|> is special", "qwen2", 300);
  const std::vector<int32_t> ids = tok->encode_special(text);
  for (int32_t id : ids) FUZZ_ASSERT(id >= 0 && id < tok->vocab_size());
  FUZZ_ASSERT(tok->decode(ids) == text);
  return 0;
}
