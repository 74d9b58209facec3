// toy serve's sampling fields over HTTP, and the prompt cache it reports. Every other HTTP test
// is greedy without penalties; here a request's seed, top_p, top_k, min_p and penalties must
// each change what is served exactly as an in-process sampling loop (the Sampler fed the same
// config, seed and history) says, and `usage.prompt_tokens_details.cached_tokens` must count
// the tokens a continuing prompt reuses. The model is the tiny llama in q8_0: there the batched
// decode step gives each row the bits a one-token decode gives (ServeEngine.DecodeStepMatches
// OneSequenceAtATime), so the reference loop below reproduces served text to the byte, sampled
// tokens included. The tiny model's logits lie within about [-1, 1]: temperature 1 already
// samples broadly and temperature 5 nearly uniformly.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve_helpers.h"
#include "toy/autograd/grad_mode.h"
#include "toy/infer/sampler.h"
#include "toy/io/model_file.h"
#include "toy/models/decoder_lm.h"
#include "toy/nn/kv_cache.h"
#include "toy/serve/engine.h"
#include "toy/serve/openai.h"
#include "toy/serve/server.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;
using nlohmann::json;
using namespace toy::test::serve_tests;

namespace {

// TestServer over a model of a given weight type.
struct Served {
  LoadedModel lm;
  std::unique_ptr<serve::Engine> engine;
  std::unique_ptr<serve::Server> server;
  std::thread thread;
  int port = 0;

  Served(const std::string& arch, const std::string& type, serve::EngineOptions eo)
      : lm(load_model(init_tiny(arch, type))) {
    engine = std::make_unique<serve::Engine>(*lm.model, *lm.tokenizer, eo);
    serve::ServerOptions so;
    so.port = 0;
    server = std::make_unique<serve::Server>(*lm.tokenizer, ChatTemplate::from_text(kChatMLTemplate, "ChatML", *lm.tokenizer), *engine, so);
    port = server->bind();
    thread = std::thread([this] { server->run(); });
  }
  ~Served() {
    engine->shutdown("the server is shutting down");
    server->stop();
    thread.join();
  }
  int64_t vocab() const { return lm.model->config().vocab; }
};

// What the engine does for one request, one token at a time: the prompt prefilled, then each
// token drawn by a Sampler of `cfg` and `seed` over the history (prompt + generated), the
// end-of-generation tokens masked when `ignore_eos`, the sampled token fed next.
struct Reference {
  std::vector<int32_t> ids;  // generated
  std::string text;          // their bytes, as the engine emits them
};

Reference run_reference(DecoderLM& m, const Tokenizer& tok, const std::vector<int32_t>& prompt, int64_t n,
                        const SamplerConfig& cfg, uint64_t seed, bool ignore_eos) {
  NoGradGuard ng;
  nn::KVCache cache = m.new_cache(1, 256);
  Sampler sampler(cfg, seed);
  const std::vector<int32_t> ends = tok.end_of_generation_ids();
  std::vector<int32_t> history = prompt;
  Reference r;
  Tensor logits = m.decode(cache, prompt);
  for (int64_t i = 0; i < n; ++i) {
    if (ignore_eos) {
      float* z = logits.data<float>();
      for (int32_t e : ends) z[e] = -std::numeric_limits<float>::infinity();
    }
    const int32_t id = sampler.sample(logits, history);
    if (std::find(ends.begin(), ends.end(), id) != ends.end()) break;
    r.ids.push_back(id);
    history.push_back(id);
    r.text += tok.token_bytes(id);
    if (i + 1 < n) logits = m.decode(cache, id);
  }
  return r;
}

Reference run_reference(Served& s, const std::vector<int32_t>& prompt, int64_t n, const SamplerConfig& cfg,
                        uint64_t seed = 0) {
  return run_reference(*s.lm.model, *s.lm.tokenizer, prompt, n, cfg, seed, /*ignore_eos=*/true);
}

// Text as a JSON reply carries it (invalid UTF-8 a random model emits becomes U+FFFD).
std::string as_served(const std::string& raw) { return json::parse(serve::dump(json(raw))).get<std::string>(); }

// A /v1/completions body: token ids (no BOS added), max_tokens, ignore_eos (every request
// runs its full length), then `fields`.
json request(const std::vector<int32_t>& prompt, int64_t max_tokens, const json& fields) {
  json b = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true}};
  for (const auto& f : fields.items()) b[f.key()] = f.value();
  return b;
}

json complete(const Served& s, const json& body) {
  httplib::Client c("127.0.0.1", s.port);
  c.set_read_timeout(std::chrono::seconds(60));
  const httplib::Result r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << "no reply to " << body.dump();
    return json::object();
  }
  EXPECT_EQ(r->status, 200) << body.dump() << " -> " << r->body;
  return json::parse(r->body);
}

std::string text_of(const json& reply) {
  if (!reply.contains("choices")) {
    ADD_FAILURE() << "no choices in " << reply.dump();
    return "<no text>";
  }
  return reply["choices"][0]["text"].get<std::string>();
}

std::string served_text(const Served& s, const json& body) { return text_of(complete(s, body)); }

SamplerConfig sampling_config(float temperature, int top_k, float top_p, float min_p) {
  SamplerConfig c = greedy();
  c.temperature = temperature;
  c.top_k = top_k;
  c.top_p = top_p;
  c.min_p = min_p;
  return c;
}

bool has_repeat(const std::vector<int32_t>& ids) { return std::set<int32_t>(ids.begin(), ids.end()).size() < ids.size(); }

// Temperature 5 with every cut off: nearly uniform over the vocabulary.
const json kHot = {{"temperature", 5.0}, {"top_k", 0}, {"top_p", 1.0}, {"min_p", 0.0}, {"seed", 3}};
SamplerConfig hot() { return sampling_config(5.0f, 0, 1.0f, 0.0f); }

json with(json base, const json& more) {
  for (const auto& f : more.items()) base[f.key()] = f.value();
  return base;
}

}  // namespace

TEST(ServeSampling, TheSameSeedGivesTheSameTextAnotherSeedAnother) {
  Served s("llama", "q8_0", {.parallel = 2, .ctx = 256});
  const std::vector<int32_t> prompt = some_ids(5, s.vocab(), 1);
  const json sampled = {{"temperature", 1.0}, {"top_k", 0}, {"top_p", 1.0}, {"min_p", 0.0}};
  const std::string a = served_text(s, request(prompt, 24, with(sampled, {{"seed", 11}})));
  const std::string b = served_text(s, request(prompt, 24, with(sampled, {{"seed", 11}})));
  const std::string c = served_text(s, request(prompt, 24, with(sampled, {{"seed", 12}})));
  EXPECT_EQ(a, b) << "the same seed, the same text";
  EXPECT_NE(a, c) << "another seed, another text";
  // Exactly the text a sampler seeded so gives (as toy generate --seed), not merely a stable one.
  const SamplerConfig cfg = sampling_config(1.0f, 0, 1.0f, 0.0f);
  const Reference ref11 = run_reference(s, prompt, 24, cfg, 11), ref12 = run_reference(s, prompt, 24, cfg, 12);
  ASSERT_EQ(ref11.ids.size(), 24u);
  EXPECT_EQ(a, as_served(ref11.text));
  EXPECT_EQ(c, as_served(ref12.text));
  EXPECT_NE(a, as_served(run_reference(s, prompt, 24, greedy()).text)) << "premise: temperature 1 samples";
}

TEST(ServeSampling, ATinyTopPKeepsOnlyTheMostLikelyToken) {
  Served s("llama", "q8_0", {.parallel = 2, .ctx = 256});
  const std::vector<int32_t> prompt = some_ids(5, s.vocab(), 1);
  const std::string greedy_text = as_served(run_reference(s, prompt, 24, greedy()).text);
  // Premise: at this temperature with no cut the draw is not the greedy text (it is the seeded
  // sampler's, and so is the one under the default top_p 0.95 a dropped field would leave).
  const std::string open = served_text(s, request(prompt, 24, kHot));
  EXPECT_EQ(open, as_served(run_reference(s, prompt, 24, hot(), 3).text));
  ASSERT_NE(open, greedy_text);
  SamplerConfig loose = hot();
  loose.top_p = 0.95f;
  ASSERT_NE(as_served(run_reference(s, prompt, 24, loose, 3).text), greedy_text);
  // The most likely token alone holds at least 1/1024 of the mass: top_p 1e-4 keeps it alone;
  // top_p 0 (OpenAI allows it) means the same.
  EXPECT_EQ(served_text(s, request(prompt, 24, with(kHot, {{"top_p", 1e-4}}))), greedy_text);
  EXPECT_EQ(served_text(s, request(prompt, 24, with(kHot, {{"top_p", 0}}))), greedy_text) << "top_p 0";
  // A middling top_p: the cut the sampler makes at that value.
  SamplerConfig half = hot();
  half.top_p = 0.5f;
  EXPECT_EQ(served_text(s, request(prompt, 24, with(kHot, {{"top_p", 0.5}}))),
            as_served(run_reference(s, prompt, 24, half, 3).text));
}

TEST(ServeSampling, AMinPOfOneKeepsOnlyTheMostLikelyToken) {
  Served s("llama", "q8_0", {.parallel = 2, .ctx = 256});
  const std::vector<int32_t> prompt = some_ids(5, s.vocab(), 1);
  const std::string greedy_text = as_served(run_reference(s, prompt, 24, greedy()).text);
  // Premise: neither no min-p nor the default 0.05 cuts down to the greedy token here.
  ASSERT_NE(served_text(s, request(prompt, 24, kHot)), greedy_text);
  SamplerConfig loose = hot();
  loose.min_p = 0.05f;
  ASSERT_NE(as_served(run_reference(s, prompt, 24, loose, 3).text), greedy_text);
  // min_p 1 keeps the tokens as likely as the most likely one: it alone.
  EXPECT_EQ(served_text(s, request(prompt, 24, with(kHot, {{"min_p", 1.0}}))), greedy_text);
  // min_p 0.9: the cut the sampler makes at that value.
  SamplerConfig tight = hot();
  tight.min_p = 0.9f;
  EXPECT_EQ(served_text(s, request(prompt, 24, with(kHot, {{"min_p", 0.9}}))),
            as_served(run_reference(s, prompt, 24, tight, 3).text));
  // (top_k 1 likewise, where the default top_k 40 would not.)
  EXPECT_EQ(served_text(s, request(prompt, 24, with(kHot, {{"top_k", 1}}))), greedy_text) << "top_k 1";
}

TEST(ServeSampling, EachPenaltyChangesTheGreedyTextAsTheSamplerDoes) {
  Served s("llama", "q8_0", {.parallel = 2, .ctx = 256});
  // 5 prompt tokens and 40 generated: all within the penalties' window of 64.
  const std::vector<int32_t> prompt = some_ids(5, s.vocab(), 1);
  const Reference plain = run_reference(s, prompt, 40, greedy());
  EXPECT_EQ(served_text(s, request(prompt, 40, {{"temperature", 0}})), as_served(plain.text));
  struct Case {
    const char* field;
    double value;
    SamplerConfig cfg;
  };
  std::vector<Case> cases = {{"repeat_penalty", 1.5, greedy()}, {"presence_penalty", 0.1, greedy()},
                             {"frequency_penalty", 0.1, greedy()}};
  cases[0].cfg.repeat_penalty = 1.5f;
  cases[1].cfg.presence_penalty = 0.1f;
  cases[2].cfg.frequency_penalty = 0.1f;
  std::vector<std::vector<int32_t>> ids;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    const Reference ref = run_reference(s, prompt, 40, c.cfg);
    ASSERT_EQ(ref.ids.size(), 40u);
    ASSERT_NE(ref.ids, plain.ids) << "premise: the penalty changes the greedy tokens";
    const std::string text = served_text(s, request(prompt, 40, {{"temperature", 0}, {c.field, c.value}}));
    EXPECT_NE(text, as_served(plain.text)) << "the penalty changes the served text";
    EXPECT_EQ(text, as_served(ref.text));
    ids.push_back(ref.ids);
  }
  // Premise: the three penalties at these values give three different texts, so one field
  // taken for another would show.
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[0], ids[2]);
  EXPECT_NE(ids[1], ids[2]) << "presence (once per token) and frequency (per occurrence) differ here";
}

TEST(ServeSampling, TokensGeneratedInTheRequestArePenalised) {
  Served s("llama", "q8_0", {.parallel = 2, .ctx = 256});
  const std::vector<int32_t> prompt = some_ids(5, s.vocab(), 1);
  // Premise: unpenalised, the greedy text repeats tokens it generated (the tiny model loops).
  const Reference plain = run_reference(s, prompt, 40, greedy());
  ASSERT_EQ(plain.ids.size(), 40u);
  ASSERT_TRUE(has_repeat(plain.ids));
  EXPECT_EQ(served_text(s, request(prompt, 40, {{"temperature", 0}})), as_served(plain.text));
  // With the largest frequency penalty (2, more than the logits' whole spread) and the largest
  // repeat penalty (100), a token once generated is never the most likely again: 45 tokens fit
  // the window of 64, so no token repeats, and none of the prompt's appears.
  SamplerConfig frequency = greedy(), repeat = greedy();
  frequency.frequency_penalty = 2.0f;
  repeat.repeat_penalty = 100.0f;
  for (const auto& [field, value, cfg] : std::vector<std::tuple<std::string, double, SamplerConfig>>{
           {"frequency_penalty", 2.0, frequency}, {"repeat_penalty", 100.0, repeat}}) {
    SCOPED_TRACE(field);
    const Reference ref = run_reference(s, prompt, 40, cfg);
    ASSERT_EQ(ref.ids.size(), 40u);
    EXPECT_FALSE(has_repeat(ref.ids));
    for (int32_t id : ref.ids) EXPECT_EQ(std::count(prompt.begin(), prompt.end(), id), 0) << id;
    EXPECT_EQ(served_text(s, request(prompt, 40, {{"temperature", 0}, {field, value}})), as_served(ref.text));
  }
}

TEST(ServeSampling, PromptTokensArePenalised) {
  Served s("llama", "q8_0", {.parallel = 2, .ctx = 256});
  // A prompt ending where the greedy text falls into a loop: its next greedy token is one the
  // prompt already holds, so only a penalty over the prompt keeps it out.
  std::vector<int32_t> prompt = some_ids(5, s.vocab(), 1);
  const Reference lead = run_reference(s, prompt, 22, greedy());
  prompt.insert(prompt.end(), lead.ids.begin(), lead.ids.end());
  const Reference plain = run_reference(s, prompt, 24, greedy());
  ASSERT_FALSE(plain.ids.empty());
  ASSERT_GE(std::count(prompt.begin(), prompt.end(), plain.ids[0]), 1) << "premise: the next token is a prompt's";
  SamplerConfig cfg = greedy();
  cfg.frequency_penalty = 2.0f;
  const Reference ref = run_reference(s, prompt, 24, cfg);  // 27 + 24 tokens: within the window of 64
  ASSERT_EQ(ref.ids.size(), 24u);
  for (int32_t id : ref.ids) EXPECT_EQ(std::count(prompt.begin(), prompt.end(), id), 0) << id;
  EXPECT_FALSE(has_repeat(ref.ids));
  EXPECT_EQ(served_text(s, request(prompt, 24, {{"temperature", 0}, {"frequency_penalty", 2.0}})), as_served(ref.text));
}

TEST(ServeSampling, UsageCountsTheCachedTokensOfAContinuedPrompt) {
  // Two slots: a continuation must go to the slot holding its prefix, not the idle one.
  Served s("llama", "q8_0", {.parallel = 2, .ctx = 256});
  const int64_t V = s.vocab();
  const json greedy_fields = {{"temperature", 0}};
  auto cached_of = [](json reply) { return reply["usage"]["prompt_tokens_details"]["cached_tokens"]; };
  // A first turn of 6 tokens and 10 generated.
  const std::vector<int32_t> first = some_ids(6, V, 2);
  const Reference said = run_reference(s, first, 10, greedy());
  ASSERT_EQ(said.ids.size(), 10u);
  json r = complete(s, request(first, 10, greedy_fields));
  EXPECT_EQ(text_of(r), as_served(said.text));
  EXPECT_EQ(r["usage"]["completion_tokens"], 10);
  EXPECT_EQ(cached_of(r), 0) << "nothing cached yet";
  // The next turn, built from the token ids generated (no re-encoding of the reply): the
  // first prompt, the reply, 4 more. The slot fed the 6 prompt tokens and 9 of the 10
  // generated (the last one is sampled, never fed): 15 are reused.
  std::vector<int32_t> next = first;
  next.insert(next.end(), said.ids.begin(), said.ids.end());
  for (int32_t id : some_ids(4, V, 9)) next.push_back(id);
  r = complete(s, request(next, 8, greedy_fields));
  EXPECT_EQ(r["usage"]["prompt_tokens"], 20);
  EXPECT_EQ(cached_of(r), 15);
  EXPECT_EQ(text_of(r), as_served(run_reference(s, next, 8, greedy()).text)) << "continuing gives what recomputing gives";
  // Fresh prompts that continue nothing: 0, and the text of a fresh start. The first goes to
  // the idle slot; the second to the slot holding the 27 tokens of the turn above (20 + 7
  // fed), which it is longer than but does not continue.
  for (int64_t salt : {4, 5}) {
    SCOPED_TRACE(salt);
    const std::vector<int32_t> fresh = some_ids(30, V, salt);
    r = complete(s, request(fresh, 8, greedy_fields));
    EXPECT_EQ(r["usage"]["prompt_tokens"], 30);
    EXPECT_EQ(cached_of(r), 0);
    EXPECT_EQ(text_of(r), as_served(run_reference(s, fresh, 8, greedy()).text));
  }
  // Streamed, the usage chunk says the same: the last fresh prompt (30 tokens), its 8
  // generated, 2 more; 30 + 7 are reused.
  std::vector<int32_t> last = some_ids(30, V, 5);
  const Reference more = run_reference(s, last, 8, greedy());
  ASSERT_EQ(more.ids.size(), 8u);
  last.insert(last.end(), more.ids.begin(), more.ids.end());
  last.push_back(7), last.push_back(8);
  httplib::Client c("127.0.0.1", s.port);
  c.set_read_timeout(std::chrono::seconds(60));
  json body = request(last, 4, greedy_fields);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const httplib::Result sr = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(sr);
  ASSERT_EQ(sr->status, 200) << sr->body;
  const std::vector<std::string> events = sse_data(sr->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 40);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 37);
}

// ServeEngine.ContinuesACachedPrefixInsteadOfRecomputing checks the cached count only when the
// reply's text re-encodes to the tokens generated; here the continuation is built from the
// token ids themselves, so the count is always checked.
TEST(ServeSampling, EngineContinuesAPrefixBuiltFromTokenIds) {
  for (const char* arch : {"llama", "qwen35"}) {
    SCOPED_TRACE(arch);
    LoadedModel lm = load_model(init_tiny(arch, "q8_0"));
    DecoderLM& m = *lm.model;
    const Tokenizer& tok = *lm.tokenizer;
    const int64_t V = m.config().vocab;
    serve::Engine e(m, tok, {.parallel = 1, .ctx = 128});
    const std::vector<int32_t> first = some_ids(6, V, 2);
    const Reference said = run_reference(m, tok, first, 10, greedy(), 0, /*ignore_eos=*/true);
    ASSERT_EQ(said.ids.size(), 10u);
    serve::GenParams p = params(first, 10);
    p.ignore_eos = true;
    auto job = e.submit(p);
    EXPECT_EQ(job->wait_all(), said.text);
    EXPECT_EQ(job->completion_tokens, 10);
    EXPECT_EQ(job->cached_tokens, 0);
    std::vector<int32_t> next = first;
    next.insert(next.end(), said.ids.begin(), said.ids.end());
    for (int32_t id : some_ids(4, V, 9)) next.push_back(id);
    job = e.submit(params(next, 8));
    const std::string text = job->wait_all();
    EXPECT_EQ(job->prompt_tokens, 20);
    EXPECT_EQ(job->cached_tokens, 15) << "6 prompt tokens and 9 generated ones were fed (the 10th never is)";
    EXPECT_EQ(text, generate_text(m, tok, next, 8, 128)) << "continuing gives what recomputing gives";
    // A prompt longer than what the slot holds that does not continue it starts over.
    const std::vector<int32_t> other = some_ids(40, V, 4);
    job = e.submit(params(other, 4));
    EXPECT_EQ(job->wait_all(), generate_text(m, tok, other, 4, 128));
    EXPECT_EQ(job->cached_tokens, 0);
  }
}
