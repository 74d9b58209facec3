// Token elements in grammars, texts without a marker, and tool_choice "required": the grammar of
// each tool-call format, walked at random over a vocabulary (as a random-weight model at
// temperature 1 would), always yields calls parse_chat_reply reads back with valid arguments.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "chat_vocab.h"
#include "proc.h"
#include "toy/core/error.h"
#include "toy/infer/chat_output.h"
#include "toy/infer/gbnf.h"
#include "toy/infer/grammar.h"
#include "toy/infer/grammar_mask.h"
#include "toy/infer/json_schema.h"
#include "toy/infer/tool_grammar.h"
#include "toy/io/gguf.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;
using Json = nlohmann::ordered_json;

namespace {

const char* const kCorpus =
    "the weather in paris is fine, call get_weather with city and unit. {\"name\": \"x\"} "
    "héllo wörld, é è ü, 日本語の天気, 😀😀 emoji";

std::unique_ptr<Tokenizer> vocab(const std::vector<std::string>& markers, int type, const std::string& tag) {
  return test::chat_vocab(kCorpus, markers, type, "tool_" + tag);
}

using test::special_id;

// Tokens drawn uniformly among those the grammar allows (ending, when it may, with odds 1 in 6).
// Returns false when the walk ran past `limit` tokens without ending.
bool random_reply(const std::shared_ptr<const Grammar>& g, const Tokenizer& tok, TokenMasker& masker,
                  std::mt19937& rng, std::string& text, std::vector<size_t>* token_ends = nullptr, size_t limit = 3000) {
  GrammarMatcher m(g);
  std::vector<int32_t> ends = tok.end_of_generation_ids();
  std::vector<int32_t> specials = tok.special_ids();
  std::sort(specials.begin(), specials.end());
  text.clear();
  for (size_t step = 0; step < limit; ++step) {  // (limit: tokens)
    if (m.complete() && (m.finished() || rng() % 6 == 0)) return true;
    const std::vector<uint8_t>& ok = masker.allowed(m, g);
    std::vector<int32_t> ids;
    for (size_t i = 0; i < ok.size(); ++i)
      if (ok[i] && std::find(ends.begin(), ends.end(), int32_t(i)) == ends.end()) ids.push_back(int32_t(i));
    if (ids.empty()) return m.complete();
    // Half the time a token without letters or digits (quotes, brackets), or a marker: walks end sooner.
    std::vector<int32_t> closers;
    for (int32_t i : ids) {
      const std::string& b = tok.token_bytes(i);
      if ((b.size() > 1 && (b[0] == '<' || b[0] == '[')) ||
          std::none_of(b.begin(), b.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || uint8_t(c) >= 0x80; }))
        closers.push_back(i);
    }
    const int32_t id = !closers.empty() && rng() % 2 ? closers[rng() % closers.size()] : ids[rng() % ids.size()];
    const bool special = std::binary_search(specials.begin(), specials.end(), id);
    EXPECT_TRUE(m.accept_token(id, tok.token_bytes(id), special)) << "the mask allowed a token the matcher refuses";
    text += tok.token_bytes(id);
    if (token_ends) token_ends->push_back(text.size());
  }
  return false;
}

// What a client of a stream receives: the text given a token at a time (at whole UTF-8
// characters, as the server's decoder sends it), each parse's deltas, then the final parse's.
struct Streamed {
  std::vector<std::string> names, arguments;
  size_t argument_pieces = 0;
};
Streamed stream(const std::string& text, const std::vector<size_t>& token_ends, const ChatSyntax& syntax, bool parallel) {
  ToolCallStreamer streamer;
  Streamed out;
  auto take = [&](const ChatReply& r) {
    for (const ToolCallStreamer::Delta& d : streamer.update(r, parallel)) {
      if (d.header) {
        EXPECT_EQ(d.index, out.names.size());
        out.names.push_back(d.name);
        out.arguments.emplace_back();
      }
      out.arguments.at(d.index) += d.arguments;
      out.argument_pieces += !d.arguments.empty();
    }
  };
  for (size_t end : token_ends) {
    size_t cut = end;  // (back to a whole character)
    while (cut > 0 && cut < text.size() && (uint8_t(text[cut]) & 0xC0) == 0x80) --cut;
    take(parse_chat_reply(std::string_view(text).substr(0, cut), syntax, true, true));
  }
  take(parse_chat_reply(text, syntax, true, false));
  return out;
}

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
  {"type": "function", "function": {"name": "note", "parameters": {"type": "object",
    "properties": {"text": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}},
    "required": ["text", "tags"]}}}
])");

// The arguments a call carries are valid for its tool (the subset of JSON Schema kTools uses).
void expect_valid(const ToolCall& c, const std::string& context) {
  const Json args = Json::parse(c.arguments, nullptr, false);
  ASSERT_TRUE(args.is_object()) << context << " arguments " << c.arguments;
  if (c.name == "get_weather") {
    ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << context;
    for (const auto& [k, v] : args.items()) {
      EXPECT_TRUE(k == "city" || k == "unit" || k == "days") << context << " key " << k;
      if (k == "unit") {
        EXPECT_TRUE(v == "c" || v == "f") << context;
      }
      if (k == "days") {
        EXPECT_TRUE(v.is_number_integer() && v.get<int>() >= 1 && v.get<int>() <= 7) << context;
      }
    }
  } else if (c.name == "now") {
    SUCCEED();
  } else if (c.name == "note") {
    EXPECT_TRUE(args.contains("text") && args["text"].is_string()) << context;
    ASSERT_TRUE(args.contains("tags") && args["tags"].is_array()) << context;
    EXPECT_LE(args["tags"].size(), 2u) << context;
  } else {
    ADD_FAILURE() << context << ": a call of an unknown tool '" << c.name << "'";
  }
}

// Every marker the formats write (those the vocabulary makes tokens of).
const std::vector<std::string> kMarkers = {
    "<tool_call>", "</tool_call>", "<seed:tool_call>", "</seed:tool_call>", "<minimax:tool_call>",
    "</minimax:tool_call>", "[TOOL_CALLS]", "[ARGS]", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>",
    "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|start|>", "<|START_ACTION|>", "<|END_ACTION|>",
    "<TOOLCALL>", "</TOOLCALL>", "<|tool_call|>", "<|tools_prefix|>", "<|tools_suffix|>", "<|tool_call>",
    "<tool_call|>", "<|\"|>", "<think>", "</think>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "<function=", "</function>", "<parameter=", "</parameter>", "<invoke name=\"", "</invoke>", "<parameter name=\"",
    "<function name=\"", "<param name=\"", "</param>"};

}  // namespace

TEST(Grammar, TokenElementsMatchWholeTokens) {
  const auto tok = vocab({"<think>", "</think>"}, 4, "think");
  const int32_t open = special_id(*tok, "<think>"), close = special_id(*tok, "</think>");
  ASSERT_GE(open, 0);
  ASSERT_GE(close, 0);
  const GrammarVocab v = grammar_vocab(*tok);
  // <think> by text and </think> by id; !<[id]> any other token.
  auto g = Grammar::parse(fmt::format("root ::= <think> !<[{}]>* <[{}]> \"ok\"", close, close), v);
  GrammarMatcher m(g);
  const int32_t lt = tok->encode("<")[0];
  EXPECT_FALSE(GrammarMatcher(m).accept_token(lt, "<", false)) << "a token element takes no text";
  EXPECT_FALSE(GrammarMatcher(m).accept("<think>")) << "the text of a token is not the token";
  ASSERT_TRUE(m.accept_token(open, tok->token_bytes(open), true));
  const std::vector<int32_t> body = tok->encode("the weather");
  for (int32_t id : body) ASSERT_TRUE(m.accept_token(id, tok->token_bytes(id), false));
  ASSERT_TRUE(m.accept_token(open, tok->token_bytes(open), true)) << "!<[close]> takes any other token, specials too";
  EXPECT_FALSE(m.complete());
  ASSERT_TRUE(m.accept_token(close, tok->token_bytes(close), true));
  EXPECT_FALSE(GrammarMatcher(m).accept_token(close, tok->token_bytes(close), true));
  ASSERT_TRUE(m.accept("ok"));
  EXPECT_TRUE(m.complete());
  // The mask offers the token element's token, and nothing else special.
  TokenMasker masker(*tok);
  GrammarMatcher start(g);
  const std::vector<uint8_t>& ok = masker.allowed(start, g);
  EXPECT_EQ(std::count(ok.begin(), ok.end(), 1), 1);
  EXPECT_EQ(ok[size_t(open)], 1);
  // Bad references are errors naming the place.
  EXPECT_THROW(Grammar::parse("root ::= <nothing-like-this>", v), Error);
  EXPECT_THROW(Grammar::parse("root ::= <[999999]>", v), Error);
  EXPECT_THROW(Grammar::parse("root ::= <think>"), Error) << "no vocabulary: token references cannot resolve";
  EXPECT_THROW(Grammar::parse("root ::= <think", v), Error);
  // A rule of the text named like a group's internal rule does not collide with it.
  auto g2 = Grammar::parse("root ::= (\"a\" | \"b\") root_1\nroot_1 ::= \"c\"");
  EXPECT_TRUE(GrammarMatcher(g2).accept("ac"));
  EXPECT_FALSE(GrammarMatcher(g2).accept("aa"));
}

TEST(Grammar, TextWithoutAMarkerIsExactlyThat) {
  std::mt19937 rng(11);
  for (const std::string marker : {"</think>", "aab", "abab", "<|end|>", "</parameter>"}) {
    auto g = Grammar::parse("root ::= t\n" + gbnf_text_without("t", marker));
    std::string alphabet = marker + "xy";
    for (int i = 0; i < 400; ++i) {
      std::string s;
      const size_t n = rng() % 14;
      for (size_t k = 0; k < n; ++k) s += alphabet[rng() % alphabet.size()];
      if (i % 7 == 0) s += marker.substr(0, rng() % marker.size());  // ends with part of the marker
      GrammarMatcher m(g);
      const bool accepted = m.accept(s) && m.complete();
      EXPECT_EQ(accepted, s.find(marker) == std::string::npos) << marker << " / " << s;
    }
  }
}

// Every format: random replies under its grammar parse back as calls of the offered tools,
// with arguments valid for each; one call unless parallel; only the named one when named.
TEST(ToolGrammar, EveryFormatsRequiredCallsParseBackValid) {
  const auto plain = vocab(kMarkers, 1, "text");  // markers as text (some of it one token)
  const auto marked = vocab(kMarkers, 3, "marked");  // markers as control tokens
  std::mt19937 rng(2026);
  // (Under the sanitizers, where a walk is ~15x slower, 2 walks per format and variant: every
  // path still runs, in half of CI's longest sanitizer test.)
  const int trials = toy::test::under_asan() ? 2 : 4;
  int replies = 0;
  std::map<std::string, size_t> streamed_pieces;  // argument deltas beyond one per call, per format
  for (int f = int(ToolCallFormat::Hermes); f <= int(ToolCallFormat::Gemma4); ++f) {
    for (int variant = 0; variant < 6; ++variant) {
      const Tokenizer& tok = variant % 2 ? *marked : *plain;
      ChatSyntax syntax;
      syntax.tools = ToolCallFormat(f);
      if (variant >= 2 && syntax.tools != ToolCallFormat::GptOss) syntax.think_open = "<think>", syntax.think_close = "</think>";
      syntax.starts_thinking = variant >= 4 && !syntax.think_open.empty();
      const bool parallel = variant % 3 != 0;
      const std::string only = variant == 5 ? "note" : "";
      const std::string gbnf = tool_call_gbnf(syntax, kTools, only, parallel, tok);
      std::shared_ptr<const Grammar> g;
      try {
        g = Grammar::parse(gbnf, grammar_vocab(tok));
      } catch (const Error& e) {
        FAIL() << syntax.tools_name() << ": " << e.what() << "\n" << gbnf;
      }
      TokenMasker masker(tok);
      for (int trial = 0; trial < trials; ++trial) {
        std::string text;
        std::vector<size_t> token_ends;
        if (!random_reply(g, tok, masker, rng, text, &token_ends)) continue;  // (a walk that did not end: no verdict)
        ++replies;
        const std::string context = fmt::format("{} variant {}: {}", syntax.tools_name(), variant, text);
        const ChatReply r = parse_chat_reply(text, syntax, true, false);
        ASSERT_FALSE(r.tool_calls.empty()) << context;
        EXPECT_EQ(r.content, "") << context;
        if (!parallel) {
          EXPECT_EQ(r.tool_calls.size(), 1u) << context;
        }
        for (const ToolCall& c : r.tool_calls) {
          if (!only.empty()) {
            EXPECT_EQ(c.name, only) << context;
          }
          expect_valid(c, context);
        }
        // Streamed, the same calls arrive: names whole, arguments in pieces that join into them.
        if (trial == 0 && token_ends.size() < 800) {
          const Streamed st = stream(text, token_ends, syntax, parallel);
          ASSERT_EQ(st.names.size(), r.tool_calls.size()) << context;
          for (size_t k = 0; k < st.names.size(); ++k) {
            EXPECT_EQ(st.names[k], r.tool_calls[k].name) << context;
            EXPECT_EQ(Json::parse(st.arguments[k], nullptr, false), Json::parse(r.tool_calls[k].arguments)) << context;
          }
          streamed_pieces[syntax.tools_name()] += st.argument_pieces - st.names.size();
        }
      }
    }
  }
  EXPECT_GE(replies, 19 * 6 * trials * 3 / 4) << "too many random walks did not end";
  // Formats that write arguments as JSON stream them in more pieces than one per call.
  for (const char* f : {"hermes", "mistral-json", "mistral-args", "deepseek-r1", "deepseek-v3.1", "kimi", "llama3-json",
                        "gpt-oss", "functionary", "command-r", "nemotron", "granite", "apertus"})
    EXPECT_GT(streamed_pieces[f], 0u) << f << ": arguments arrived whole";
}

// The mask (a walk of the vocabulary's trie over interned grammar states, cached per state) is
// exactly the set of tokens the matcher takes, token by token: over grammars with bounded
// strings (chain keys), markers as tokens, unicode and partial UTF-8 tokens, at every step of
// random walks to their ends.
TEST(TokenMasker, MasksAreExactlyTheTokensTheMatcherTakes) {
  const auto tok = vocab(kMarkers, 3, "mask");
  std::vector<int32_t> specials = tok->special_ids();
  std::sort(specials.begin(), specials.end());
  ChatSyntax hermes;
  hermes.tools = ToolCallFormat::Hermes;
  hermes.think_open = "<think>", hermes.think_close = "</think>";
  const std::vector<std::string> grammars = {
      json_schema_to_gbnf(Json::parse(R"({"type": "object", "properties": {"t": {"type": "string", "minLength": 2,
          "maxLength": 40}, "n": {"type": "integer", "minimum": -5, "maximum": 300}}, "required": ["t"]})")),
      json_object_gbnf(),
      tool_call_gbnf(hermes, kTools, "", true, *tok),
      "root ::= (\"é\" | [日-語] | [^a-z\"]){1,30} \"!\"\n",
  };
  std::mt19937 rng(7);
  int checked = 0;
  for (const std::string& gbnf : grammars) {
    const auto g = Grammar::parse(gbnf, grammar_vocab(*tok));
    TokenMasker masker(*tok);
    for (int walk = 0; walk < 6; ++walk) {
      GrammarMatcher m(g);
      for (int step = 0; step < 120; ++step) {
        const std::vector<uint8_t>& ok = masker.allowed(m, g);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < tok->vocab_size(); ++id) {
          const bool special = std::binary_search(specials.begin(), specials.end(), id);
          const bool takes = GrammarMatcher(m).accept_token(id, tok->token_bytes(id), special);
          ASSERT_EQ(bool(ok[size_t(id)]), takes) << "token " << id << " '" << tok->token_bytes(id) << "' at step " << step;
          if (takes) allowed.push_back(id);
          ++checked;
        }
        if (allowed.empty() || (m.complete() && rng() % 8 == 0)) break;
        const int32_t id = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept_token(id, tok->token_bytes(id), std::binary_search(specials.begin(), specials.end(), id)));
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

TEST(ToolGrammar, RefusalsNameTheReason) {
  const auto tok = vocab({}, 3, "plain");
  ChatSyntax none;
  EXPECT_THROW(tool_call_gbnf(none, kTools, "", true, *tok), Error);
  ChatSyntax hermes;
  hermes.tools = ToolCallFormat::Hermes;
  try {
    tool_call_gbnf(hermes, kTools, "missing", true, *tok);
    ADD_FAILURE() << "an unknown function was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  const Json bad = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"x": {"type": "string", "pattern": "a+"}}}}}])");
  try {
    tool_call_gbnf(hermes, bad, "", true, *tok);
    ADD_FAILURE() << "an unsupported keyword was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pattern"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'f'"), std::string::npos) << e.what();
  }
}

// A tool whose name spells like the grammar's own primitives ("g-…", "js-…": the fuzzer's
// "g=t_weather") gets rules of its own; the rule namer once looked for a free name forever.
TEST(ToolGrammar, ToolsNamedLikeThePrimitivesCompile) {
  const auto tok = vocab({"<tool_call>", "</tool_call>"}, 3, "hermes");
  ChatSyntax hermes;
  hermes.tools = ToolCallFormat::Hermes;
  for (const std::string name : {"g=t_weather", "g-x", "js-text", "G_value"}) {
    const Json tools = Json::parse(R"([{"type": "function", "function": {"name": ")" + name +
                                   R"(", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"]}}}])");
    const auto g = Grammar::parse(tool_call_gbnf(hermes, tools, "", false, *tok), grammar_vocab(*tok));
    const int32_t open = special_id(*tok, "<tool_call>"), close = special_id(*tok, "</tool_call>");
    GrammarMatcher m(g);
    EXPECT_TRUE(m.accept_token(open, tok->token_bytes(open), true) &&
                m.accept("\n{\"name\": \"" + name + "\", \"arguments\": {\"city\": \"Paris\"}}\n") &&
                m.accept_token(close, tok->token_bytes(close), true) && m.complete())
        << name;
    GrammarMatcher without_city(g);
    EXPECT_TRUE(without_city.accept_token(open, tok->token_bytes(open), true));
    EXPECT_FALSE(without_city.accept("\n{\"name\": \"" + name + "\", \"arguments\": {}}")) << "city is required";
  }
}
