#!/usr/bin/python3
"""Reference renderings of chat templates: tests/fixtures/chat/expected.json

Renders every chat template (*.jinja) x every conversation (*.json) with Python's jinja2
(Debian python3-jinja2), set up the way Hugging Face's `apply_chat_template` sets it up, so
toy's own Jinja engine (toy::render_chat_template) can be compared with the real thing:

  - an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, and the
    jinja2.ext.loopcontrols extension ({% break %}, {% continue %});
  - a {% generation %}...{% endgeneration %} block that renders its body (HF uses it to mark
    assistant tokens; the text is unchanged);
  - raise_exception(msg) raising a TemplateError with that message;
  - strftime_now(fmt): the conversation's "now" (local time, YYYY-MM-DDTHH:MM:SS) formatted
    with Python's strftime, so the output does not depend on the clock;
  - a tojson filter that is json.dumps(x, ensure_ascii=False, indent=..., separators=...,
    sort_keys=...) (jinja2's own tojson would HTML-escape <, >, & and ');
  - the variables messages, add_generation_prompt (default true), bos_token and eos_token
    (default ""), and tools only when the conversation has tools.

Conversations are loaded with every object's keys sorted: toy receives them as nlohmann::json,
whose objects iterate in key order, so `tojson`, `.items()` and `for k, v in d` see the keys in
the same order on both sides. (Python keeps a request's own order; an engine fed sorted keys
cannot, so the fixtures do not test that.)

A conversation file is {"messages": [...], "tools"?: [...], "add_generation_prompt"?: bool,
"bos_token"?: str, "eos_token"?: str, "now"?: "YYYY-MM-DDTHH:MM:SS"}.

Output: {"<template file>": {"<conversation name>": {"text": "..."}
                                                 or {"error": "<message>", "kind": "<type>"}}}
where "kind" is the Python exception's class: TemplateError for raise_exception (the message
is the template's own), anything else (SecurityError, UndefinedError, TypeError, ...) is a
Python-side failure whose message a C++ engine can only approximate.

Run (from the repository root):
  /usr/bin/python3 tools/chat/render_reference.py \
      ../shared/data/chat-templates tests/fixtures/chat/conversations \
      tests/fixtures/chat/expected.json
"""
import argparse
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(jinja2.ext.Extension):
    """{% generation %}body{% endgeneration %}: renders body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def make_env(now):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    return env


def render(template_text, conversation):
    now = conversation.get("now")
    now = datetime.datetime.strptime(now, "%Y-%m-%dT%H:%M:%S") if now else datetime.datetime.now()
    variables = {
        "messages": conversation["messages"],
        "add_generation_prompt": conversation.get("add_generation_prompt", True),
        "bos_token": conversation.get("bos_token", ""),
        "eos_token": conversation.get("eos_token", ""),
    }
    if conversation.get("tools"):
        variables["tools"] = conversation["tools"]
    try:
        return {"text": make_env(now).from_string(template_text).render(**variables)}
    except Exception as e:  # the error is the expected result
        return {"error": str(e), "kind": type(e).__name__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("templates", help="folder of *.jinja chat templates")
    ap.add_argument("conversations", help="folder of *.json conversations")
    ap.add_argument("output", help="expected.json to write")
    a = ap.parse_args()

    conversations = {}
    for name in sorted(os.listdir(a.conversations)):
        if name.endswith(".json"):
            with open(os.path.join(a.conversations, name), encoding="utf-8") as f:
                conversations[name[:-len(".json")]] = json.load(
                    f, object_pairs_hook=lambda pairs: dict(sorted(pairs)))
    out = {}
    for name in sorted(os.listdir(a.templates)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(a.templates, name), encoding="utf-8") as f:
            text = f.read()
        out[name] = {c: render(text, conv) for c, conv in conversations.items()}

    with open(a.output, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")
    n = sum(len(v) for v in out.values())
    errors = sum(1 for v in out.values() for r in v.values() if "error" in r)
    print(f"{len(out)} templates x {len(conversations)} conversations: "
          f"{n - errors} text, {errors} errors -> {a.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
