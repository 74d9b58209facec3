// Fine-tuning records as `toy finetune --data FILE.jsonl` reads them, one line each:
// {"prompt","completion"} or {"messages": [...]} through a ChatML template. Either a clean
// error or an example whose tokens are in the vocabulary, with a mask as long as the tokens
// that counts something.
#include <algorithm>
#include <memory>
#include <string>

#include "fuzz_common.h"
#include "toy/data/sft.h"
#include "toy/infer/chat.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Tokenizer> tok = Tokenizer::train_fixed_size(
      "the prompt and the completion; <|im_start|>user hello<|im_end|>", "qwen2", 300);
  static const ChatTemplate chat = ChatTemplate::from_text(kChatMLTemplate, "ChatML", *tok);
  const std::string line(reinterpret_cast<const char*>(data), size);
  try {
    const SftExample e = parse_sft_record(line, *tok, size % 3 == 0 ? nullptr : &chat, "fuzz line 1");
    FUZZ_ASSERT(e.tokens.size() == e.trained.size());
    for (int32_t id : e.tokens) FUZZ_ASSERT(id >= 0 && id < tok->vocab_size());
    FUZZ_ASSERT(std::any_of(e.trained.begin(), e.trained.end(), [](uint8_t t) { return t != 0; }));
  } catch (const Error&) {
  }
  return 0;
}
