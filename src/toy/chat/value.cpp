#include "toy/chat/value.h"

#include <algorithm>
#include <cmath>

#include "toy/chat/pystr.h"

namespace toy::jinja {
namespace {

bool hashable(const Value& v) {
  if (v.is_dict()) return false;
  if (v.is_list()) return v.list().seq == Seq::Tuple || v.list().seq == Seq::Range;
  return true;
}

// Three-way comparison for <, <=, >, >=; raises TypeError's message for kinds Python cannot
// order. NaN compares as neither smaller nor larger (the callers check for it first).
int compare3(const Value& a, const Value& b, std::string_view op) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.integer() < b.integer() ? -1 : a.integer() > b.integer();
    return a.number() < b.number() ? -1 : a.number() > b.number();
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0;
  }
  if (a.is_list() && b.is_list() && a.list().seq == b.list().seq &&
      (a.list().seq == Seq::List || a.list().seq == Seq::Tuple)) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equal(x[i], y[i])) return compare3(x[i], y[i], op);
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  failf("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b));
}

bool is_nan(const Value& v) { return v.is_float() && std::isnan(v.number()); }

std::string repr_items(const std::vector<Value>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += repr(items[i]);
  }
  return out;
}

std::string repr_dict(const Dict& d) {
  std::string out = "{";
  for (size_t i = 0; i < d.entries.size(); ++i) {
    if (i) out += ", ";
    out += repr(d.entries[i].first) + ": " + repr(d.entries[i].second);
  }
  return out + "}";
}

}  // namespace

void Value::fail_undefined() const {
  if (unsafe()) throw Failure(s_);
  throw Failure(s_.empty() ? "undefined value" : s_);
}

const Value* Dict::find(const Value& key) const {
  if (!hashable(key)) return nullptr;
  for (const auto& [k, v] : entries)
    if (equal(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

void Dict::set(const Value& key, Value value) {
  if (!hashable(key)) failf("unhashable type: '{}'", type_name(key));
  for (auto& [k, v] : entries)
    if (equal(k, key)) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(key, std::move(value));
}

Value make_list(std::vector<Value> items, Seq seq) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->seq = seq;
  return Value(l);
}

Value make_dict() { return Value(std::make_shared<Dict>()); }

Value make_function(std::string name, std::function<Value(Args&)> fn, std::string repr) {
  auto f = std::make_shared<Function>();
  f->name = std::move(name);
  f->call = std::move(fn);
  f->repr = std::move(repr);
  return Value(f);
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Object: return v.object().type;
    case Value::Kind::Function: return v.function().repr.rfind("<Macro", 0) == 0 ? "Macro" : "function";
    case Value::Kind::List: break;
  }
  switch (v.list().seq) {
    case Seq::List: return "list";
    case Seq::Tuple: return "tuple";
    case Seq::Iterator: return "generator";
    case Seq::Range: return "range";
    case Seq::DictKeys: return "dict_keys";
    case Seq::DictValues: return "dict_values";
    case Seq::DictItems: return "dict_items";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.boolean();
    case Value::Kind::Int: return v.integer() != 0;
    case Value::Kind::Float: return v.number() != 0.0;
    case Value::Kind::String: return !v.str().empty();
    case Value::Kind::List: return v.list().seq == Seq::Iterator || !v.list().items.empty();
    case Value::Kind::Dict: return v.dict().size() > 0;
    case Value::Kind::Object:
      if (const Value* n = v.object().attrs.find("length"); n && v.object().type == "LoopContext") return truthy(*n);
      return true;
    case Value::Kind::Function: return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.integer() == b.integer();
    return a.number() == b.number();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.str() == b.str();
    case Value::Kind::List: {
      const List& x = a.list();
      const List& y = b.list();
      if (&x == &y) return true;
      if (x.seq != y.seq || x.seq == Seq::Iterator || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equal(x.items[i], y.items[i])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      const Dict& x = a.dict();
      const Dict& y = b.dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* w = y.find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

bool less(const Value& a, const Value& b) { return ordered(a, b, "<"); }

bool ordered(const Value& a, const Value& b, std::string_view op) {
  if (is_nan(a) || is_nan(b)) {
    if (!a.is_number() || !b.is_number()) compare3(a, b, op);  // still a TypeError
    return false;
  }
  const int c = compare3(a, b, op);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::String: return v.str();
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  // A namespace can hold itself (ns.self = [ns]); Python prints [...] there, toy refuses.
  thread_local int depth = 0;
  struct Guard {
    Guard() {
      if (++depth > 500) {
        --depth;
        failf("cannot print a value that contains itself");
      }
    }
    ~Guard() { --depth; }
  } guard;
  switch (v.kind()) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.boolean() ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.integer());
    case Value::Kind::Float: return py::float_repr(v.number());
    case Value::Kind::String: return py::repr(v.str());
    case Value::Kind::Dict: return repr_dict(v.dict());
    case Value::Kind::Object:
      if (v.object().type == "Namespace") return "<Namespace " + repr_dict(v.object().attrs) + ">";
      if (v.object().type == "LoopContext")
        return fmt::format("<LoopContext {}/{}>", v.object().attrs.find("index")->integer(),
                           v.object().attrs.find("length")->integer());
      failf("cannot print a {} object (Python would print its address)", v.object().type);
    case Value::Kind::Function:
      if (!v.function().repr.empty()) return v.function().repr;
      failf("cannot print the function '{}' (Python would print its address)", v.function().name);
    case Value::Kind::List: break;
  }
  const List& l = v.list();
  switch (l.seq) {
    case Seq::List: return fmt::format("[{}]", repr_items(l.items));
    case Seq::Tuple: return fmt::format("({}{}", repr_items(l.items), l.items.size() == 1 ? ",)" : ")");
    case Seq::Iterator: failf("cannot print a generator object (Python would print its address); add |list");
    case Seq::Range:
      return l.step == 1 ? fmt::format("range({}, {})", l.start, l.stop)
                         : fmt::format("range({}, {}, {})", l.start, l.stop, l.step);
    case Seq::DictKeys: return "dict_keys([" + repr_items(l.items) + "])";
    case Seq::DictValues: return "dict_values([" + repr_items(l.items) + "])";
    case Seq::DictItems: return "dict_items([" + repr_items(l.items) + "])";
  }
  return "";
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return py::length(v.str());
    case Value::Kind::Dict: return static_cast<int64_t>(v.dict().size());
    case Value::Kind::List:
      if (v.list().seq != Seq::Iterator) return static_cast<int64_t>(v.list().items.size());
      break;
    case Value::Kind::Object:
      if (v.object().type == "LoopContext") return v.object().attrs.find("length")->integer();
      break;
    default: break;
  }
  failf("object of type '{}' has no len()", type_name(v));
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::String: {
      std::vector<Value> out;
      for (char32_t c : py::decode(v.str())) {
        std::string s;
        py::append_utf8(s, c);
        out.emplace_back(std::move(s));
      }
      return out;
    }
    case Value::Kind::List:
      if (v.list().seq == Seq::Iterator) return std::exchange(v.list().items, {});
      return v.list().items;
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& e : v.dict().entries) keys.push_back(e.first);
      return keys;
    }
    default: failf("'{}' object is not iterable", type_name(v));
  }
}

bool contains(const Value& haystack, const Value& needle) {
  switch (haystack.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (!needle.is_string()) failf("'in <string>' requires string as left operand, not {}", type_name(needle));
      return haystack.str().find(needle.str()) != std::string::npos;
    case Value::Kind::Dict:
      if (!hashable(needle)) failf("unhashable type: '{}'", type_name(needle));
      return haystack.dict().find(needle) != nullptr;
    case Value::Kind::List:
      for (const Value& x : iterate(haystack))
        if (equal(x, needle)) return true;
      return false;
    default: failf("argument of type '{}' is not iterable", type_name(haystack));
  }
}

}  // namespace toy::jinja
