#include "toy/train/memory.h"

#include <fmt/core.h>

#include "toy/core/error.h"
#include "toy/core/machine.h"
#include "toy/models/decoder_lm.h"

namespace toy {

TrainingMemory estimate_training_memory(const ModelConfig& m, int64_t batch) {
  double params = 0;
  for (const auto& [name, shape] : DecoderLM::parameter_shapes(m)) params += double(shape.numel());
  TrainingMemory t;
  t.weights = 4 * params;
  t.state = 4 * 4 * params;  // gradient, m, v, best copy
  // Per token and layer the backward keeps ~14 D-wide tensors (norm inputs and outputs, the
  // packed q/k/v before and after RoPE, attention output, projections, residuals) and 2-3
  // F-wide ones (MLP input and activation); the head keeps logits and their gradient unless
  // the loss is chunked. Counted in doubles: the product of flags can exceed 2^63.
  const double tokens = double(batch) * double(m.ctx);
  const double mlp_width = double(m.ffn) * (m.mlp == MlpKind::SwiGLU ? 3.0 : 2.0);
  const double per_layer = 14.0 * double(m.dim) + mlp_width + 2.0 * double(m.heads);
  const double head = tokens * double(m.vocab) > double(int64_t(1) << 22) ? 2.0 * double(int64_t(1) << 22) / tokens
                                                                            : 3.0 * double(m.vocab);
  t.activations = 4 * tokens * (double(m.layers) * per_layer + head + 4.0 * double(m.dim));
  return t;
}

void check_training_memory(const TrainingMemory& need, uint64_t available, const std::string& hint) {
  TOY_CHECK(need.total() <= double(available),
            "[train] this run needs about {} (weights {}, gradients and optimizer state {}, activations of one "
            "micro-batch {}) but the machine has {} available: {}",
            format_bytes(need.total()), format_bytes(need.weights), format_bytes(need.state),
            format_bytes(need.activations), format_bytes(double(available)), hint);
}

double corpus_memory(uint64_t bytes) {
  // The text, one file's read buffer, i32 tokens (at most one per byte) and their train/val
  // copies: ~10 bytes per byte of text.
  return 10.0 * double(bytes);
}

}  // namespace toy
