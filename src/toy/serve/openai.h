// The OpenAI API's request bodies, validated (no sockets here, so a fuzz target can drive
// it): /v1/chat/completions and /v1/completions bodies into a CompletionRequest, and the
// error object every failure answers with. A bad body is an ApiError naming the field; the
// server answers it with the status it carries.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "toy/infer/chat.h"
#include "toy/infer/grammar.h"
#include "toy/infer/sampler.h"

namespace toy::serve {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message, std::string param = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)) {}
  int status;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, ...
  std::string param;  // the field at fault, when there is one
};

// A 400 for a malformed or invalid body.
ApiError bad_request(const std::string& message, const std::string& param = "");

// {"error": {"message", "type", "param", "code"}} (code: the HTTP status, as llama-server).
nlohmann::json error_body(const ApiError& e);

// Sampling defaults when a request leaves a field out (llama-server's).
SamplerConfig default_sampling();

struct CompletionRequest {
  bool chat = false;
  // chat: the conversation, each message as the client sent it (keys in its order) but for
  // `content` as text (text parts joined) and tool calls' `arguments` as the JSON object
  // templates expect (OpenAI sends a string).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // chat: the functions the model may call (OpenAI's `tools`, passed to the template; null:
  // none), whether it may ("auto"; "none": not offered), and whether more than one per reply.
  // "required": a reply must call one (`tool_choice_name`, when the client named it).
  nlohmann::ordered_json tools = nullptr;
  std::string tool_choice = "auto";
  std::string tool_choice_name;
  bool parallel_tool_calls = true;
  std::string prompt;                 // completions: the text ...
  std::vector<int32_t> prompt_ids;    // ... or token ids
  bool prompt_is_ids = false;
  int64_t max_tokens = -1;  // -1: until end of text or the end of the context
  SamplerConfig sampling = default_sampling();
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
  bool ignore_eos = false;  // llama-server's extension: generate past end-of-text (benchmarks)
  // Log-probabilities: -1 none; else each token's and this many alternatives (chat: logprobs
  // true with top_logprobs K; completions: logprobs K), K <= 20.
  int top_logprobs = -1;
  // Structured output: response_format json_object / json_schema (compiled to GBNF), or a
  // `grammar` in GBNF (llama-server's field); null: unconstrained.
  std::shared_ptr<const Grammar> grammar;
};

// Parses and validates a body; throws ApiError (400) naming the field for malformed JSON, a
// field of the wrong type or out of range, n != 1, a missing prompt or messages.
// `vocab` resolves the token references of a `grammar` (<think>, <[id]>).
CompletionRequest parse_completion_request(std::string_view body, bool chat, const GrammarVocab& vocab = {});

// /v1/embeddings: `input` a string, a list of strings, a list of token ids or a list of such
// lists; `encoding_format` float (default) or base64; `model`, `user` accepted; anything else
// (`dimensions`...) a 400 naming it.
struct EmbeddingInput {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};
struct EmbeddingRequest {
  std::vector<EmbeddingInput> inputs;
  bool base64 = false;
};
EmbeddingRequest parse_embedding_request(std::string_view body);

// /tokenize {content, add_special = false, parse_special = true} and /detokenize {tokens}.
struct TokenizeRequest {
  std::string content;
  bool add_special = false, parse_special = true;
};
TokenizeRequest parse_tokenize_request(std::string_view body);
std::vector<int32_t> parse_detokenize_request(std::string_view body);

// JSON text of j; invalid UTF-8 (a model can emit any bytes) becomes U+FFFD, never a throw.
std::string dump(const nlohmann::json& j);

}  // namespace toy::serve
