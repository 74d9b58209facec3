// toy serve's request bodies: arbitrary bytes as the JSON body of /v1/chat/completions,
// /v1/completions, /tokenize, /detokenize or /v1/embeddings, or as a model's reply read for
// tool calls and reasoning in a format chosen by the second byte (the first byte picks which). Only ApiError may
// escape the parser; a body it accepts gives sampling values the sampler takes, a chat that
// renders (or fails with toy::Error, a 400) and an error object that always serialises.
#include <iterator>
#include <memory>
#include <string_view>

#include "fuzz_common.h"
#include "toy/infer/chat.h"
#include "toy/infer/chat_output.h"
#include "toy/infer/sampler.h"
#include "toy/serve/openai.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int kind = data[0] % 6;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    if (kind == 2) {
      const serve::TokenizeRequest t = serve::parse_tokenize_request(body);
      FUZZ_ASSERT(t.content.size() <= body.size());
      return 0;
    }
    if (kind == 4) {
      const serve::EmbeddingRequest e = serve::parse_embedding_request(body);
      FUZZ_ASSERT(!e.inputs.empty());
      for (const auto& in : e.inputs) FUZZ_ASSERT(in.is_ids ? !in.ids.empty() : !in.text.empty());
      return 0;
    }
    if (kind == 5) {  // a reply: the text is the body after a byte choosing the template markers
      static const char* const kMarkers[] = {"<tool_call>", "<function=", "<arg_key>", "[TOOL_CALLS][ARGS]", "[TOOL_CALLS]",
                                             "<｜tool▁calls▁begin｜>```json", "<｜tool▁calls▁begin｜>",
                                             "<|tool_calls_section_begin|>", "<|start_header_id|>parameters",
                                             "<|channel|><|message|>", ">>>all", "<|START_ACTION|>", "<TOOLCALL>",
                                             "<|tool_call|>", "<|tools_prefix|>", "<tool_call|>", "<seed:tool_call>",
                                             "<minimax:tool_call>", "<function name=", "<think></think>"};
      if (body.empty()) return 0;
      const ChatSyntax syntax = ChatSyntax::detect(kMarkers[uint8_t(body[0]) % std::size(kMarkers)]);
      for (bool partial : {false, true}) {
        const ChatReply r = parse_chat_reply(body.substr(1), syntax, true, partial);
        for (const ToolCall& c : r.tool_calls) FUZZ_ASSERT(nlohmann::json::parse(c.arguments).is_object());
        FUZZ_ASSERT(!r.call_in_progress || (partial && !r.call_in_progress->name.empty()));
      }
      // Streamed in halves: the streamer's deltas never send a call twice.
      ToolCallStreamer streamer;
      size_t headers = 0;
      for (const ChatReply& r : {parse_chat_reply(body.substr(1, body.size() / 2), syntax, true, true),
                                 parse_chat_reply(body.substr(1), syntax, true, true),
                                 parse_chat_reply(body.substr(1), syntax, true, false)})
        for (const ToolCallStreamer::Delta& d : streamer.update(r, true)) headers += d.header;
      FUZZ_ASSERT(headers == streamer.calls());
      return 0;
    }
    if (kind == 3) {
      for (int32_t id : serve::parse_detokenize_request(body)) FUZZ_ASSERT(id >= 0);
      return 0;
    }
    const serve::CompletionRequest r = serve::parse_completion_request(body, kind == 0);
    FUZZ_ASSERT(r.max_tokens >= -1);
    FUZZ_ASSERT(r.chat == (kind == 0));
    FUZZ_ASSERT(!r.chat || !r.messages.empty());
    for (const std::string& s : r.stop) FUZZ_ASSERT(!s.empty());
    Sampler check(r.sampling, r.seed.value_or(0));  // a validated request never makes the sampler throw
    if (r.chat) {
      // The messages render through ChatML (or fail with toy::Error, a 400) and tokenize.
      static const std::unique_ptr<Tokenizer> tok = Tokenizer::train_fixed_size("a tiny corpus", "qwen2", 300);
      static const ChatTemplate chatml = ChatTemplate::from_text(kChatMLTemplate, "ChatML", *tok);
      try {
        const ChatText t = chatml.render(r.messages, true);
        for (int32_t id : chatml.prompt_ids(*tok, t)) FUZZ_ASSERT(id >= 0 && id < tok->vocab_size());
      } catch (const Error&) {
      }
    }
    (void)serve::dump(nlohmann::json{{"text", r.prompt}});
  } catch (const serve::ApiError& e) {
    FUZZ_ASSERT(e.status == 400);
    FUZZ_ASSERT(!serve::dump(serve::error_body(e)).empty());
  }
  return 0;
}
