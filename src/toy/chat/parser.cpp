#include "toy/chat/parser.h"

#include <fmt/core.h>

#include <algorithm>
#include <initializer_list>

#include "toy/chat/builtins.h"
#include "toy/chat/lexer.h"
#include "toy/core/error.h"

namespace toy::jinja {
namespace {

using T = Token::Type;

std::string describe(const Token& t) {
  switch (t.type) {
    case T::Text: return "template data";
    case T::VarBegin: return "'{{'";
    case T::VarEnd: return "end of print statement";
    case T::BlockBegin: return "'{%'";
    case T::BlockEnd: return "end of statement block";
    case T::End: return "end of template";
    case T::String: return "string";
    default: return "'" + t.text + "'";
  }
}

ExprPtr node(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

ExprPtr node(ExprKind kind, int line, ExprPtr a, ExprPtr b = nullptr) {
  auto e = node(kind, line);
  e->items.push_back(std::move(a));
  if (b) e->items.push_back(std::move(b));
  return e;
}

// Whether an expression or statement list mentions `name` (for a macro's varargs/kwargs/caller).
bool mentions(const Expr* e, std::string_view name);
bool mentions(const Body& body, std::string_view name);

bool mentions(const Expr* e, std::string_view name) {
  if (!e) return false;
  if (e->kind == ExprKind::Name && e->name == name) return true;
  for (const auto& i : e->items)
    if (mentions(i.get(), name)) return true;
  for (const auto& a : e->args)
    if (mentions(a.value.get(), name)) return true;
  return false;
}

bool mentions(const Body& body, std::string_view name) {
  for (const auto& s : body) {
    if (mentions(s->expr.get(), name) || mentions(s->cond.get(), name)) return true;
    for (const auto& f : s->filters)
      if (mentions(f.get(), name)) return true;
    for (const auto& p : s->params)
      if (mentions(p.fallback.get(), name)) return true;
    for (const auto& a : s->assigns)
      if (mentions(a.second.get(), name)) return true;
    // jinja2 looks into nested macros and call blocks too.
    if (mentions(s->body, name) || mentions(s->else_body, name)) return true;
  }
  return false;
}

// jinja2 refuses an unknown filter or test when it compiles the template, except inside an
// `if` statement or an `x if c else y` expression (a "soft" frame: it fails only if reached,
// so templates can guard with `is filter`). Loops, macros and blocks inside an `if` start
// hard frames again.
void check_names(const Expr* e, bool soft) {
  if (!e) return;
  if (e->kind == ExprKind::Filter && !soft && !filter_exists(e->name))
    throw toy::Error(where(e->line) + fmt::format("unknown filter '{}'", e->name));
  if (e->kind == ExprKind::Test && !soft && !test_exists(e->name))
    throw toy::Error(where(e->line) + fmt::format("unknown test '{}'", e->name));
  soft = soft || e->kind == ExprKind::Cond;
  for (const auto& i : e->items) check_names(i.get(), soft);
  for (const auto& a : e->args) check_names(a.value.get(), soft);
}

void check_names(const Body& body, bool soft) {
  for (const auto& s : body) {
    const bool if_stmt = s->kind == StmtKind::If;
    // the iterable, a call block's call and with's values belong to the enclosing frame
    check_names(s->expr.get(), soft || if_stmt);
    for (const auto& a : s->assigns) check_names(a.second.get(), soft);
    check_names(s->cond.get(), false);
    for (const auto& f : s->filters) check_names(f.get(), false);
    for (const auto& p : s->params) check_names(p.fallback.get(), false);
    check_names(s->body, if_stmt);
    check_names(s->else_body, if_stmt);
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body run() {
    Body body = parse_body({});
    if (cur().type != T::End) fail(cur().line, "unexpected " + describe(cur()));
    return body;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& msg) const { throw toy::Error(where(line) + msg); }

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  const Token& take() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(std::string_view op) const { return cur().type == T::Op && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == T::Name && cur().text == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    ++pos_;
    return true;
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail(cur().line, fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  void expect(T type, const char* what) {
    if (cur().type != type) fail(cur().line, fmt::format("expected {}, got {}", what, describe(cur())));
    ++pos_;
  }
  std::string expect_name() {
    if (cur().type != T::Name) fail(cur().line, "expected a name, got " + describe(cur()));
    return take().text;
  }

  // ---- statements ----

  // Statements up to a {% tag %} whose name is in `ends` (left unconsumed: the `{%` is current).
  Body parse_body(std::initializer_list<std::string_view> ends) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == T::End) {
        if (ends.size() == 0) return body;
        std::string want;
        for (auto e : ends) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
        fail(t.line, "unexpected end of template; looking for " + want);
      }
      if (t.type == T::Text) {
        auto s = stmt(StmtKind::Text, t.line);
        s->text = take().text;
        body.push_back(std::move(s));
      } else if (t.type == T::VarBegin) {
        auto s = stmt(StmtKind::Print, take().line);
        s->expr = parse_tuple(true, false, {});
        expect(T::VarEnd, "'}}'");
        body.push_back(std::move(s));
      } else if (t.type == T::BlockBegin) {
        const Token& tag = peek();
        if (tag.type == T::Name && std::find(ends.begin(), ends.end(), tag.text) != ends.end()) return body;
        take();
        body.push_back(parse_statement());
      } else {
        fail(t.line, "unexpected " + describe(t));
      }
    }
  }

  StmtPtr stmt(StmtKind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // Nesting deeper than any real template is refused before it can exhaust the stack.
  struct Nest {
    Parser& p;
    Nest(Parser& parser, int line) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.fail(line, "too deeply nested");
    }
    ~Nest() { --p.depth_; }
  };
  static constexpr int kMaxNesting = 300;

  // After `{%`, at the tag's name.
  StmtPtr parse_statement() {
    Nest nest(*this, cur().line);
    const Token& t = cur();
    if (t.type != T::Name) fail(t.line, "tag name expected, got " + describe(t));
    const std::string tag = take().text;
    const int line = t.line;
    StmtPtr s;
    if (tag == "if") s = parse_if(line);
    else if (tag == "for") s = parse_for(line);
    else if (tag == "set") s = parse_set(line);
    else if (tag == "macro") s = parse_macro(line);
    else if (tag == "call") s = parse_call_block(line);
    else if (tag == "filter") s = parse_filter_block(line);
    else if (tag == "with") s = parse_with(line);
    else if (tag == "generation") s = parse_block_of(StmtKind::Scoped, line, "endgeneration");
    else if (tag == "break" || tag == "continue") {
      s = stmt(tag == "break" ? StmtKind::Break : StmtKind::Continue, line);
      if (loop_depth_ == 0) fail(line, fmt::format("'{}' outside of a loop", tag));
      expect(T::BlockEnd, "'%}'");
    } else {
      fail(line, fmt::format("unknown tag '{}'", tag));
    }
    return s;
  }

  // `{% name %}` closing a block: the current token is `{%`.
  void end_tag(std::string_view name) {
    expect(T::BlockBegin, "'{%'");
    if (!skip_name(name)) fail(cur().line, fmt::format("expected '{}', got {}", name, describe(cur())));
    expect(T::BlockEnd, "'%}'");
  }

  StmtPtr parse_block_of(StmtKind kind, int line, std::string_view end) {
    auto s = stmt(kind, line);
    expect(T::BlockEnd, "'%}'");
    s->body = parse_body({end});
    end_tag(end);
    return s;
  }

  StmtPtr parse_if(int line) {
    auto s = stmt(StmtKind::If, line);
    s->expr = parse_tuple(false, false, {});
    expect(T::BlockEnd, "'%}'");
    s->body = parse_body({"elif", "else", "endif"});
    take();  // {%
    const Token& t = take();
    if (t.text == "elif") {
      s->else_body.push_back(parse_if(t.line));
      return s;  // the nested if consumed the endif
    }
    if (t.text == "else") {
      expect(T::BlockEnd, "'%}'");
      s->else_body = parse_body({"endif"});
      end_tag("endif");
      return s;
    }
    expect(T::BlockEnd, "'%}'");
    return s;
  }

  StmtPtr parse_for(int line) {
    auto s = stmt(StmtKind::For, line);
    s->target = parse_target(false, {"in"});
    if (!skip_name("in")) fail(cur().line, "expected 'in', got " + describe(cur()));
    s->expr = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) take(), s->recursive = true;
    expect(T::BlockEnd, "'%}'");
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"});
    --loop_depth_;
    take();
    if (take().text == "else") {
      expect(T::BlockEnd, "'%}'");
      s->else_body = parse_body({"endfor"});
      end_tag("endfor");
    } else {
      expect(T::BlockEnd, "'%}'");
    }
    return s;
  }

  StmtPtr parse_set(int line) {
    Target target = parse_target(true, {});
    if (skip_op("=")) {
      auto s = stmt(StmtKind::Set, line);
      s->target = std::move(target);
      s->expr = parse_tuple(true, false, {});
      expect(T::BlockEnd, "'%}'");
      return s;
    }
    auto s = stmt(StmtKind::SetBlock, line);
    s->target = std::move(target);
    if (s->target.kind != Target::Kind::Name && s->target.kind != Target::Kind::Attr)
      fail(line, "a block set assigns to one name");
    while (skip_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect(T::BlockEnd, "'%}'");
    const int saved = std::exchange(loop_depth_, 0);
    s->body = parse_body({"endset"});
    loop_depth_ = saved;
    end_tag("endset");
    return s;
  }

  std::vector<Param> parse_params() {
    std::vector<Param> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      Param p;
      p.name = expect_name();
      if (skip_op("=")) p.fallback = parse_expression(true);
      else if (!params.empty() && params.back().fallback) fail(cur().line, "non-default argument follows default argument");
      params.push_back(std::move(p));
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_macro(int line) {
    auto s = stmt(StmtKind::Macro, line);
    s->text = expect_name();
    s->params = parse_params();
    expect(T::BlockEnd, "'%}'");
    const int saved = std::exchange(loop_depth_, 0);
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    end_tag("endmacro");
    s->uses_varargs = mentions(s->body, "varargs");
    s->uses_kwargs = mentions(s->body, "kwargs");
    s->uses_caller = mentions(s->body, "caller");
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = stmt(StmtKind::CallBlock, line);
    if (is_op("(")) s->params = parse_params();
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) fail(line, "expected a call after {% call %}");
    expect(T::BlockEnd, "'%}'");
    const int saved = std::exchange(loop_depth_, 0);
    s->body = parse_body({"endcall"});
    loop_depth_ = saved;
    end_tag("endcall");
    s->uses_varargs = mentions(s->body, "varargs");
    s->uses_kwargs = mentions(s->body, "kwargs");
    s->uses_caller = mentions(s->body, "caller");
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = stmt(StmtKind::FilterBlock, line);
    s->filters.push_back(parse_filter(nullptr));
    while (skip_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect(T::BlockEnd, "'%}'");
    s->body = parse_body({"endfilter"});
    end_tag("endfilter");
    return s;
  }

  StmtPtr parse_with(int line) {
    auto s = stmt(StmtKind::With, line);
    while (cur().type != T::BlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      Target t = parse_target(false, {});
      expect_op("=");
      s->assigns.emplace_back(std::move(t), parse_expression(true));
    }
    expect(T::BlockEnd, "'%}'");
    s->body = parse_body({"endwith"});
    end_tag("endwith");
    return s;
  }

  // Names, (nested) tuples of names, or with `ns_attr` a `name.attr`.
  Target parse_target(bool ns_attr, std::initializer_list<std::string_view> extra_ends) {
    if (ns_attr && cur().type == T::Name && peek().type == T::Op && peek().text == ".") {
      Target t;
      t.kind = Target::Kind::Attr;
      t.name = take().text;
      take();
      t.attr = expect_name();
      return t;
    }
    Target tuple;
    tuple.kind = Target::Kind::Tuple;
    bool is_tuple = false;
    while (true) {
      if (!tuple.items.empty()) expect_op(",");
      if (tuple_end(extra_ends)) break;
      tuple.items.push_back(parse_target_primary());
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (tuple.items.empty()) fail(cur().line, "expected a name, got " + describe(cur()));
    if (!is_tuple) return std::move(tuple.items[0]);
    return tuple;
  }

  Target parse_target_primary() {
    if (skip_op("(")) {
      Target t = parse_target(false, {});
      expect_op(")");
      return t;
    }
    const Token& tok = cur();
    if (tok.type != T::Name) fail(tok.line, "can't assign to " + describe(tok));
    if (tok.text == "true" || tok.text == "false" || tok.text == "none" || tok.text == "True" || tok.text == "False" ||
        tok.text == "None")
      fail(tok.line, "can't assign to " + describe(tok));
    Target t;
    t.name = take().text;
    return t;
  }

  // ---- expressions ----

  bool tuple_end(std::initializer_list<std::string_view> extra) const {
    const Token& t = cur();
    if (t.type == T::VarEnd || t.type == T::BlockEnd || t.type == T::End) return true;
    if (t.type == T::Op && t.text == ")") return true;
    return t.type == T::Name && std::find(extra.begin(), extra.end(), t.text) != extra.end();
  }

  // Comma-separated expressions; a comma makes a tuple (`{{ 1, 2 }}`, `for a, b in ...`).
  ExprPtr parse_tuple(bool with_cond, bool parenthesized, std::initializer_list<std::string_view> extra_ends) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra_ends)) break;
      items.push_back(parse_expression(with_cond));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!parenthesized) fail(cur().line, "expected an expression, got " + describe(cur()));
    }
    auto t = node(ExprKind::Tuple, line);
    t->items = std::move(items);
    return t;
  }

  ExprPtr parse_expression(bool with_cond) { return with_cond ? parse_cond() : parse_or(); }

  ExprPtr parse_cond() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const int line = take().line;
      ExprPtr test = parse_or();
      ExprPtr other = skip_name("else") ? parse_cond() : nullptr;
      auto c = node(ExprKind::Cond, line, std::move(e), std::move(test));
      c->items.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = take().line;
      e = node(ExprKind::Or, line, std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = take().line;
      e = node(ExprKind::And, line, std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = take().line;
      return node(ExprKind::Not, line, parse_not());
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    while (true) {
      const Token& t = cur();
      if (t.type == T::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" ||
                              t.text == ">=")) {
        ops.push_back(take().text);
      } else if (is_name("in")) {
        take();
        ops.push_back("in");
      } else if (is_name("not") && peek().type == T::Name && peek().text == "in") {
        pos_ += 2;
        ops.push_back("notin");
      } else {
        break;
      }
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto c = node(ExprKind::Compare, line, std::move(first));
    for (auto& r : rest) c->items.push_back(std::move(r));
    c->ops = std::move(ops);
    return c;
  }

  ExprPtr binary(std::string op, int line, ExprPtr a, ExprPtr b) {
    auto e = node(ExprKind::Binary, line, std::move(a), std::move(b));
    e->name = std::move(op);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = take();
      e = binary(t.text, t.line, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto c = node(ExprKind::Concat, line, std::move(first));
    while (skip_op("~")) c->items.push_back(parse_math2());
    return c;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = take();
      e = binary(t.text, t.line, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = take();
      e = binary("**", t.line, std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this, cur().line);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = take();
      e = node(t.text == "-" ? ExprKind::Neg : ExprKind::Pos, t.line, parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr literal(Value v, int line) {
    auto e = node(ExprKind::Literal, line);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    switch (t.type) {
      case T::Name: {
        const std::string& n = take().text;
        if (n == "true" || n == "True") return literal(Value(true), line);
        if (n == "false" || n == "False") return literal(Value(false), line);
        if (n == "none" || n == "None") return literal(Value::none(), line);
        auto e = node(ExprKind::Name, line);
        e->name = n;
        return e;
      }
      case T::String: {
        std::string s;
        while (cur().type == T::String) s += take().text;  // adjacent literals join, as in Python
        return literal(Value(std::move(s)), line);
      }
      case T::Int: return literal(Value(take().int_value), line);
      case T::Float: return literal(Value(take().float_value), line);
      case T::Op:
        if (t.text == "(") {
          take();
          ExprPtr e = parse_tuple(true, true, {});
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    fail(line, "unexpected " + describe(t));
  }

  ExprPtr parse_list() {
    auto e = node(ExprKind::List, take().line);
    while (!is_op("]")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("]")) break;
      e->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    auto e = node(ExprKind::Dict, take().line);
    while (!is_op("}")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("}")) break;
      e->items.push_back(parse_expression(true));
      expect_op(":");
      e->items.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) e = parse_subscript(std::move(e));
      else if (is_op("(")) e = parse_call(std::move(e));
      else return e;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        take();
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Token& t = take();
    if (t.text == ".") {
      const Token& a = take();
      if (a.type == T::Name) {
        auto e = node(ExprKind::Attr, t.line, std::move(obj));
        e->name = a.text;
        return e;
      }
      if (a.type == T::Int) return node(ExprKind::Item, t.line, std::move(obj), literal(Value(a.int_value), a.line));
      fail(a.line, "expected a name after '.', got " + describe(a));
    }
    // [ ... ]: an index, a slice, or several (a tuple index)
    std::vector<ExprPtr> parts;
    while (!is_op("]")) {
      if (!parts.empty()) expect_op(",");
      parts.push_back(parse_subscribed());
    }
    expect_op("]");
    if (parts.empty()) fail(t.line, "expected an index inside []");
    if (parts.size() == 1) {
      if (parts[0]->kind == ExprKind::Slice) {
        parts[0]->items[0] = std::move(obj);
        return std::move(parts[0]);
      }
      return node(ExprKind::Item, t.line, std::move(obj), std::move(parts[0]));
    }
    auto tuple = node(ExprKind::Tuple, t.line);
    for (auto& p : parts) {
      if (p->kind == ExprKind::Slice) fail(t.line, "slices inside a tuple index are not supported");
      tuple->items.push_back(std::move(p));
    }
    return node(ExprKind::Item, t.line, std::move(obj), std::move(tuple));
  }

  // One index or `a:b:c` (a Slice node whose items[0] the caller fills in).
  ExprPtr parse_subscribed() {
    const int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    take();  // the first ':'
    auto s = node(ExprKind::Slice, line);
    s->items.push_back(nullptr);
    s->items.push_back(std::move(start));
    s->items.push_back(is_op("]") || is_op(",") || is_op(":") ? nullptr : parse_expression(true));
    ExprPtr step;
    if (skip_op(":") && !is_op("]") && !is_op(",")) step = parse_expression(true);
    s->items.push_back(std::move(step));
    return s;
  }

  void parse_args(std::vector<Arg>& args) {
    expect_op("(");
    bool keywords = false;
    while (!is_op(")")) {
      if (!args.empty()) expect_op(",");
      if (is_op(")")) break;
      Arg a;
      if (skip_op("*")) {
        a.name = "*";
      } else if (skip_op("**")) {
        a.name = "**";
      } else if (cur().type == T::Name && peek().type == T::Op && peek().text == "=") {
        a.name = take().text;
        take();
        keywords = true;
      } else if (keywords) {
        fail(cur().line, "positional argument follows keyword argument");
      }
      a.value = parse_expression(true);
      args.push_back(std::move(a));
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(ExprKind::Call, cur().line, std::move(callee));
    parse_args(e->args);
    return e;
  }

  // At the filter's name (after `|`, or after {% filter %}); `subject` null in a filter chain.
  ExprPtr parse_filter(ExprPtr subject) {
    const int line = cur().line;
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    auto e = node(ExprKind::Filter, line);
    e->items.push_back(std::move(subject));
    e->name = std::move(name);
    if (is_op("(")) parse_args(e->args);
    return e;
  }

  ExprPtr parse_test(ExprPtr subject) {
    const int line = take().line;  // is
    const bool negated = skip_name("not");
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    auto e = node(ExprKind::Test, line, std::move(subject));
    e->name = std::move(name);
    e->negated = negated;
    const Token& t = cur();
    if (is_op("(")) {
      parse_args(e->args);
    } else if ((t.type == T::Name || t.type == T::String || t.type == T::Int || t.type == T::Float ||
                (t.type == T::Op && (t.text == "[" || t.text == "{"))) &&
               !(t.type == T::Name && (t.text == "else" || t.text == "or" || t.text == "and"))) {
      // `x is divisibleby 3`: one argument without parentheses
      if (is_name("is")) fail(t.line, "you cannot chain multiple tests with is");
      Arg a;
      a.value = parse_postfix(parse_primary());
      e->args.push_back(std::move(a));
    }
    return e;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) {
  Body body = Parser(tokenize(source)).run();
  check_names(body, false);
  return body;
}

}  // namespace toy::jinja
