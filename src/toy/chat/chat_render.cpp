#include "toy/chat/chat_render.h"

#include <cstdio>
#include <ctime>

#include "toy/chat/builtins.h"
#include "toy/chat/render.h"
#include "toy/core/error.h"

namespace toy {
namespace {

// "YYYY-MM-DDTHH:MM:SS" as a broken-down time with its weekday and day of the year filled in.
std::tm parse_now(const std::string& s) {
  std::tm tm{};
  int y, mo, d, h, mi, sec;
  char tail;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%c", &y, &mo, &d, &h, &mi, &sec, &tail) != 6 || s.size() != 19)
    fail("[chat] \"now\" must look like 2026-03-14T09:26:53, got '{}'", s);
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  std::tm check = tm;
  const time_t t = timegm(&check);  // normalizes and fills tm_wday / tm_yday
  std::tm out;
  gmtime_r(&t, &out);
  if (out.tm_year != tm.tm_year || out.tm_mon != tm.tm_mon || out.tm_mday != tm.tm_mday || out.tm_hour != h ||
      out.tm_min != mi || out.tm_sec != sec)
    fail("[chat] \"now\" is not a valid time: '{}'", s);
  out.tm_isdst = 0;
  return out;
}

bool truthy_json(const nlohmann::ordered_json& j) {
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_array() || j.is_object() || j.is_string()) return !j.empty() && !(j.is_string() && j.get<std::string>().empty());
  if (j.is_number()) return j.get<double>() != 0;
  return true;
}

}  // namespace

ChatRenderer::ChatRenderer(std::string_view template_text)
    : template_(std::make_shared<const jinja::Template>(template_text)) {}

std::string ChatRenderer::render(const nlohmann::ordered_json& conversation) const {
  TOY_CHECK(conversation.is_object(), "[chat] a conversation is a JSON object, got {}", conversation.type_name());
  TOY_CHECK(conversation.contains("messages") && conversation["messages"].is_array(),
            "[chat] the conversation needs a \"messages\" array");
  auto get_bool = [&](const char* key, bool dflt) {
    if (!conversation.contains(key)) return dflt;
    TOY_CHECK(conversation[key].is_boolean(), "[chat] \"{}\" must be true or false", key);
    return conversation[key].get<bool>();
  };
  auto get_string = [&](const char* key) {
    if (!conversation.contains(key)) return std::string();
    TOY_CHECK(conversation[key].is_string(), "[chat] \"{}\" must be a string", key);
    return conversation[key].get<std::string>();
  };
  std::optional<std::tm> now;
  if (conversation.contains("now")) now = parse_now(get_string("now"));

  jinja::Dict vars;
  jinja::add_globals(vars, now);
  try {
    // The caller's other keys first (template kwargs), so the named ones below win.
    for (const auto& [key, value] : conversation.items())
      if (key != "messages" && key != "tools" && key != "add_generation_prompt" && key != "bos_token" &&
          key != "eos_token" && key != "now")
        vars.set(jinja::Value(key), jinja::from_json(value));
    vars.set(jinja::Value("messages"), jinja::from_json(conversation["messages"]));
    // As HF's apply_chat_template: tools only when the request has some.
    if (conversation.contains("tools") && truthy_json(conversation["tools"]))
      vars.set(jinja::Value("tools"), jinja::from_json(conversation["tools"]));
  } catch (const jinja::Failure& e) {
    fail("[chat] {}", e.what());
  }
  vars.set(jinja::Value("add_generation_prompt"), jinja::Value(get_bool("add_generation_prompt", true)));
  vars.set(jinja::Value("bos_token"), jinja::Value(get_string("bos_token")));
  vars.set(jinja::Value("eos_token"), jinja::Value(get_string("eos_token")));
  return template_->render(vars);
}

std::string render_chat_template(std::string_view template_text, const nlohmann::ordered_json& conversation) {
  TOY_CHECK(conversation.is_object(), "[chat] a conversation is a JSON object, got {}", conversation.type_name());
  TOY_CHECK(conversation.contains("messages") && conversation["messages"].is_array(),
            "[chat] the conversation needs a \"messages\" array");
  return ChatRenderer(template_text).render(conversation);
}

}  // namespace toy
