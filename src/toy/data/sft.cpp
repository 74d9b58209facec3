#include "toy/data/sft.h"

#include <algorithm>
#include <fstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/core/error.h"
#include "toy/core/files.h"
#include "toy/core/text.h"
#include "toy/data/labels.h"

namespace toy {

namespace {

// Appends a piece of a rendered conversation's tokens (the template's markers special).
void append(SftExample& e, const Tokenizer& tok, const ChatTemplate& chat, const ChatText& piece, bool trained) {
  if (piece.text.empty()) return;
  const std::vector<int32_t> ids = chat.tokenize(tok, piece);
  e.tokens.insert(e.tokens.end(), ids.begin(), ids.end());
  e.trained.insert(e.trained.end(), ids.size(), uint8_t(trained));
}

void append_id(SftExample& e, int32_t id, bool trained) {
  e.tokens.push_back(id);
  e.trained.push_back(uint8_t(trained));
}

const std::string& string_field(const nlohmann::json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  TOY_CHECK(it != j.end(), "{}: no \"{}\"", where, key);
  TOY_CHECK(it->is_string(), "{}: \"{}\" must be a string, got {}", where, key, it->type_name());
  return it->get_ref<const std::string&>();
}

// A conversation's record: each assistant turn counted (its content or tool calls through the
// template's end of turn), everything else context. The messages go to the template as they
// are (tool calls, tool results, reasoning_content: whatever it renders).
SftExample from_messages(const nlohmann::ordered_json& msgs, const nlohmann::ordered_json& tools, const Tokenizer& tok,
                         const ChatTemplate& chat, const std::string& where) {
  TOY_CHECK(tools.is_null() || tools.is_array(), "{}: \"tools\" must be a list of tool definitions", where);
  TOY_CHECK(msgs.is_array() && !msgs.empty(), "{}: \"messages\" must be a non-empty array", where);
  bool any_assistant = false;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string at = fmt::format("{} message {}", where, i + 1);
    const auto& m = msgs[i];
    TOY_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(),
              "{}: must be an object with a string \"role\"", at);
    const bool has_calls = m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty();
    TOY_CHECK(has_calls || (m.contains("content") && m["content"].is_string()),
              "{}: no \"content\" string (nor \"tool_calls\")", at);
    if (m["role"] == "assistant") {
      TOY_CHECK(has_calls || !m["content"].get_ref<const std::string&>().empty(), "{}: an empty assistant reply", at);
      any_assistant = true;
    }
  }
  TOY_CHECK(any_assistant, "{}: no assistant message, so nothing to learn", where);
  SftExample e;
  if (tok.adds_bos() && tok.bos_id() >= 0) append_id(e, tok.bos_id(), false);
  // Each assistant turn is the text between the conversation rendered up to it (with the
  // opening of the assistant's turn) and rendered through it.
  std::string covered;
  auto next_piece = [&](const ChatText& rendered, bool trained) {
    TOY_CHECK(rendered.text.compare(0, covered.size(), covered) == 0,
              "{}: {} does not render this conversation incrementally (an earlier turn renders differently once "
              "later turns follow)", where, chat.name());
    append(e, tok, chat, rendered.tail(covered.size()), trained);
    covered = rendered.text;
  };
  try {
    nlohmann::ordered_json upto = nlohmann::ordered_json::array();
    for (const auto& m : msgs) {
      const bool assistant = m["role"] == "assistant";
      if (assistant) next_piece(chat.render(upto, true, tools), false);
      upto.push_back(m);
      if (assistant) next_piece(chat.render(upto, false, tools), true);
    }
    next_piece(chat.render(msgs, false, tools), false);
  } catch (const Error& ex) {
    fail("{}: {}", where, ex.what());
  }
  return e;
}

// Cuts a record to ctx + 1 tokens; false when nothing counted is left (as a target).
bool fit(SftExample& e, int64_t ctx, SftData& d) {
  if (int64_t(e.tokens.size()) > ctx + 1) {
    e.tokens.resize(size_t(ctx + 1));
    e.trained.resize(size_t(ctx + 1));
    ++d.truncated;
  }
  const bool any = e.tokens.size() >= 2 && std::any_of(e.trained.begin() + 1, e.trained.end(), [](uint8_t t) { return t; });
  if (!any) ++d.dropped;
  return any;
}


}  // namespace

SftExample parse_sft_record(const std::string& line, const Tokenizer& tok, const ChatTemplate* chat,
                            const std::string& where, std::string_view no_template_why) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& ex) {
    fail("{}: not valid JSON ({})", where, printable(ex.what()));
  }
  TOY_CHECK(j.is_object(), "{}: a record must be a JSON object, got {}", where, j.type_name());
  if (j.contains("messages")) {
    TOY_CHECK(!j.contains("prompt") && !j.contains("completion"),
              "{}: a record has either \"messages\" or \"prompt\"/\"completion\", not both", where);
    TOY_CHECK(chat != nullptr, "{}: a \"messages\" record needs a chat template ({}; --chat-template FILE gives one)",
              where, no_template_why.empty() ? "none was given" : no_template_why);
    // Again with keys in the record's order: a template's tojson prints them so.
    const auto ordered = nlohmann::ordered_json::parse(line);
    return from_messages(ordered["messages"], ordered.contains("tools") ? ordered["tools"] : nlohmann::ordered_json(),
                         tok, *chat, where);
  }
  TOY_CHECK(j.contains("prompt") || j.contains("completion"),
            "{}: a record needs \"prompt\" and \"completion\", or \"messages\"", where);
  const std::string& prompt = string_field(j, "prompt", where);
  const std::string& completion = string_field(j, "completion", where);
  TOY_CHECK(!completion.empty(), "{}: an empty completion", where);
  SftExample e;
  if (tok.adds_bos() && tok.bos_id() >= 0) append_id(e, tok.bos_id(), false);
  const std::vector<int32_t> p = tok.encode(prompt), c = tok.encode(completion);
  for (int32_t id : p) append_id(e, id, false);
  for (int32_t id : c) append_id(e, id, true);
  if (tok.eos_id() >= 0) append_id(e, tok.eos_id(), true);
  return e;
}

SftData read_sft_data(const std::string& path, const Tokenizer& tok, const ChatTemplate* chat, int64_t ctx,
                      std::string_view no_template_why) {
  TOY_CHECK(ctx >= 1, "[finetune] --ctx must be at least 1, got {}", ctx);
  const std::string shown = printable(path);
  const std::string text = read_regular_file(path, "[finetune] --data");
  SftData d;
  if (!path.ends_with(".jsonl")) {
    // Plain text: windows of ctx + 1 tokens, every token counted.
    std::vector<int32_t> ids = tok.encode(text);
    if (tok.adds_bos() && tok.bos_id() >= 0) ids.insert(ids.begin(), tok.bos_id());
    for (size_t at = 0; at + 1 < ids.size(); at += size_t(ctx + 1)) {
      SftExample e;
      const size_t end = std::min(ids.size(), at + size_t(ctx + 1));
      e.tokens.assign(ids.begin() + long(at), ids.begin() + long(end));
      e.trained.assign(e.tokens.size(), 1);
      d.examples.push_back(std::move(e));
    }
    TOY_CHECK(!d.examples.empty(), "[finetune] '{}': the text is shorter than 2 tokens", shown);
    return d;
  }
  size_t start = 0;
  int64_t line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = fmt::format("[finetune] '{}' line {}", shown, line_no);
    SftExample e = parse_sft_record(line, tok, chat, where, no_template_why);
    e.line = line_no;
    if (fit(e, ctx, d)) d.examples.push_back(std::move(e));
  }
  TOY_CHECK(!d.examples.empty(), "[finetune] '{}': no records with anything to learn ({} dropped)", shown, d.dropped);
  return d;
}

void split_sft(std::vector<SftExample> all, double fraction, uint64_t seed, std::vector<SftExample>& train,
               std::vector<SftExample>& val) {
  TOY_CHECK(fraction >= 0 && fraction < 1, "[finetune] --val-fraction must be in [0, 1), got {}", fraction);
  Generator g(seed, 7);
  shuffle(all, g);
  size_t n_val = size_t(double(all.size()) * fraction + 0.5);
  if (fraction > 0 && all.size() >= 2) n_val = std::clamp<size_t>(n_val, 1, all.size() - 1);
  val.assign(std::make_move_iterator(all.begin()), std::make_move_iterator(all.begin() + long(n_val)));
  train.assign(std::make_move_iterator(all.begin() + long(n_val)), std::make_move_iterator(all.end()));
}

int64_t make_sft_batch(const std::vector<const SftExample*>& batch, int64_t vocab, Tensor& ids, Tensor& targets) {
  TOY_CHECK(!batch.empty(), "[finetune] an empty batch");
  int64_t T = 1;
  for (const SftExample* e : batch) T = std::max<int64_t>(T, int64_t(e->tokens.size()) - 1);
  const int64_t B = int64_t(batch.size());
  ids = zeros(Shape{B, T}, DType::I32);
  targets = full(Shape{B, T}, labels::kIgnore, DType::I32);
  int32_t* ip = ids.data<int32_t>();
  int32_t* tp = targets.data<int32_t>();
  int64_t counted = 0;
  for (int64_t b = 0; b < B; ++b) {
    const SftExample& e = *batch[size_t(b)];
    const Tensor t = labels::masked_next_token(e.tokens, e.trained, vocab);
    const int32_t* src = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      ip[b * T + i] = e.tokens[size_t(i)];
      tp[b * T + i] = src[i];
      counted += src[i] != labels::kIgnore;
    }
  }
  return counted;
}

int64_t make_packed_sft_batch(const std::vector<std::vector<const SftExample*>>& rows, int64_t ctx, int64_t vocab,
                              Tensor& ids, Tensor& targets, Tensor& positions, Tensor& segments) {
  TOY_CHECK(!rows.empty() && ctx >= 1, "[finetune] an empty packed batch");
  const int64_t R = int64_t(rows.size());
  ids = zeros(Shape{R, ctx}, DType::I32);
  targets = full(Shape{R, ctx}, labels::kIgnore, DType::I32);
  positions = zeros(Shape{R, ctx}, DType::I32);
  segments = zeros(Shape{R, ctx}, DType::I32);
  int32_t* ip = ids.data<int32_t>();
  int32_t* tp = targets.data<int32_t>();
  int32_t* pp = positions.data<int32_t>();
  int32_t* sp = segments.data<int32_t>();
  int64_t counted = 0;
  for (int64_t r = 0; r < R; ++r) {
    int64_t at = 0;
    int32_t segment = 0;
    for (const SftExample* e : rows[size_t(r)]) {
      const Tensor t = labels::masked_next_token(e->tokens, e->trained, vocab);
      const int64_t n = t.numel();
      TOY_CHECK(at + n <= ctx, "[finetune] packed row {}: {} tokens do not fit in {}", r, at + n, ctx);
      ++segment;
      const int32_t* src = t.data<int32_t>();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = r * ctx + at + i;
        ip[k] = e->tokens[size_t(i)];
        tp[k] = src[i];
        pp[k] = int32_t(i);
        sp[k] = segment;
        counted += src[i] != labels::kIgnore;
      }
      at += n;
    }
    // Padding keeps segment 0 and its own increasing positions; its targets are ignored.
    for (int64_t i = at; i < ctx; ++i) pp[r * ctx + i] = int32_t(i - at);
  }
  return counted;
}

}  // namespace toy
