#include "toy/infer/generate.h"

#include <algorithm>
#include <chrono>
#include <span>
#include <string_view>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/infer/sampler.h"
#include "toy/infer/stop_filter.h"
#include "toy/models/decoder_lm.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy {

Tensor decode_next(DecoderLM& model, nn::KVCache& cache, const std::vector<int32_t>& history) {
  TOY_CHECK(!history.empty(), "[generate] no token to continue from");
  if (cache.size() < cache.capacity()) return model.decode(cache, history.back());
  cache.clear();
  const int64_t keep = std::min<int64_t>(int64_t(history.size()), std::max<int64_t>(1, cache.capacity() / 2));
  return model.decode(cache, std::span<const int32_t>(history).last(size_t(keep)));
}

std::vector<int32_t> fit_prompt(std::vector<int32_t> ids, int64_t ctx) {
  const int64_t keep = std::max<int64_t>(1, ctx - 1);
  if (int64_t(ids.size()) > keep) ids.erase(ids.begin(), ids.end() - keep);
  return ids;
}

GenerateStats generate(DecoderLM& model, const Tokenizer& tok, Sampler& sampler, std::vector<int32_t> prompt,
                       int64_t n, const std::function<void(const std::string&)>& on_text, int64_t capacity,
                       const std::vector<std::string>& stop) {
  using Clock = std::chrono::steady_clock;
  NoGradGuard ng;
  GenerateStats st;
  nn::KVCache cache = model.new_cache(1, capacity);
  std::vector<int32_t> history = fit_prompt(std::move(prompt), cache.capacity());
  TOY_CHECK(!history.empty(), "[generate] empty prompt");
  history.reserve(history.size() + size_t(std::min<int64_t>(n, int64_t(1) << 20)) + 1);  // no growth per token
  auto t0 = Clock::now();
  Tensor logits = model.decode(cache, history);
  st.prompt_tokens = int64_t(history.size());
  st.prompt_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  Utf8StreamDecoder dec(tok);
  StopFilter filter(stop, on_text);
  bool stop_string = false;
  const std::vector<int32_t> ends = tok.end_of_generation_ids();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = sampler.sample(logits, history);
    if (std::find(ends.begin(), ends.end(), id) != ends.end()) {
      st.finish_reason = "stop";
      break;
    }
    ++st.generated_tokens;
    history.push_back(id);
    if ((stop_string = filter.push(dec.push(id)))) break;
    if (i + 1 == n) break;
    logits = decode_next(model, cache, history);
  }
  // What is still held back: an unfinished character, text that might have begun a stop string.
  if (!stop_string) stop_string = filter.push(dec.flush());
  if (stop_string)
    st.finish_reason = "stop";
  else
    filter.flush();
  st.generate_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return st;
}

}  // namespace toy
