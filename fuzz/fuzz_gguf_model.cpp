// GGUF models: the reader (header, metadata, tensor table, bounds), typed getters, tensor
// views and their conversion to f32 (every dtype incl. block types), then load_model (config
// JSON, shapes before allocation, tokenizer) and a forward pass of the model it built.
#include "fuzz_common.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/ops/ops.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    gguf::Reader r("fuzz.gguf", data, size);
    for (const auto& [key, v] : r.metadata()) FUZZ_ASSERT(!printable(key).empty() || key.empty());
    for (const gguf::TensorInfo& ti : r.tensors()) {
      Tensor t = r.tensor(ti.name);
      FUZZ_ASSERT(t.nbytes() == ti.bytes);
      if (t.numel() <= 4096) (void)t.to_f32_vector();
    }
    (void)r.find_u32("general.alignment");
    LoadedModel lm = load_model(r);
    NoGradGuard ng;
    const int64_t v = lm.model->config().vocab;
    std::vector<int32_t> ids = {0, int32_t(v - 1), int32_t(v / 2)};
    ids.resize(size_t(std::min<int64_t>(3, lm.model->config().ctx)));
    Tensor logits = lm.model->logits(from_vector(ids, Shape{1, int64_t(ids.size())}));
    FUZZ_ASSERT(logits.size(-1) == v);
  } catch (const Error&) {
  }
  return 0;
}
