#include "toy/serve/openai.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/infer/json_schema.h"

namespace toy::serve {

using nlohmann::json;

ApiError bad_request(const std::string& message, const std::string& param) {
  return ApiError(400, "invalid_request_error", message, param);
}

json error_body(const ApiError& e) {
  // toy's internal "[serve] ", "[chat] " ... prefixes say where in toy; an API client needs none.
  std::string_view m = e.what();
  if (const size_t end = m.find("] "); !m.empty() && m[0] == '[' && end < 32 &&
                                       m.substr(1, end - 1).find_first_of(" []") == std::string_view::npos)
    m.remove_prefix(end + 2);
  json err = {{"message", std::string(m)}, {"type", e.type}, {"code", e.status}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  return {{"error", err}};
}

SamplerConfig default_sampling() {
  SamplerConfig c;
  c.temperature = 0.8f;
  c.top_k = 40;
  c.top_p = 0.95f;
  c.min_p = 0.05f;
  return c;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace {

json parse_object(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw bad_request("the body is not valid JSON (or not valid UTF-8)");
  if (!j.is_object()) throw bad_request("the body must be a JSON object");
  return j;
}

// A field, when present and not null.
const json* field(const json& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& j, const char* name, double lo, double hi) {
  const json* v = field(j, name);
  if (!v->is_number()) throw bad_request(fmt::format("'{}' must be a number", name), name);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw bad_request(fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, x), name);
  return x;
}

int64_t integer(const json& j, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(j, name);
  if (!v->is_number_integer() && !(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
                                   std::abs(v->get<double>()) < 9e15))
    throw bad_request(fmt::format("'{}' must be an integer", name), name);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw bad_request(fmt::format("'{}' must be at most {}", name, hi), name);
  const int64_t x = v->is_number_float() ? int64_t(v->get<double>()) : v->get<int64_t>();
  if (x < lo || x > hi) throw bad_request(fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, x), name);
  return x;
}

bool boolean(const json& j, const char* name) {
  const json* v = field(j, name);
  if (!v->is_boolean()) throw bad_request(fmt::format("'{}' must be true or false", name), name);
  return v->get<bool>();
}

std::string string_of(const json& v, const std::string& name) {
  if (!v.is_string()) throw bad_request(fmt::format("'{}' must be a string", name), name);
  return v.get<std::string>();
}

// A message's content: a string, or a list of parts of which the text parts count.
template <class Json>
std::string message_content(const Json& c, size_t i) {
  const std::string where = fmt::format("messages[{}].content", i);
  if (c.is_string()) return c.template get<std::string>();
  if (c.is_null()) return "";
  if (!c.is_array()) throw bad_request(fmt::format("'{}' must be a string or a list of text parts", where), where);
  std::string text;
  for (const Json& part : c) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw bad_request(fmt::format("'{}': only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported", where),
                        where);
    text += part["text"].template get<std::string>();
  }
  return text;
}

std::vector<int32_t> token_list(const json& v, const char* name) {
  std::vector<int32_t> ids;
  for (const json& t : v) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw bad_request(fmt::format("'{}' must be a list of token ids (non-negative integers)", name), name);
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return ids;
}

// One message of a chat request, as the template receives it.
nlohmann::ordered_json chat_message(const nlohmann::ordered_json& msg, size_t i) {
  if (!msg.is_object() || !msg.contains("role"))
    throw bad_request(fmt::format("'messages[{}]' must be an object with a 'role'", i), "messages");
  if (!msg["role"].is_string())
    throw bad_request(fmt::format("'messages[{}].role' must be a string", i), fmt::format("messages[{}].role", i));
  nlohmann::ordered_json out = msg;
  if (msg.contains("content") && !msg["content"].is_null()) out["content"] = message_content(msg["content"], i);
  else out["content"] = nullptr;
  if (msg.contains("tool_calls") && msg["tool_calls"].is_array())
    for (auto& call : out["tool_calls"])
      if (call.is_object() && call.contains("function") && call["function"].is_object() &&
          call["function"].contains("arguments") && call["function"]["arguments"].is_string()) {
        const std::string& text = call["function"]["arguments"].get_ref<const std::string&>();
        auto args = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (args.is_object()) call["function"]["arguments"] = std::move(args);
      }
  return out;
}

// response_format ({"type": "text" | "json_object" | "json_schema", "json_schema": {"schema",
// "strict"?, "name"?}}) or llama-server's `grammar` (GBNF), compiled; null when neither.
std::shared_ptr<const Grammar> structured_output(std::string_view body, const json& j, const GrammarVocab& vocab) {
  const json* rf = field(j, "response_format");
  const json* gbnf = field(j, "grammar");
  if (rf && gbnf) throw bad_request("give 'response_format' or 'grammar', not both", "grammar");
  std::string text;
  const char* param = "grammar";
  if (gbnf) {
    if (!gbnf->is_string()) throw bad_request("'grammar' must be a GBNF text", "grammar");
    text = gbnf->get<std::string>();
  } else if (rf) {
    param = "response_format";
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      throw bad_request("'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}",
                        "response_format");
    const std::string type = (*rf)["type"];
    if (type == "text") return nullptr;
    if (type == "json_object") {
      text = json_object_gbnf();
    } else if (type == "json_schema") {
      // Keys in the schema's order: properties are written so.
      const auto ordered = nlohmann::ordered_json::parse(body.begin(), body.end());
      const auto& spec = ordered["response_format"];
      if (!spec.contains("json_schema") || !spec["json_schema"].is_object() || !spec["json_schema"].contains("schema"))
        throw bad_request("'response_format' json_schema needs {\"json_schema\": {\"schema\": {...}}}", "response_format");
      try {
        text = json_schema_to_gbnf(spec["json_schema"]["schema"]);
      } catch (const Error& e) {
        throw bad_request(e.what(), "response_format");
      }
    } else {
      throw bad_request(fmt::format("'response_format' type '{}' is not one of text, json_object, json_schema",
                                    printable(type, 40)), "response_format");
    }
  } else {
    return nullptr;
  }
  try {
    auto g = Grammar::parse_cached(text, vocab);
    GrammarMatcher start(g);  // a grammar whose rules expand without end fails here, not mid-reply
    return g;
  } catch (const Error& e) {
    throw bad_request(e.what(), param);
  }
}

// OpenAI's tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}].
nlohmann::ordered_json tool_list(const nlohmann::ordered_json& tools) {
  if (!tools.is_array()) throw bad_request("'tools' must be a list of {\"type\": \"function\", \"function\": ...}", "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    const bool ok = t.is_object() && t.value("type", "") == "function" && t.contains("function") &&
                    t["function"].is_object() && t["function"].contains("name") && t["function"]["name"].is_string() &&
                    (!t["function"].contains("parameters") || t["function"]["parameters"].is_object());
    if (!ok)
      throw bad_request(fmt::format("'tools[{}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                                    "\"parameters\": {{...}}}}}}", i), "tools");
  }
  return tools.empty() ? nlohmann::ordered_json(nullptr) : tools;
}

// OpenAI's {"token id": bias} (bias in [-100, 100]) or llama-server's [[id, bias], ...].
std::vector<std::pair<int32_t, float>> logit_bias(const json& v) {
  std::vector<std::pair<int32_t, float>> out;
  auto add = [&](const std::string& where, int64_t id, const json& bias) {
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw bad_request(fmt::format("'logit_bias': {} is not a token id", where), "logit_bias");
    if (!bias.is_number() || !std::isfinite(bias.get<double>()) || std::abs(bias.get<double>()) > 100)
      throw bad_request(fmt::format("'logit_bias': the bias of token {} must be a number in [-100, 100]", id),
                        "logit_bias");
    out.emplace_back(int32_t(id), bias.get<float>());
  };
  if (v.is_object()) {
    for (const auto& [key, bias] : v.items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size()) id = -1;
      add(fmt::format("\"{}\"", key), id, bias);
    }
  } else if (v.is_array()) {
    for (const json& pair : v) {
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer())
        throw bad_request("'logit_bias' as a list holds [token id, bias] pairs", "logit_bias");
      add(pair[0].dump(), pair[0].get<int64_t>(), pair[1]);
    }
  } else {
    throw bad_request("'logit_bias' must be an object {\"token id\": bias}", "logit_bias");
  }
  return out;
}

// Every field a request may carry; anything else is refused by name, never ignored.
void check_known_fields(const json& j, bool chat) {
  static const std::set<std::string> common = {
      "model", "user", "max_tokens", "max_completion_tokens", "n_predict", "n", "temperature", "top_p", "top_k",
      "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty", "seed", "stop", "stream", "stream_options",
      "ignore_eos", "logit_bias", "cache_prompt"};
  for (const auto& [key, value] : j.items()) {
    if (value.is_null() || common.count(key) || key == (chat ? "messages" : "prompt") || (!chat && key == "best_of"))
      continue;
    if (chat && (key == "tools" || key == "tool_choice" || key == "parallel_tool_calls")) continue;
    if (key == "logprobs" || (chat && key == "top_logprobs") || key == "response_format" || key == "grammar") continue;
    // Asked for and off: nothing to do.
    if (key == "echo" && value == false) continue;
    throw bad_request(fmt::format("'{}' is not supported by toy serve", printable(key, 60)), key);
  }
}

}  // namespace

CompletionRequest parse_completion_request(std::string_view body, bool chat, const GrammarVocab& vocab) {
  const json j = parse_object(body);
  check_known_fields(j, chat);
  CompletionRequest r;
  r.chat = chat;
  if (chat) {
    const json* m = field(j, "messages");
    if (!m || !m->is_array() || m->empty())
      throw bad_request("'messages' must be a non-empty list of {\"role\", \"content\"} objects", "messages");
    // Again with keys in the client's order: a template's tojson prints them so.
    const auto ordered = nlohmann::ordered_json::parse(body.begin(), body.end());
    for (size_t i = 0; i < m->size(); ++i) r.messages.push_back(chat_message(ordered["messages"][i], i));
    if (field(j, "tools")) r.tools = tool_list(ordered["tools"]);
    if (const json* c = field(j, "tool_choice")) {
      const char* shape = "'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": "
                          "{\"name\": ...}}";
      if (c->is_object()) {
        const json* f = c->contains("function") ? &(*c)["function"] : nullptr;
        if (c->value("type", json()) != "function" || !f || !f->is_object() || !f->contains("name") ||
            !(*f)["name"].is_string())
          throw bad_request(shape, "tool_choice");
        r.tool_choice = "required";
        r.tool_choice_name = (*f)["name"].get<std::string>();
      } else if (*c == "auto" || *c == "none" || *c == "required") {
        r.tool_choice = c->get<std::string>();
      } else {
        throw bad_request(shape, "tool_choice");
      }
      if (r.tool_choice == "required") {
        if (r.tools.is_null() || r.tools.empty())
          throw bad_request("tool_choice asks for a tool call, but the request offers no 'tools'", "tool_choice");
        const bool offered = r.tool_choice_name.empty() ||
                             std::any_of(r.tools.begin(), r.tools.end(), [&](const nlohmann::ordered_json& t) {
                               return t["function"]["name"] == r.tool_choice_name;
                             });
        if (!offered)
          throw bad_request(fmt::format("tool_choice names the function '{}', which is not among 'tools'",
                                        printable(r.tool_choice_name, 60)), "tool_choice");
      }
    }
    if (field(j, "parallel_tool_calls")) r.parallel_tool_calls = boolean(j, "parallel_tool_calls");
  } else {
    const json* p = field(j, "prompt");
    if (!p) throw bad_request("'prompt' is required", "prompt");
    if (p->is_string()) {
      r.prompt = p->get<std::string>();
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
      r.prompt_ids = token_list(*p, "prompt");
      r.prompt_is_ids = true;
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
      r.prompt = (*p)[0].get<std::string>();
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) {
      r.prompt_ids = token_list((*p)[0], "prompt");
      r.prompt_is_ids = true;
    } else {
      throw bad_request("'prompt' must be a string or a list of token ids (one prompt per request)", "prompt");
    }
  }
  if (field(j, "n") && integer(j, "n", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()) != 1)
    throw bad_request("only n = 1 is supported", "n");
  if (field(j, "best_of") && integer(j, "best_of", 1, 1) != 1) throw bad_request("only best_of = 1 is supported", "best_of");
  for (const char* name : {"max_tokens", "max_completion_tokens", "n_predict"})
    if (field(j, name)) {
      const int64_t n = integer(j, name, -1, std::numeric_limits<int64_t>::max());
      r.max_tokens = n;
    }
  SamplerConfig& s = r.sampling;
  if (field(j, "temperature")) s.temperature = float(number(j, "temperature", 0, 100));
  if (field(j, "top_p")) s.top_p = float(number(j, "top_p", 0, 1));
  if (field(j, "top_k")) s.top_k = int(integer(j, "top_k", 0, std::numeric_limits<int32_t>::max()));
  if (field(j, "min_p")) s.min_p = float(number(j, "min_p", 0, 1));
  if (field(j, "presence_penalty")) s.presence_penalty = float(number(j, "presence_penalty", -2, 2));
  if (field(j, "frequency_penalty")) s.frequency_penalty = float(number(j, "frequency_penalty", -2, 2));
  if (field(j, "repeat_penalty")) s.repeat_penalty = float(number(j, "repeat_penalty", 0.01, 100));
  if (s.top_p == 0) s.top_p = 1e-6f;  // OpenAI allows 0: keep only the most likely token
  if (field(j, "seed")) {
    const json* v = field(j, "seed");
    if (v->is_number_unsigned()) {
      r.seed = v->get<uint64_t>();
    } else {
      const int64_t seed = integer(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
      if (seed != -1) r.seed = uint64_t(seed);  // -1: a random seed, as llama-server takes it
    }
  }
  if (const json* st = field(j, "stop")) {
    if (st->is_string()) {
      r.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 16) throw bad_request("'stop' may hold at most 16 strings", "stop");
      for (const json& x : *st) r.stop.push_back(string_of(x, "stop"));
    } else {
      throw bad_request("'stop' must be a string or a list of strings", "stop");
    }
    std::erase(r.stop, std::string());
  }
  if (const json* b = field(j, "logit_bias")) s.logit_bias = logit_bias(*b);
  r.grammar = structured_output(body, j, vocab);
  if (r.grammar && r.tool_choice == "required")
    throw bad_request("a required tool call is itself constrained output: give 'tool_choice' 'required' (or a named "
                      "function) or 'response_format'/'grammar', not both", "tool_choice");
  if (chat) {
    const bool want = field(j, "logprobs") && boolean(j, "logprobs");
    if (field(j, "top_logprobs")) {
      const int64_t k = integer(j, "top_logprobs", 0, 20);
      if (!want) throw bad_request("'top_logprobs' needs \"logprobs\": true", "top_logprobs");
      r.top_logprobs = int(k);
    } else if (want) {
      r.top_logprobs = 0;
    }
  } else if (field(j, "logprobs")) {
    r.top_logprobs = int(integer(j, "logprobs", 0, 20));
  }
  if (field(j, "cache_prompt")) (void)boolean(j, "cache_prompt");  // toy always reuses a cached prefix
  if (field(j, "stream")) r.stream = boolean(j, "stream");
  if (field(j, "ignore_eos")) r.ignore_eos = boolean(j, "ignore_eos");
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    if (field(*so, "include_usage")) r.include_usage = boolean(*so, "include_usage");
  }
  return r;
}

EmbeddingRequest parse_embedding_request(std::string_view body) {
  const json j = parse_object(body);
  for (const auto& [key, value] : j.items())
    if (!value.is_null() && key != "input" && key != "model" && key != "user" && key != "encoding_format")
      throw bad_request(fmt::format("'{}' is not supported by toy serve", printable(key, 60)), key);
  EmbeddingRequest r;
  const json* in = field(j, "input");
  if (!in) throw bad_request("'input' is required", "input");
  auto one_ids = [&](const json& v) {
    EmbeddingInput e;
    e.ids = token_list(v, "input");
    e.is_ids = true;
    if (e.ids.empty()) throw bad_request("an 'input' is empty", "input");
    return e;
  };
  if (in->is_string()) {
    r.inputs.push_back({in->get<std::string>(), {}, false});
  } else if (in->is_array() && !in->empty() && (*in)[0].is_number()) {
    r.inputs.push_back(one_ids(*in));
  } else if (in->is_array() && !in->empty()) {
    if (in->size() > 2048) throw bad_request("'input' may hold at most 2048 items", "input");
    for (const json& item : *in) {
      if (item.is_string()) r.inputs.push_back({item.get<std::string>(), {}, false});
      else if (item.is_array()) r.inputs.push_back(one_ids(item));
      else throw bad_request("'input' must be a string, a list of strings, or token ids", "input");
    }
  } else {
    throw bad_request("'input' must be a string, a list of strings, or token ids", "input");
  }
  for (const auto& e : r.inputs)
    if (!e.is_ids && e.text.empty()) throw bad_request("an 'input' is empty", "input");
  if (const json* f = field(j, "encoding_format")) {
    if (*f != "float" && *f != "base64") throw bad_request("'encoding_format' must be float or base64", "encoding_format");
    r.base64 = *f == "base64";
  }
  return r;
}

TokenizeRequest parse_tokenize_request(std::string_view body) {
  const json j = parse_object(body);
  TokenizeRequest r;
  const json* c = field(j, "content");
  if (!c) throw bad_request("'content' is required", "content");
  r.content = string_of(*c, "content");
  if (field(j, "add_special")) r.add_special = boolean(j, "add_special");
  if (field(j, "parse_special")) r.parse_special = boolean(j, "parse_special");
  return r;
}

std::vector<int32_t> parse_detokenize_request(std::string_view body) {
  const json j = parse_object(body);
  const json* t = field(j, "tokens");
  if (!t || !t->is_array()) throw bad_request("'tokens' must be a list of token ids", "tokens");
  return token_list(*t, "tokens");
}

}  // namespace toy::serve
