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

class Template {
 public:
  explicit Template(std::string_view source);  // throws toy::Error for a syntax error
  // `variables` holds the globals too (see add_globals). Throws toy::Error naming the line.
  std::string render(const Dict& variables) const;

 private:
  Body body_;
};

}  // namespace toy::jinja
