// LoRA adapter files as `toy generate --lora A.gguf` loads them onto a model: the file type,
// architecture, every .lora_a/.lora_b pair and shape checked. Either a clean error or an
// adapted model whose logits are computed (finite or not: values are the file's business).
#include <cstdio>
#include <fstream>

#include "fuzz_common.h"
#include "toy/autograd/grad_mode.h"
#include "toy/models/decoder_lm.h"
#include "toy/models/lora.h"
#include "toy/ops/ops.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = toy::fuzz::scratch_dir("lora_adapter") + "/adapter.gguf";
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  ModelConfig c = ModelConfig::from_preset("llama");
  c.vocab = 16, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ctx = 8, c.ffn = 64;
  DecoderLM m(c);
  try {
    load_lora_adapter(m, "llama", path, 1.0f);
  } catch (const Error&) {
    return 0;
  }
  FUZZ_ASSERT(!lora_adapters(m).empty());
  for (const auto& [name, lora] : lora_adapters(m)) {
    FUZZ_ASSERT(lora->a.dtype() == DType::F32 && lora->b.dtype() == DType::F32);
    FUZZ_ASSERT(lora->a.size(0) == lora->b.size(1));
  }
  NoGradGuard ng;
  const Tensor logits = m.logits(from_vector(std::vector<int32_t>{1, 2, 3}, Shape{1, 3}));
  FUZZ_ASSERT(logits.size(2) == 16);
  return 0;
}
