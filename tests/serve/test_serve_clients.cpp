// toy serve with real clients: the official openai SDK from npm, and the chat page in Debian's
// chromium driven by puppeteer-core (tools/serve-clients). Label slow: they start Node.js
// and a browser, and run outside the sanitizer build.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "requirements.h"
#include "serve_helpers.h"
#include "toy/autograd/grad_mode.h"
#include "toy/cli/bench_util.h"
#include "toy/ops/ops.h"

using namespace toy;
using namespace toy::test::serve_tests;

namespace {

const std::string kClients = std::string(TOY_SOURCE_DIR) + "/tools/serve-clients";

bool node_clients_installed() {
  return fs::exists(kClients + "/node_modules/openai") && std::system("node --version >/dev/null 2>&1") == 0;
}

// Runs `node SCRIPT args...`; its exit status and stdout (stderr goes to err).
std::pair<int, std::string> node_script(const std::string& script, const std::vector<std::string>& args,
                                        const std::string& err) {
  std::string cmd = "NO_PROXY='*' no_proxy='*' timeout 120 node " + toy::cli::shell_quote(kClients + "/" + script);
  for (const std::string& a : args) cmd += " " + toy::cli::shell_quote(a);
  cmd += " 2>" + toy::cli::shell_quote(err);
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

}  // namespace

TEST(ServeClients, TheOfficialOpenAIClientChatsCompletesStreamsAndSeesErrors) {
  TOY_REQUIRE(node_clients_installed(), "node and tools/serve-clients/node_modules (npm ci in tools/serve-clients)");
  TestServer ts("llama", {.parallel = 4, .ctx = 512}, {.api_key = "k-123"});
  const std::string prompt = "The cat sat on";
  const std::string err = temp("openai.err");
  const auto [status, out] =
      node_script("openai_check.mjs", {"http://127.0.0.1:" + std::to_string(ts.port) + "/v1", "k-123", prompt}, err);
  ASSERT_EQ(status, 0) << out << toy::test::read_all(err);
  const json j = json::parse(out);
  std::vector<int32_t> ids = ts.lm.tokenizer->encode(prompt);
  if (ts.lm.tokenizer->adds_bos()) ids.insert(ids.begin(), ts.lm.tokenizer->bos_id());
  GenerateStats st;
  EXPECT_EQ(j["completion"], generate_text(*ts.lm.model, *ts.lm.tokenizer, ids, 16, 512, {}, &st))
      << "greedy text through the client equals generate()";
  EXPECT_EQ(j["completion_usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(j["completion_usage"]["completion_tokens"], st.generated_tokens);
  EXPECT_EQ(j["completion_finish"], st.finish_reason);
  EXPECT_FALSE(j["chat"].get<std::string>().empty());
  EXPECT_TRUE(j.value("stop_checked", false));
  EXPECT_EQ(j["logprobs"].size(), 4u);
  EXPECT_TRUE(j["structured"].is_object()) << "the SDK's parse() read the structured reply";
  // The embedding of "The cat": the mean of the model's final hidden states, unit length.
  std::vector<int32_t> cat = ts.lm.tokenizer->encode("The cat");
  if (ts.lm.tokenizer->adds_bos()) cat.insert(cat.begin(), ts.lm.tokenizer->bos_id());
  NoGradGuard ng;
  const int64_t T = int64_t(cat.size()), D = ts.lm.model->config().dim;
  const std::vector<float> h = ts.lm.model->hidden(from_vector(cat, Shape{1, T})).to_f32_vector();
  std::vector<double> mean(size_t(D), 0.0);
  double norm = 0;
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t t = 0; t < T; ++t) mean[size_t(d)] += h[size_t(t * D + d)] / double(T);
    norm += mean[size_t(d)] * mean[size_t(d)];
  }
  const std::vector<double> got = j["embedding"];
  ASSERT_EQ(got.size(), size_t(D));
  for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(got[size_t(d)], mean[size_t(d)] / std::sqrt(norm), 1e-5);
}

TEST(ServeClients, TheChatPageStreamsARepliesInAHeadlessBrowser) {
  TOY_REQUIRE(node_clients_installed(), "node and tools/serve-clients/node_modules (npm ci in tools/serve-clients)");
  TOY_REQUIRE(fs::exists("/usr/bin/chromium"), "chromium (apt-get install chromium)");
  for (const std::string key : {"", "page-key"}) {
    SCOPED_TRACE(key);
    TestServer ts("llama", {.parallel = 2, .ctx = 512}, {.api_key = key});
    const std::string err = temp("page.err");
    const auto [status, out] = node_script("chat_page_check.mjs", {"http://127.0.0.1:" + std::to_string(ts.port) + "/", key},
                                           err);
    ASSERT_EQ(status, 0) << out << toy::test::read_all(err);
    const json j = json::parse(out);
    EXPECT_EQ(j["user"], "Tell me a story.");
    EXPECT_FALSE(j["reply"].get<std::string>().empty());
    EXPECT_GT(j["states"].get<int>(), 1) << "the reply arrives in pieces, not at once";
    EXPECT_TRUE(j["growing"].get<bool>()) << "each piece extends the reply shown so far";
    EXPECT_EQ(j["asked_for_key"], !key.empty());
    EXPECT_TRUE(j["foreign_requests"].empty());
  }
}


// The whole tool-call loop with a model toy trained itself: toy init, then toy finetune on SFT
// records whose answers are tool calls, rendered with Qwen2.5's real template (which
// model.gguf then carries); toy serve parses the calls; the openai client receives them (whole
// and streamed), sends the tool's result back and gets the final answer.
TEST(ServeClients, TheOpenAIClientCallsAToolOfAModelToyFineTuned) {
  TOY_REQUIRE(node_clients_installed(), "node and tools/serve-clients/node_modules (npm ci in tools/serve-clients)");
  const std::string qwen = toy::test::shared_path("chat-templates") + "/Qwen-Qwen2.5-7B-Instruct.jinja";
  TOY_REQUIRE_FILE(qwen);
  const std::string base = temp("tools_base.gguf"), data = temp("tools.jsonl"), run = temp("tools_run");
  fs::remove_all(run);
  auto r = toy::test::run_toy({"init", "--arch", "qwen2", "--shape", "tiny", "--out", base});
  ASSERT_EQ(r.status, 0) << toy::test::describe(r);
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
      "required": ["city"]}}}])");
  const std::string question = "Weather in Paris?", result = "sunny", answer = "It is sunny in Paris.";
  {
    const json call = {{"role", "assistant"}, {"content", ""},
                       {"tool_calls", {{{"type", "function"}, {"id", "call_1"},
                                        {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}}}};
    const json record = {{"messages", {{{"role", "user"}, {"content", question}}, call,
                                       {{"role", "tool"}, {"content", result}}, {{"role", "assistant"}, {"content", answer}}}},
                         {"tools", tools}};
    std::ofstream f(data);
    for (int i = 0; i < 8; ++i) f << record.dump() << "\n";
  }
  r = toy::test::run_toy({"finetune", "-m", base, "--data", data, "--chat-template", qwen, "--method", "full", "--train-embeddings", "--steps",
                          "120", "--batch", "2", "--lr", "3e-3", "--warmup", "10", "--val-fraction", "0", "--ctx", "1024",
                          "--seed", "7", "--out", run, "--json"});
  ASSERT_EQ(r.status, 0) << toy::test::describe(r);
  ServeProcess sp({"-m", run + "/model.gguf", "--parallel", "1", "--ctx", "1024"});
  ASSERT_GT(sp.port, 0) << toy::test::read_all(sp.err);
  const std::string err = temp("tools.err");
  const auto [status, out] = node_script(
      "tools_check.mjs", {"http://127.0.0.1:" + std::to_string(sp.port) + "/v1", question, tools.dump(), result}, err);
  ASSERT_EQ(status, 0) << out << toy::test::read_all(err) << toy::test::read_all(sp.err);
  const json j = json::parse(out);
  ASSERT_EQ(j["tool_calls"].size(), 1u) << out;
  EXPECT_EQ(j["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(j["arguments"], json({{"city", "Paris"}}));
  EXPECT_TRUE(j["content"].is_null()) << out;
  ASSERT_EQ(j["streamed"].size(), 1u) << out;
  EXPECT_EQ(j["streamed"][0]["name"], "get_weather");
  EXPECT_EQ(json::parse(j["streamed"][0]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(j["stream_finish"], "tool_calls");
  EXPECT_GT(j["helper_pieces"].get<int>(), 1) << "the arguments arrived whole: " << out;
  ASSERT_TRUE(j["helper_call"].is_object()) << out;
  EXPECT_EQ(json::parse(j["helper_call"]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(j["forced_finish"], "tool_calls") << out;
  ASSERT_EQ(j["forced"].size(), 1u) << out;
  EXPECT_EQ(j["forced"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(j["forced"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(j["final"], answer);
  EXPECT_EQ(j["final_finish"], "stop");
}
