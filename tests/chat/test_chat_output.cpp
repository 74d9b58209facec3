// Reading replies (toy/infer/chat_output.h): each template's own rendering of tool calls parses
// back into the calls (a round trip through the 30 shared templates), reasoning comes out of
// the answer, and a streamed (partial) text never shows half a marker.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "helpers.h"
#include "requirements.h"
#include "toy/chat/chat_render.h"
#include "toy/core/error.h"
#include "toy/infer/chat_output.h"

namespace fs = std::filesystem;
using namespace toy;
using Json = nlohmann::ordered_json;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

Json conversation(const std::string& name) {
  return Json::parse(read_text(fs::path(TOY_FIXTURE_DIR) / "chat" / "conversations" / name));
}

// What the template writes for the conversation's first assistant turn with tool calls (after
// the prompt that opens it), or "" when it cannot render it.
std::string assistant_turn(const std::string& tmpl, const Json& conv) {
  const Json& msgs = conv["messages"];
  size_t at = 0;
  while (at < msgs.size() && !msgs[at].contains("tool_calls")) ++at;
  Json before = conv, through = conv;
  before["messages"] = Json::array(), through["messages"] = Json::array();
  for (size_t i = 0; i < at; ++i) before["messages"].push_back(msgs[i]);
  for (size_t i = 0; i <= at; ++i) through["messages"].push_back(msgs[i]);
  before["add_generation_prompt"] = true, through["add_generation_prompt"] = false;
  try {
    const std::string a = render_chat_template(tmpl, before), b = render_chat_template(tmpl, through);
    if (b.starts_with(a)) return b.substr(a.size());
    // History drops reasoning and the like: what follows the user's question.
    const std::string question = msgs[at - 1]["content"].get<std::string>();
    const size_t q = b.rfind(question);
    return q == std::string::npos ? "" : b.substr(q + question.size());
  } catch (const Error&) {
    return "";
  }
}

std::vector<std::pair<std::string, Json>> expected_calls(const Json& conv) {
  for (const Json& m : conv["messages"])
    if (m.contains("tool_calls")) {
      std::vector<std::pair<std::string, Json>> out;
      for (const Json& c : m["tool_calls"]) {
        Json args = c["function"]["arguments"];
        if (args.is_string()) args = Json::parse(args.get<std::string>());
        out.emplace_back(c["function"]["name"].get<std::string>(), args);
      }
      return out;
    }
  return {};
}

}  // namespace

TEST(ChatOutput, EveryTemplatesOwnToolCallsParseBack) {
  const std::string dir = test::shared_path("chat-templates");
  TOY_REQUIRE_FILE(dir);
  std::set<std::string> round_trips, formats;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".jinja") continue;
    const std::string name = e.path().stem().string(), tmpl = read_text(e.path());
    const ChatSyntax syntax = ChatSyntax::detect(tmpl);
    // Parallel calls where the template renders them, else one.
    for (const char* file : {"09_parallel_tool_calls.json", "07_tool_call_roundtrip.json"}) {
      const Json conv = conversation(file);
      const std::string turn = assistant_turn(tmpl, conv);
      const auto want = expected_calls(conv);
      size_t named = 0;  // how many calls the template wrote (some write only the first)
      for (size_t at = turn.find(want[0].first); at != std::string::npos; at = turn.find(want[0].first, at + 1)) ++named;
      if (named < want.size()) continue;
      SCOPED_TRACE(name + " " + file + ": " + turn);
      ASSERT_NE(syntax.tools, ToolCallFormat::None) << "a template that writes tool calls has a format";
      const ChatReply r = parse_chat_reply(turn, syntax, true, false);
      ASSERT_EQ(r.tool_calls.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(r.tool_calls[i].name, want[i].first);
        EXPECT_EQ(Json::parse(r.tool_calls[i].arguments), want[i].second);
      }
      EXPECT_EQ(r.content.find(want[0].first), std::string::npos) << "the calls are not left in the content";
      round_trips.insert(name);
      formats.insert(syntax.tools_name());
      break;
    }
  }
  std::string got;
  for (const auto& n : round_trips) got += n + " ";
  std::printf("tool calls round-trip for %zu templates (%zu formats): %s\n", round_trips.size(), formats.size(),
              got.c_str());
  for (const char* must : {"Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "Qwen3-Coder", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
                           "mistralai-Mistral-Nemo-Instruct-2407", "unsloth-mistral-Devstral-Small-2507",
                           "Mistral-Small-3.2-24B-Instruct-2506", "deepseek-ai-DeepSeek-V3.1",
                           "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "GLM-4.6", "openai-gpt-oss-120b",
                           "meta-llama-Llama-3.1-8B-Instruct", "ByteDance-Seed-OSS", "MiniMax-M2"})
    EXPECT_TRUE(round_trips.count(must)) << must;
}

TEST(ChatOutput, ReasoningIsTakenOutOfTheAnswer) {
  ChatSyntax s = ChatSyntax::detect("{{ '<think>' }}{{ '</think>' }}<|im_start|>");
  ChatReply r = parse_chat_reply("<think>\nLet me see.\n</think>\n\nParis.", s, false, false);
  EXPECT_EQ(r.reasoning, "Let me see.");
  EXPECT_EQ(r.content, "Paris.");
  // The prompt opened the block (DeepSeek R1's generation prompt ends with <think>\n).
  const ChatSyntax opened = s.for_prompt("<｜Assistant｜><think>\n");
  EXPECT_TRUE(opened.starts_thinking);
  r = parse_chat_reply("hmm\n</think>Yes.", opened, false, false);
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.content, "Yes.");
  // Unfinished: all reasoning so far; streaming holds back a half-written close.
  r = parse_chat_reply("<think>still going</thi", s, false, true);
  EXPECT_EQ(r.reasoning, "still going");
  EXPECT_EQ(r.content, "");
  // No markers in the template: the text is the answer, byte for byte.
  r = parse_chat_reply("  <think>x</think> y ", ChatSyntax::detect("plain"), false, false);
  EXPECT_EQ(r.content, "  <think>x</think> y ");
}

TEST(ChatOutput, StreamingNeverShowsHalfAMarkerAndToolsOffLeaveText) {
  const ChatSyntax s = ChatSyntax::detect("{{ '<tool_call>' }}");
  ASSERT_EQ(s.tools, ToolCallFormat::Hermes);
  const std::string full = "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
  std::string last_content;
  size_t calls = 0;
  for (size_t n = 1; n <= full.size(); ++n) {
    const ChatReply r = parse_chat_reply(full.substr(0, n), s, true, true);
    EXPECT_EQ(r.content.find('<'), std::string::npos) << n << ": " << r.content;
    EXPECT_TRUE(r.content.starts_with(last_content) || last_content.starts_with(r.content)) << n;
    last_content = r.content;
    calls = r.tool_calls.size();
  }
  EXPECT_EQ(calls, 1u);
  const ChatReply done = parse_chat_reply(full, s, true, false);
  EXPECT_EQ(done.content, "Checking.");
  ASSERT_EQ(done.tool_calls.size(), 1u);
  EXPECT_EQ(done.tool_calls[0].arguments, R"({"a":1})");
  // Without tools offered the text stays as it is; a malformed call is content, nothing lost.
  EXPECT_EQ(parse_chat_reply(full, s, false, false).content, full);
  const std::string broken = "<tool_call>{\"name\": \"f\", \"arguments\": {oops}</tool_call>";
  const ChatReply b = parse_chat_reply(broken, s, true, false);
  EXPECT_TRUE(b.tool_calls.empty());
  EXPECT_EQ(b.content, broken);
}

// Formats whose shared templates cannot render a call in history (jinja2 refuses those
// conversations too): replies written as the models write them.
TEST(ChatOutput, KimiFunctionaryAndGptOssReplies) {
  const ChatSyntax kimi = ChatSyntax::detect("<|tool_calls_section_begin|>");
  ChatReply r = parse_chat_reply(
      "Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
      "{\"location\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}"
      "<|tool_call_end|><|tool_calls_section_end|>",
      kimi, true, false);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"location":"Paris"})");
  EXPECT_EQ(r.tool_calls[1].name, "get_time");
  EXPECT_EQ(r.content, "Let me look.");

  const ChatSyntax functionary = ChatSyntax::detect("{{ '>>>' }}{{ 'all' }}");
  ASSERT_EQ(functionary.tools, ToolCallFormat::Functionary);
  r = parse_chat_reply("all\nOne moment.>>>get_weather\n{\"location\": \"Tokyo\"}", functionary, true, false);
  EXPECT_EQ(r.content, "One moment.");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"location":"Tokyo"})");

  const ChatSyntax harmony = ChatSyntax::detect("<|channel|>x<|message|>");
  r = parse_chat_reply("<|channel|>analysis<|message|>User wants weather.<|end|><|start|>assistant<|channel|>commentary "
                       "to=functions.get_weather <|constrain|>json<|message|>{\"location\": \"Oslo\"}",
                       harmony, true, false);
  EXPECT_EQ(r.reasoning, "User wants weather.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  r = parse_chat_reply("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>42",
                       harmony, false, false);
  EXPECT_EQ(r.reasoning, "Easy.");
  EXPECT_EQ(r.content, "42");
}
