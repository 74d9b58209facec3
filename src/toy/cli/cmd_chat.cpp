// `toy chat -m M [--system TEXT] [-p TEXT]`: talk to a model through its chat template.
// Interactive: each line read from stdin is a user turn; the reply streams to stdout and the
// conversation goes on (/reset starts over, /exit or end of input ends). With -p, one turn:
// exactly the reply on stdout. The model's own template (tokenizer.chat_template) renders the
// conversation, or --chat-template FILE; a file with none gets ChatML, said on stderr. A
// reasoning model's thinking goes to stderr ("[thinking] ..."), its answer to stdout.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/cli/sampler_flags.h"
#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/core/runtime.h"
#include "toy/infer/chat.h"
#include "toy/infer/chat_output.h"
#include "toy/infer/generate.h"
#include "toy/io/model_file.h"

namespace toy::cli {

namespace {

struct ChatFlags {
  std::string model, prompt, system, chat_template;
  int64_t n = 512;
  SamplingFlags sampling;
  int threads = 0;
  int64_t ctx = 0;
};

// One assistant turn after `messages`: rendered, tokenized with the format's special tokens,
// generated until the end of the turn; returns the answer (also streamed to stdout). With a
// template that has reasoning blocks (or gpt-oss's channels), the reasoning streams to stderr
// and only the answer to stdout (and into the conversation, as the templates keep it).
std::string reply(DecoderLM& m, const Tokenizer& tok, const ChatTemplate& tmpl, Sampler& sampler,
                  const std::vector<ChatMessage>& messages, const ChatFlags& f, int64_t capacity) {
  const ChatText prompt = tmpl.render(messages, true);
  std::vector<int32_t> ids = tmpl.prompt_ids(tok, prompt);
  if (int64_t(ids.size()) >= capacity)
    std::fprintf(stderr, "toy chat: the conversation (%zu tokens) is longer than the context (%lld): the model sees "
                 "its end only; /reset starts over\n", ids.size(), static_cast<long long>(capacity));
  const ChatSyntax syntax = tmpl.syntax().for_prompt(prompt.text);
  const bool parsed = !syntax.think_open.empty() || syntax.tools == ToolCallFormat::GptOss;
  std::string text;
  ChatReply shown;  // what has been printed of the parse so far
  auto show = [&](bool partial) {
    const ChatReply now = parse_chat_reply(text, syntax, false, partial);
    auto grown = [](const std::string& was, const std::string& is) {
      return is.size() > was.size() && is.starts_with(was) ? is.substr(was.size()) : std::string();
    };
    if (const std::string d = grown(shown.reasoning, now.reasoning); !d.empty()) {
      if (shown.reasoning.empty()) std::fputs("[thinking] ", stderr);
      std::fwrite(d.data(), 1, d.size(), stderr);
      shown.reasoning = now.reasoning;
    }
    if (const std::string d = grown(shown.content, now.content); !d.empty()) {
      if (!shown.reasoning.empty() && shown.content.empty()) std::fputc('\n', stderr);
      std::fwrite(d.data(), 1, d.size(), stdout);
      shown.content = now.content;
    }
    std::fflush(stderr);
    std::fflush(stdout);
  };
  generate(m, tok, sampler, std::move(ids), f.n, [&](const std::string& piece) {
    text += piece;
    if (parsed) return show(true);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  }, capacity);
  if (!parsed) return text;
  show(false);
  if (!shown.reasoning.empty() && shown.content.empty()) std::fputc('\n', stderr);
  return shown.content;
}

int run_chat(const ChatFlags& f) {
  gguf::Reader r(f.model);
  LoadedModel lm = load_model(r);
  const ChatTemplate tmpl = ChatTemplate::choose(f.chat_template, r, *lm.tokenizer);
  if (tmpl.defaulted()) std::fprintf(stderr, "toy chat: the model has no chat template; using ChatML\n");
  Sampler sampler(f.sampling.config, f.sampling.seed);
  const int64_t capacity = f.ctx ? f.ctx : std::min<int64_t>(lm.model->config().ctx, 4096);
  std::vector<ChatMessage> messages;
  auto start = [&] {
    messages.clear();
    if (!f.system.empty()) messages.push_back({"system", f.system});
  };
  start();
  if (!f.prompt.empty()) {
    messages.push_back({"user", f.prompt});
    reply(*lm.model, *lm.tokenizer, tmpl, sampler, messages, f, capacity);
    if (isatty(fileno(stdout))) std::fputc('\n', stdout);
    return 0;
  }
  const bool tty = isatty(fileno(stdin));
  if (tty) std::fprintf(stderr, "toy chat (%s): type a message; /reset starts over, /exit ends\n", tmpl.name().c_str());
  std::string line;
  while (true) {
    if (tty) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      start();
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({"user", line});
    std::string answer;
    try {
      answer = reply(*lm.model, *lm.tokenizer, tmpl, sampler, messages, f, capacity);
    } catch (const Error& e) {
      // The template refused the conversation (its raise_exception): say so, drop the turn.
      std::fprintf(stderr, "toy chat: %s\n", e.what());
      messages.pop_back();
      continue;
    }
    messages.push_back({"assistant", answer});
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

Run add_chat_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Chat with a model through its chat template");
  auto f = std::make_shared<ChatFlags>();
  f->sampling.config.temperature = 0.7f;
  cmd->add_option("-m,--model", f->model, "Model file (GGUF)")->required();
  cmd->add_option("-p,--prompt", f->prompt, "One user message: print the reply and exit");
  cmd->add_option("--system", f->system, "A system message first");
  cmd->add_option("--chat-template", f->chat_template, "A chat template (.jinja) to use instead of the model's");
  add_int(cmd, "-n,--tokens", f->n, 1, int64_t(1) << 30, "Most tokens per reply (default 512)");
  add_sampling_flags(cmd, f->sampling);
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  add_int(cmd, "--ctx", f->ctx, 1, int64_t(1) << 24, "KV cache size in tokens (default: the model's context, at most 4096)")
      ->default_str("");
  return [f]() {
    if (f->threads) set_num_threads(f->threads);
    return run_chat(*f);
  };
}

}  // namespace toy::cli
