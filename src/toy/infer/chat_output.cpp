#include "toy/infer/chat_output.h"

#include <algorithm>
#include <cctype>
#include <functional>

#include <nlohmann/json.hpp>

namespace toy {

namespace {

using Json = nlohmann::ordered_json;
using std::string_view;
constexpr size_t npos = string_view::npos;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

size_t skip_space(string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

string_view trim(string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

string_view trim_end(string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_at(string_view s, size_t i, string_view what) { return i <= s.size() && s.substr(i).starts_with(what); }

// The longest end of `s` that begins `marker` (an unfinished marker, held back while streaming).
size_t unfinished_marker(string_view s, string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (marker.starts_with(s.substr(s.size() - n))) return n;
  return 0;
}

// The end of the JSON value at i (after whitespace): past its closing bracket or quote, or of
// its scalar; npos when it does not end inside s.
size_t json_end(string_view s, size_t i) {
  i = skip_space(s, i);
  if (i >= s.size()) return npos;
  if (s[i] == '{' || s[i] == '[' || s[i] == '"') {
    int depth = 0;
    bool in_string = false;
    for (size_t k = i; k < s.size(); ++k) {
      const char c = s[k];
      if (in_string) {
        if (c == '\\') ++k;
        else if (c == '"') {
          in_string = false;
          if (depth == 0) return k + 1;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) return k + 1;
      }
    }
    return npos;
  }
  size_t k = i;
  while (k < s.size() && (std::isalnum(static_cast<unsigned char>(s[k])) || s[k] == '-' || s[k] == '+' || s[k] == '.'))
    ++k;
  return k == s.size() || k == i ? npos : k;
}

bool parse_json(string_view s, Json& out) {
  out = Json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
  return !out.is_discarded();
}

// OpenAI's arguments: the JSON text of an object (a string holding JSON is taken as that JSON).
bool arguments_of(const Json& v, std::string& out) {
  if (v.is_object()) {
    out = v.dump();
    return true;
  }
  if (v.is_string()) {
    Json inner;
    if (parse_json(v.get_ref<const std::string&>(), inner) && inner.is_object()) {
      out = inner.dump();
      return true;
    }
  }
  return false;
}

// The JSON value at i (after whitespace) as written: up to its end, or to the end of s when it
// does not end there yet.
string_view raw_json(string_view s, size_t i) {
  i = skip_space(s, i);
  if (i >= s.size()) return {};
  const size_t end = json_end(s, i);
  return s.substr(i, end == npos ? npos : end - i);
}

// The arguments object a call's body holds so far (empty unless it begins as an object).
std::string object_so_far(string_view body) {
  const string_view v = raw_json(body, 0);
  return !v.empty() && v[0] == '{' ? std::string(v) : std::string();
}

// A call object, whole or being written ({"name": "f", "arguments": {"x": ...): its name once
// that string is whole, its id, and its arguments object as written so far (raw_arguments; not
// when the arguments are a string holding JSON). `key_is_name`: Apertus's {NAME: {arguments}}.
void object_call_parts(string_view obj, bool key_is_name, ToolCall& c) {
  size_t i = skip_space(obj, 0);
  if (i >= obj.size() || obj[i] != '{') return;
  ++i;
  while (true) {
    i = skip_space(obj, i);
    if (i < obj.size() && obj[i] == ',') {
      ++i;
      continue;
    }
    if (i >= obj.size() || obj[i] != '"') return;
    const size_t key_end = json_end(obj, i);
    Json key;
    if (key_end == npos || !parse_json(obj.substr(i, key_end - i), key) || !key.is_string()) return;
    i = skip_space(obj, key_end);
    if (i >= obj.size() || obj[i] != ':') return;
    i = skip_space(obj, i + 1);
    if (i >= obj.size()) return;
    const size_t value_end = json_end(obj, i);
    const std::string& k = key.get_ref<const std::string&>();
    const string_view value = obj.substr(i, value_end == npos ? npos : value_end - i);
    Json v;
    const bool whole = value_end != npos && parse_json(value, v);
    if (key_is_name) {
      c.name = k;
      if (obj[i] == '{') c.raw_arguments = std::string(value);
      return;
    }
    if ((k == "name" || k == "tool_name") && whole && v.is_string()) c.name = v.get<std::string>();
    if ((k == "id" || k == "tool_call_id") && whole && v.is_string()) c.id = v.get<std::string>();
    if ((k == "arguments" || k == "parameters") && obj[i] == '{') c.raw_arguments = std::string(value);
    if (value_end == npos) return;
    i = value_end;
  }
}

// A call written as a JSON object: {"name"|"tool_name", "arguments"|"parameters", "id"|"tool_call_id"?},
// or Apertus's {NAME: {arguments}}.
bool call_from_object(const Json& o, ToolCall& c) {
  if (!o.is_object()) return false;
  const Json* name = o.contains("name") ? &o["name"] : o.contains("tool_name") ? &o["tool_name"] : nullptr;
  const Json* args = o.contains("arguments") ? &o["arguments"] : o.contains("parameters") ? &o["parameters"] : nullptr;
  if (name && name->is_string()) {
    c.name = name->get<std::string>();
    if (!args) c.arguments = "{}";
    else if (!arguments_of(*args, c.arguments)) return false;
    for (const char* k : {"id", "tool_call_id"})
      if (o.contains(k) && o[k].is_string()) c.id = o[k].get<std::string>();
    return !c.name.empty();
  }
  if (o.size() == 1 && o.begin().value().is_object()) {
    c.name = o.begin().key();
    c.arguments = o.begin().value().dump();
    return !c.name.empty();
  }
  return false;
}

// A parameter's value in the XML formats: JSON when it is a number, boolean, null, list or
// object written as JSON; else the text itself.
Json xml_value(string_view v) {
  Json j;
  if (parse_json(v, j) && !j.is_string()) return j;
  return Json(std::string(v));
}

// What parsing found: the calls from `start` (the first marker) to `end`.
struct Calls {
  size_t start = npos, end = npos;
  std::vector<ToolCall> calls;
  bool ok = false;    // every call finished and well formed
  size_t stop = npos;  // when not ok: where the call that is not (yet) whole begins
};

// A sequence "OPEN body CLOSE" repeated (whitespace between): body parsed by `one`.
Calls repeated(string_view s, string_view open, string_view close,
               const std::function<bool(string_view body, std::vector<ToolCall>&)>& one) {
  Calls r;
  r.start = s.find(open);
  if (r.start == npos) return r;
  size_t at = r.start;
  while (starts_at(s, at, open)) {
    r.stop = at;
    const size_t body = at + open.size();
    const size_t end = close.empty() ? npos : s.find(close, body);
    if (end == npos) return r;
    if (!one(s.substr(body, end - body), r.calls)) return r;
    r.stop = npos;  // (until the next call begins)
    at = skip_space(s, end + close.size());
  }
  r.end = at;
  r.ok = true;
  return r;
}

// A JSON list of call objects after `open` (and before `close`, when there is one), read an
// object at a time (a stream sees each call once it is whole). `key_is_name`: Apertus's objects.
Calls json_list(string_view s, string_view open, string_view close, bool key_is_name = false) {
  Calls r;
  r.start = s.find(open);
  if (r.start == npos) return r;
  size_t at = skip_space(s, r.start + open.size());
  if (at >= s.size()) return r;
  const bool bracketed = s[at] == '[';  // (a single object without the list is taken too)
  if (bracketed) at = skip_space(s, at + 1);
  while (true) {
    if (at >= s.size()) return r;
    if (bracketed && s[at] == ']' && r.calls.empty()) break;
    r.stop = at;
    const size_t end = json_end(s, at);
    Json o;
    ToolCall c;
    if (end == npos || !parse_json(s.substr(at, end - at), o) || !call_from_object(o, c)) return r;
    object_call_parts(s.substr(at, end - at), key_is_name, c);
    if (!c.raw_arguments.empty() && !Json::parse(c.raw_arguments, nullptr, false).is_object()) c.raw_arguments.clear();
    r.calls.push_back(std::move(c));
    r.stop = npos;  // (until the next call begins)
    at = skip_space(s, end);
    if (!bracketed) break;
    if (at < s.size() && s[at] == ',') {
      at = skip_space(s, at + 1);
      continue;
    }
    if (at >= s.size() || s[at] != ']') return r;
    break;
  }
  if (bracketed) at = skip_space(s, at + 1);
  r.stop = npos;
  if (!close.empty()) {
    if (!starts_at(s, at, close)) return r;
    at += close.size();
  }
  r.end = at;
  r.ok = true;
  return r;
}

bool json_body(string_view body, std::vector<ToolCall>& out) {
  Json o;
  ToolCall c;
  if (!parse_json(trim(body), o) || !call_from_object(o, c)) return false;
  object_call_parts(trim(body), false, c);
  out.push_back(std::move(c));
  return true;
}

// <function=NAME><parameter=K>V</parameter>...</function> and its kin: the opening of a
// function / parameter up to its name, and what ends the name.
struct XmlSpelling {
  string_view function_open, name_end, function_close, param_open, param_name_end, param_close;
};

bool xml_function(string_view body, const XmlSpelling& x, std::vector<ToolCall>& out) {
  size_t at = skip_space(body, 0);
  bool any = false;
  while (starts_at(body, at, x.function_open)) {
    const size_t name = at + x.function_open.size(), name_end = body.find(x.name_end, name);
    if (name_end == npos) return false;
    const size_t close = body.find(x.function_close, name_end);
    if (close == npos) return false;
    Json args = Json::object();
    size_t p = skip_space(body, name_end + x.name_end.size());
    while (starts_at(body, p, x.param_open) && p < close) {
      const size_t k = p + x.param_open.size(), k_end = body.find(x.param_name_end, k);
      if (k_end == npos) return false;
      const size_t v = k_end + x.param_name_end.size(), v_end = body.find(x.param_close, v);
      if (v_end == npos) return false;
      string_view value = body.substr(v, v_end - v);
      if (value.starts_with('\n')) value.remove_prefix(1);
      if (value.ends_with('\n')) value.remove_suffix(1);
      args[std::string(body.substr(k, k_end - k))] = xml_value(value);
      p = skip_space(body, v_end + x.param_close.size());
    }
    if (p != close) return false;
    out.push_back({"", std::string(trim(body.substr(name, name_end - name))), args.dump()});
    any = true;
    at = skip_space(body, close + x.function_close.size());
  }
  return any && at == body.size();
}

// GLM: NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>... inside <tool_call>...</tool_call>.
bool glm_call(string_view body, std::vector<ToolCall>& out) {
  const size_t first = body.find("<arg_key>");
  ToolCall c;
  c.name = std::string(trim(body.substr(0, first)));
  if (c.name.empty() || c.name.find('{') != std::string::npos) return false;
  Json args = Json::object();
  size_t at = first == npos ? body.size() : first;
  while (starts_at(body, at, "<arg_key>")) {
    const size_t k_end = body.find("</arg_key>", at);
    if (k_end == npos) return false;
    const size_t v = skip_space(body, k_end + 10);
    if (!starts_at(body, v, "<arg_value>")) return false;
    const size_t v_end = body.find("</arg_value>", v);
    if (v_end == npos) return false;
    args[std::string(body.substr(at + 9, k_end - at - 9))] = xml_value(body.substr(v + 11, v_end - v - 11));
    at = skip_space(body, v_end + 12);
  }
  if (at != body.size()) return false;
  c.arguments = args.dump();
  out.push_back(std::move(c));
  return true;
}

// Mistral's NAME([CALL_ID]ID)? before [ARGS].
void mistral_head(string_view head, ToolCall& c) {
  if (const size_t id = head.find("[CALL_ID]"); id != npos) {
    c.id = std::string(trim(head.substr(id + 9)));
    head = head.substr(0, id);
  }
  c.name = std::string(trim(head));
}

// Mistral Small 3.2 / Devstral: ([TOOL_CALLS]NAME([CALL_ID]ID)?[ARGS]{json})+
Calls mistral_args(string_view s) {
  Calls r;
  r.start = s.find("[TOOL_CALLS]");
  if (r.start == npos) return r;
  size_t at = r.start;
  while (starts_at(s, at, "[TOOL_CALLS]")) {
    r.stop = at;
    const size_t name = at + 12, args = s.find("[ARGS]", name);
    if (args == npos) return r;
    ToolCall c;
    mistral_head(s.substr(name, args - name), c);
    const size_t end = json_end(s, args + 6);
    Json j;
    if (end == npos || !parse_json(s.substr(args + 6, end - args - 6), j) || !arguments_of(j, c.arguments)) return r;
    if (j.is_object()) c.raw_arguments = std::string(raw_json(s.substr(0, end), args + 6));
    r.calls.push_back(std::move(c));
    r.stop = npos;  // (until the next call begins)
    at = skip_space(s, end);
  }
  r.end = at;
  r.ok = true;
  return r;
}

// NAME SEP {json} in a call's body (DeepSeek V3.1, Kimi), NAME cleaned by `name_of`.
bool name_then_json(string_view body, string_view sep, std::vector<ToolCall>& out,
                    const std::function<std::string(string_view)>& name_of) {
  const size_t at = body.find(sep);
  if (at == npos) return false;
  ToolCall c;
  c.name = name_of(trim(body.substr(0, at)));
  Json j;
  if (c.name.empty() || !parse_json(trim(body.substr(at + sep.size())), j) || !arguments_of(j, c.arguments)) return false;
  if (j.is_object()) c.raw_arguments = std::string(trim(body.substr(at + sep.size())));
  out.push_back(std::move(c));
  return true;
}

// Calls inside a section: BEGIN (OPEN body CLOSE)* END (DeepSeek, Kimi), each body read by `one`.
Calls section(string_view s, string_view begin, string_view end_mark, string_view open, string_view close,
              const std::function<bool(string_view body, std::vector<ToolCall>&)>& one) {
  Calls r;
  r.start = s.find(begin);
  if (r.start == npos) return r;
  const size_t end = s.find(end_mark, r.start);
  Calls inner = repeated(s.substr(0, end == npos ? s.size() : end), open, close, one);
  r.calls = std::move(inner.calls);
  r.stop = inner.stop;
  if (!inner.ok || end == npos || skip_space(s, inner.end) != end) return r;
  r.end = end + end_mark.size();
  r.ok = true;
  return r;
}

// DeepSeek: <｜tool▁calls▁begin｜> (<｜tool▁call▁begin｜> call <｜tool▁call▁end｜>)* <｜tool▁calls▁end｜>;
// a call is NAME<｜tool▁sep｜>{json} (V3.1) or function<｜tool▁sep｜>NAME\n```json\n{json}\n``` (R1).
Calls deepseek(string_view s, bool r1) {
  static constexpr string_view kSep = "<｜tool▁sep｜>";
  return section(s, "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                 [&](string_view body, std::vector<ToolCall>& out) {
                   if (!r1) return name_then_json(body, kSep, out, [](string_view n) { return std::string(n); });
                   const size_t sep = body.find(kSep);
                   if (sep == npos) return false;
                   string_view rest = body.substr(sep + kSep.size());
                   const size_t fence = rest.find("```json");
                   if (fence == npos) return false;
                   ToolCall c;
                   c.name = std::string(trim(rest.substr(0, fence)));
                   string_view json = rest.substr(fence + 7);
                   if (const size_t close = json.rfind("```"); close != npos) json = json.substr(0, close);
                   Json j;
                   if (c.name.empty() || !parse_json(trim(json), j) || !arguments_of(j, c.arguments)) return false;
                   if (j.is_object()) c.raw_arguments = std::string(trim(json));
                   out.push_back(std::move(c));
                   return true;
                 });
}

// Kimi's call names are written functions.NAME:INDEX.
std::string kimi_name(string_view n) {
  if (n.starts_with("functions.")) n.remove_prefix(10);
  if (const size_t colon = n.rfind(':'); colon != npos) n = n.substr(0, colon);
  return std::string(n);
}

// Kimi: a section of functions.NAME:INDEX<|tool_call_argument_begin|>{json} calls.
Calls kimi(string_view s) {
  return section(s, "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                 "<|tool_call_end|>", [](string_view body, std::vector<ToolCall>& out) {
                   return name_then_json(body, "<|tool_call_argument_begin|>", out, kimi_name);
                 });
}

// Llama 3.x: the whole reply is {"name": ..., "parameters": {...}} (after <|python_tag|>, maybe).
Calls llama3(string_view s) {
  Calls r;
  size_t at = skip_space(s, 0);
  if (starts_at(s, at, "<|python_tag|>")) at = skip_space(s, at + 14);
  if (!starts_at(s, at, "{")) return r;
  r.start = 0;
  const size_t end = json_end(s, at);
  Json o;
  ToolCall c;
  r.stop = at;
  if (end == npos || !parse_json(s.substr(at, end - at), o) || !call_from_object(o, c)) return r;
  object_call_parts(s.substr(at, end - at), false, c);
  r.calls.push_back(std::move(c));
  r.stop = npos;
  r.end = end;
  r.ok = true;
  return r;
}

// Functionary v3.2: segments after >>> (the prompt ends with the first): NAME\nBODY, where
// NAME "all" is text and any other name a call with JSON arguments.
ChatReply functionary(string_view s, bool partial) {
  ChatReply out;
  size_t at = 0;
  std::vector<ToolCall> calls;
  while (at <= s.size()) {
    size_t next = s.find(">>>", at);
    const string_view seg = s.substr(at, next == npos ? npos : next - at);
    const size_t nl = seg.find('\n');
    if (nl == npos) {  // no name yet: unfinished, or plain text
      if (!partial) out.content += std::string(seg);
      break;
    }
    const string_view name = trim(seg.substr(0, nl)), body = seg.substr(nl + 1);
    if (name == "all") {
      out.content += std::string(body);
    } else {
      Json j;
      ToolCall c;
      c.name = std::string(name);
      if (parse_json(trim(body), j) && arguments_of(j, c.arguments)) {
        if (j.is_object()) c.raw_arguments = std::string(trim(body));
        calls.push_back(std::move(c));
      } else if (partial && next == npos && !c.name.empty()) {  // being written
        c.raw_arguments = object_so_far(body);
        out.call_in_progress = std::move(c);
      } else if (!partial) {
        out.content += std::string(seg);
      }
    }
    if (next == npos) break;
    at = next + 3;
  }
  out.tool_calls = std::move(calls);
  return out;
}

// gpt-oss (harmony): messages <|channel|>HEADER<|message|>BODY separated by <|end|><|start|>assistant;
// analysis is reasoning, final and plain commentary are the answer, "to=functions.NAME" a call.
ChatReply gpt_oss(string_view s, bool with_tools, bool partial) {
  ChatReply out;
  size_t at = 0;
  while (at < s.size()) {
    const size_t msg = s.find("<|message|>", at);
    if (msg == npos) {
      if (!partial && s.substr(at).find("<|channel|>") == npos) out.content += std::string(s.substr(at));
      break;
    }
    const string_view header = s.substr(at, msg - at);
    size_t end = npos, end_len = 0;  // the message ends at <|end|> (or <|call|>, <|return|>: the reply's end)
    for (string_view mark : {"<|end|>", "<|call|>", "<|return|>"})
      if (const size_t e = s.find(mark, msg); e < end) end = e, end_len = mark.size();
    const string_view body = s.substr(msg + 11, end == npos ? npos : end - msg - 11);
    const size_t to = header.find("to=functions.");
    if (to != npos && with_tools) {
      string_view name = header.substr(to + 13);
      name = name.substr(0, std::min(name.find_first_of(" <"), name.size()));
      Json j;
      ToolCall c;
      c.name = std::string(name);
      const bool named = name.size() < header.size() - to - 13;  // (the name's end was written)
      if (parse_json(trim(body), j) && arguments_of(j, c.arguments)) {  // (the reply's <|call|> ends it unseen)
        if (j.is_object()) c.raw_arguments = std::string(trim(body));
        out.tool_calls.push_back(std::move(c));
      } else if (partial && end == npos && named && !c.name.empty()) {  // being written
        c.raw_arguments = object_so_far(body);
        out.call_in_progress = std::move(c);
      } else if (!partial) {
        out.content += std::string(body);
      }
    } else if (header.find("analysis") != npos) {
      out.reasoning += std::string(body);
    } else {
      out.content += std::string(body);
    }
    if (end == npos) break;
    at = end + end_len;
    if (starts_at(s, at, "<|start|>assistant")) at += 18;
  }
  out.reasoning = std::string(trim(out.reasoning));
  return out;
}

// Gemma 4: call:NAME{key:<|"|>text<|"|>,n:3} — keys bare, strings between <|"|> marks.
bool gemma4_call(string_view body, std::vector<ToolCall>& out) {
  if (!body.starts_with("call:")) return false;
  const size_t brace = body.find('{');
  if (brace == npos) return false;
  ToolCall c;
  c.name = std::string(trim(body.substr(5, brace - 5)));
  static constexpr string_view kQuote = "<|\"|>";
  std::string json;
  for (size_t i = brace; i < body.size();) {
    if (starts_at(body, i, kQuote)) {
      const size_t e = body.find(kQuote, i + kQuote.size());
      if (e == npos) return false;
      json += Json(std::string(body.substr(i + kQuote.size(), e - i - kQuote.size()))).dump();
      i = e + kQuote.size();
    } else if (std::isalpha(static_cast<unsigned char>(body[i])) || body[i] == '_') {
      size_t j = i;
      while (j < body.size() && (std::isalnum(static_cast<unsigned char>(body[j])) || body[j] == '_' || body[j] == '-')) ++j;
      const std::string word(body.substr(i, j - i));
      const size_t k = skip_space(body, j);
      json += k < body.size() && body[k] == ':' ? Json(word).dump() : word;  // a key, or true/false/null
      i = j;
    } else {
      json += body[i++];
    }
  }
  Json args;
  if (c.name.empty() || !parse_json(json, args) || !args.is_object()) return false;
  c.arguments = args.dump();
  out.push_back(std::move(c));
  return true;
}

Calls find_calls(string_view s, ToolCallFormat f) {
  static const XmlSpelling qwen{"<function=", ">", "</function>", "<parameter=", ">", "</parameter>"};
  static const XmlSpelling minimax{"<invoke name=\"", "\">", "</invoke>", "<parameter name=\"", "\">", "</parameter>"};
  static const XmlSpelling minicpm{"<function name=\"", "\">", "</function>", "<param name=\"", "\">", "</param>"};
  auto xml = [](const XmlSpelling& x) {
    return [&x](string_view body, std::vector<ToolCall>& out) { return xml_function(body, x, out); };
  };
  switch (f) {
    case ToolCallFormat::Hermes: return repeated(s, "<tool_call>", "</tool_call>", json_body);
    case ToolCallFormat::QwenXml: return repeated(s, "<tool_call>", "</tool_call>", xml(qwen));
    case ToolCallFormat::SeedXml: return repeated(s, "<seed:tool_call>", "</seed:tool_call>", xml(qwen));
    case ToolCallFormat::MiniMaxXml: return repeated(s, "<minimax:tool_call>", "</minimax:tool_call>", xml(minimax));
    case ToolCallFormat::MiniCpmXml: {
      // No wrapper: the calls are the <function name="..."> elements themselves.
      Calls r;
      r.start = s.find(minicpm.function_open);
      if (r.start == npos) return r;
      const size_t last = s.rfind(minicpm.function_close);
      if (last == npos || last < r.start) return r;
      r.end = last + minicpm.function_close.size();
      r.ok = xml_function(s.substr(r.start, r.end - r.start), minicpm, r.calls);
      return r;
    }
    case ToolCallFormat::Glm: return repeated(s, "<tool_call>", "</tool_call>", glm_call);
    case ToolCallFormat::MistralJson: return json_list(s, "[TOOL_CALLS]", "");
    case ToolCallFormat::MistralArgs: return mistral_args(s);
    case ToolCallFormat::DeepSeekR1: return deepseek(s, true);
    case ToolCallFormat::DeepSeekV31: return deepseek(s, false);
    case ToolCallFormat::Kimi: return kimi(s);
    case ToolCallFormat::Llama3Json: return llama3(s);
    case ToolCallFormat::CommandR: return json_list(s, "<|START_ACTION|>", "<|END_ACTION|>");
    case ToolCallFormat::Nemotron: return json_list(s, "<TOOLCALL>", "</TOOLCALL>");
    case ToolCallFormat::Granite: return json_list(s, "<|tool_call|>", "");
    case ToolCallFormat::Apertus: return json_list(s, "<|tools_prefix|>", "<|tools_suffix|>");
    case ToolCallFormat::Gemma4: return repeated(s, "<|tool_call>", "<tool_call|>", gemma4_call);
    default: return {};
  }
}

// The call a streamed reply is writing, from where it begins (`region`): its name once whole,
// and its arguments object as written so far where the format writes one.
std::optional<ToolCall> call_being_written(string_view region, ToolCallFormat f) {
  ToolCall c;
  // NAME between `open` and `end` (both present).
  auto name_between = [&](string_view open, string_view end) -> size_t {
    const size_t at = region.find(open);
    if (at == npos) return npos;
    const size_t e = region.find(end, at + open.size());
    if (e == npos) return npos;
    c.name = std::string(trim(region.substr(at + open.size(), e - at - open.size())));
    return e + end.size();
  };
  // NAME then SEP then the arguments (DeepSeek V3.1, Kimi, Mistral's [ARGS]).
  auto name_sep_args = [&](string_view open, string_view sep) {
    if (!starts_at(region, 0, open)) return;
    const size_t at = region.find(sep, open.size());
    if (at == npos) return;
    c.name = std::string(trim(region.substr(open.size(), at - open.size())));
    c.raw_arguments = std::string(raw_json(region, at + sep.size()));
  };
  using F = ToolCallFormat;
  switch (f) {
    case F::Hermes:
      if (starts_at(region, 0, "<tool_call>")) object_call_parts(region.substr(11), false, c);
      break;
    case F::QwenXml:
    case F::SeedXml: name_between("<function=", ">"); break;
    case F::MiniMaxXml: name_between("<invoke name=\"", "\">"); break;
    case F::MiniCpmXml: name_between("<function name=\"", "\">"); break;
    case F::Glm:
      if (starts_at(region, 0, "<tool_call>")) {
        const size_t e = region.find_first_of("\n<", 11);
        if (e != npos) c.name = std::string(trim(region.substr(11, e - 11)));
      }
      break;
    case F::MistralJson:
    case F::Nemotron:
    case F::Granite:
    case F::CommandR:
    case F::Llama3Json: object_call_parts(region, false, c); break;
    case F::Apertus: object_call_parts(region, true, c); break;
    case F::MistralArgs: {
      name_sep_args("[TOOL_CALLS]", "[ARGS]");
      const std::string head = c.name;
      mistral_head(head, c);
      break;
    }
    case F::DeepSeekV31: name_sep_args("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"); break;
    case F::DeepSeekR1:
      if (const size_t after = name_between("<｜tool▁sep｜>", "```json"); after != npos)
        c.raw_arguments = std::string(raw_json(region, after));
      break;
    case F::Kimi:
      name_sep_args("<|tool_call_begin|>", "<|tool_call_argument_begin|>");
      c.name = kimi_name(c.name);
      break;
    case F::Gemma4: name_between("<|tool_call>call:", "{"); break;
    default: break;
  }
  if (c.name.empty()) return std::nullopt;
  if (!c.raw_arguments.empty() && c.raw_arguments[0] != '{') c.raw_arguments.clear();
  c.arguments.clear();
  return c;
}

// The marker that opens a format's calls (held back while streaming until it is whole).
string_view opening_marker(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::Hermes:
    case ToolCallFormat::QwenXml:
    case ToolCallFormat::Glm: return "<tool_call>";
    case ToolCallFormat::SeedXml: return "<seed:tool_call>";
    case ToolCallFormat::MiniMaxXml: return "<minimax:tool_call>";
    case ToolCallFormat::MiniCpmXml: return "<function name=\"";
    case ToolCallFormat::MistralJson:
    case ToolCallFormat::MistralArgs: return "[TOOL_CALLS]";
    case ToolCallFormat::DeepSeekR1:
    case ToolCallFormat::DeepSeekV31: return "<｜tool▁calls▁begin｜>";
    case ToolCallFormat::Kimi: return "<|tool_calls_section_begin|>";
    case ToolCallFormat::CommandR: return "<|START_ACTION|>";
    case ToolCallFormat::Nemotron: return "<TOOLCALL>";
    case ToolCallFormat::Granite: return "<|tool_call|>";
    case ToolCallFormat::Apertus: return "<|tools_prefix|>";
    case ToolCallFormat::Gemma4: return "<|tool_call>";
    default: return "";
  }
}

}  // namespace

ChatSyntax ChatSyntax::detect(string_view t) {
  ChatSyntax s;
  auto has = [&](string_view x) { return t.find(x) != npos; };
  using F = ToolCallFormat;
  if (has("<|channel|>") && has("<|message|>")) s.tools = F::GptOss;
  else if (has("<tool_call|>")) s.tools = F::Gemma4;
  else if (has("<|tool_calls_section_begin|>")) s.tools = F::Kimi;
  else if (has("<｜tool▁calls▁begin｜>")) s.tools = has("```json") ? F::DeepSeekR1 : F::DeepSeekV31;
  else if (has("<arg_key>")) s.tools = F::Glm;
  else if (has("<seed:tool_call>")) s.tools = F::SeedXml;
  else if (has("<minimax:tool_call>")) s.tools = F::MiniMaxXml;
  else if (has("<function=")) s.tools = F::QwenXml;
  else if (has("<tool_call>")) s.tools = F::Hermes;
  else if (has("<function name=")) s.tools = F::MiniCpmXml;
  else if (has("[TOOL_CALLS]")) s.tools = has("[ARGS]") ? F::MistralArgs : F::MistralJson;
  else if (has("<|START_ACTION|>")) s.tools = F::CommandR;
  else if (has("<TOOLCALL>")) s.tools = F::Nemotron;
  else if (has("<|tool_call|>")) s.tools = F::Granite;
  else if (has("<|tools_prefix|>")) s.tools = F::Apertus;
  else if (has(">>>") && has("all")) s.tools = F::Functionary;
  else if (has("<|start_header_id|>") && has("parameters")) s.tools = F::Llama3Json;
  if (has("<seed:think>")) s.think_open = "<seed:think>", s.think_close = "</seed:think>";
  else if (has("<|START_THINKING|>")) s.think_open = "<|START_THINKING|>", s.think_close = "<|END_THINKING|>";
  else if (has("<think>") && has("</think>")) s.think_open = "<think>", s.think_close = "</think>";
  else if (has("<|channel>thought")) s.think_open = "<|channel>thought", s.think_close = "<channel|>";
  return s;
}

ChatSyntax ChatSyntax::for_prompt(string_view prompt) const {
  ChatSyntax s = *this;
  s.starts_thinking = !think_open.empty() && trim_end(prompt).ends_with(think_open);
  return s;
}

const char* ChatSyntax::tools_name() const {
  static constexpr const char* kNames[] = {"none", "hermes", "qwen3-coder", "seed-oss", "minimax", "minicpm", "glm",
                                           "mistral-json", "mistral-args", "deepseek-r1", "deepseek-v3.1", "kimi",
                                           "llama3-json", "gpt-oss", "functionary", "command-r", "nemotron",
                                           "granite", "apertus", "gemma4"};
  return kNames[size_t(tools)];
}

ChatReply parse_chat_reply(string_view text, const ChatSyntax& syntax, bool with_tools, bool partial) {
  if (syntax.tools == ToolCallFormat::GptOss) return gpt_oss(text, with_tools, partial);
  ChatReply out;
  string_view rest = text;
  bool parsed = false;  // something was taken out of the text: the answer is trimmed
  // Reasoning first: from the opening marker (or the start, when the prompt opened it) to the close.
  if (!syntax.think_open.empty()) {
    const size_t lead = skip_space(text, 0);
    size_t from = npos;
    if (syntax.starts_thinking) from = 0;
    else if (starts_at(text, lead, syntax.think_open)) from = lead + syntax.think_open.size();
    else if (partial && lead < text.size() && string_view(syntax.think_open).starts_with(text.substr(lead)))
      return out;  // the opening marker is on its way
    if (from != npos) {
      parsed = true;
      const size_t close = text.find(syntax.think_close, from);
      if (close == npos) {
        string_view r = text.substr(from);
        if (partial) r.remove_suffix(unfinished_marker(r, syntax.think_close));
        out.reasoning = std::string(trim(r));
        if (!partial) out.reasoning = std::string(trim(text.substr(from)));
        return out;
      }
      out.reasoning = std::string(trim(text.substr(from, close - from)));
      rest = text.substr(close + syntax.think_close.size());
    }
  }
  if (syntax.tools == ToolCallFormat::Functionary && with_tools) {
    ChatReply f = functionary(rest, partial);
    f.reasoning = std::move(out.reasoning);
    return f;
  }
  const bool tools = with_tools && syntax.tools != ToolCallFormat::None;
  Calls calls = tools ? find_calls(rest, syntax.tools) : Calls{};
  if (calls.start == npos || (!calls.ok && !partial)) {
    string_view content = rest;
    if (partial && tools) content.remove_suffix(unfinished_marker(content, opening_marker(syntax.tools)));
    if (syntax.tools == ToolCallFormat::Llama3Json && tools && partial && trim(content).starts_with("{"))
      content = {};  // a call being written
    out.content = std::string(parsed ? trim(content) : content);
    if (parsed && partial) out.content = std::string(content.substr(skip_space(content, 0)));
    return out;
  }
  out.tool_calls = std::move(calls.calls);
  if (partial && !calls.ok && calls.stop != npos) out.call_in_progress = call_being_written(rest.substr(calls.stop), syntax.tools);
  std::string content(trim(rest.substr(0, calls.start)));
  if (calls.ok && calls.end < rest.size()) {
    const string_view after = trim(rest.substr(calls.end));
    if (!after.empty()) content += (content.empty() ? "" : "\n") + std::string(after);
  }
  out.content = std::move(content);
  return out;
}

std::vector<ToolCallStreamer::Delta> ToolCallStreamer::update(const ChatReply& now, bool parallel) {
  std::vector<const ToolCall*> calls;
  for (const ToolCall& c : now.tool_calls) calls.push_back(&c);
  if (now.call_in_progress) calls.push_back(&*now.call_in_progress);
  if (!parallel && calls.size() > 1) calls.resize(1);
  std::vector<Delta> out;
  for (size_t k = 0; k < calls.size(); ++k) {
    const ToolCall& c = *calls[k];
    const bool finished = k < now.tool_calls.size();
    if (k >= sent_.size()) {
      sent_.emplace_back();
      out.push_back({k, true, c.id, c.name, ""});
    }
    // (the raw text only grows: what was sent is its beginning)
    const std::string& target = !c.raw_arguments.empty() || !finished ? c.raw_arguments : c.arguments;
    std::string& sent = sent_[k];
    if (target.size() > sent.size() && target.starts_with(sent)) {
      out.push_back({k, false, "", "", target.substr(sent.size())});
      sent = target;
    }
  }
  return out;
}

}  // namespace toy
