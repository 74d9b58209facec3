#include "toy/serve/server.h"

#include <httplib.h>
#include <malloc.h>
#include <strings.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <random>

#include <fmt/format.h>

#include "toy/core/error.h"
#include "toy/infer/grammar_mask.h"
#include "toy/infer/tool_grammar.h"
#include "toy/serve/connection.h"
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

// "Authorization: Bearer KEY", the scheme in any case (RFC 9110: schemes are case-insensitive).
bool bearer_is(const std::string& header, const std::string& key) {
  const bool scheme = header.size() > 7 && strncasecmp(header.c_str(), "bearer ", 7) == 0;
  const size_t at = scheme ? header.find_first_not_of(' ', 7) : std::string::npos;
  return same_secret(at == std::string::npos ? std::string() : header.substr(at), key) && scheme;
}

json usage_of(const Job& job) {
  return {{"prompt_tokens", job.prompt_tokens},
          {"completion_tokens", job.completion_tokens},
          {"total_tokens", job.prompt_tokens + job.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", job.cached_tokens}}}};
}

// RFC 4648 base64 (embeddings' encoding_format).
std::string base64(std::string_view bytes) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = uint32_t(uint8_t(bytes[i])) << 16 | (i + 1 < bytes.size() ? uint32_t(uint8_t(bytes[i + 1])) << 8 : 0) |
                       (i + 2 < bytes.size() ? uint32_t(uint8_t(bytes[i + 2])) : 0);
    out += kDigits[n >> 18];
    out += kDigits[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kDigits[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kDigits[n & 63] : '=';
  }
  return out;
}

// A call's id: the one the model wrote, else made from the reply's (unique per reply and index).
std::string call_id(const std::string& given, const std::string& reply_id, size_t index) {
  return given.empty() ? fmt::format("call_{}_{}", reply_id.substr(reply_id.find('-') + 1), index) : given;
}

// OpenAI's tool_calls of a whole reply.
json tool_calls_json(const std::vector<ToolCall>& calls, const std::string& reply_id) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i)
    out.push_back({{"id", call_id(calls[i].id, reply_id, i)},
                   {"type", "function"},
                   {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  return out;
}

// Log-probabilities in OpenAI's shapes: chat {"content": [{token, logprob, bytes, top_logprobs}]},
// completions {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
json logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, bool chat, int64_t& text_offset) {
  auto bytes_of = [&](int32_t id) {
    json b = json::array();
    for (char c : tok.token_bytes(id)) b.push_back(int(uint8_t(c)));
    return b;
  };
  if (chat) {
    json content = json::array();
    for (const TokenLogprob& lp : lps) {
      json top = json::array();
      for (const auto& [id, v] : lp.top) top.push_back({{"token", tok.token_bytes(id)}, {"logprob", v}, {"bytes", bytes_of(id)}});
      content.push_back({{"token", tok.token_bytes(lp.id)}, {"logprob", lp.logprob}, {"bytes", bytes_of(lp.id)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& lp : lps) {
    tokens.push_back(tok.token_bytes(lp.id));
    values.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [id, v] : lp.top) top[tok.token_bytes(id)] = v;
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += int64_t(tok.token_bytes(lp.id).size());
  }
  return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(values)}, {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

// A job that ended with an error: the server is stopping (503) or the model failed (500).
ApiError job_error(const Job& job) {
  const bool stopping = job.error.find("shutting down") != std::string::npos;
  return ApiError(stopping ? 503 : 500, stopping ? "unavailable_error" : "server_error",
                  job.error.empty() ? "generation failed" : job.error);
}

// The refusal of a request that never arrived whole: 431 (its head over kMaxHead) or 408.
ApiError unfinished_request_error(bool head_too_large) {
  return head_too_large ? ApiError(431, "invalid_request_error",
                                   fmt::format("the request line and headers are larger than {} bytes", kMaxHead))
                        : ApiError(408, "invalid_request_error", "the request did not arrive in time");
}

uint64_t random_seed() {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  return counter.fetch_add(0x9E3779B97F4A7C15ull);
}

// httplib's request processing on any Stream (it is protected there), and its per-connection
// loop replaced by toy's (connection.h: one deadline per request, capped headers, the
// connection known to the handler). process_and_close_socket is httplib's virtual for this.
class HttpServer : public httplib::Server {
 public:
  using httplib::Server::process_request;
  // cpp-httplib 0.11 listens with a backlog of 5 (compiled into the library): a burst of
  // clients past that waits for SYN retries (seconds, then a minute). listen() again on the
  // bound socket raises it (the kernel caps it at net.core.somaxconn).
  void widen_backlog(int n) { ::listen(svr_sock_, n); }

  Clock::duration request_timeout = std::chrono::seconds(10), idle_timeout = std::chrono::seconds(2);
  size_t max_request_bytes = size_t(1) << 21;

 private:
  bool process_and_close_socket(socket_t sock) override {
    open_.fetch_add(1);
    Connection conn;
    conn.sock = sock;
    ConnectionStream strm(conn, idle_timeout, request_timeout,
                          std::chrono::seconds(write_timeout_sec_) + std::chrono::microseconds(write_timeout_usec_),
                          max_request_bytes);
    const auto stopping = [this] { return svr_sock_ == INVALID_SOCKET; };
    for (size_t n = 1; n <= keep_alive_max_count_; ++n) {
      if (!strm.next_request(std::chrono::seconds(keep_alive_timeout_sec_), stopping)) break;
      conn.close_after = conn.head_too_large = conn.timed_out = false;
      bool closed = false;
      current_connection() = &conn;
      const bool ok = process_request(strm, n == keep_alive_max_count_, closed, nullptr);
      current_connection() = nullptr;
      if (!ok && strm.written() == 0 && (conn.head_too_large || conn.timed_out)) {
        // It failed inside the request line or headers, before httplib could answer.
        const ApiError e = unfinished_request_error(conn.head_too_large);
        const std::string body = dump(error_body(e));
        const std::string r = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
                                          "Connection: close\r\n\r\n{}",
                                          e.status, e.status == 431 ? "Request Header Fields Too Large" : "Request Timeout",
                                          body.size(), body);
        strm.write(r.data(), r.size());
      }
      if (!ok || closed || conn.close_after || conn.head_too_large || conn.timed_out) break;
    }
    linger_close(sock);
    // The last connection gone: hand the memory a burst of requests left in the allocator's
    // free lists back to the system (glibc keeps it otherwise: 160-340 MB after a crowd).
    // (At most once a second: one client with a connection per request would otherwise trim
    // after every request.)
    if (open_.fetch_sub(1) == 1) {
      const int64_t now = Clock::now().time_since_epoch().count();
      int64_t last = last_trim_.load();
      if (now - last >= std::chrono::nanoseconds(std::chrono::seconds(1)).count() &&
          last_trim_.compare_exchange_strong(last, now))
        malloc_trim(0);
    }
    return true;
  }

  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> last_trim_{0};
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
  Connection conn;  // (no socket)
  for (int i = 0; i < 8 && s.remaining() > 0; ++i) {
    bool closed = false;
    const size_t before = s.remaining();
    conn.close_after = false;
    current_connection() = &conn;
    http.process_request(s, false, closed, nullptr);
    current_connection() = nullptr;
    if (closed || conn.close_after || s.remaining() == before) break;
  }
  return s.out;
}

Server::Server(const Tokenizer& tok, const ChatTemplate& tmpl, Engine& engine, ServerOptions o)
    : tok_(tok), vocab_(grammar_vocab(tok)), tmpl_(tmpl), engine_(engine), o_(std::move(o)), http_(std::make_unique<HttpServer>()) {
  // A thread per open connection, started as needed: a slow client holds only its own.
  const size_t threads = o_.http_threads ? size_t(o_.http_threads) : 1024;
  http_->new_task_queue = [threads] { return new ElasticPool(threads); };
  auto& hs = static_cast<HttpServer&>(*http_);
  hs.request_timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.request_timeout_s));
  hs.idle_timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.read_idle_timeout_s));
  hs.max_request_bytes = o_.max_body + kMaxHead + (64 << 10);  // (chunk framing)
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
    if (bearer_is(req.get_header_value("Authorization"), o_.api_key)) return true;
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

  // Embeddings: pooled final hidden states, unit length (OpenAI's shape; base64 = float32 LE).
  auto embeddings = [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    try {
      const EmbeddingRequest er = parse_embedding_request(req.body);
      std::vector<std::vector<int32_t>> inputs;
      int64_t tokens = 0;
      for (const EmbeddingInput& in : er.inputs) {
        std::vector<int32_t> ids;
        if (in.is_ids) {
          ids = in.ids;
        } else {
          if (tok_.adds_bos()) ids.push_back(tok_.bos_id());
          const std::vector<int32_t> body = tok_.encode(in.text);
          ids.insert(ids.end(), body.begin(), body.end());
        }
        tokens += int64_t(ids.size());
        inputs.push_back(std::move(ids));
      }
      std::vector<std::vector<float>> vectors;
      try {
        vectors = engine_.embed(std::move(inputs), o_.pooling);
      } catch (const Error& e) {
        throw bad_request(e.what(), "input");
      }
      json data = json::array();
      for (size_t i = 0; i < vectors.size(); ++i) {
        json item = {{"object", "embedding"}, {"index", i}};
        if (er.base64) {
          std::string bytes(reinterpret_cast<const char*>(vectors[i].data()), vectors[i].size() * sizeof(float));
          item["embedding"] = base64(bytes);
        } else {
          item["embedding"] = vectors[i];
        }
        data.push_back(std::move(item));
      }
      send_json(res, {{"object", "list"}, {"data", std::move(data)}, {"model", o_.model_name},
                      {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  };
  h.Post("/v1/embeddings", embeddings);
  h.Post("/embeddings", embeddings);

  // Prometheus text (llama-server's --metrics, named toy:...).
  h.Get("/metrics", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    res.set_content(prometheus_text(engine_.metrics(), counts_, engine_.parallel()), "text/plain; version=0.0.4");
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
      ++(chat ? counts_.chat : counts_.completions);
      std::shared_ptr<Job> job;
      CompletionRequest cr;
      // Chat replies read in the template's format (tool calls, reasoning) when there is one to read.
      ChatSyntax syntax;
      bool offer_tools = false, structured = false;
      try {
        cr = parse_completion_request(req.body, chat, vocab_);
        offer_tools = chat && !cr.tools.is_null() && cr.tool_choice != "none";
        for (const auto& [id, bias] : cr.sampling.logit_bias)
          if (id >= tok_.vocab_size())
            throw bad_request(fmt::format("'logit_bias': token {} is outside the vocabulary [0, {})", id,
                                          tok_.vocab_size()), "logit_bias");
        GenParams p;
        if (chat || !cr.prompt_is_ids) {
          try {
            if (chat) {
              const ChatText text = tmpl_.render(cr.messages, true, offer_tools ? cr.tools : nullptr);
              p.prompt = tmpl_.prompt_ids(tok_, text);
              syntax = tmpl_.syntax().for_prompt(text.text);
              structured = offer_tools || !syntax.think_open.empty() || syntax.tools == ToolCallFormat::GptOss;
              if (cr.tool_choice == "required") {  // the reply is calls, in the template's format
                try {
                  cr.grammar = Grammar::parse_cached(
                      tool_call_gbnf(syntax, cr.tools, cr.tool_choice_name, cr.parallel_tool_calls, tok_), vocab_);
                  GrammarMatcher start(cr.grammar);  // (rules that expand without end fail here)
                } catch (const Error& e) {
                  throw bad_request(e.what(), "tool_choice");
                }
              }
            } else {
              if (tok_.adds_bos()) p.prompt.push_back(tok_.bos_id());
              const std::vector<int32_t> body = tok_.encode(cr.prompt);
              p.prompt.insert(p.prompt.end(), body.begin(), body.end());
            }
          } catch (const Error& e) {
            throw bad_request(e.what(), chat ? "messages" : "prompt");
          }
        } else {
          p.prompt = cr.prompt_ids;
        }
        // No prompt at all: start from end-of-text, as toy generate does.
        if (p.prompt.empty()) p.prompt.push_back(tok_.eos_id() >= 0 ? tok_.eos_id() : 0);
        // More than the slot's context leaves after the prompt is refused, not cut short silently.
        const int64_t room = engine_.slot_ctx() - int64_t(p.prompt.size());
        if (room > 0 && cr.max_tokens > room)
          throw bad_request(fmt::format("max_tokens is {}, but the prompt's {} tokens leave {} of the slot's context of "
                                        "{}: ask for at most {} (or -1: until the context ends)",
                                        cr.max_tokens, p.prompt.size(), room, engine_.slot_ctx(), room),
                            "max_tokens");
        p.max_tokens = cr.max_tokens;
        p.sampling = cr.sampling;
        p.seed = cr.seed ? *cr.seed : random_seed();
        p.stop = cr.stop;
        p.ignore_eos = cr.ignore_eos;
        p.top_logprobs = cr.top_logprobs;
        p.grammar = cr.grammar;
        try {
          job = engine_.submit(std::move(p));
        } catch (const Error& e) {
          throw bad_request(e.what(), chat ? "messages" : "prompt");
        }
        if (!job)
          throw ApiError(503, "unavailable_error", "the server is busy: every slot is decoding and the queue is full; "
                         "retry later");
      } catch (const ApiError& e) {
        ++counts_.rejected;
        return send_error(res, e);
      }
      const std::string id = fmt::format("{}-{:x}", chat ? "chatcmpl" : "cmpl", next_id_++);
      const std::time_t created = std::time(nullptr);
      const std::string model = o_.model_name;
      const char* object = chat ? "chat.completion" : "text_completion";
      if (!cr.stream) {
        // In slices: a client that closed its connection cancels its job (the slot is free at
        // the next step) instead of holding the slot to the end.
        Connection* conn = current_connection();
        std::string text, piece;
        for (bool ended = false; !ended;) {
          ended = job->wait(piece, std::chrono::milliseconds(100));
          text += piece;
          if (!ended && conn && conn->sock >= 0 && !job->cancelled() && peer_gone(conn->sock)) job->cancel();
        }
        if (job->finish_reason == "cancelled") {  // nobody is left to answer
          if (conn) conn->close_after = true;
          return;
        }
        if (job->finish_reason == "error") return send_error(res, job_error(*job));
        json choice = {{"index", 0}, {"finish_reason", job->finish_reason}, {"logprobs", nullptr}};
        if (cr.top_logprobs >= 0) {
          int64_t offset = 0;
          choice["logprobs"] = logprobs_json(tok_, job->take_logprobs(), chat, offset);
        }
        if (chat && structured) {
          ChatReply reply = parse_chat_reply(text, syntax, offer_tools, false);
          if (!cr.parallel_tool_calls && reply.tool_calls.size() > 1) reply.tool_calls.resize(1);
          json message = {{"role", "assistant"},
                          {"content", reply.content.empty() && !reply.tool_calls.empty() ? json(nullptr) : json(reply.content)}};
          if (!reply.reasoning.empty()) message["reasoning_content"] = reply.reasoning;
          if (!reply.tool_calls.empty()) {
            message["tool_calls"] = tool_calls_json(reply.tool_calls, id);
            if (job->finish_reason == "stop") choice["finish_reason"] = "tool_calls";
          }
          choice["message"] = std::move(message);
        } else if (chat) {
          choice["message"] = {{"role", "assistant"}, {"content", text}};
        } else {
          choice["text"] = text;
        }
        return send_json(res, {{"id", id}, {"object", object}, {"created", created}, {"model", model},
                               {"choices", json::array({choice})}, {"usage", usage_of(*job)}});
      }
      // Streaming: server-sent events, one chunk per piece of text, as OpenAI sends them.
      const bool include_usage = cr.include_usage;
      const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      const bool parallel = cr.parallel_tool_calls;
      const bool want_logprobs = cr.top_logprobs >= 0;
      const Tokenizer* tok = &tok_;
      auto provider = [job, chat, include_usage, id, created, model, chunk_object, syntax, offer_tools, structured,
                       parallel, want_logprobs, tok, text_offset = int64_t(0)](size_t, httplib::DataSink& sink) mutable {
            auto send = [&](const json& j) {
              const std::string s = "data: " + dump(j) + "\n\n";
              return sink.write(s.data(), s.size());
            };
            std::vector<TokenLogprob> pending;  // log-probabilities not yet sent: they ride on the next chunk
            auto chunk = [&](json delta_or_text, json finish) {
              json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
              if (want_logprobs) {
                std::vector<TokenLogprob> more = job->take_logprobs();
                pending.insert(pending.end(), more.begin(), more.end());
                if (!pending.empty()) choice["logprobs"] = logprobs_json(*tok, pending, chat, text_offset);
                pending.clear();
              }
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
            // A structured reply streams as what its parse adds: reasoning, content, and tool
            // calls (a call's header once its name is whole, then its arguments as written).
            std::string all;
            ChatReply sent;
            ToolCallStreamer calls;
            auto send_parsed = [&](bool partial) {
              ChatReply now = parse_chat_reply(all, syntax, offer_tools, partial);
              if (!parallel && now.tool_calls.size() > 1) now.tool_calls.resize(1);
              auto grown = [](const std::string& was, const std::string& is) {
                return is.size() > was.size() && is.starts_with(was) ? is.substr(was.size()) : std::string();
              };
              bool ok = true;
              if (const std::string d = grown(sent.reasoning, now.reasoning); !d.empty())
                ok = ok && send(chunk(json{{"reasoning_content", d}}, nullptr)), sent.reasoning = now.reasoning;
              if (const std::string d = grown(sent.content, now.content); !d.empty())
                ok = ok && send(chunk(json{{"content", d}}, nullptr)), sent.content = now.content;
              json deltas = json::array();
              for (const ToolCallStreamer::Delta& d : calls.update(now, parallel)) {
                json one = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
                if (d.header) {
                  one["id"] = call_id(d.id, id, d.index);
                  one["type"] = "function";
                  one["function"]["name"] = d.name;
                }
                deltas.push_back(std::move(one));
              }
              if (!deltas.empty()) ok = ok && send(chunk(json{{"tool_calls", std::move(deltas)}}, nullptr));
              return ok;
            };
            std::string piece;
            auto quiet_since = std::chrono::steady_clock::now();
            while (true) {
              const bool ended = job->wait(piece, std::chrono::milliseconds(100));
              const auto now = std::chrono::steady_clock::now();
              if (!piece.empty()) {
                if (structured) {
                  all += piece;
                  if (!send_parsed(true)) return drop();
                } else if (!send(chunk(chat ? json{{"content", piece}} : json(piece), nullptr))) {
                  return drop();
                }
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
              if (structured && !send_parsed(false)) return drop();
              const bool called = calls.calls() > 0 && job->finish_reason == "stop";
              send(chunk(chat ? json::object() : json(""), called ? "tool_calls" : job->finish_reason));
              if (include_usage) {
                send({{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                      {"choices", json::array()}, {"usage", usage_of(*job)}});
              }
              static const std::string done = "data: [DONE]\n\n";
              sink.write(done.data(), done.size());
            }
            sink.done();
            return true;
          };
      auto release = [job](bool success) {
        if (!success) job->cancel();
      };
      if (req.version == "HTTP/1.0") {
        // An HTTP/1.0 client cannot read chunks: the body is plain, and ends with the connection.
        res.set_header("Connection", "close");
        if (Connection* conn = current_connection()) conn->close_after = true;
        res.set_content_provider("text/event-stream", std::move(provider), std::move(release));
      } else {
        res.set_chunked_content_provider("text/event-stream", std::move(provider), std::move(release));
      }
    };
  };
  h.Post("/v1/chat/completions", completion(true));
  h.Post("/chat/completions", completion(true));
  h.Post("/v1/completions", completion(false));
  h.Post("/completions", completion(false));

  // A request that states its length twice, or two ways, is refused before its body is read
  // (which length a proxy in front used is anyone's guess: request smuggling), and the
  // connection is closed after the answer.
  h.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    const bool chunked = req.has_header("Transfer-Encoding"), length = req.has_header("Content-Length");
    if ((chunked && length) || req.get_header_value_count("Content-Length") > 1) {
      send_error(res, bad_request("a request carries one Content-Length or Transfer-Encoding, not both"));
      res.set_header("Connection", "close");
      if (Connection* conn = current_connection()) conn->close_after = true;
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  h.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // an error we already shaped
    Connection* conn = current_connection();
    if (conn && res.status != 404) {  // httplib's own refusal (bad head or body): answer, then close
      conn->close_after = true;
      res.set_header("Connection", "close");
      if (res.status == 400 && conn->head_too_large) res.status = 431;
      else if (res.status == 400 && conn->timed_out) res.status = 408;
    }
    if (res.status == 431 || res.status == 408)
      send_error(res, unfinished_request_error(res.status == 431));
    else if (res.status == 413)
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
