#include "toy/infer/chat.h"

#include <algorithm>
#include <set>

#include "toy/core/error.h"
#include "toy/core/files.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"

namespace toy {

const char* const kChatMLTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "(message['content'] if message['content'] is string else '') + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

namespace {

// Private-use code points stand in for control-token text inside the messages while the
// template runs: one code point survives whatever a template does to a string (trim, split,
// upper, slicing), and is turned back into the token's text, marked plain, afterwards.
constexpr uint32_t kFirstPrivate = 0xE000, kLastPrivate = 0xF8FF;

std::string utf8_of(uint32_t cp) {  // cp in the BMP's private-use area: three bytes
  return {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
}

// Private-use code points appearing in `s` (three-byte sequences EE/EF xx xx).
void collect_private(std::string_view s, std::set<uint32_t>& used) {
  for (size_t i = 0; i + 2 < s.size(); ++i) {
    const auto b0 = uint8_t(s[i]), b1 = uint8_t(s[i + 1]), b2 = uint8_t(s[i + 2]);
    if ((b0 == 0xEE || b0 == 0xEF) && (b1 & 0xC0) == 0x80 && (b2 & 0xC0) == 0x80) {
      const uint32_t cp = (uint32_t(b0 & 0x0F) << 12) | (uint32_t(b1 & 0x3F) << 6) | (b2 & 0x3F);
      if (cp >= kFirstPrivate && cp <= kLastPrivate) used.insert(cp);
    }
  }
}

// Every string in j (keys too), in order.
template <class F>
void each_string(const nlohmann::ordered_json& j, F&& f) {
  if (j.is_string()) {
    f(j.get_ref<const std::string&>());
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      f(k);
      each_string(v, f);
    }
  } else if (j.is_array()) {
    for (const auto& v : j) each_string(v, f);
  }
}

// The messages' text with control-token texts replaced by their stand-ins.
class Masker {
 public:
  Masker(const std::vector<std::string>& controls, std::string_view template_text,
         const std::vector<const nlohmann::ordered_json*>& inputs) {
    // Which control texts the inputs spell (longest first, so the longest match wins).
    std::vector<const std::string*> found;
    for (const std::string& c : controls) {
      bool spelled = false;
      for (const auto* in : inputs)
        each_string(*in, [&](const std::string& s) { spelled = spelled || s.find(c) != std::string::npos; });
      if (spelled) found.push_back(&c);
    }
    if (found.empty()) return;
    std::stable_sort(found.begin(), found.end(), [](auto* a, auto* b) { return a->size() > b->size(); });
    std::set<uint32_t> used;
    collect_private(template_text, used);
    for (const auto* in : inputs) each_string(*in, [&](const std::string& s) { collect_private(s, used); });
    uint32_t cp = kFirstPrivate;
    for (const std::string* c : found) {
      while (cp <= kLastPrivate && used.count(cp)) ++cp;
      TOY_CHECK(cp <= kLastPrivate, "[chat] the conversation uses every private-use character; toy cannot mark its text");
      stand_ins_.push_back({*c, utf8_of(cp++)});
    }
  }

  bool active() const { return !stand_ins_.empty(); }

  nlohmann::ordered_json mask(const nlohmann::ordered_json& j) const {
    if (j.is_string()) return mask_string(j.get_ref<const std::string&>());
    if (j.is_array()) {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const auto& v : j) out.push_back(mask(v));
      return out;
    }
    if (j.is_object()) {
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      for (const auto& [k, v] : j.items()) out[mask_string(k)] = mask(v);
      return out;
    }
    return j;
  }

  // The rendered text with each stand-in turned back into its control text, marked plain.
  ChatText unmask(const std::string& rendered) const {
    ChatText t;
    t.text.reserve(rendered.size());
    size_t i = 0;
    while (i < rendered.size()) {
      const StandIn* hit = nullptr;
      if (uint8_t(rendered[i]) == 0xEE || uint8_t(rendered[i]) == 0xEF)
        for (const StandIn& s : stand_ins_)
          if (rendered.compare(i, s.code.size(), s.code) == 0) hit = &s;
      if (!hit) {
        t.text += rendered[i++];
        continue;
      }
      if (!t.plain.empty() && t.plain.back().end == t.text.size())
        t.plain.back().end += hit->text.size();  // adjacent spans merge
      else
        t.plain.push_back({t.text.size(), t.text.size() + hit->text.size()});
      t.text += hit->text;
      i += hit->code.size();
    }
    return t;
  }

 private:
  struct StandIn {
    std::string text, code;
  };
  std::vector<StandIn> stand_ins_;

  std::string mask_string(const std::string& s) const {
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
      const StandIn* hit = nullptr;
      for (const StandIn& c : stand_ins_)
        if (s.compare(i, c.text.size(), c.text) == 0) {
          hit = &c;
          break;
        }
      if (hit) {
        out += hit->code;
        i += hit->text.size();
      } else {
        out += s[i++];
      }
    }
    return out;
  }
};

}  // namespace

ChatText ChatText::tail(size_t from) const {
  ChatText t;
  t.text = text.substr(std::min(from, text.size()));
  for (const Tokenizer::Span& s : plain)
    if (s.end > from) t.plain.push_back({std::max(s.begin, from) - from, s.end - from});
  return t;
}

ChatTemplate::ChatTemplate(std::string text, std::string name, bool defaulted, const Tokenizer& tok)
    : source_(std::move(text)), name_(std::move(name)), defaulted_(defaulted), renderer_(source_),
      syntax_(ChatSyntax::detect(source_)) {
  if (tok.bos_id() >= 0) bos_ = tok.token_bytes(tok.bos_id());
  if (tok.eos_id() >= 0) eos_ = tok.token_bytes(tok.eos_id());
  strip_bos_ = tok.adds_bos() && !bos_.empty();
  for (int32_t id : tok.control_ids())
    if (!tok.token_bytes(id).empty()) controls_.push_back(tok.token_bytes(id));
}

ChatTemplate ChatTemplate::from_text(std::string text, std::string name, const Tokenizer& tok) {
  try {
    return ChatTemplate(std::move(text), name, false, tok);
  } catch (const Error& e) {
    fail("[chat] {}: {}", name, e.what());
  }
}

ChatTemplate ChatTemplate::from_model(const gguf::Reader& r, const Tokenizer& tok) {
  const gguf::Value* v = r.find("tokenizer.chat_template");
  if (!v) return ChatTemplate(kChatMLTemplate, "ChatML (the model has no template)", true, tok);
  TOY_CHECK(v->type == gguf::Type::STRING, "[chat] '{}': tokenizer.chat_template has type {}, expected a string",
            printable(r.path()), gguf::type_name(v->type));
  return from_text(v->s, fmt::format("the chat template of '{}'", printable(r.path())), tok);
}

ChatTemplate ChatTemplate::from_file(const std::string& path, const Tokenizer& tok) {
  constexpr uint64_t kMaxBytes = uint64_t{64} << 20;
  return from_text(read_regular_file(path, "[chat] --chat-template", kMaxBytes), fmt::format("'{}'", printable(path)), tok);
}

ChatTemplate ChatTemplate::choose(const std::string& path, const gguf::Reader& r, const Tokenizer& tok) {
  return path.empty() ? from_model(r, tok) : from_file(path, tok);
}

ChatText ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                              const nlohmann::ordered_json& tools) const {
  TOY_CHECK(messages.is_array(), "[chat] the messages must be a list, got {}", messages.type_name());
  const Masker masker(controls_, source_, {&messages, &tools});
  nlohmann::ordered_json conv = nlohmann::ordered_json::object();
  conv["messages"] = masker.active() ? masker.mask(messages) : messages;
  if (!tools.is_null()) conv["tools"] = masker.active() ? masker.mask(tools) : tools;
  conv["add_generation_prompt"] = add_generation_prompt;
  conv["bos_token"] = bos_;
  conv["eos_token"] = eos_;
  std::string rendered;
  try {
    rendered = renderer_.render(conv);
  } catch (const Error& e) {
    fail("[chat] {}: {}", name_, e.what());
  }
  ChatText t = masker.active() ? masker.unmask(rendered) : ChatText{std::move(rendered), {}};
  if (strip_bos_ && t.text.starts_with(bos_) && (t.plain.empty() || t.plain.front().begin >= bos_.size()))
    t = t.tail(bos_.size());
  return t;
}

ChatText ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
  return render(j, add_generation_prompt);
}

std::vector<int32_t> ChatTemplate::tokenize(const Tokenizer& tok, const ChatText& t) const {
  return tok.encode_special(t.text, t.plain);
}

std::vector<int32_t> ChatTemplate::prompt_ids(const Tokenizer& tok, const ChatText& t) const {
  std::vector<int32_t> ids;
  if (tok.adds_bos()) ids.push_back(tok.bos_id());
  const std::vector<int32_t> body = tokenize(tok, t);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

}  // namespace toy
