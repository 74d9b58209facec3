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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toy {

struct ToolCall {
  std::string id;         // when the format carries one (Mistral, Command R); else empty
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI's function.arguments)
  // When the format writes the arguments as a JSON object: that text as the model wrote it (a
  // call being written: what it has written so far). Streamed replies send it piece by piece;
  // empty when the format spells arguments otherwise (XML parameters, Gemma's).
  std::string raw_arguments;
};

struct ChatReply {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
  // Streaming (`partial`): the call being written after the finished ones, once its name is
  // whole (its raw_arguments so far; `arguments` empty). Not set for a final text.
  std::optional<ToolCall> call_in_progress;
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
// at the end is held back, finished tool calls are returned and the one being written is
// call_in_progress. A final text whose tool calls do not parse is all content (nothing is lost).
ChatReply parse_chat_reply(std::string_view text, const ChatSyntax& syntax, bool with_tools, bool partial);

// A streamed reply's tool calls as OpenAI's deltas. Fed the parse of the text so far (partial)
// each time, and the final parse at the end, it returns what is new: a call's header (its name,
// and its id when the format gave one) once the name is whole, then pieces of its arguments as
// they are written. The pieces of a call join into its arguments: the object as the model wrote
// it where the format writes one (raw_arguments), else OpenAI's text of them, whole.
class ToolCallStreamer {
 public:
  struct Delta {
    size_t index = 0;
    bool header = false;  // a new call: id (may be empty: the server names it) and name
    std::string id, name;
    std::string arguments;  // a piece of the arguments (header: empty)
  };
  // `parallel` false: only the first call is streamed (as the reply keeps only it).
  std::vector<Delta> update(const ChatReply& now, bool parallel);
  size_t calls() const { return sent_.size(); }

 private:
  std::vector<std::string> sent_;  // per call: the arguments sent so far
};

}  // namespace toy
