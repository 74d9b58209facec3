// tool_choice "required" or a named function: a grammar (GBNF, grammar.h) whose sentences are
// replies that call tools in the format the model's chat template defines, the arguments valid
// for each tool's `parameters` schema, so that parse_chat_reply (chat_output.h) reads the
// calls back every time. A marker that is one special token of the vocabulary is asked for as
// that token (<[id]>), as the template's own text would be tokenized. When the template has
// reasoning blocks, one may come first (it must, when the prompt opened it).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "toy/infer/chat_output.h"

namespace toy {

class Tokenizer;

// `tools`: OpenAI's list of {"type": "function", "function": {"name", "parameters"?}}; `only`:
// the one function a call must name (empty: any of them); `parallel`: one or more calls (else
// exactly one). Throws toy::Error when the template defines no tool-call format, `only` is not
// offered, or a tool's schema uses what json_schema.h does not support (naming it).
std::string tool_call_gbnf(const ChatSyntax& syntax, const nlohmann::ordered_json& tools, const std::string& only,
                           bool parallel, const Tokenizer& tok);

}  // namespace toy
