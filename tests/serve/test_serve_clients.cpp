// toy serve with real clients: the official openai SDK from npm, and the chat page in Debian's
// chromium driven by puppeteer-core (tools/serve-clients). Label slow: they start Node.js
// and a browser, and run outside the sanitizer build.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "requirements.h"
#include "serve_helpers.h"
#include "toy/cli/bench_util.h"

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

