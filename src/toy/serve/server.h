// `toy serve`'s HTTP side: the OpenAI-compatible endpoints over cpp-httplib, shaped as
// llama-server shapes them, in front of an Engine (engine.h).
//   GET  /                      the chat page (one self-contained HTML file in the binary)
//   GET  /health                {"status": "ok"}                     (no key needed)
//   GET  /v1/models             the one model                        (no key needed)
//   POST /v1/chat/completions   messages through the chat template
//   POST /v1/completions        a prompt (text or token ids)
//   POST /tokenize, /detokenize
//   GET  /slots                 slots decoding, requests waiting, batched steps so far
// With an API key every other endpoint wants "Authorization: Bearer KEY" (401 otherwise).
// Errors are OpenAI error objects: 400 bad body (or max_tokens past the slot's context), 401,
// 404, 408 a request that did not arrive within request_timeout_s, 413 body over max_body,
// 431 headers over 32 KB, 503 when every slot is busy and the queue is full (or the server is
// stopping). A non-streaming request whose client has gone cancels its job.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "toy/infer/chat.h"
#include "toy/serve/engine.h"
#include "toy/serve/metrics.h"

namespace httplib {
class Server;
}

namespace toy::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (port() says which)
  std::string api_key;
  size_t max_body = size_t(1) << 20;
  std::string model_name = "toy";
  Pooling pooling = Pooling::Mean;  // /v1/embeddings
  int http_threads = 0;     // the most connections served at once (a thread each); 0: 1024
  double write_timeout_s = 10;  // a client that stops reading is dropped after this
  double request_timeout_s = 10;   // a request's line, headers and body must all arrive within this
  double read_idle_timeout_s = 2;  // ... with no silence longer than this (else 408, connection closed)
};

class Server {
 public:
  Server(const Tokenizer& tok, const ChatTemplate& tmpl, Engine& engine, ServerOptions o);
  ~Server();
  // Binds (throws toy::Error naming the address when it cannot); returns the port.
  int bind();
  // Serves until stop(); returns when the listener has closed.
  void run();
  // Stops accepting and returns once every handler has finished (engine.shutdown() first makes
  // in-flight streams end with an error event).
  void stop();
  int port() const { return port_; }
  // Runs the raw bytes of one or more HTTP requests through the server's parser and handlers
  // without a socket; returns the raw bytes of the responses (the fuzz target's entry).
  std::string process_raw(std::string_view request);

 private:
  void routes();
  const Tokenizer& tok_;
  GrammarVocab vocab_;  // what grammars' token references resolve against
  ChatTemplate tmpl_;
  Engine& engine_;
  ServerOptions o_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::atomic<uint64_t> next_id_{1};
  RequestCounts counts_;  // for GET /metrics
};

// The chat page (chat.html, embedded at build time).
extern const char* const kChatPage;

}  // namespace toy::serve
