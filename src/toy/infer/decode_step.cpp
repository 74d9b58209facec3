#include "toy/infer/decode_step.h"

#include <algorithm>

#include "toy/core/error.h"
#include "toy/models/decoder_lm.h"

namespace toy {

Tensor decode_next(DecoderLM& model, const std::vector<int32_t>& history) {
  TOY_CHECK(!history.empty(), "[generate] no token to continue from");
  const int64_t ctx = model.config().ctx;
  if (model.cache_len() < ctx) return model.decode({history.back()});
  model.reset_cache();
  const int64_t keep = std::min<int64_t>(int64_t(history.size()), std::max<int64_t>(1, ctx / 2));
  std::vector<int32_t> tail(history.end() - keep, history.end());
  return model.decode(tail);
}

std::vector<int32_t> fit_prompt(std::vector<int32_t> ids, int64_t ctx) {
  const int64_t keep = std::max<int64_t>(1, ctx - 1);
  if (int64_t(ids.size()) > keep) ids.erase(ids.begin(), ids.end() - keep);
  return ids;
}

}  // namespace toy
