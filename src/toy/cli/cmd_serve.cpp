// `toy serve -m M`: the OpenAI-compatible server (serve/server.h) with continuous batching
// (serve/engine.h). Binds 127.0.0.1 unless told otherwise, prints its URL on stdout, and stops
// cleanly on SIGINT/SIGTERM: streams in flight end with an error event, the rest are answered
// 503, then it exits 0. A second signal ends it at once.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/cli/lora_flags.h"
#include "toy/core/error.h"
#include "toy/core/runtime.h"
#include "toy/infer/chat.h"
#include "toy/io/model_file.h"
#include "toy/serve/engine.h"
#include "toy/serve/server.h"

namespace toy::cli {

namespace {

struct ServeFlags {
  std::string model, host = "127.0.0.1", api_key, cache_type = "f32", name, chat_template, pooling = "mean";
  LoraFlags lora;
  int port = 8080, parallel = 4, threads = 0;
  Device device = Device::CPU;
  int64_t ctx = 0, queue = 64, max_body = int64_t(1) << 20, batch = 512;
};

volatile sig_atomic_t g_signals = 0;

void on_signal(int) {
  if (g_signals) _exit(130);  // a second signal: at once
  g_signals = 1;
}

int run_serve(const ServeFlags& f) {
  gguf::Reader reader(f.model);
  LoadedModel lm = load_model(reader);
  apply_lora_flags(f.lora, lm);
  lm.model->params().move_to(f.device);  // the weights copied once; the slots' caches follow the model
  const ChatTemplate tmpl = ChatTemplate::choose(f.chat_template, reader, *lm.tokenizer);
  TOY_CHECK(f.cache_type == "f32" || f.cache_type == "f16", "[serve] --cache-type must be f32 or f16, got {}",
            f.cache_type);
  serve::EngineOptions eo;
  eo.parallel = f.parallel;
  eo.ctx = f.ctx;
  eo.queue = f.queue;
  eo.batch = f.batch;
  eo.cache_dtype = f.cache_type == "f16" ? DType::F16 : DType::F32;
  serve::ServerOptions so;
  so.host = f.host;
  so.port = f.port;
  so.api_key = f.api_key;
  if (so.api_key.empty())
    if (const char* k = std::getenv("TOY_API_KEY")) so.api_key = k;
  so.max_body = size_t(f.max_body);
  so.pooling = f.pooling == "last" ? serve::Pooling::Last : f.pooling == "cls" ? serve::Pooling::Cls : serve::Pooling::Mean;
  so.model_name = f.name.empty() ? std::filesystem::path(f.model).filename().string() : f.name;

  // Signals only set a flag; this thread turns it into an orderly stop.
  ::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  serve::Engine engine(*lm.model, *lm.tokenizer, eo);
  serve::Server server(*lm.tokenizer, tmpl, engine, so);
  const int port = server.bind();
  std::printf("toy serve: http://%s:%d/ (model %s, %d slots of %lld tokens%s%s)\n", f.host.c_str(), port,
              so.model_name.c_str(), engine.parallel(), static_cast<long long>(engine.slot_ctx()),
              tmpl.defaulted() ? ", ChatML template" : "", so.api_key.empty() ? "" : ", API key required");
  std::fflush(stdout);
  std::thread http([&] { server.run(); });
  while (!g_signals) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::fprintf(stderr, "toy serve: stopping\n");
  engine.shutdown("the server is shutting down");
  server.stop();
  http.join();
  std::fprintf(stderr, "toy serve: stopped\n");
  return 0;
}

}  // namespace

Run add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API (and a chat page at /)");
  auto f = std::make_shared<ServeFlags>();
  cmd->add_option("-m,--model", f->model, "Model file (GGUF)")->required();
  add_lora_flags(cmd, f->lora);
  cmd->add_option("--host", f->host, "Address to listen on (default 127.0.0.1: this machine only)");
  add_int(cmd, "--port", f->port, 0, 65535, "Port (default 8080; 0: any free port, printed)");
  add_int(cmd, "--parallel,--np", f->parallel, 1, 256, "Sequences decoded together (default 4)");
  add_int(cmd, "-c,--ctx", f->ctx, 2, int64_t(1) << 24,
          "Tokens per slot (default: the model's context, at most 4096)")->default_str("");
  add_int(cmd, "-b,--batch-size", f->batch, 0, int64_t(1) << 24,
          "Tokens one step computes at most: the decoding slots' next tokens, then chunks of the prompts being "
          "prefilled, so a long prompt does not stall the others (default 512; 0: each prompt whole at once)");
  add_int(cmd, "--queue", f->queue, 0, int64_t(1) << 20, "Requests waiting for a slot before 503 (default 64)");
  add_int(cmd, "--max-body", f->max_body, 1, int64_t(1) << 32, "Largest request body in bytes (default 1 MB; 413 over it)");
  cmd->add_option("--api-key", f->api_key, "Require 'Authorization: Bearer KEY' (or set TOY_API_KEY)");
  cmd->add_option("--cache-type", f->cache_type, "KV cache dtype: f32 (default) or f16 (half the memory)");
  cmd->add_option("--name", f->name, "Model name the API reports (default: the file name)");
  cmd->add_option("--chat-template", f->chat_template, "A chat template (.jinja) to use instead of the model's");
  cmd->add_option("--pooling", f->pooling, "/v1/embeddings: mean (default), last or cls token of the hidden states")
      ->check(CLI::IsMember({"mean", "last", "cls"}));
  add_int(cmd, "-t,--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  add_device(cmd, f->device);
  return [f]() {
    if (f->threads) set_num_threads(f->threads);
    return run_serve(*f);
  };
}

}  // namespace toy::cli
