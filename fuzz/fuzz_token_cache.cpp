// The token cache (tokens.bin in a run folder): header, count against the file size and the
// corpus, content hash, ids against the vocabulary. Anything wrong must read as "stale"
// (rebuild), never as tokens the trainer would trust. The first input byte chooses which
// header fields the harness makes right (magic, count, hash), so both the refusals and the
// accepted path are reached.
#include <cstring>
#include <fstream>
#include <vector>

#include "fuzz_common.h"
#include "toy/core/hash.h"
#include "toy/data/batches.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_dir("token_cache") + "/tokens.bin";
  if (size < 1) return 0;
  const uint8_t fix = data[0];
  std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
  if (file.size() >= 32) {
    const size_t payload = file.size() - 32;
    if (fix & 1) std::memcpy(file.data(), "TOYTOK02", 8);
    if (fix & 2) {
      const uint64_t n = payload / 4;
      std::memcpy(file.data() + 16, &n, 8);
    }
    if ((fix & 4) && payload % 4 == 0) {
      const uint64_t h = fnv1a(std::string_view(file.data() + 32, payload));
      std::memcpy(file.data() + 24, &h, 8);
    }
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(file.data(), std::streamsize(file.size()));
  uint64_t key = 0;  // the key the file claims, so the fuzzer reaches past the key check
  if (file.size() >= 16) std::memcpy(&key, file.data() + 8, 8);
  const int64_t vocab = 300;
  const uint64_t max_tokens = (fix & 8) ? 4 : 1 << 20;
  std::vector<int32_t> tokens = {1, 2, 3};
  try {
    if (load_token_cache(path, key, vocab, max_tokens, tokens)) {
      FUZZ_ASSERT(file.size() == 32 + tokens.size() * 4 && tokens.size() <= max_tokens);
      for (int32_t t : tokens) FUZZ_ASSERT(t >= 0 && t < vocab);
    } else {
      FUZZ_ASSERT(tokens.empty());
    }
  } catch (const Error&) {
  }
  return 0;
}
