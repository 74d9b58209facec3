#include "toy/cli/sampler_flags.h"

#include <climits>

#include "toy/cli/flags.h"

namespace toy::cli {

void add_sampling_flags(CLI::App* cmd, SamplingFlags& f) {
  SamplerConfig& c = f.config;
  add_real(cmd, "--temp,--temperature", c.temperature, {0, 100}, "Sampling temperature (0 = greedy)");
  add_int(cmd, "--top-k", c.top_k, 0, INT32_MAX, "Keep the k most likely tokens (0 = off)");
  add_real(cmd, "--top-p", c.top_p, {0, 1, true}, "Nucleus sampling mass (1 = off)");
  add_real(cmd, "--min-p", c.min_p, {0, 1}, "Drop tokens below this fraction of the most likely one's probability");
  add_real(cmd, "--repeat-penalty", c.repeat_penalty, {0, 100, true}, "Penalty on recently seen tokens (1 = off)");
  add_int(cmd, "--repeat-last-n", c.penalty_last_n, 0, 1 << 20, "How many recent tokens the penalties look at");
  add_real(cmd, "--presence-penalty", c.presence_penalty, {-100, 100}, "Subtracted from recent tokens' logits");
  add_real(cmd, "--frequency-penalty", c.frequency_penalty, {-100, 100},
           "Subtracted per occurrence in the recent tokens");
  add_u64(cmd, "--seed", f.seed, "Sampling seed (same seed, same text)");
}

}  // namespace toy::cli
