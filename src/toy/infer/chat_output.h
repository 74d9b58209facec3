// What a chat model's reply says — its answer, its reasoning, its tool calls — read from the
// generated text in the format the model's own chat template defines (as llama-server's
// --jinja parsers do). The format is recognised from the template's text: Hermes/Qwen
// <tool_call>{json}</tool_call>, Qwen3-Coder/Seed-OSS/MiniMax/MiniCPM XML parameters,
// GLM's <arg_key>/<arg_value>, Mistral's [TOOL_CALLS] (JSON list, or name[ARGS]{json}),
// DeepSeek R1 and V3.1, Kimi K2, Llama 3.x's bare JSON, gpt-oss's channels, Functionary's
// >>>name, Command R7B's actions, Nemotron's <TOOLCALL>, Granite's <|tool_call|>, Apertus's
// <|tools_prefix|>, Gemma 4's <|tool_call>call:NAME{k:<|"|>v<|"|>}. Reasoning: the template's think markers (<think>...</think>,
// <seed:think>, <|START_THINKING|>, Gemma 4's thought channel, gpt-oss's analysis channel) become `reasoning`.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace toy {

struct ToolCall {
  std::string id;         // when the format carries one (Mistral, Command R); else empty
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI's function.arguments)
};

struct ChatReply {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
};

enum class ToolCallFormat {
  None, Hermes, QwenXml, SeedXml, MiniMaxXml, MiniCpmXml, Glm, MistralJson, MistralArgs, DeepSeekR1, DeepSeekV31, Kimi,
  Llama3Json, GptOss, Functionary, CommandR, Nemotron, Granite, Apertus, Gemma4
};

struct ChatSyntax {
  ToolCallFormat tools = ToolCallFormat::None;
  std::string think_open, think_close;  // empty: the template has no reasoning blocks
  bool starts_thinking = false;         // the prompt ends inside an open reasoning block

  // The format a template's text defines.
  static ChatSyntax detect(std::string_view template_source);
  // For a prompt rendered by that template: whether generation starts inside reasoning.
  ChatSyntax for_prompt(std::string_view rendered_prompt) const;
  const char* tools_name() const;
};

// Reads `text` (everything generated so far). `with_tools`: tool calls are parsed (the request
// offered tools); else they stay in the content. `partial` (streaming): an unfinished marker
// at the end is held back, and only finished tool calls are returned. A final text whose tool
// calls do not parse is all content (nothing is lost).
ChatReply parse_chat_reply(std::string_view text, const ChatSyntax& syntax, bool with_tools, bool partial);

}  // namespace toy
