// Chat prompts: a conversation rendered by the model's own chat template
// (tokenizer.chat_template, run by toy's Jinja engine as Hugging Face's apply_chat_template
// runs it, toy/chat/chat_render.h) and tokenized as llama.cpp tokenizes a chat prompt, with
// two differences that keep a conversation what it says:
// - the messages' own text is text: a control token's text a user writes in `content`
//   ("<|im_end|><|im_start|>system") stays text; only the template's markers (and bos_token)
//   become special tokens;
// - the BOS follows the vocabulary: added when tokenizer.ggml.add_bos_token says so, and a
//   BOS the template writes at the start is not doubled.
// A file without a template gets ChatML, as llama.cpp assumes; `--chat-template FILE`
// replaces the model's.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "toy/chat/chat_render.h"
#include "toy/infer/chat_output.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy::gguf {
class Reader;
}

namespace toy {

struct ChatMessage {
  std::string role;  // system, user, assistant, tool ... (what the template knows)
  std::string content;
};

// A rendered conversation: its text (after the BOS the vocabulary adds by itself) and the
// byte ranges in it where the messages' text spelled a control token (to be tokenized as text).
struct ChatText {
  std::string text;
  std::vector<Tokenizer::Span> plain;

  ChatText tail(size_t from) const;  // the text from byte `from` on, its spans moved along
};

class ChatTemplate {
 public:
  // The model file's template, or ChatML when it has none.
  static ChatTemplate from_model(const gguf::Reader& r, const Tokenizer& tok);
  // A template from a .jinja file (--chat-template FILE).
  static ChatTemplate from_file(const std::string& path, const Tokenizer& tok);
  // --chat-template FILE when `path` is not empty, else the model's.
  static ChatTemplate choose(const std::string& path, const gguf::Reader& r, const Tokenizer& tok);
  // Template text given directly (`name` says where it came from in messages).
  static ChatTemplate from_text(std::string text, std::string name, const Tokenizer& tok);

  bool defaulted() const { return defaulted_; }  // the model has none: ChatML
  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }  // the Jinja text
  // How replies in this template's format spell tool calls and reasoning (chat_output.h).
  const ChatSyntax& syntax() const { return syntax_; }

  // `messages` a JSON array of message objects (role, content, and what the template reads:
  // tool_calls, reasoning_content ...), `tools` an array or null. Throws toy::Error (the
  // template's own message when it refuses the conversation).
  ChatText render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                  const nlohmann::ordered_json& tools = nullptr) const;
  ChatText render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // Tokens of a rendered text (no BOS), and the whole prompt (BOS when the vocabulary adds one).
  std::vector<int32_t> tokenize(const Tokenizer& tok, const ChatText& t) const;
  std::vector<int32_t> prompt_ids(const Tokenizer& tok, const ChatText& t) const;

 private:
  ChatTemplate(std::string text, std::string name, bool defaulted, const Tokenizer& tok);

  std::string source_, name_;
  bool defaulted_ = false;
  ChatRenderer renderer_;
  ChatSyntax syntax_;
  std::string bos_, eos_;             // the vocabulary's, as the template's bos_token/eos_token
  bool strip_bos_ = false;            // the vocabulary adds a BOS: one the template writes first goes
  std::vector<std::string> controls_;  // control tokens' texts (what a message may not spell)
};

// The template llama.cpp assumes for a file without one.
extern const char* const kChatMLTemplate;

}  // namespace toy
