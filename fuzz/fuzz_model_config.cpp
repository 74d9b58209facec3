// Model configs and training options as JSON (toy.config in a model, toy.train.options in a
// checkpoint): strict types and ranges, then the parameter shapes and the memory estimate the
// trainer derives from them (without allocating anything).
#include <string>

#include "fuzz_common.h"
#include "toy/core/json_fields.h"
#include "toy/models/decoder_lm.h"
#include "toy/train/memory.h"
#include "toy/train/trainer.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json j;
  try {
    j = json_fields::parse_object(text, "fuzz");
  } catch (const Error&) {
    return 0;
  }
  try {
    ModelConfig c = ModelConfig::from_json(j, "fuzz config");
    // (A stated head dim frees dim from being a multiple of the heads: Gemma 3's 640 = 4 x 256 is not.)
    FUZZ_ASSERT(c.dim > 0 && c.heads > 0 && (c.head_dim > 0 || c.dim % c.heads == 0) && c.layers > 0);
    if (c.layers <= 64) {
      int64_t n = 0;
      for (const auto& [name, shape] : DecoderLM::parameter_shapes(c)) n += shape.numel();
      FUZZ_ASSERT(n > 0);
      FUZZ_ASSERT(estimate_training_memory(c, 4).total() > 0);
    }
    FUZZ_ASSERT(ModelConfig::from_json(c.to_json()).to_json() == c.to_json());
  } catch (const Error&) {
  }
  try {
    TrainOptions o = TrainOptions::from_json(j, "fuzz options");
    o.validate();
    FUZZ_ASSERT(TrainOptions::from_json(o.to_json(), "again").to_json() == o.to_json());
  } catch (const Error&) {
  }
  return 0;
}
