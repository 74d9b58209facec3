#include "toy/serve/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/infer/grammar_mask.h"
#include "toy/infer/stop_filter.h"
#include "toy/models/decoder_lm.h"
#include "toy/nn/kv_cache.h"
#include "toy/ops/ops.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy::serve {

// ---- Job --------------------------------------------------------------------------------

bool Job::wait(std::string& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return done_ || !text_.empty(); });
  out.clear();
  out.swap(text_);
  return done_ && text_.empty();
}

std::string Job::wait_all() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return done_; });
  std::string out;
  out.swap(text_);
  return out;
}

void Job::emit(const std::string& text) {
  if (text.empty()) return;
  {
    std::lock_guard lk(mu_);
    text_ += text;
  }
  cv_.notify_all();
}

void Job::record(TokenLogprob lp) {
  std::lock_guard lk(mu_);
  logprobs_.push_back(std::move(lp));
}

std::vector<TokenLogprob> Job::take_logprobs() {
  std::lock_guard lk(mu_);
  std::vector<TokenLogprob> out;
  out.swap(logprobs_);
  return out;
}

void Job::first_token() { ttft_s = std::chrono::duration<double>(Clock::now() - submitted).count(); }

void Job::finish(const std::string& reason, const std::string& err) {
  {
    std::lock_guard lk(mu_);
    if (done_) return;
    finish_reason = reason;
    error = err;
    done_ = true;
  }
  cv_.notify_all();
}

// ---- Engine -----------------------------------------------------------------------------

struct Engine::Slot {
  nn::KVCache cache;
  std::vector<int32_t> cached;  // the tokens the cache holds, in order
  std::shared_ptr<Job> job;     // null: free
  bool prefilling = false;      // its job started, not all of its prompt run yet
  uint64_t started = 0;         // when its job started (orders prompts of equal length)
  std::optional<Sampler> sampler;
  std::optional<Utf8StreamDecoder> decoder;
  std::optional<StopFilter> filter;
  std::optional<GrammarMatcher> matcher;  // structured output: where the reply is in its grammar
  std::vector<int32_t> history;  // prompt + generated (what the penalties look at)
  int64_t budget = 0;            // tokens it may still generate
  Tensor logits;                 // [V]: the next token's, waiting to be sampled
  int32_t feed = -1;             // the token the next step feeds (sampled, not yet cached)
  uint64_t last_used = 0;
};

Engine::Engine(DecoderLM& model, const Tokenizer& tok, EngineOptions o) : model_(model), tok_(tok), o_(o) {
  TOY_CHECK(o.parallel >= 1 && o.parallel <= 256, "[serve] --parallel must be in [1, 256], got {}", o.parallel);
  TOY_CHECK(o.batch >= 0, "[serve] --batch-size must be >= 0 (0: no limit), got {}", o.batch);
  TOY_CHECK(o.queue >= 0, "[serve] --queue must be >= 0, got {}", o.queue);
  ctx_ = o.ctx ? o.ctx : std::min<int64_t>(model.config().ctx, 4096);
  TOY_CHECK(ctx_ >= 2, "[serve] --ctx must be at least 2 tokens, got {}", ctx_);
  ends_ = tok.end_of_generation_ids();
  specials_ = tok.special_ids();
  std::sort(specials_.begin(), specials_.end());
  for (int i = 0; i < o.parallel; ++i) {
    auto s = std::make_unique<Slot>();
    s->cache = model.new_cache(1, ctx_, o.cache_dtype);
    slots_.push_back(std::move(s));
  }
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown("the server is shutting down"); }

int64_t Engine::waiting() const {
  std::lock_guard lk(mu_);
  return int64_t(queue_.size());
}

std::shared_ptr<Job> Engine::submit(GenParams p) {
  TOY_CHECK(!p.prompt.empty(), "[serve] the prompt is empty");
  TOY_CHECK(int64_t(p.prompt.size()) < ctx_,
            "[serve] the prompt has {} tokens; a slot's context is {} (the prompt needs at least one token less): "
            "shorten it or start the server with a larger --ctx", p.prompt.size(), ctx_);
  const int32_t V = model_.config().vocab;
  for (int32_t id : p.prompt) TOY_CHECK(id >= 0 && id < V, "[serve] token id {} is out of the vocabulary [0, {})", id, V);
  Sampler check(p.sampling, p.seed);  // throws on nonsense sampling values, before queueing
  auto job = std::make_shared<Job>(std::move(p));
  {
    std::lock_guard lk(mu_);
    if (stopping_) {
      job->finish("error", stop_reason_);
      return job;
    }
    if (active_.load() + int64_t(queue_.size()) >= int64_t(slots_.size()) + o_.queue) return nullptr;
    queue_.push_back(job);
  }
  cv_.notify_all();
  return job;
}

std::vector<std::vector<float>> Engine::embed(std::vector<std::vector<int32_t>> inputs, Pooling pooling) {
  const int32_t V = model_.config().vocab;
  for (const auto& ids : inputs) {
    TOY_CHECK(!ids.empty(), "[serve] an input to embed is empty");
    TOY_CHECK(int64_t(ids.size()) <= ctx_, "[serve] an input to embed has {} tokens; the context is {}", ids.size(), ctx_);
    for (int32_t id : ids) TOY_CHECK(id >= 0 && id < V, "[serve] token id {} is out of the vocabulary [0, {})", id, V);
  }
  auto task = std::make_shared<EmbedTask>();
  task->inputs = std::move(inputs);
  task->pooling = pooling;
  std::future<std::vector<std::vector<float>>> result = task->done.get_future();
  {
    std::lock_guard lk(mu_);
    TOY_CHECK(!stopping_, "[serve] the server is shutting down");
    embeds_.push_back(task);
  }
  cv_.notify_all();
  return result.get();
}

void Engine::run_embeds() {
  std::deque<std::shared_ptr<EmbedTask>> tasks;
  {
    std::lock_guard lk(mu_);
    tasks.swap(embeds_);
  }
  for (auto& task : tasks) {
    try {
      std::vector<std::vector<float>> out;
      const int64_t D = model_.config().dim;
      for (const auto& ids : task->inputs) {
        const int64_t T = int64_t(ids.size());
        const Tensor x = to(from_vector(ids, Shape{1, T}), model_.device());
        const std::vector<float> h = to(model_.hidden(x), Device::CPU).to_f32_vector();
        std::vector<float> v(size_t(D), 0.0f);
        if (task->pooling == Pooling::Mean) {
          for (int64_t t = 0; t < T; ++t)
            for (int64_t d = 0; d < D; ++d) v[size_t(d)] += h[size_t(t * D + d)] / float(T);
        } else {
          const int64_t t = task->pooling == Pooling::Last ? T - 1 : 0;
          std::copy(h.begin() + t * D, h.begin() + (t + 1) * D, v.begin());
        }
        double norm = 0;
        for (float x : v) norm += double(x) * x;
        if (norm > 0)
          for (float& x : v) x = float(x / std::sqrt(norm));
        out.push_back(std::move(v));
      }
      task->done.set_value(std::move(out));
    } catch (...) {
      task->done.set_exception(std::current_exception());
    }
  }
}

void Engine::shutdown(const std::string& why) {
  {
    std::lock_guard lk(mu_);
    if (!stopping_) stopping_ = true, stop_reason_ = why;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Engine::Slot* Engine::pick_slot(const std::vector<int32_t>& prompt) {
  Slot* best = nullptr;
  size_t best_len = 0;
  for (auto& s : slots_) {
    if (s->job) continue;
    // The cached tokens must be a strict prefix: the last prompt token has to be fed to get
    // the logits after it (and a recurrent state cannot be cut back).
    const size_t n = s->cached.size();
    const bool prefix = n < prompt.size() && std::equal(s->cached.begin(), s->cached.end(), prompt.begin());
    const size_t len = prefix ? n : 0;
    if (!best || len > best_len || (len == best_len && s->last_used < best->last_used)) best = s.get(), best_len = len;
  }
  return best;
}

void Engine::set_up(Slot& s) {
  Job& job = *s.job;
  const std::vector<int32_t>& prompt = job.params.prompt;
  const size_t n = s.cached.size();
  const bool prefix = n > 0 && n < prompt.size() && std::equal(s.cached.begin(), s.cached.end(), prompt.begin());
  if (!prefix) {
    s.cache.clear();
    s.cached.clear();
  }
  job.prompt_tokens = int64_t(prompt.size());
  job.cached_tokens = int64_t(s.cached.size());
  s.history = prompt;
  s.sampler.emplace(job.params.sampling, job.params.seed);
  s.decoder.emplace(tok_);
  Job* j = &job;
  s.filter.emplace(job.params.stop, [j](const std::string& t) { j->emit(t); });
  const int64_t room = ctx_ - int64_t(prompt.size());  // tokens that still fit, the last one never fed
  s.budget = job.params.max_tokens < 0 ? room : std::min(job.params.max_tokens, room);
  if (job.params.grammar) s.matcher.emplace(job.params.grammar);
  s.feed = -1;
  s.prefilling = true;
  s.started = ++start_clock_;
}

void Engine::prefill_chunks(int64_t budget) {
  std::vector<Slot*> waiting;
  for (auto& s : slots_) {
    if (!s->job || !s->prefilling) continue;
    if (s->job->cancelled()) {
      release(*s, "cancelled");
      continue;
    }
    waiting.push_back(s.get());
  }
  if (waiting.empty()) return;
  // (s.cached grows chunk by chunk: it is always the prompt's first tokens.)
  auto left = [](const Slot* s) { return int64_t(s->job->params.prompt.size() - s->cached.size()); };
  std::sort(waiting.begin(), waiting.end(), [&](const Slot* a, const Slot* b) {
    return left(a) != left(b) ? left(a) < left(b) : a->started < b->started;
  });
  std::vector<Slot*> ready;
  std::vector<nn::KVCache*> caches;
  std::vector<std::span<const int32_t>> chunks;
  for (Slot* s : waiting) {
    if (budget <= 0) break;
    const int64_t n = std::min(left(s), budget);
    budget -= n;
    chunks.push_back(std::span<const int32_t>(s->job->params.prompt).subspan(s->cached.size(), size_t(n)));
    ready.push_back(s), caches.push_back(&s->cache);
  }
  // The tokens of `run` are in s's cache now; `logits` follow them.
  auto ran = [&](Slot& s, std::span<const int32_t> run, const Tensor& logits) {
    s.cached.insert(s.cached.end(), run.begin(), run.end());
    prompt_tokens_ += int64_t(run.size());
    if (s.cached.size() < s.job->params.prompt.size()) return;
    s.logits = logits;
    s.prefilling = false;
  };
  const auto t0 = Job::Clock::now();
  try {
    const Tensor logits = model_.prefill(caches, chunks);  // [N, V]
    const int64_t V = logits.size(1);
    for (size_t i = 0; i < ready.size(); ++i)
      ran(*ready[i], chunks[i], reshape(slice(logits, 0, int64_t(i), int64_t(i) + 1), Shape{V}));
  } catch (const std::exception&) {
    // (A cache the failed forward wrote to holds no more than it did: it is cleared and its
    // prompt, up to the end of this chunk, run again from the start.)
    for (size_t i = 0; i < ready.size(); ++i) {
      Slot& s = *ready[i];
      const std::span<const int32_t> upto =
          std::span<const int32_t>(s.job->params.prompt).first(s.cached.size() + chunks[i].size());
      try {
        s.cache.clear(), s.cached.clear();
        s.job->cached_tokens = 0;
        ran(s, upto, model_.decode(s.cache, upto));
      } catch (const std::exception& e) {
        s.cache.clear(), s.cached.clear();
        release(s, "error", e.what());
      }
    }
  }
  ++prompt_chunks_;
  prompt_us_ += std::chrono::duration_cast<std::chrono::microseconds>(Job::Clock::now() - t0).count();
}

void Engine::release(Slot& s, const std::string& reason, const std::string& error) {
  if (!s.job) return;
  std::shared_ptr<Job> job = std::move(s.job);
  s.logits = Tensor();
  s.feed = -1;
  s.prefilling = false;
  s.filter.reset(), s.decoder.reset(), s.sampler.reset(), s.matcher.reset();
  s.last_used = ++use_clock_;
  --active_;  // before the client hears of the end: a request it sends next finds the slot free
  predicted_ += job->completion_tokens;
  (reason == "stop" ? finished_stop_ : reason == "length" ? finished_length_ : reason == "cancelled"
                                                                                 ? finished_cancelled_
                                                                                 : finished_error_)++;
  job->finish(reason, error);
}

bool Engine::is_special(int32_t id) const { return std::binary_search(specials_.begin(), specials_.end(), id); }

// Structured output, as llama.cpp samples it: draw from the model's distribution; when the
// grammar takes that token keep it (usually: the mask is never built), else draw again with the
// tokens it does not allow at -inf (an end only once the reply is a whole sentence of it).
// Exactly the masked distribution for plain sampling (accepting a valid first draw and
// resampling from the renormalised rest sum to it); with top-k/p the cut comes first. Returns
// the token with the slot's matcher past it, or -1 when the slot was released.
int32_t Engine::draw_constrained(Slot& s) {
  Job& job = *s.job;
  const int32_t first = s.sampler->sample(s.logits, s.history);
  if (is_end(first)) {
    if (s.matcher->complete()) return first;
  } else if (GrammarMatcher next(*s.matcher); next.accept_token(first, tok_.token_bytes(first), is_special(first))) {
    *s.matcher = std::move(next);
    return first;
  }
  if (!masker_) masker_ = std::make_unique<TokenMasker>(tok_);
  const std::vector<uint8_t>& ok = masker_->allowed(*s.matcher, job.params.grammar);
  const bool complete = s.matcher->complete();
  const int64_t V = s.logits.numel();
  mask_bias_.assign(size_t(V), -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < ok.size() && i < size_t(V); ++i)
    if (ok[i]) mask_bias_[i] = 0;
  for (int32_t e : ends_)  // (an end only where the reply may end, whatever the mask says)
    if (e < V) mask_bias_[size_t(e)] = complete ? 0 : -std::numeric_limits<float>::infinity();
  if (std::none_of(mask_bias_.begin(), mask_bias_.end(), [](float b) { return b == 0; })) {
    if (!s.filter->push(s.decoder->flush())) s.filter->flush();
    release(s, complete ? "stop" : "error", complete ? "" : "the grammar cannot go on with this vocabulary");
    return -1;
  }
  const Tensor masked =
      add(cast(reshape(s.logits, Shape{V}), DType::F32), to(from_vector(mask_bias_, Shape{V}), s.logits.device()));
  const int32_t id = s.sampler->sample(masked, s.history);
  if (!is_end(id) && !s.matcher->accept_token(id, tok_.token_bytes(id), is_special(id))) {  // (the mask allowed it)
    if (!s.filter->push(s.decoder->flush())) s.filter->flush();
    release(s, "error", "a token outside the grammar was drawn");
    return -1;
  }
  return id;
}

bool Engine::is_end(int32_t id) const { return std::find(ends_.begin(), ends_.end(), id) != ends_.end(); }

void Engine::sample(Slot& s) {
  Job& job = *s.job;
  if (job.cancelled()) return release(s, "cancelled");
  if (s.budget <= 0) {
    // max_tokens 0 or no room left; whatever text is held back goes out first.
    if (!s.filter->push(s.decoder->flush())) s.filter->flush();
    return release(s, "length");
  }
  if (job.params.ignore_eos) {
    float* z = s.logits.data<float>();
    for (int32_t e : ends_)
      if (e < s.logits.numel()) z[e] = -std::numeric_limits<float>::infinity();
  }
  // Log-probabilities, when asked for: the model's distribution (one row read back per token).
  std::vector<float> logprobs;
  if (job.params.top_logprobs >= 0)
    logprobs = to(log_softmax(cast(reshape(s.logits.detach(), Shape{-1}), DType::F32)), Device::CPU).to_f32_vector();
  int32_t id = -1;
  if (s.matcher) {
    try {
      id = draw_constrained(s);
      if (id < 0) return;  // (released)
    } catch (const Error& e) {  // (a grammar whose rules nest without end)
      if (!s.filter->push(s.decoder->flush())) s.filter->flush();
      return release(s, "error", e.what());
    }
  } else {
    id = s.sampler->sample(s.logits, s.history);
  }
  s.logits = Tensor();
  if (job.completion_tokens == 0) job.first_token();
  if (is_end(id)) {
    if (!s.filter->push(s.decoder->flush())) s.filter->flush();
    return release(s, "stop");
  }
  if (!logprobs.empty()) {
    TokenLogprob lp{id, logprobs[size_t(id)], {}};
    std::vector<int32_t> order(logprobs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    const size_t k = std::min(order.size(), size_t(job.params.top_logprobs));
    std::partial_sort(order.begin(), order.begin() + long(k), order.end(), [&](int32_t a, int32_t b) {
      return logprobs[size_t(a)] > logprobs[size_t(b)] || (logprobs[size_t(a)] == logprobs[size_t(b)] && a < b);
    });
    for (size_t i = 0; i < k; ++i) lp.top.emplace_back(order[i], logprobs[size_t(order[i])]);
    job.record(std::move(lp));
  }
  ++job.completion_tokens;
  --s.budget;
  s.history.push_back(id);
  if (s.filter->push(s.decoder->push(id))) return release(s, "stop");
  if (s.budget == 0) {
    if (s.filter->push(s.decoder->flush())) return release(s, "stop");
    s.filter->flush();
    return release(s, "length");
  }
  s.feed = id;
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  m.prompt_tokens = prompt_tokens_.load(), m.prompt_seconds = double(prompt_us_.load()) * 1e-6;
  m.predicted_tokens = predicted_.load(), m.decode_seconds = double(decode_us_.load()) * 1e-6;
  m.decode_steps = steps_.load(), m.busy_slot_steps = busy_slot_steps_.load();
  m.finished_stop = finished_stop_.load(), m.finished_length = finished_length_.load();
  m.finished_cancelled = finished_cancelled_.load(), m.finished_error = finished_error_.load();
  m.processing = active_.load(), m.waiting = waiting();
  return m;
}

void Engine::loop() {
  NoGradGuard ng;
  std::vector<nn::KVCache*> caches;
  std::vector<int32_t> ids;
  std::vector<Slot*> stepping;
  while (true) {
    std::vector<Slot*> fresh;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || !embeds_.empty() || active_.load() > 0; });
      if (stopping_) break;
      while (!queue_.empty()) {
        std::shared_ptr<Job> job = queue_.front();
        if (job->cancelled()) {
          queue_.pop_front();
          ++finished_cancelled_;
          job->finish("cancelled");
          continue;
        }
        Slot* s = pick_slot(job->params.prompt);
        if (!s) break;
        queue_.pop_front();
        s->job = std::move(job);
        ++active_;
        fresh.push_back(s);
      }
    }
    for (Slot* s : fresh) {
      try {
        set_up(*s);
      } catch (const std::exception& e) {
        s->cache.clear(), s->cached.clear();
        release(*s, "error", e.what());
      }
    }
    run_embeds();
    // This step's prompt tokens: what the decoding slots leave of the batch.
    int64_t decoding = 0;
    for (auto& s : slots_) decoding += s->job && !s->prefilling;
    prefill_chunks(o_.batch == 0 ? std::numeric_limits<int64_t>::max() : std::max<int64_t>(1, o_.batch - decoding));
    const bool prefill_goes_on =
        std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->job && s->prefilling; });
    // Every slot with logits samples its next token; those going on are fed in one step.
    caches.clear(), ids.clear(), stepping.clear();
    for (auto& s : slots_) {
      if (!s->job) continue;
      if (s->logits.defined()) sample(*s);
      if (s->job && s->feed >= 0) {
        caches.push_back(&s->cache), ids.push_back(s->feed), stepping.push_back(s.get());
      }
    }
    if (stepping.empty()) continue;
    try {
      const auto t0 = Job::Clock::now();
      Tensor logits = model_.decode_step(caches, ids);  // [N, V]
      decode_us_ += std::chrono::duration_cast<std::chrono::microseconds>(Job::Clock::now() - t0).count();
      busy_slot_steps_ += int64_t(stepping.size());
      const int64_t V = logits.size(1);
      for (size_t i = 0; i < stepping.size(); ++i) {
        Slot& s = *stepping[i];
        s.cached.push_back(s.feed);
        s.feed = -1;
        s.logits = reshape(slice(logits, 0, int64_t(i), int64_t(i) + 1), Shape{V});
      }
      ++steps_;
      if (prefill_goes_on) ++steps_beside_prefill_;
      widest_ = std::max<int64_t>(widest_.load(), int64_t(stepping.size()));
    } catch (const std::exception& e) {
      for (Slot* s : stepping) {
        s->cache.clear(), s->cached.clear();
        release(*s, "error", e.what());
      }
    }
  }
  // Stopping: every job still running or waiting ends with the reason.
  for (auto& s : slots_) release(*s, "error", stop_reason_);
  std::lock_guard lk(mu_);
  for (auto& task : embeds_) task->done.set_exception(std::make_exception_ptr(Error(stop_reason_)));
  embeds_.clear();
  for (auto& job : queue_) job->finish("error", stop_reason_);
  queue_.clear();
}

}  // namespace toy::serve
