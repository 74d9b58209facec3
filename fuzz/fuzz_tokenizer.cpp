// Tokenizers on arbitrary bytes (invalid UTF-8, NULs, long runs): byte, char (trained on the
// text) and byte-level BPE (with a few merges learned from the text). Encoding then decoding
// must give back the text exactly; decoding an id outside the vocabulary must be an error.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int mode = data[0] % 3, merges = 1 + data[1] % 48;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = Tokenizer::train(mode == 0 ? "byte" : mode == 1 ? "char" : "bpe:" + std::to_string(merges), text);
  } catch (const Error&) {
    FUZZ_ASSERT(mode == 1 && text.empty());  // only an empty corpus may fail to train
    return 0;
  }
  const std::vector<int32_t> ids = tok->encode(text);
  for (int32_t id : ids) FUZZ_ASSERT(id >= 0 && id < tok->vocab_size());
  FUZZ_ASSERT(tok->decode(ids) == text);
  // Streaming decode gives the same bytes.
  Utf8StreamDecoder stream(*tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.flush();
  FUZZ_ASSERT(streamed == text);
  // Ids from the input: in range decode, out of range throw.
  for (size_t i = 0; i + 1 < text.size() && i < 64; i += 2) {
    const int32_t id = int32_t(uint8_t(text[i]) | (uint8_t(text[i + 1]) << 8)) - 128;
    try {
      (void)tok->decode(std::vector<int32_t>{id});
      FUZZ_ASSERT(id >= 0 && id < tok->vocab_size());
    } catch (const Error&) {
      FUZZ_ASSERT(id < 0 || id >= tok->vocab_size());
    }
  }
  return 0;
}
