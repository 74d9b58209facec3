#include "toy/chat/render.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "toy/chat/builtins.h"
#include "toy/chat/lexer.h"
#include "toy/chat/parser.h"
#include "toy/core/error.h"

namespace toy::jinja {
namespace {

// Python's recursion limit stops a template that calls macros without end; toy stops earlier,
// long before its own stack would.
constexpr int kMaxCallDepth = 200;

struct Scope;
using ScopePtr = std::shared_ptr<Scope>;

struct Scope {
  explicit Scope(ScopePtr p = nullptr) : parent(std::move(p)) {}
  ScopePtr parent;
  std::unordered_map<std::string, Value> vars;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      if (auto it = s->vars.find(name); it != s->vars.end()) return &it->second;
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

// Runs f, turning a Failure (a value operation's error) into a toy::Error naming the line.
template <class F>
auto at_line(int line, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Failure& e) {
    throw toy::Error(where(line) + e.what());
  }
}

class Renderer {
 public:
  ~Renderer() {
    // Macros hold the scope they were defined in, which holds them: break those cycles.
    for (auto& s : closures_) s->vars.clear();
  }

  Flow exec(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec_stmt(*s, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Value eval(const Expr& e, const ScopePtr& scope) { return at_line(e.line, [&] { return eval_inner(e, scope); }); }

 private:
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
    switch (s.kind) {
      case StmtKind::Text: out += s.text; return Flow::Normal;
      case StmtKind::Print: {
        const Value v = eval(*s.expr, scope);
        out += at_line(s.line, [&] { return to_str(v); });
        return Flow::Normal;
      }
      case StmtKind::If:
        return exec(truthy(eval(*s.expr, scope)) ? s.body : s.else_body, scope, out);
      case StmtKind::For: return exec_for(s, scope, out);
      case StmtKind::Set: {
        const Value v = eval(*s.expr, scope);
        at_line(s.line, [&] { assign(s.target, v, *scope); });
        return Flow::Normal;
      }
      case StmtKind::SetBlock: {
        Value v(render_block(s.body, scope, s.line));
        for (const auto& f : s.filters) v = apply_filter_node(*f, v, scope);
        at_line(s.line, [&] { assign(s.target, v, *scope); });
        return Flow::Normal;
      }
      case StmtKind::Macro: {
        closures_.push_back(scope);
        const Stmt* m = &s;
        scope->vars[s.text] = make_function(s.text, [this, m, scope](Args& a) { return call_macro(*m, scope, a, m->text); },
                                            "<Macro '" + s.text + "'>");
        return Flow::Normal;
      }
      case StmtKind::CallBlock: {
        const Expr& call = *s.expr;
        const Value callee = eval(*call.items[0], scope);
        Args args = eval_args(call.args, scope, call.line);
        closures_.push_back(scope);
        const Stmt* c = &s;
        args.kw.emplace_back("caller", make_function("caller", [this, c, scope](Args& a) {
          return call_macro(*c, scope, a, "caller");
        }, "<Macro 'caller'>"));
        const Value r = at_line(s.line, [&] { return call_value(callee, args); });
        out += at_line(s.line, [&] { return to_str(r); });
        return Flow::Normal;
      }
      case StmtKind::FilterBlock: {
        Value v(render_block(s.body, scope, s.line));
        for (const auto& f : s.filters) v = apply_filter_node(*f, v, scope);
        out += at_line(s.line, [&] { return to_str(v); });
        return Flow::Normal;
      }
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
      case StmtKind::With: {
        auto inner = std::make_shared<Scope>(scope);
        std::vector<Value> values;
        for (const auto& [target, expr] : s.assigns) values.push_back(eval(*expr, scope));
        at_line(s.line, [&] {
          for (size_t i = 0; i < values.size(); ++i) assign(s.assigns[i].first, values[i], *inner);
        });
        return exec(s.body, inner, out);
      }
      case StmtKind::Scoped: return exec(s.body, std::make_shared<Scope>(scope), out);
    }
    return Flow::Normal;
  }

  std::string render_block(const Body& body, const ScopePtr& scope, int line) {
    std::string text;
    if (exec(body, std::make_shared<Scope>(scope), text) != Flow::Normal)
      throw toy::Error(where(line) + "'break' or 'continue' outside of a loop");
    return text;
  }

  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    return run_for(s, eval(*s.expr, scope), scope, out, 1);
  }

  // One level of a for loop over `seq` (a recursive loop's nested levels: loop(items) in its
  // body renders this again one level deeper and gives the text).
  Flow run_for(const Stmt& s, const Value& seq, const ScopePtr& scope, std::string& out, int depth) {
    if (depth > kMaxCallDepth) failf("maximum recursion depth exceeded in a recursive loop");
    std::vector<Value> items = at_line(s.line, [&] { return iterate(seq); });
    if (s.cond) {
      std::vector<Value> kept;
      for (Value& x : items) {
        auto probe = std::make_shared<Scope>(scope);
        at_line(s.line, [&] { assign(s.target, x, *probe); });
        if (truthy(eval(*s.cond, probe))) kept.push_back(std::move(x));
      }
      items = std::move(kept);
    }
    auto last_changed = std::make_shared<std::optional<Value>>();
    for (size_t i = 0; i < items.size(); ++i) {
      if (++loop_steps_ > render_limits().loop_steps || out.size() > render_limits().text_bytes)
        fail("[template] line {}: the template runs more than {} loop steps or writes more than {} MiB (toy's "
             "limit for a chat template)", s.line, render_limits().loop_steps, render_limits().text_bytes >> 20);
      auto inner = std::make_shared<Scope>(scope);
      at_line(s.line, [&] { assign(s.target, items[i], *inner); });
      Value loop = loop_object(items, i, last_changed, depth);
      if (s.recursive)
        loop.object().attrs.set(Value("__call__"), make_function("loop", [this, &s, scope, depth](Args& a) {
          if (a.pos.size() != 1 || !a.kw.empty()) failf("loop() takes one iterable");
          std::string text;
          run_for(s, a.pos[0], scope, text, depth + 1);
          return Value(std::move(text));
        }));
      inner->vars["loop"] = std::move(loop);
      if (exec(s.body, inner, out) == Flow::Break) break;
    }
    if (items.empty()) exec(s.else_body, std::make_shared<Scope>(scope), out);
    return Flow::Normal;
  }

  static Value loop_object(const std::vector<Value>& items, size_t i, std::shared_ptr<std::optional<Value>> last_changed,
                           int depth) {
    const int64_t n = static_cast<int64_t>(items.size()), k = static_cast<int64_t>(i);
    auto loop = std::make_shared<Object>();
    loop->type = "LoopContext";
    Dict& d = loop->attrs;
    d.set(Value("index"), Value(k + 1));
    d.set(Value("index0"), Value(k));
    d.set(Value("revindex"), Value(n - k));
    d.set(Value("revindex0"), Value(n - k - 1));
    d.set(Value("first"), Value(k == 0));
    d.set(Value("last"), Value(k == n - 1));
    d.set(Value("length"), Value(n));
    d.set(Value("depth"), Value(int64_t(depth)));
    d.set(Value("depth0"), Value(int64_t(depth - 1)));
    d.set(Value("previtem"), k > 0 ? items[k - 1] : Value::undefined("there is no previous item"));
    d.set(Value("nextitem"), k + 1 < n ? items[k + 1] : Value::undefined("there is no next item"));
    d.set(Value("cycle"), make_function("cycle", [k](Args& a) {
      if (!a.kw.empty()) failf("cycle() takes no keyword arguments");
      if (a.pos.empty()) failf("no items for cycling given");
      return a.pos[k % static_cast<int64_t>(a.pos.size())];
    }));
    d.set(Value("changed"), make_function("changed", [last_changed](Args& a) {
      if (!a.kw.empty()) failf("changed() takes no keyword arguments");
      Value now = make_list(a.pos, Seq::Tuple);
      if (*last_changed && equal(**last_changed, now)) return Value(false);
      *last_changed = now;
      return Value(true);
    }));
    return Value(loop);
  }

  void assign(const Target& t, const Value& v, Scope& scope) {
    switch (t.kind) {
      case Target::Kind::Name: scope.vars[t.name] = v; return;
      case Target::Kind::Attr: {
        const Value* ns = scope.lookup(t.name);
        if (!ns || !ns->is_object() || !ns->object().assignable)
          failf("cannot assign attribute on non-namespace object");
        ns->object().attrs.set(Value(t.attr), v);
        return;
      }
      case Target::Kind::Tuple: {
        if (!v.is_string() && !v.is_list() && !v.is_dict()) failf("cannot unpack non-iterable {} object", type_name(v));
        std::vector<Value> parts = iterate(v);
        if (parts.size() > t.items.size()) failf("too many values to unpack (expected {})", t.items.size());
        if (parts.size() < t.items.size())
          failf("not enough values to unpack (expected {}, got {})", t.items.size(), parts.size());
        for (size_t i = 0; i < parts.size(); ++i) assign(t.items[i], parts[i], scope);
        return;
      }
    }
  }

  // A macro (or a call block's caller) called with `args`: binds parameters as jinja2's
  // Macro.__call__ does, then renders the body in a new scope under `closure`.
  Value call_macro(const Stmt& m, const ScopePtr& closure, Args& args, const std::string& name) {
    if (depth_ >= kMaxCallDepth) failf("maximum recursion depth exceeded in macro '{}'", name);
    struct Depth {
      int& d;
      explicit Depth(int& x) : d(++x) {}
      ~Depth() { --d; }
    } guard(depth_);
    auto scope = std::make_shared<Scope>(closure);
    Value caller = Value::undefined("No caller defined");
    if (m.uses_caller) {
      for (auto it = args.kw.begin(); it != args.kw.end(); ++it)
        if (it->first == "caller") {
          caller = it->second;
          args.kw.erase(it);
          break;
        }
    }
    for (size_t i = 0; i < m.params.size(); ++i) {
      const Param& p = m.params[i];
      auto kw = std::find_if(args.kw.begin(), args.kw.end(), [&](const auto& kv) { return kv.first == p.name; });
      if (i < args.pos.size()) {
        if (kw != args.kw.end()) failf("macro '{}' got multiple values for argument '{}'", name, p.name);
        scope->vars[p.name] = args.pos[i];
      } else if (kw != args.kw.end()) {
        scope->vars[p.name] = kw->second;
        args.kw.erase(kw);
      } else if (p.fallback) {
        scope->vars[p.name] = eval(*p.fallback, scope);
      } else {
        scope->vars[p.name] = Value::undefined(fmt::format("parameter '{}' was not provided", p.name));
      }
    }
    if (args.pos.size() > m.params.size() && !m.uses_varargs)
      failf("macro '{}' takes not more than {} argument(s)", name, m.params.size());
    if (!args.kw.empty() && !m.uses_kwargs) failf("macro '{}' takes no keyword argument '{}'", name, args.kw.front().first);
    if (m.uses_varargs) {
      std::vector<Value> extra;
      for (size_t i = m.params.size(); i < args.pos.size(); ++i) extra.push_back(args.pos[i]);
      scope->vars["varargs"] = make_list(std::move(extra), Seq::Tuple);
    }
    if (m.uses_kwargs) {
      Value kw = make_dict();
      for (auto& [k, v] : args.kw) kw.dict().set(Value(k), v);
      scope->vars["kwargs"] = kw;
    }
    if (m.uses_caller) scope->vars["caller"] = caller;
    std::string out;
    exec(m.body, scope, out);
    return Value(std::move(out));
  }

  Args eval_args(const std::vector<Arg>& in, const ScopePtr& scope, int line) {
    Args a;
    for (const Arg& arg : in) {
      Value v = eval(*arg.value, scope);
      at_line(line, [&] {
        if (arg.name.empty()) {
          a.pos.push_back(std::move(v));
        } else if (arg.name == "*") {
          for (Value& x : iterate(v)) a.pos.push_back(std::move(x));
        } else if (arg.name == "**") {
          if (!v.is_dict()) failf("argument after ** must be a mapping, not {}", type_name(v));
          for (const auto& [k, x] : v.dict().entries) {
            if (!k.is_string()) failf("keywords must be strings");
            a.kw.emplace_back(k.str(), x);
          }
        } else {
          for (const auto& kv : a.kw)
            if (kv.first == arg.name) failf("keyword argument repeated: {}", arg.name);
          a.kw.emplace_back(arg.name, std::move(v));
        }
      });
    }
    return a;
  }

  Value apply_filter_node(const Expr& f, const Value& subject, const ScopePtr& scope) {
    Args args = eval_args(f.args, scope, f.line);
    return at_line(f.line, [&] { return apply_filter(f.name, subject, args); });
  }

  Value eval_inner(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case ExprKind::Literal: return e.literal;
      case ExprKind::Name: {
        if (const Value* v = scope->lookup(e.name)) return *v;
        return Value::undefined(fmt::format("'{}' is undefined", e.name));
      }
      case ExprKind::List:
      case ExprKind::Tuple: {
        std::vector<Value> items;
        for (const auto& x : e.items) items.push_back(eval(*x, scope));
        return make_list(std::move(items), e.kind == ExprKind::Tuple ? Seq::Tuple : Seq::List);
      }
      case ExprKind::Dict: {
        Value d = make_dict();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          Value k = eval(*e.items[i], scope);
          d.dict().set(k, eval(*e.items[i + 1], scope));
        }
        return d;
      }
      case ExprKind::Not: return Value(!truthy(eval(*e.items[0], scope)));
      case ExprKind::Neg:
      case ExprKind::Pos: return negate(eval(*e.items[0], scope), e.kind == ExprKind::Neg);
      case ExprKind::And: {
        Value a = eval(*e.items[0], scope);
        return truthy(a) ? eval(*e.items[1], scope) : a;
      }
      case ExprKind::Or: {
        Value a = eval(*e.items[0], scope);
        return truthy(a) ? a : eval(*e.items[1], scope);
      }
      case ExprKind::Binary: {
        Value a = eval(*e.items[0], scope);
        Value b = eval(*e.items[1], scope);
        return binary_op(e.name, a, b);
      }
      case ExprKind::Concat: {
        std::string s;
        for (const auto& x : e.items) s += to_str(eval(*x, scope));
        if (s.size() > render_limits().text_bytes)
          fail("[template] line {}: a string longer than {} MiB (toy's limit for a chat template)", e.line,
               render_limits().text_bytes >> 20);
        return Value(std::move(s));
      }
      case ExprKind::Compare: return compare(e, scope);
      case ExprKind::Cond:
        if (truthy(eval(*e.items[1], scope))) return eval(*e.items[0], scope);
        if (e.items[2]) return eval(*e.items[2], scope);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
      case ExprKind::Attr: return get_attr(eval(*e.items[0], scope), e.name);
      case ExprKind::Item: {
        Value obj = eval(*e.items[0], scope);
        if (obj.is_undefined()) obj.fail_undefined();
        return get_item(obj, eval(*e.items[1], scope));
      }
      case ExprKind::Slice: {
        Value obj = eval(*e.items[0], scope);
        auto bound = [&](size_t i) { return e.items[i] ? eval(*e.items[i], scope) : Value::none(); };
        Value start = bound(1), stop = bound(2), step = bound(3);
        return get_slice(obj, start, stop, step);
      }
      case ExprKind::Call: {
        Value callee = eval(*e.items[0], scope);
        Args args = eval_args(e.args, scope, e.line);
        return call_value(callee, args);
      }
      case ExprKind::Filter: return apply_filter_node(e, eval(*e.items[0], scope), scope);
      case ExprKind::Test: {
        Value subject = eval(*e.items[0], scope);
        Args args = eval_args(e.args, scope, e.line);
        return Value(apply_test(e.name, subject, args) != e.negated);
      }
    }
    failf("unknown expression");
  }

  // Chained comparisons: a < b < c is (a < b) and (b < c), each operand evaluated once.
  Value compare(const Expr& e, const ScopePtr& scope) {
    Value left = eval(*e.items[0], scope);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.items[i + 1], scope);
      const std::string& op = e.ops[i];
      bool ok;
      if (op == "==") ok = equal(left, right);
      else if (op == "!=") ok = !equal(left, right);
      else if (op == "in") ok = contains(right, left);
      else if (op == "notin") ok = !contains(right, left);
      else ok = ordered(left, right, op);
      if (!ok) return Value(false);
      left = std::move(right);
    }
    return Value(true);
  }

  int depth_ = 0;
  int64_t loop_steps_ = 0;
  std::vector<ScopePtr> closures_;
};

}  // namespace

Template::Template(std::string_view source) : body_(parse_template(source)) {}

RenderLimits& render_limits() {
  static RenderLimits limits;
  return limits;
}

std::string Template::render(const Dict& variables) const {
  auto globals = std::make_shared<Scope>();
  for (const auto& [k, v] : variables.entries) {
    if (!k.is_string()) throw toy::Error("[template] variable names must be strings");
    globals->vars[k.str()] = v;
  }
  auto top = std::make_shared<Scope>(globals);
  std::string out;
  try {
    Renderer r;
    if (r.exec(body_, top, out) != Flow::Normal) throw toy::Error("[template] 'break' or 'continue' outside of a loop");
  } catch (const toy::Error&) {
    throw;
  } catch (const Failure& e) {
    throw toy::Error(std::string("[template] ") + e.what());
  } catch (const std::exception& e) {
    throw toy::Error(std::string("[template] internal error: ") + e.what());
  }
  return out;
}

}  // namespace toy::jinja
