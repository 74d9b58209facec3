// Vocabularies from a GGUF file (byte, char and byte-level BPE as toy and llama.cpp write
// them): Tokenizer::load, then encoding arbitrary text and decoding every id.
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "toy/io/gguf.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<Tokenizer> tok;
  try {
    gguf::Reader r("fuzz.gguf", data, size);
    tok = Tokenizer::load(r);
  } catch (const Error&) {
    return 0;
  }
  const int32_t n = tok->vocab_size();
  FUZZ_ASSERT(n > 0);
  for (std::string_view text : {std::string_view("Hello, world! It's 2026."), std::string_view("caf\xc3\xa9 \xe2\x98\x83\n\t"),
                                std::string_view("\xff\xfe\x00 bad utf-8", 14),
                                std::string_view(reinterpret_cast<const char*>(data), std::min<size_t>(size, 256))}) {
    try {
      std::vector<int32_t> ids = tok->encode(text);
      for (int32_t id : ids) FUZZ_ASSERT(id >= 0 && id < n);
      (void)tok->decode(ids);
    } catch (const Error&) {  // a char vocabulary may lack a character: an error, not a crash
    }
  }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < n && id < 4096; ++id) all.push_back(id);
  try {
    (void)tok->decode(all);
    Utf8StreamDecoder stream(*tok);
    for (int32_t id : all) (void)stream.push(id);
  } catch (const Error&) {
  }
  for (int32_t bad : {-1, n, n + 1000}) {
    try {
      (void)tok->decode(std::vector<int32_t>{bad});
      FUZZ_ASSERT(!"an out-of-range id decoded");
    } catch (const Error&) {
    }
  }
  return 0;
}
