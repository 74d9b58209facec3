// Chat templates: the conversation as the text a model was tuned on. toy does not run the
// Jinja in tokenizer.chat_template; it recognises the family the template belongs to and
// renders that format exactly, as llama.cpp's built-in templates do:
//   chatml  — <|im_start|>role\ncontent<|im_end|>\n ... (Qwen, SmolLM2, and files with no
//             template, as llama.cpp falls back to it)
//   llama3  — <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ... (Llama 3.x;
//             the BOS comes from the vocabulary's add_bos_token, not the text)
// Any other template is an error naming what toy knows, never a guess.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace toy::gguf {
class Reader;
}

namespace toy {

enum class ChatFormat { ChatML, Llama3 };

struct ChatMessage {
  std::string role;  // system, user, assistant (or any role the format can spell)
  std::string content;
};

struct ChatTemplate {
  ChatFormat format = ChatFormat::ChatML;
  bool defaulted = false;  // the file has no template: ChatML, as llama.cpp assumes

  // Recognises `jinja` (a tokenizer.chat_template value); throws toy::Error for a template
  // of another family.
  static ChatTemplate recognise(std::string_view jinja);
  // The model file's template (tokenizer.chat_template), or ChatML when it has none.
  static ChatTemplate from_model(const gguf::Reader& r);

  std::string name() const;
  // The conversation as text; with add_generation_prompt, the opening of the assistant's turn.
  // Throws for a role with a line break or a format marker in it.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
};

}  // namespace toy
