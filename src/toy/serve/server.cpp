#include "toy/serve/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <random>

#include <fmt/format.h>

#include "toy/core/error.h"
#include "toy/serve/openai.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy::serve {

using nlohmann::json;

namespace {

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_body(e)), "application/json");
}

void send_json(httplib::Response& res, const json& j) { res.set_content(dump(j), "application/json"); }

// Compares without leaking how many leading characters matched.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned diff = unsigned(a.size() ^ b.size());
  for (size_t i = 0; i < a.size(); ++i) diff |= unsigned(uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0));
  return diff == 0;
}

json usage_of(const Job& job) {
  return {{"prompt_tokens", job.prompt_tokens},
          {"completion_tokens", job.completion_tokens},
          {"total_tokens", job.prompt_tokens + job.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", job.cached_tokens}}}};
}

// A job that ended with an error: the server is stopping (503) or the model failed (500).
ApiError job_error(const Job& job) {
  const bool stopping = job.error.find("shutting down") != std::string::npos;
  return ApiError(stopping ? 503 : 500, stopping ? "unavailable_error" : "server_error",
                  job.error.empty() ? "generation failed" : job.error);
}

uint64_t random_seed() {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  return counter.fetch_add(0x9E3779B97F4A7C15ull);
}

// httplib's request processing on any Stream (it is protected there).
class HttpServer : public httplib::Server {
 public:
  using httplib::Server::process_request;
  // cpp-httplib 0.11 listens with a backlog of 5 (compiled into the library): a burst of
  // clients past that waits for SYN retries (seconds, then a minute). listen() again on the
  // bound socket raises it (the kernel caps it at net.core.somaxconn).
  void widen_backlog(int n) { ::listen(svr_sock_, n); }
};

// A stream over bytes in memory: reads the request, collects the response.
class MemoryStream : public httplib::Stream {
 public:
  explicit MemoryStream(std::string_view in) : in_(in) {}
  bool is_readable() const override { return at_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size() - at_);
    std::memcpy(ptr, in_.data() + at_, n);
    at_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out.append(ptr, size);
    return ssize_t(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { ip = "127.0.0.1", port = 1; }
  void get_local_ip_and_port(std::string& ip, int& port) const override { ip = "127.0.0.1", port = 2; }
  socket_t socket() const override { return INVALID_SOCKET; }
  size_t remaining() const { return in_.size() - at_; }
  std::string out;

 private:
  std::string_view in_;
  size_t at_ = 0;
};

}  // namespace

std::string Server::process_raw(std::string_view request) {
  MemoryStream s(request);
  auto& http = static_cast<HttpServer&>(*http_);
  for (int i = 0; i < 8 && s.remaining() > 0; ++i) {
    bool closed = false;
    const size_t before = s.remaining();
    http.process_request(s, false, closed, nullptr);
    if (closed || s.remaining() == before) break;
  }
  return s.out;
}

Server::Server(const Tokenizer& tok, const ChatTemplate& tmpl, Engine& engine, ServerOptions o)
    : tok_(tok), tmpl_(tmpl), engine_(engine), o_(std::move(o)), http_(std::make_unique<HttpServer>()) {
  const int threads = o_.http_threads ? o_.http_threads : engine.parallel() + 64 + 16;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_->set_payload_max_length(o_.max_body);
  const auto wt = std::chrono::milliseconds(int64_t(o_.write_timeout_s * 1000));
  http_->set_write_timeout(wt);
  http_->set_read_timeout(std::chrono::seconds(10));
  http_->set_keep_alive_timeout(5);
  routes();
}

Server::~Server() = default;

int Server::bind() {
  if (o_.port == 0) {
    port_ = http_->bind_to_any_port(o_.host);
    TOY_CHECK(port_ > 0, "[serve] cannot listen on {} (any port)", o_.host);
  } else {
    TOY_CHECK(http_->bind_to_port(o_.host, o_.port), "[serve] cannot listen on {}:{}: is it in use, or not an address "
              "of this machine?", o_.host, o_.port);
    port_ = o_.port;
  }
  static_cast<HttpServer&>(*http_).widen_backlog(1024);
  return port_;
}

void Server::run() { http_->listen_after_bind(); }

void Server::stop() { http_->stop(); }

void Server::routes() {
  httplib::Server& h = *http_;
  const std::time_t started = std::time(nullptr);
  auto authorized = [this](const httplib::Request& req, httplib::Response& res) {
    if (o_.api_key.empty()) return true;
    if (same_secret(req.get_header_value("Authorization"), "Bearer " + o_.api_key)) return true;
    send_error(res, ApiError(401, "authentication_error", "Invalid API Key"));
    return false;
  };

  h.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kChatPage, "text/html; charset=utf-8"); });
  h.Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, {{"status", "ok"}}); });
  h.Get("/v1/models", [this, started](const httplib::Request&, httplib::Response& res) {
    send_json(res, {{"object", "list"},
                    {"data", json::array({{{"id", o_.model_name},
                                           {"object", "model"},
                                           {"created", started},
                                           {"owned_by", "toy"},
                                           {"meta", {{"n_ctx_slot", engine_.slot_ctx()},
                                                     {"n_parallel", engine_.parallel()},
                                                     {"n_vocab", tok_.vocab_size()}}}}})}});
  });

  // The slots at a glance (llama-server has /slots): how many decode, how many requests wait.
  h.Get("/slots", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    send_json(res, {{"slots", engine_.parallel()}, {"processing", engine_.active()}, {"waiting", engine_.waiting()},
                    {"n_ctx_slot", engine_.slot_ctx()}, {"steps", engine_.steps()}, {"widest_step", engine_.widest_step()}});
  });

  h.Post("/tokenize", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    try {
      const TokenizeRequest t = parse_tokenize_request(req.body);
      std::vector<int32_t> ids;
      if (t.add_special && tok_.adds_bos()) ids.push_back(tok_.bos_id());
      const std::vector<int32_t> body = t.parse_special ? tok_.encode_special(t.content) : tok_.encode(t.content);
      ids.insert(ids.end(), body.begin(), body.end());
      send_json(res, {{"tokens", ids}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  h.Post("/detokenize", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    try {
      const std::vector<int32_t> ids = parse_detokenize_request(req.body);
      for (int32_t id : ids)
        if (id >= tok_.vocab_size())
          throw bad_request(fmt::format("token id {} is out of the vocabulary [0, {})", id, tok_.vocab_size()), "tokens");
      send_json(res, {{"content", tok_.decode(ids)}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });

  auto completion = [this, authorized](bool chat) {
    return [this, authorized, chat](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      std::shared_ptr<Job> job;
      CompletionRequest cr;
      try {
        cr = parse_completion_request(req.body, chat);
        GenParams p;
        if (chat || !cr.prompt_is_ids) {
          if (tok_.adds_bos()) p.prompt.push_back(tok_.bos_id());
          std::vector<int32_t> body;
          try {
            body = chat ? tok_.encode_special(tmpl_.render(cr.messages, true)) : tok_.encode(cr.prompt);
          } catch (const Error& e) {
            throw bad_request(e.what(), chat ? "messages" : "prompt");
          }
          p.prompt.insert(p.prompt.end(), body.begin(), body.end());
        } else {
          p.prompt = cr.prompt_ids;
        }
        // No prompt at all: start from end-of-text, as toy generate does.
        if (p.prompt.empty()) p.prompt.push_back(tok_.eos_id() >= 0 ? tok_.eos_id() : 0);
        p.max_tokens = cr.max_tokens;
        p.sampling = cr.sampling;
        p.seed = cr.seed ? *cr.seed : random_seed();
        p.stop = cr.stop;
        p.ignore_eos = cr.ignore_eos;
        try {
          job = engine_.submit(std::move(p));
        } catch (const Error& e) {
          throw bad_request(e.what(), chat ? "messages" : "prompt");
        }
        if (!job)
          throw ApiError(503, "unavailable_error", "the server is busy: every slot is decoding and the queue is full; "
                         "retry later");
      } catch (const ApiError& e) {
        return send_error(res, e);
      }
      const std::string id = fmt::format("{}-{:x}", chat ? "chatcmpl" : "cmpl", next_id_++);
      const std::time_t created = std::time(nullptr);
      const std::string model = o_.model_name;
      const char* object = chat ? "chat.completion" : "text_completion";
      if (!cr.stream) {
        const std::string text = job->wait_all();
        if (job->finish_reason == "error") return send_error(res, job_error(*job));
        json choice = {{"index", 0}, {"finish_reason", job->finish_reason}, {"logprobs", nullptr}};
        if (chat)
          choice["message"] = {{"role", "assistant"}, {"content", text}};
        else
          choice["text"] = text;
        return send_json(res, {{"id", id}, {"object", object}, {"created", created}, {"model", model},
                               {"choices", json::array({choice})}, {"usage", usage_of(*job)}});
      }
      // Streaming: server-sent events, one chunk per piece of text, as OpenAI sends them.
      const bool include_usage = cr.include_usage;
      const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      res.set_chunked_content_provider(
          "text/event-stream",
          [job, chat, include_usage, id, created, model, chunk_object](size_t, httplib::DataSink& sink) {
            auto send = [&](const json& j) {
              const std::string s = "data: " + dump(j) + "\n\n";
              return sink.write(s.data(), s.size());
            };
            auto chunk = [&](json delta_or_text, json finish) {
              json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
              if (chat)
                choice["delta"] = std::move(delta_or_text);
              else
                choice["text"] = std::move(delta_or_text);
              return json{{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                          {"choices", json::array({choice})}};
            };
            auto drop = [&] {
              job->cancel();
              return false;
            };
            if (chat && !send(chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr))) return drop();
            std::string piece;
            auto quiet_since = std::chrono::steady_clock::now();
            while (true) {
              const bool ended = job->wait(piece, std::chrono::milliseconds(100));
              const auto now = std::chrono::steady_clock::now();
              if (!piece.empty()) {
                if (!send(chunk(chat ? json{{"content", piece}} : json(piece), nullptr))) return drop();
                quiet_since = now;
              }
              if (ended) break;
              // A comment line now and then: finds a client that left while nothing was sent.
              if (now - quiet_since > std::chrono::seconds(2)) {
                static const std::string beat = ": keep-alive\n\n";
                if (!sink.write(beat.data(), beat.size())) return drop();
                quiet_since = now;
              }
            }
            if (job->finish_reason == "error") {
              send(error_body(job_error(*job)));
            } else {
              send(chunk(chat ? json::object() : json(""), job->finish_reason));
              if (include_usage) {
                send({{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                      {"choices", json::array()}, {"usage", usage_of(*job)}});
              }
              static const std::string done = "data: [DONE]\n\n";
              sink.write(done.data(), done.size());
            }
            sink.done();
            return true;
          },
          [job](bool success) {
            if (!success) job->cancel();
          });
    };
  };
  h.Post("/v1/chat/completions", completion(true));
  h.Post("/chat/completions", completion(true));
  h.Post("/v1/completions", completion(false));
  h.Post("/completions", completion(false));

  h.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // an error we already shaped
    if (res.status == 413)
      send_error(res, ApiError(413, "invalid_request_error",
                               fmt::format("the body is larger than the server's limit of {} bytes (--max-body)",
                                           o_.max_body)));
    else if (res.status == 404)
      send_error(res, ApiError(404, "not_found_error", fmt::format("no endpoint {} {}", req.method, req.path)));
    else
      send_error(res, ApiError(res.status, "invalid_request_error", fmt::format("HTTP error {}", res.status)));
    return httplib::Server::HandlerResponse::Handled;
  }));
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "server_error", what));
  });
}

}  // namespace toy::serve
