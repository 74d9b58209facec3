// What the sampling kernel needs of one draw (infer/sampler.h's chain, one token): in core,
// like the lr schedule, because ops and every device's kernel share it.
#pragma once
#include <cstdint>

namespace toy {

struct SampleDraw {
  float temperature = 0;  // 0: greedy (argmax, the first of equal maxima)
  int32_t top_k = 0;      // 0 = off
  float top_p = 1, min_p = 0;
  float repeat_penalty = 1, presence_penalty = 0, frequency_penalty = 0;
  double r = 0;  // the uniform draw in [0, 1) that picks among the candidates
};

}  // namespace toy
