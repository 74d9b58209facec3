// toy serve's chunked prefill (EngineOptions::batch, `--batch-size`): a prompt run in chunks
// over several steps gives the text it gives run whole (every kind of layer that keeps state
// across the chunks: full and sliding-window attention, the Gated DeltaNet, the short conv;
// F32 and block-quantized weights), the slots already decoding take steps between its chunks,
// a short prompt is not held behind a long one, and a prompt cancelled part-way leaves a cache
// the next prompt continues.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "helpers.h"
#include "proc.h"
#include "serve_helpers.h"
#include "toy/io/model_file.h"
#include "toy/serve/engine.h"

using namespace toy;
using toy::test::describe;
using toy::test::run_toy;
using namespace toy::test::serve_tests;

TEST(ServeChunks, APromptInChunksGivesTheTextItGivesWhole) {
  for (const auto& [arch, type] : std::vector<std::pair<std::string, std::string>>{
           {"llama", "f32"}, {"llama", "q8_0"}, {"gemma3", "f32"}, {"qwen35", "f32"}, {"lfm2", "q8_0"}}) {
    SCOPED_TRACE(arch + " " + type);
    LoadedModel lm = load_model(init_tiny(arch, type));
    DecoderLM& m = *lm.model;
    const Tokenizer& tok = *lm.tokenizer;
    const int64_t V = m.config().vocab;
    // Lengths about a chunk, a few chunks and many (gemma3's tiny window is 8 tokens).
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> want;
    std::vector<GenerateStats> stats(4);
    for (int64_t n : {1, 9, 23, 40}) {
      prompts.push_back(some_ids(n, V, n));
      want.push_back(generate_text(m, tok, prompts.back(), 12, 128, {}, &stats[prompts.size() - 1]));
    }
    for (int64_t batch : {1, 3, 8, 0}) {
      SCOPED_TRACE("batch " + std::to_string(batch));
      serve::Engine e(m, tok, {.parallel = 4, .ctx = 128, .batch = batch});
      std::vector<std::shared_ptr<serve::Job>> jobs;
      for (const auto& p : prompts) jobs.push_back(e.submit(params(p, 12)));
      for (size_t i = 0; i < jobs.size(); ++i) {
        EXPECT_EQ(jobs[i]->wait_all(), want[i]) << "prompt " << i;
        EXPECT_EQ(jobs[i]->finish_reason, stats[i].finish_reason) << jobs[i]->error;
        EXPECT_EQ(jobs[i]->completion_tokens, stats[i].generated_tokens);
      }
      // 73 prompt tokens: at most `batch` a forward (one each while the others decode).
      if (batch > 0) EXPECT_GE(e.prompt_chunks(), (73 + batch - 1) / batch);
      else EXPECT_LE(e.prompt_chunks(), 4);
      EXPECT_EQ(e.metrics().prompt_tokens, 73);
    }
  }
}

// A decoding slot steps between each two chunks of a long prompt; with no limit (batch 0) it
// waits for the whole prompt.
TEST(ServeChunks, ALongPromptDoesNotStallTheSlotsDecoding) {
  LoadedModel lm = load_model(init_tiny("llama", "q8_0"));
  DecoderLM& m = *lm.model;
  const Tokenizer& tok = *lm.tokenizer;
  const int64_t V = m.config().vocab;
  const std::vector<int32_t> short_prompt = some_ids(4, V, 1), long_prompt = some_ids(150, V, 2);
  const std::string want_long = generate_text(m, tok, long_prompt, 1, 512);
  for (int64_t batch : {10, 0}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    serve::Engine e(m, tok, {.parallel = 2, .ctx = 512, .batch = batch});
    serve::GenParams a = params(short_prompt, 300);
    a.ignore_eos = true;  // (decoding all through the long prompt's prefill)
    auto decoding = e.submit(a);
    auto longer = e.submit(params(long_prompt, 1));
    EXPECT_EQ(longer->wait_all(), want_long);
    decoding->wait_all();
    EXPECT_EQ(decoding->completion_tokens, 300);
    if (batch > 0) {
      // The decoding slot's token leaves 9 of the 10 to the long prompt once the short one
      // is done: >= 17 forwards with prompt tokens in all (whichever came first), and the
      // short one decodes beside all but one or two of them.
      EXPECT_GE(e.prompt_chunks(), 17);
      EXPECT_GE(e.steps_beside_a_prefill(), 15);
    } else {
      EXPECT_EQ(e.steps_beside_a_prefill(), 0);
    }
  }
}

// Prompts that start together: the short ones are done in the first forward, whatever the
// order they came in, while the long one goes on in chunks.
TEST(ServeChunks, AShortPromptIsNotHeldBehindALongOne) {
  LoadedModel lm = load_model(init_tiny("llama"));
  DecoderLM& m = *lm.model;
  const Tokenizer& tok = *lm.tokenizer;
  const int64_t V = m.config().vocab;
  const std::vector<int32_t> long_prompt = some_ids(120, V, 3), short_prompt = some_ids(5, V, 4);
  serve::Engine e(m, tok, {.parallel = 2, .ctx = 256, .batch = 8});
  auto longer = e.submit(params(long_prompt, 1));
  auto shorter = e.submit(params(short_prompt, 6));
  EXPECT_EQ(shorter->wait_all(), generate_text(m, tok, short_prompt, 6, 256));
  EXPECT_EQ(longer->wait_all(), generate_text(m, tok, long_prompt, 1, 256));
  // The short prompt finished first: it had all its tokens generated before the long one's
  // first (the long prompt takes at least 120 / 7 more forwards after the short one began).
  EXPECT_LT(shorter->ttft_s, longer->ttft_s);
  EXPECT_EQ(shorter->completion_tokens, 6);
}

// Cancelled between its chunks, a prompt frees its slot; what its cache holds is the prompt's
// start, which the next request continues (the same text as computing it all).
TEST(ServeChunks, ACancelledPromptLeavesAPrefixTheNextRequestContinues) {
  for (const char* arch : {"llama", "qwen35"}) {
    SCOPED_TRACE(arch);
    LoadedModel lm = load_model(init_tiny(arch));
    DecoderLM& m = *lm.model;
    const Tokenizer& tok = *lm.tokenizer;
    // (1000 forwards of two tokens: the cancel below comes long before the last.)
    const std::vector<int32_t> prompt = some_ids(2000, m.config().vocab, 5);
    serve::Engine e(m, tok, {.parallel = 1, .ctx = 2048, .batch = 2});
    auto job = e.submit(params(prompt, 4));
    std::string text;
    while (e.prompt_chunks() < 3)
      if (job->wait(text, std::chrono::milliseconds(1))) break;  // (ended: the prompt was not chunked)
    job->cancel();
    job->wait_all();
    EXPECT_EQ(job->finish_reason, "cancelled");
    EXPECT_EQ(job->completion_tokens, 0);
    auto again = e.submit(params(prompt, 4));
    EXPECT_EQ(again->wait_all(), generate_text(m, tok, prompt, 4, 2048));
    EXPECT_GE(again->cached_tokens, 6) << "three chunks of two ran before the cancel";
    EXPECT_LT(again->cached_tokens, int64_t(prompt.size()));
  }
}

TEST(ServeChunks, TheBatchSizeIsCheckedAndTheBenchmarkMeasuresTheStall) {
  LoadedModel lm = load_model(init_tiny("llama"));
  EXPECT_NE(test::error_of([&] {
              serve::Engine e(*lm.model, *lm.tokenizer, {.batch = -1});
            }).find("--batch-size must be >= 0"),
            std::string::npos);
  const std::string model = init_tiny("llama", "q8_0");
  auto r = run_toy({"serve", "-m", model, "--batch-size=-3"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--batch-size"), std::string::npos) << describe(r);
  r = run_toy({"bench", "serve", "-m", model, "--no-peer", "--clients", "2", "--prompt", "4", "--tokens", "8",
               "--rounds", "1", "--threads", "1", "--long-prompt", "600", "--batch-size", "8", "--json"});
  ASSERT_EQ(r.status, 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("long_prompt_tokens").get<int64_t>(), 600);
  EXPECT_EQ(j.at("batch_size").get<int64_t>(), 8);
  for (const char* k : {"long_prompt_ms_chunked", "long_prompt_ms_whole", "tokens_per_s"})
    EXPECT_GT(j.at(k).get<double>(), 0.0) << k;
  // (The gaps a tiny model's streams see depend on the machine's timing: present, not zero-free.)
  for (const char* k : {"stall_ms_chunked", "stall_ms_whole"}) EXPECT_GE(j.at(k).get<double>(), 0.0) << k;
  EXPECT_TRUE(j.at("stall_lower_bound").is_boolean());
}
