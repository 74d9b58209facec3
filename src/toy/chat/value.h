// toy::jinja::Value — what a template computes with, modelled on the Python objects jinja2
// hands around, because a chat template's output depends on Python's rules: truthiness, `==`
// across int/float/bool, str() and repr() text (`True`, `None`, `1.0`, `['a', 1]`), and which
// operations raise. Lists, dicts, objects and functions are shared by reference, as in Python.
//
// Kinds: undefined (jinja2's Undefined: prints as "", raises when used further; it carries the
// message it raises with), none, bool, int (64-bit; overflow is an error, not a bigint), float,
// string (UTF-8; `markup` marks jinja2's Markup from |safe / |escape), list (also tuple,
// iterator, range and dict views: see Seq), dict (keeps insertion order), object (namespace(),
// loop, cycler: named attributes) and function (macros, builtins, bound methods).
#pragma once
#include <fmt/core.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace toy::jinja {

// A failure inside a value operation (Python's TypeError, ValueError, UndefinedError...). The
// renderer turns it into a toy::Error naming the template line.
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void failf(fmt::format_string<Args...> f, Args&&... args) {
  throw Failure(fmt::format(f, std::forward<Args>(args)...));
}

class Value;
struct List;
struct Dict;
struct Object;
struct Function;
using ListPtr = std::shared_ptr<List>;
using DictPtr = std::shared_ptr<Dict>;
using ObjectPtr = std::shared_ptr<Object>;
using FunctionPtr = std::shared_ptr<Function>;

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Object, Function };

  Value() = default;  // undefined
  Value(bool b) : kind_(Kind::Bool), b_(b) {}
  Value(int i) : kind_(Kind::Int), i_(i) {}
  Value(int64_t i) : kind_(Kind::Int), i_(i) {}
  Value(double d) : kind_(Kind::Float), f_(d) {}
  Value(std::string s, bool markup = false) : kind_(Kind::String), flag_(markup), s_(std::move(s)) {}
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(ListPtr p) : kind_(Kind::List), p_(std::move(p)) {}
  Value(DictPtr p) : kind_(Kind::Dict), p_(std::move(p)) {}
  Value(ObjectPtr p) : kind_(Kind::Object), p_(std::move(p)) {}
  Value(FunctionPtr p) : kind_(Kind::Function), p_(std::move(p)) {}

  static Value none() {
    Value v;
    v.kind_ = Kind::None;
    return v;
  }
  // `message` is what using the value raises ("'x' is undefined"); `unsafe`: the sandbox hid
  // an attribute (calling it is a security error rather than an undefined error).
  static Value undefined(std::string message, bool unsafe = false) {
    Value v;
    v.s_ = std::move(message);
    v.flag_ = unsafe;
    return v;
  }

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_function() const { return kind_ == Kind::Function; }

  bool boolean() const { return b_; }
  int64_t integer() const { return kind_ == Kind::Bool ? b_ : i_; }  // bool is an int in Python
  double number() const { return kind_ == Kind::Float ? f_ : static_cast<double>(integer()); }
  const std::string& str() const { return s_; }
  bool markup() const { return kind_ == Kind::String && flag_; }
  const std::string& undefined_message() const { return s_; }
  bool unsafe() const { return kind_ == Kind::Undefined && flag_; }
  List& list() const { return *static_cast<List*>(p_.get()); }
  Dict& dict() const { return *static_cast<Dict*>(p_.get()); }
  Object& object() const { return *static_cast<Object*>(p_.get()); }
  Function& function() const { return *static_cast<Function*>(p_.get()); }
  const void* identity() const { return p_.get(); }

  // Raises the undefined value's error (for operations jinja2's Undefined refuses).
  [[noreturn]] void fail_undefined() const;

 private:
  Kind kind_ = Kind::Undefined;
  bool flag_ = false;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::string s_;
  std::shared_ptr<void> p_;
};

// What a list-like value is in Python: printing, len(), truthiness and JSON differ by kind.
// Iterator: the generators jinja2's map/select/reverse/... return (always truthy, no len(), and
// used up once iterated). Range and the dict views are materialized but print as Python does.
enum class Seq : uint8_t { List, Tuple, Iterator, Range, DictKeys, DictValues, DictItems };

struct List {
  std::vector<Value> items;
  Seq seq = Seq::List;
  int64_t start = 0, stop = 0, step = 1;  // Range: its arguments, for repr
  std::vector<std::string> fields;        // a namedtuple's field names (groupby's grouper, list)
};

struct Dict {
  std::vector<std::pair<Value, Value>> entries;  // in insertion order

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  const Value* find(const std::string& key) const { return find(std::string_view(key)); }
  const Value* find(const char* key) const { return find(std::string_view(key)); }
  void set(const Value& key, Value value);  // an existing key keeps its position
  size_t size() const { return entries.size(); }
};

// namespace() objects (`assignable`), loop contexts, cyclers and joiners: named attributes.
struct Object {
  std::string type;  // Python's class name: "Namespace", "LoopContext", "Cycler"
  Dict attrs;
  bool assignable = false;
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Function {
  std::string name;
  std::function<Value(Args&)> call;
  std::string repr;  // how Python prints it; empty: printing it is refused (Python shows an address)
};

Value make_list(std::vector<Value> items, Seq seq = Seq::List);
Value make_dict();
Value make_function(std::string name, std::function<Value(Args&)> fn, std::string repr = "");

// Python's type(x).__name__.
std::string type_name(const Value& v);
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
// a <op> b for op in <, <=, >, >=; raises TypeError's message for unorderable kinds.
bool less(const Value& a, const Value& b);
bool ordered(const Value& a, const Value& b, std::string_view op);
// str(v) (undefined: ""), and repr(v).
std::string to_str(const Value& v);
std::string repr(const Value& v);
// len(v); raises for values without one.
int64_t length(const Value& v);
// The items `for x in v` sees: list items, dict keys, string characters (undefined: none).
// Iterating an iterator uses it up.
std::vector<Value> iterate(const Value& v);
// `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);

// nlohmann::json <-> Value. Objects keep the json's key order (sorted for nlohmann::json, the
// document's for ordered_json: what a request's `tools` need, as HF keeps Python's dict order);
// to_json gives nlohmann's own (sorted) order and refuses what JSON cannot hold.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);
nlohmann::json to_json(const Value& v);

// Python's json.dumps(v, ensure_ascii, indent, separators, sort_keys) as HF's tojson calls it.
struct JsonStyle {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;              // the indent unit when has_indent
  std::string item_sep, key_sep;   // empty: json.dumps' defaults
  bool sort_keys = false;
};
std::string dump_json(const Value& v, const JsonStyle& style);

}  // namespace toy::jinja
