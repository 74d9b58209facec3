// Shared by the toy serve tests: tiny models written by `toy init`, greedy generate() as the
// reference text, and an in-process server on a free loopback port.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "proc.h"
#include "toy/infer/chat.h"
#include "toy/infer/generate.h"
#include "toy/infer/sampler.h"
#include "toy/io/model_file.h"
#include "toy/serve/engine.h"
#include "toy/serve/server.h"

namespace toy::test::serve_tests {

namespace fs = std::filesystem;
using nlohmann::json;

inline std::string temp(const std::string& name) { return (fs::path(::testing::TempDir()) / ("toy_serve_" + name)).string(); }

inline std::string init_tiny(const std::string& arch, const std::string& type = "f32") {
  const std::string path = temp(arch + "_" + type + ".gguf");
  if (!fs::exists(path)) {
    // ctest runs tests in parallel processes: each writes its own file, then renames it into
    // place (atomic; every writer makes the same bytes), so none reads another's half-written one.
    const std::string mine = path + "." + std::to_string(getpid());
    const auto r = toy::test::run_toy({"init", "--arch", arch, "--shape", "tiny", "--type", type, "--seed", "7",
                                       "--out", mine});
    EXPECT_EQ(r.status, 0) << toy::test::describe(r);
    fs::rename(mine, path);
  }
  return path;
}

inline std::vector<int32_t> some_ids(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(int32_t((i * 131 + salt * 977 + 5) % vocab));
  return ids;
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

inline SamplerConfig greedy() {
  SamplerConfig c;
  c.temperature = 0;
  return c;
}

inline std::string generate_text(DecoderLM& m, const Tokenizer& tok, const std::vector<int32_t>& prompt, int64_t n,
                          int64_t capacity, const std::vector<std::string>& stop = {}, GenerateStats* stats = nullptr) {
  Sampler s(greedy(), 1);
  std::string text;
  const GenerateStats st = generate(m, tok, s, prompt, n, [&](const std::string& piece) { text += piece; }, capacity, stop);
  if (stats) *stats = st;
  return text;
}

inline serve::GenParams params(std::vector<int32_t> prompt, int64_t max_tokens) {
  serve::GenParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling = greedy();
  return p;
}

struct TestServer {
  LoadedModel lm;
  std::unique_ptr<serve::Engine> engine;
  std::unique_ptr<serve::Server> server;
  std::thread thread;
  int port = 0;

  // `chat_template`: the Jinja text chat requests are rendered with (ChatML when empty).
  TestServer(const std::string& arch, serve::EngineOptions eo, serve::ServerOptions so,
             const std::string& chat_template = "")
      : lm(load_model(init_tiny(arch))) {
    engine = std::make_unique<serve::Engine>(*lm.model, *lm.tokenizer, eo);
    so.port = 0;
    const std::string text = chat_template.empty() ? std::string(kChatMLTemplate) : chat_template;
    server = std::make_unique<serve::Server>(*lm.tokenizer, ChatTemplate::from_text(text, "test", *lm.tokenizer), *engine, so);
    port = server->bind();
    thread = std::thread([this] { server->run(); });
  }
  ~TestServer() {
    engine->shutdown("the server is shutting down");
    server->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(std::chrono::seconds(60));
    return c;
  }
};

inline json body_of(const httplib::Result& r) { return json::parse(r->body); }

// The data: payloads of a server-sent event stream, in order.
inline std::vector<std::string> sse_data(const std::string& stream) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t end = stream.find("\n\n", at);
    if (end == std::string::npos) break;
    const std::string event = stream.substr(at, end - at);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    at = end + 2;
  }
  return out;
}


// A toy serve process on a free port; stopped (SIGTERM) when it goes.
struct ServeProcess {
  pid_t pid = -1;
  int port = 0;
  std::string err, out;  // the files its stderr and stdout go to (removed when it goes)
  explicit ServeProcess(std::vector<std::string> args) {
    static int counter = 0;
    const std::string base = temp("proc" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    err = base + ".err", out = base + ".out";
    args.insert(args.begin(), "serve");
    args.insert(args.end(), {"--port", "0"});
    pid = toy::test::spawn_toy(args, {}, out, err);
    for (int i = 0; i < 600 && !port; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {  // it refused to start
        pid = -1;
        break;
      }
      const std::string text = toy::test::read_all(out);
      const size_t at = text.find("http://127.0.0.1:");
      if (at != std::string::npos && text.find('/', at + 17) != std::string::npos) port = std::stoi(text.substr(at + 17));
    }
  }
  // SIGTERM, then the exit status (-1 if it had already gone).
  int stop() {
    if (pid < 0) return -1;
    kill(pid, SIGTERM);
    toy::test::ProcResult r;
    toy::test::wait_toy(pid, 30, r);
    pid = -1;
    return r.timed_out ? -2 : r.status;
  }
  ~ServeProcess() {
    stop();
    std::remove(err.c_str());
    std::remove(out.c_str());
  }
};


}  // namespace toy::test::serve_tests
