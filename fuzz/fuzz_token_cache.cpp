// The token cache (tokens.bin in a run folder): header, count against the file size, content
// hash, ids against the vocabulary. Anything wrong must read as "stale" (rebuild), never as
// tokens the trainer would trust.
#include <fstream>
#include <vector>

#include "fuzz_common.h"
#include "toy/data/batches.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_dir("token_cache") + "/tokens.bin";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  uint64_t key = 0;  // the key the file claims, so the fuzzer reaches past the key check
  if (size >= 16) std::memcpy(&key, data + 8, 8);
  const int64_t vocab = 300;
  std::vector<int32_t> tokens = {1, 2, 3};
  try {
    const bool ok = load_token_cache(path, key, vocab, tokens);
    if (ok) {
      FUZZ_ASSERT(size == 32 + tokens.size() * 4);
      for (int32_t t : tokens) FUZZ_ASSERT(t >= 0 && t < vocab);
    } else {
      FUZZ_ASSERT(tokens.empty());
    }
  } catch (const Error&) {
  }
  return 0;
}
