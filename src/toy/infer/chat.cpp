#include "toy/infer/chat.h"

#include <cctype>

#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"

namespace toy {

namespace {
// Llama 3's template trims each message (as llama.cpp's built-in one does).
std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}
}  // namespace

ChatTemplate ChatTemplate::recognise(std::string_view jinja) {
  ChatTemplate t;
  const bool chatml = jinja.find("<|im_start|>") != std::string_view::npos;
  const bool llama3 = jinja.find("<|start_header_id|>") != std::string_view::npos &&
                      jinja.find("<|end_header_id|>") != std::string_view::npos;
  TOY_CHECK(chatml || llama3,
            "[chat] the model's chat template is not one toy renders (it knows ChatML, as Qwen and SmolLM2 "
            "use, and Llama 3's header format); the template begins: \"{}\"",
            printable(jinja, 120));
  t.format = chatml ? ChatFormat::ChatML : ChatFormat::Llama3;
  return t;
}

ChatTemplate ChatTemplate::from_model(const gguf::Reader& r) {
  const gguf::Value* v = r.find("tokenizer.chat_template");
  if (!v) {
    ChatTemplate t;
    t.defaulted = true;
    return t;
  }
  TOY_CHECK(v->type == gguf::Type::STRING, "[chat] '{}': tokenizer.chat_template has type {}, expected a string",
            printable(r.path()), gguf::type_name(v->type));
  try {
    return recognise(v->s);
  } catch (const Error& e) {
    fail("[chat] '{}': {}", printable(r.path()), e.what());
  }
}

std::string ChatTemplate::name() const { return format == ChatFormat::ChatML ? "chatml" : "llama3"; }

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string out;
  for (const ChatMessage& m : messages) {
    TOY_CHECK(!m.role.empty() && m.role.find_first_of("\n<>|") == std::string::npos,
              "[chat] a message role must be a plain word, got \"{}\"", printable(m.role, 40));
    if (format == ChatFormat::ChatML)
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    else
      out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
  }
  if (add_generation_prompt)
    out += format == ChatFormat::ChatML ? "<|im_start|>assistant\n" : "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace toy
