// The serving engine: continuous batching of generation requests over one model. Up to
// `parallel` slots decode together, one batched forward per step (DecoderLM::decode_step:
// every weight matrix read once for all of them); a request that arrives joins at the next
// step; a cancelled request frees its slot at the next step. Prompts are prefilled in
// chunks (EngineOptions::batch tokens a step, shared by the prompts being prefilled): a long
// prompt takes several steps, and the slots already decoding take a step between each two of
// its chunks instead of waiting for all of it. Each slot owns a KV cache (and recurrent
// state) of its own; when a slot's cached tokens are a prefix of a new prompt, the prompt
// continues them instead of being recomputed. No HTTP here: the server (server.h) turns
// requests into Jobs and Jobs into responses.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "toy/core/dtype.h"
#include "toy/infer/grammar.h"
#include "toy/infer/sampler.h"

namespace toy {
class DecoderLM;
class Tokenizer;
class TokenMasker;
}  // namespace toy

namespace toy::serve {

// A generated token's log-probability under the model (its distribution before sampling's
// biases, penalties and cuts) and the most likely tokens there, best first.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

// One generation request, tokenized.
struct GenParams {
  std::vector<int32_t> prompt;  // not empty; fewer tokens than the slot context
  int64_t max_tokens = -1;      // -1: until end of text or the end of the slot's context
  SamplerConfig sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // stop strings (not output)
  bool ignore_eos = false;        // end-of-generation tokens are never drawn
  int top_logprobs = -1;          // -1: none; else each token's log-probability and this many alternatives
  std::shared_ptr<const Grammar> grammar;  // structured output: only tokens the grammar allows
};

// A request in flight, shared by the thread that answers the client and the engine: the text
// generated so far (taken in pieces), then the end with its reason and token counts.
class Job {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Job(GenParams p) : params(std::move(p)), submitted(Clock::now()) {}

  // Client side. Waits until there is new text or the job ended (or `timeout` passed); moves
  // the new text into `out` (replacing it). Returns true once the job has ended and every
  // piece of its text was taken.
  bool wait(std::string& out, std::chrono::milliseconds timeout);
  // Blocks until the job ends; returns all the text not yet taken.
  std::string wait_all();
  // The log-probabilities of the tokens generated since the last call (when asked for).
  std::vector<TokenLogprob> take_logprobs();
  // The client went away (or no longer wants the rest): the engine frees the slot.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Results, valid once wait() returned true.
  std::string finish_reason;  // "stop", "length"; "error" with `error` set
  std::string error;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  double ttft_s = 0;  // submission to the first generated token

  // Engine side.
  void emit(const std::string& text);
  void record(TokenLogprob lp);
  void finish(const std::string& reason, const std::string& error = "");
  void first_token();

  const GenParams params;
  const Clock::time_point submitted;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
  std::vector<TokenLogprob> logprobs_;
  bool done_ = false;
  std::atomic<bool> cancelled_{false};
};

// What the engine has done since it started (GET /metrics): totals, read without a lock.
struct EngineMetrics {
  int64_t prompt_tokens = 0;     // prompt tokens computed (a cached prefix is not)
  double prompt_seconds = 0;     // spent computing them
  int64_t predicted_tokens = 0;  // tokens generated
  double decode_seconds = 0;     // spent in batched decode steps
  int64_t decode_steps = 0;
  int64_t busy_slot_steps = 0;   // slots carried, summed over the steps
  int64_t finished_stop = 0, finished_length = 0, finished_cancelled = 0, finished_error = 0;
  int64_t processing = 0, waiting = 0;
};

// How /v1/embeddings makes one vector of a sequence's hidden states (after the final norm):
// their mean, the last token's, or the first's (cls).
enum class Pooling { Mean, Last, Cls };

struct EngineOptions {
  int parallel = 4;        // slots decoding together
  int64_t ctx = 0;         // tokens per slot (0: the model's context, at most 4096)
  int64_t queue = 64;      // requests waiting for a slot before submit() refuses
  DType cache_dtype = DType::F32;
  // Tokens one step computes at most, as llama-server's --batch-size: each decoding slot's
  // next token, then the prompts being prefilled share what is left (at least one token),
  // shortest remaining first so that a short prompt does not wait behind a long one; their
  // chunks run in one forward. 0: no limit (each prompt whole in the step it starts).
  int64_t batch = 512;
};

class Engine {
 public:
  // Allocates every slot's cache up front (the memory a server needs is known at start) and
  // starts the engine thread. The model and tokenizer must outlive the engine.
  Engine(DecoderLM& model, const Tokenizer& tok, EngineOptions o);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a job; nullptr when every slot is busy and the queue is full. Throws toy::Error for
  // a prompt that is empty or does not fit the slot context, or a token out of the vocabulary.
  std::shared_ptr<Job> submit(GenParams p);
  // Embeddings of token sequences (each non-empty, within the slot context): pooled hidden
  // states, L2-normalised. Runs on the engine thread between decode steps (one model, one
  // thread at a time); blocks until done. Throws toy::Error for bad input or a stopped engine.
  std::vector<std::vector<float>> embed(std::vector<std::vector<int32_t>> inputs, Pooling pooling);
  // Ends every job in flight and waiting with an error naming `why`, and stops the thread.
  void shutdown(const std::string& why);

  int64_t slot_ctx() const { return ctx_; }
  int parallel() const { return int(slots_.size()); }
  // Jobs decoding and waiting, for /health and tests.
  int64_t active() const { return active_.load(); }
  int64_t waiting() const;
  // Batched steps run and the most sequences one step carried (tests check batching happens).
  int64_t steps() const { return steps_.load(); }
  int64_t widest_step() const { return widest_.load(); }
  // Forwards that ran prompt tokens, and decode steps taken while a prompt was part-way
  // through its prefill (tests check that a long prompt does not stall the others).
  int64_t prompt_chunks() const { return prompt_chunks_.load(); }
  int64_t steps_beside_a_prefill() const { return steps_beside_prefill_.load(); }
  EngineMetrics metrics() const;

 private:
  struct Slot;
  void loop();
  // One step's prompt tokens: the slots still prefilling (the cancelled ones released) take
  // chunks of `budget` tokens in all, shortest remaining first, run in one forward (each
  // one's run so far again alone when that fails, so that a fault ends only the job it
  // belongs to); a slot whose prompt is done holds the logits after it.
  void prefill_chunks(int64_t budget);
  void set_up(Slot& s);  // s's job started: sampling state, and what of the prompt its cache holds
  void sample(Slot& s);                      // the next token from s's logits
  void release(Slot& s, const std::string& reason, const std::string& error = "");
  Slot* pick_slot(const std::vector<int32_t>& prompt);  // a free slot, preferring a cached prefix

  DecoderLM& model_;
  const Tokenizer& tok_;
  EngineOptions o_;
  int64_t ctx_ = 0;
  std::vector<int32_t> ends_;  // end-of-generation ids
  std::vector<int32_t> specials_;  // control and user-defined ids, sorted (a grammar takes them only as token elements)
  bool is_special(int32_t id) const;
  bool is_end(int32_t id) const;
  int32_t draw_constrained(Slot& s);
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  struct EmbedTask {
    std::vector<std::vector<int32_t>> inputs;
    Pooling pooling;
    std::promise<std::vector<std::vector<float>>> done;
  };
  std::deque<std::shared_ptr<EmbedTask>> embeds_;
  std::unique_ptr<TokenMasker> masker_;  // built at the first constrained request
  std::vector<float> mask_bias_;
  void run_embeds();
  bool stopping_ = false;
  std::string stop_reason_;
  std::atomic<int64_t> active_{0}, steps_{0}, widest_{0}, prompt_chunks_{0}, steps_beside_prefill_{0};
  // Metrics (written by the engine thread, read by any).
  std::atomic<int64_t> prompt_tokens_{0}, prompt_us_{0}, predicted_{0}, decode_us_{0}, busy_slot_steps_{0};
  std::atomic<int64_t> finished_stop_{0}, finished_length_{0}, finished_cancelled_{0}, finished_error_{0};
  uint64_t use_clock_ = 0;  // orders slots by last use (engine thread only)
  uint64_t start_clock_ = 0;  // orders jobs by the step they started (engine thread only)
  std::thread thread_;
};

}  // namespace toy::serve
