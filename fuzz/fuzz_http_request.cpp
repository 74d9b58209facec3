// toy serve's HTTP front: arbitrary bytes as one or more HTTP/1.1 requests, through
// cpp-httplib's request parser and every route of the server (a tiny random model behind it,
// two slots of 64 tokens, so a valid completion is short). No exception may escape, nothing
// may crash, and every response the server writes starts with a status line.
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "fuzz_common.h"
#include "toy/infer/chat.h"
#include "toy/models/decoder_lm.h"
#include "toy/models/shapes.h"
#include "toy/serve/engine.h"
#include "toy/serve/server.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;

namespace {
struct World {
  std::unique_ptr<Tokenizer> tok = Tokenizer::train_fixed_size(
      "a tiny corpus for a tiny model that the fuzzer's requests talk to", "qwen2", 300);
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<serve::Engine> engine;
  std::unique_ptr<serve::Server> server;
  World() {
    ModelConfig cfg = shape_config("llama", "tiny");
    cfg.vocab = tok->vocab_size();
    model = std::make_unique<DecoderLM>(cfg);
    model->init(1);
    engine = std::make_unique<serve::Engine>(*model, *tok, serve::EngineOptions{.parallel = 2, .ctx = 64, .queue = 4});
    serve::ServerOptions o;
    o.api_key = (std::getenv("TOY_FUZZ_KEY") ? std::getenv("TOY_FUZZ_KEY") : "");
    o.max_body = 4096;
    server = std::make_unique<serve::Server>(*tok, ChatTemplate::from_text(kChatMLTemplate, "ChatML", *tok), *engine, o);
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World w;
  const std::string out = w.server->process_raw(std::string_view(reinterpret_cast<const char*>(data), size));
  FUZZ_ASSERT(out.empty() || out.rfind("HTTP/1.1 ", 0) == 0);
  // A job whose client is gone may still be decoding: let it end, so that each input starts
  // from an idle engine (a finding replays alone) and none is mid-step when the fuzzer exits.
  while (w.engine->active() > 0 || w.engine->waiting() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return 0;
}
