// Chat templates rendered as Hugging Face's tokenizer.apply_chat_template renders them, with
// toy's own Jinja2 engine (toy::jinja, in this folder).
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace toy {

// Renders a chat template for one conversation as Hugging Face's apply_chat_template does
// (trim_blocks, lstrip_blocks, loopcontrols, tojson keeping non-ASCII, generation blocks,
// raise_exception, strftime_now). `conversation` is {"messages": [...], "tools"?: [...],
// "add_generation_prompt"?: bool (default true), "bos_token"?: str (default ""),
// "eos_token"?: str (default ""), "now"?: "YYYY-MM-DDTHH:MM:SS" (the local time strftime_now uses)}.
// Variables given to the template: messages, add_generation_prompt, bos_token, eos_token,
// tools only when the conversation has "tools", and any other key of the conversation as a
// variable of its own (HF's template kwargs, e.g. "enable_thinking"). Throws toy::Error (the
// template's own message for raise_exception).
std::string render_chat_template(std::string_view template_text, const nlohmann::ordered_json& conversation);

namespace jinja {
class Template;
}

// A chat template parsed once, rendered for many conversations (a server's requests).
class ChatRenderer {
 public:
  explicit ChatRenderer(std::string_view template_text);  // throws toy::Error for a syntax error
  std::string render(const nlohmann::ordered_json& conversation) const;  // as render_chat_template

 private:
  std::shared_ptr<const jinja::Template> template_;
};

}  // namespace toy
