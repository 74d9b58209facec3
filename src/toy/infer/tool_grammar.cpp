#include "toy/infer/tool_grammar.h"

#include <map>
#include <vector>

#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/infer/gbnf.h"
#include "toy/infer/json_schema.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy {

namespace {

using Json = nlohmann::ordered_json;
using F = ToolCallFormat;

std::string lit(std::string_view s) { return gbnf_literal(s); }

struct Tool {
  std::string name;
  std::string args;  // the rule of its arguments (a JSON object, or Gemma's spelling of one)
  Json params;       // its parameters schema
};

// The texts a format's parser looks for: no string or raw value inside a call may hold one (the
// parser would take it for the call's end).
std::vector<std::string> markers_of(F f) {
  switch (f) {
    case F::Hermes: return {"<tool_call>", "</tool_call>"};
    case F::QwenXml: return {"<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"};
    case F::SeedXml:
      return {"<seed:tool_call>", "</seed:tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"};
    case F::MiniMaxXml:
      return {"<minimax:tool_call>", "</minimax:tool_call>", "<invoke name=", "</invoke>", "<parameter name=",
              "</parameter>"};
    case F::MiniCpmXml: return {"<function name=", "</function>", "<param name=", "</param>"};
    case F::Glm: return {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};
    case F::MistralJson:
    case F::MistralArgs: return {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"};
    case F::DeepSeekR1:
    case F::DeepSeekV31:
      return {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
              "<｜tool▁sep｜>"};
    case F::Kimi:
      return {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>",
              "<|tool_call_argument_begin|>"};
    case F::GptOss: return {"<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|start|>", "<|constrain|>"};
    case F::Functionary: return {">>>"};
    case F::CommandR: return {"<|START_ACTION|>", "<|END_ACTION|>"};
    case F::Nemotron: return {"<TOOLCALL>", "</TOOLCALL>"};
    case F::Granite: return {"<|tool_call|>"};
    case F::Apertus: return {"<|tools_prefix|>", "<|tools_suffix|>"};
    case F::Gemma4: return {"<|tool_call>", "<tool_call|>"};
    case F::Llama3Json:
    case F::None: return {};
  }
  return {};
}

// Writes one grammar: the caller's rules are named with a '_' (JsonSchemaRules never does).
class Writer {
 public:
  // `gemma`: arguments in Gemma 4's spelling (its quote mark a token when the vocabulary has it).
  Writer(const Tokenizer& tok, F f) : markers(markers_of(f)), specials_(special_map(tok)), json(spelling(f)) {}

  const std::vector<std::string> markers;

  // A marker: its special token when the vocabulary has one of exactly that text, else its text.
  std::string mark(std::string_view text) const {
    auto it = specials_.find(std::string(text));
    return it != specials_.end() ? fmt::format("<[{}]>", it->second) : lit(text);
  }

  // The rule of any text without `marker` in it (one per marker); with `all_markers`, without
  // the format's markers either (a raw value inside a call).
  std::string text_without(std::string_view marker, bool all_markers = false) {
    const std::string key = std::string(marker) + (all_markers ? "\x01" : "");
    auto it = without_.find(key);
    if (it != without_.end()) return it->second;
    const std::string name = fmt::format("tc_text_{}", without_.size());
    std::vector<std::string> avoid = {std::string(marker)};
    if (all_markers) avoid.insert(avoid.end(), markers.begin(), markers.end());
    rules += gbnf_text_without(name, avoid);
    return without_.emplace(key, name).first->second;
  }

  void rule(const std::string& name, const std::string& body) { rules += name + " ::= " + body + "\n"; }

 private:
  std::map<std::string, int32_t> specials_;
  std::map<std::string, std::string> without_;

  static std::map<std::string, int32_t> special_map(const Tokenizer& tok) {
    std::map<std::string, int32_t> m;
    for (int32_t id : tok.special_ids()) m.emplace(tok.token_bytes(id), id);
    return m;
  }
  JsonSpelling spelling(F f) const {
    JsonSpelling sp;
    if (f == F::Gemma4) sp.gemma = true, sp.quote = "<|\"|>", sp.quote_gbnf = mark(sp.quote);
    sp.forbidden = markers;
    return sp;
  }

 public:
  JsonSchemaRules json;
  std::string rules;
};

// {"NAME_KEY": "name", "ARGS_KEY": args} (with "tool_call_id" first for Command R).
std::string json_call(const Tool& t, std::string_view name_key, std::string_view args_key, bool with_id = false) {
  std::string out = "\"{\" space ";
  if (with_id) out += lit("\"tool_call_id\"") + " space \":\" space \"\\\"\" [0-9]{1,3} \"\\\"\" space \",\" space ";
  out += lit(Json(name_key).dump()) + " space \":\" space " + lit(Json(t.name).dump()) + " space \",\" space " +
         lit(Json(args_key).dump()) + " space \":\" space " + t.args + " \"}\" space";
  return out;
}

// The parameters of an XML-style call: OPEN key NAME_END value CLOSE for each property, in the
// schema's order (optional ones may be left out). A string's value is raw text; others JSON.
std::string xml_params(Writer& w, const Tool& t, std::string_view open, const std::string& name_end,
                       std::string_view close) {
  if (!t.params.contains("properties") || !t.params["properties"].is_object()) return "";
  std::vector<std::string> required;
  if (t.params.contains("required") && t.params["required"].is_array())
    for (const Json& r : t.params["required"])
      if (r.is_string()) required.push_back(r.get<std::string>());
  std::string out;
  for (const auto& [key, sub] : t.params["properties"].items()) {
    // A string is written raw (the parser reads a value as JSON only when it is not a string).
    std::string value;
    auto all_strings = [](const Json& list) {
      return list.is_array() && !list.empty() && std::all_of(list.begin(), list.end(), [](const Json& v) { return v.is_string(); });
    };
    const Json choices = !sub.is_object() ? Json() : sub.contains("const") ? Json::array({sub["const"]})
                                                   : sub.contains("enum") ? sub["enum"] : Json();
    if (all_strings(choices)) {
      value = "(";
      for (size_t i = 0; i < choices.size(); ++i) value += (i ? " | " : "") + lit(choices[i].get<std::string>());
      value += ")";
    } else if (sub.is_object() && sub.value("type", Json()) == "string" && choices.is_null()) {
      value = w.text_without(close, true);
    } else {
      value = "\"\\n\"? " + w.json.add(sub, t.name + "-" + key) + " \"\\n\"?";
    }
    const std::string one = w.mark(open) + " " + lit(key) + " " + name_end + " " + value + " " + w.mark(close) + " tc_ws";
    const bool needed = std::find(required.begin(), required.end(), key) != required.end();
    out += needed ? one + " " : "(" + one + ")? ";
  }
  return out;
}

// One call of tool t in format f (the repetition of calls is the caller's).
std::string call(Writer& w, F f, const Tool& t) {
  const std::string name = lit(t.name);
  switch (f) {
    case F::Hermes:
      return w.mark("<tool_call>") + " tc_ws " + json_call(t, "name", "arguments") + " tc_ws " + w.mark("</tool_call>");
    case F::QwenXml:
    case F::SeedXml: {
      const bool seed = f == F::SeedXml;
      return w.mark(seed ? "<seed:tool_call>" : "<tool_call>") + " tc_ws " + w.mark("<function=") + " " + name + " " +
             w.mark(">") + " tc_ws " + xml_params(w, t, "<parameter=", w.mark(">"), "</parameter>") + w.mark("</function>") +
             " tc_ws " + w.mark(seed ? "</seed:tool_call>" : "</tool_call>");
    }
    case F::MiniMaxXml:
      return w.mark("<minimax:tool_call>") + " tc_ws " + w.mark("<invoke name=\"") + " " + name + " " + w.mark("\">") +
             " tc_ws " + xml_params(w, t, "<parameter name=\"", w.mark("\">"), "</parameter>") + w.mark("</invoke>") +
             " tc_ws " + w.mark("</minimax:tool_call>");
    case F::MiniCpmXml:
      return w.mark("<function name=\"") + " " + name + " " + w.mark("\">") + " tc_ws " +
             xml_params(w, t, "<param name=\"", w.mark("\">"), "</param>") + w.mark("</function>");
    case F::Glm: {
      std::string out = w.mark("<tool_call>") + " " + name + " \"\\n\" ";
      // <arg_key>K</arg_key>\n<arg_value>V</arg_value>
      out += xml_params(w, t, "<arg_key>", w.mark("</arg_key>") + " tc_ws " + w.mark("<arg_value>"), "</arg_value>");
      return out + w.mark("</tool_call>");
    }
    case F::MistralArgs: return w.mark("[TOOL_CALLS]") + " " + name + " " + w.mark("[ARGS]") + " " + t.args;
    case F::DeepSeekR1:
      return w.mark("<｜tool▁call▁begin｜>") + " \"function\" " + w.mark("<｜tool▁sep｜>") + " " + name +
             " \"\\n```json\\n\" " + t.args + " \"\\n```\" " + w.mark("<｜tool▁call▁end｜>");
    case F::DeepSeekV31:
      return w.mark("<｜tool▁call▁begin｜>") + " " + name + " " + w.mark("<｜tool▁sep｜>") + " " + t.args + " " +
             w.mark("<｜tool▁call▁end｜>");
    case F::Kimi:
      return w.mark("<|tool_call_begin|>") + " \"functions.\" " + name + " \":\" [0-9]{1,2} " +
             w.mark("<|tool_call_argument_begin|>") + " " + t.args + " " + w.mark("<|tool_call_end|>");
    case F::Llama3Json: return json_call(t, "name", "parameters");
    case F::GptOss: {
      // The recipient after the channel (as the model writes it) or before it (as the template
      // renders a call in history, after "<|start|>assistant"); json, or <|constrain|>json.
      const std::string type = "(\" \" " + w.mark("<|constrain|>") + " \"json\" | \" json\")? ";
      return "(" + w.mark("<|channel|>") + " \"commentary to=functions.\" " + name + " " + type + "| \" to=functions.\" " +
             name + " " + w.mark("<|channel|>") + " \"commentary\" " + type + ") " + w.mark("<|message|>") + " " + t.args;
    }
    case F::Functionary: return name + " \"\\n\" " + t.args;
    case F::CommandR: return json_call(t, "tool_name", "parameters", true);
    case F::MistralJson:
    case F::Nemotron:
    case F::Granite: return json_call(t, "name", "arguments");
    case F::Apertus: return "\"{\" space " + lit(Json(t.name).dump()) + " space \":\" space " + t.args + " \"}\" space";
    case F::Gemma4: return w.mark("<|tool_call>") + " \"call:\" " + name + " " + t.args + " " + w.mark("<tool_call|>");
    case F::None: break;
  }
  fail("[chat] no tool-call format");
}

// The calls: one, or (parallel) one or more, in the format's framing.
std::string calls(Writer& w, F f, bool parallel) {
  auto list = [&](const std::string& open, const std::string& close) {  // OPEN [call, call] CLOSE
    return open + " \"[\" space tc_call " + (parallel ? "(\",\" space tc_call)* " : "") + "\"]\" space" +
           (close.empty() ? "" : " " + close);
  };
  auto section = [&](const char* begin, const char* end) {
    return w.mark(begin) + " tc_call " + (parallel ? "(tc_ws tc_call)* " : "") + w.mark(end);
  };
  switch (f) {
    case F::MistralJson: return list(w.mark("[TOOL_CALLS]"), "");
    case F::CommandR: return list(w.mark("<|START_ACTION|>"), w.mark("<|END_ACTION|>"));
    case F::Nemotron: return list(w.mark("<TOOLCALL>"), w.mark("</TOOLCALL>"));
    case F::Granite: return list(w.mark("<|tool_call|>"), "");
    case F::Apertus: return list(w.mark("<|tools_prefix|>"), w.mark("<|tools_suffix|>"));
    case F::DeepSeekR1:
    case F::DeepSeekV31: return section("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>");
    case F::Kimi: return section("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>");
    case F::Llama3Json:
    case F::GptOss: return "tc_call";  // (one call a turn)
    case F::Functionary: return parallel ? "tc_call (\">>>\" tc_call)*" : "tc_call";
    default: return parallel ? "tc_call (tc_ws tc_call)*" : "tc_call";
  }
}

}  // namespace

std::string tool_call_gbnf(const ChatSyntax& syntax, const nlohmann::ordered_json& tools, const std::string& only,
                           bool parallel, const Tokenizer& tok) {
  const F f = syntax.tools;
  TOY_CHECK(f != F::None, "[chat] the model's chat template defines no tool-call format, so a tool call cannot be "
            "required of it: use tool_choice 'auto', or a template that writes tool calls (--chat-template)");
  Writer w(tok, f);
  std::vector<Tool> offered;
  TOY_CHECK(tools.is_array(), "[chat] 'tools' must be a list");
  for (const Json& t : tools) {
    const Json& fn = t.at("function");
    const std::string name = fn.at("name").get<std::string>();
    if (!only.empty() && name != only) continue;
    Tool tool;
    tool.name = name;
    tool.params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"]
                                                                           : Json{{"type", "object"}};
    try {
      tool.args = w.json.add(tool.params, name + "-args");
    } catch (const Error& e) {
      fail("[chat] the parameters of tool '{}': {}", printable(name, 60), e.what());
    }
    offered.push_back(std::move(tool));
  }
  TOY_CHECK(!offered.empty(), "[chat] tool_choice names '{}', which is not among the tools", printable(only, 60));
  std::string one;
  for (size_t i = 0; i < offered.size(); ++i) one += (i ? " | " : "") + call(w, f, offered[i]);
  w.rule("tc_call", one);
  w.rule("tc_ws", "[ \\t\\r\\n]{0,4}");
  w.rule("tc_calls", calls(w, f, parallel));
  // (Functionary's name follows its >>> directly: no space before its calls)
  const std::string lead = f == F::Functionary ? "" : "tc_ws ";
  std::string root = lead + "tc_calls";
  if (f == F::GptOss) {  // its analysis message may come first
    const std::string think = w.text_without("<|end|>");
    root = "(" + w.mark("<|channel|>") + " \"analysis\" " + w.mark("<|message|>") + " " + think + " " +
           w.mark("<|end|>") + " " + w.mark("<|start|>") + " \"assistant\")? tc_calls";
  } else if (!syntax.think_open.empty()) {
    const std::string think = w.text_without(syntax.think_close);
    const std::string block = think + " " + w.mark(syntax.think_close);
    root = syntax.starts_thinking ? block + " " + lead + "tc_calls"
                                  : "(tc_ws " + w.mark(syntax.think_open) + " " + block + ")? " + lead + "tc_calls";
  }
  w.rule("root", root);
  return w.rules + w.json.text();
}

}  // namespace toy
