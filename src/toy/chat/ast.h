// The parsed template: expressions and statements as jinja2's parser builds them. One node
// type each with a kind, rather than a class per kind: the renderer switches on the kind, and
// the fields each kind uses are listed beside them.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "toy/chat/value.h"

namespace toy::jinja {

enum class ExprKind : uint8_t {
  Literal,  // literal
  Name,     // name
  List,     // items
  Tuple,    // items
  Dict,     // items: key, value, key, value...
  Not,      // items[0]
  Neg,      // items[0]
  Pos,      // items[0]
  And,      // items[0], items[1]
  Or,       // items[0], items[1]
  Binary,   // items[0] <name> items[1], name one of + - * / // % **
  Concat,   // items joined with ~
  Compare,  // items[0] ops[0] items[1] ops[1] items[2]...; ops: == != < <= > >= in notin
  Cond,     // items[0] if items[1] else items[2] (items[2] null: no else)
  Attr,     // items[0].name
  Item,     // items[0][items[1]]
  Slice,    // items[0][items[1]:items[2]:items[3]], any of the three null
  Call,     // items[0](args)
  Filter,   // items[0]|name(args); items[0] null in a filter chain of {% filter %} / {% set %}
  Test,     // items[0] is [not] name(args)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arg {
  std::string name;  // empty: positional; "*" and "**": spread a list / a dict
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> items;
  std::vector<std::string> ops;
  std::vector<Arg> args;
  bool negated = false;  // Test: `is not`
};

// What `for` and `set` assign to: a name, a tuple of targets, or ns.attr (set only).
struct Target {
  enum class Kind : uint8_t { Name, Tuple, Attr };
  Kind kind = Kind::Name;
  std::string name, attr;
  std::vector<Target> items;
};

enum class StmtKind : uint8_t {
  Text,         // text
  Print,        // expr
  If,           // expr, body, else_body (an elif is an If alone in else_body)
  For,          // target in expr [if cond], body, else_body
  Set,          // target = expr
  SetBlock,     // target, filters, body
  Macro,        // text (the name), params, body
  CallBlock,    // expr (the call), params (the caller's), body
  FilterBlock,  // filters, body
  Break,
  Continue,
  With,         // assigns, body
  Scoped,       // body in its own scope: {% generation %}
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Param {
  std::string name;
  ExprPtr fallback;  // the default; null: none
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr, cond;
  std::vector<ExprPtr> filters;
  Target target;
  std::vector<Param> params;
  std::vector<std::pair<Target, ExprPtr>> assigns;
  Body body, else_body;
  // Macro: whether the body mentions these names (jinja2 accepts extra arguments only then).
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
  bool recursive = false;  // For: `recursive`, the body may call loop(items) for a nested level
};

}  // namespace toy::jinja
