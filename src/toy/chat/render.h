// toy's Jinja2 engine: parse a template, render it with variables. Scoping is jinja2's: `for`
// bodies, macros, call/filter/set blocks and `with` get their own scope (a `set` inside one is
// gone after it: carry state out with namespace()), `if` does not; each loop iteration starts
// afresh; macros see the scope they were defined in as it is when they are called.
#pragma once
#include <string>
#include <string_view>

#include "toy/chat/ast.h"
#include "toy/chat/value.h"

namespace toy::jinja {

// What one render may do (all loops together, bytes of text) before it is stopped with an
// error: a chat template renders a conversation, not a computation, and a hostile template in
// a model file must not hang a server. Process-wide; the fuzz target lowers the loop steps (a
// sanitizer build runs ~10x slower and libFuzzer counts an input over 10 s as a finding).
struct RenderLimits {
  int64_t loop_steps = 1'000'000;
  size_t text_bytes = size_t(64) << 20;
};
RenderLimits& render_limits();

class Template {
 public:
  explicit Template(std::string_view source);  // throws toy::Error for a syntax error
  // `variables` holds the globals too (see add_globals). Throws toy::Error naming the line.
  std::string render(const Dict& variables) const;

 private:
  Body body_;
};

}  // namespace toy::jinja
