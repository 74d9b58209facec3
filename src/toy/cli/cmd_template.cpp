// `toy template FILE.jinja CONVERSATION.json`: renders a chat template for a conversation as
// Hugging Face's apply_chat_template would, and prints exactly that (no newline added). The
// conversation is {"messages": [...], "tools"?, "add_generation_prompt"?, "bos_token"?,
// "eos_token"?, "now"?}; a template error (raise_exception too) exits 1 with its message.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "toy/chat/chat_render.h"
#include "toy/cli/commands.h"
#include "toy/core/error.h"
#include "toy/core/files.h"

namespace toy::cli {

Run add_template_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("template", "Render a chat template (Jinja2) for a conversation given as JSON");
  struct Flags {
    std::string tmpl, conversation;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("TEMPLATE", f->tmpl, "The chat template (.jinja)")->required();
  cmd->add_option("CONVERSATION", f->conversation, "The conversation (.json)")->required();
  return [f]() {
    constexpr uint64_t kMaxBytes = uint64_t{64} << 20;
    const std::string text = read_regular_file(f->tmpl, "[template]", kMaxBytes);
    const std::string conv_text = read_regular_file(f->conversation, "[template]", kMaxBytes);
    nlohmann::ordered_json conv;
    try {
      conv = nlohmann::ordered_json::parse(conv_text);
    } catch (const nlohmann::json::exception& e) {
      fail("[template] {}: not valid JSON: {}", f->conversation, e.what());
    }
    const std::string out = render_chat_template(text, conv);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    return 0;
  };
}

}  // namespace toy::cli
