// What templates can do to values besides the grammar: attribute and item access, operators,
// the methods of str/dict/list, jinja2's filters and tests, and the global functions. Each is
// Python's or jinja2's behaviour under HF's ImmutableSandboxedEnvironment: methods that change
// a list or dict (append, update, pop...) are hidden attributes whose call is a security error.
// Everything here raises Failure; the renderer adds the template line.
#pragma once
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include "toy/chat/value.h"

namespace toy::jinja {

// ---- arguments ----

// Reads a builtin's arguments as Python binds them: positionally in order, else by keyword,
// else the default; done() refuses what is left over.
class ArgReader {
 public:
  ArgReader(std::string_view fn, Args& args) : fn_(fn), args_(args) {}
  Value next(std::string_view name);                    // required
  Value next(std::string_view name, Value fallback);    // optional
  std::vector<Value> rest();                            // *args
  std::vector<std::pair<std::string, Value>> rest_kw();  // **kwargs
  void done();

 private:
  std::optional<Value> find(std::string_view name);
  std::string fn_;
  Args& args_;
  size_t pos_ = 0;
};

int64_t to_index(const Value& v, std::string_view what);  // an int (or bool), else TypeError
int64_t float_to_int(double x);  // int(x): truncates; refuses what 64 bits cannot hold
std::string to_text(const Value& v, std::string_view what);  // a str, else TypeError

// ---- access and operators (access.cpp, operators.cpp) ----

// obj.name as jinja2's sandbox does it: Python attributes (methods) first, then obj[name].
Value get_attr(const Value& obj, std::string_view name);
// obj[key]: item first, then (for a string key) the attribute; missing: undefined.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on str, list, tuple; none where a bound is missing.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
Value call_value(const Value& callee, Args& args);
// a <op> b for + - * / // % ** (and % on a string: printf-style formatting).
Value binary_op(std::string_view op, const Value& a, const Value& b);
Value negate(const Value& v, bool minus);

// ---- methods (methods.cpp) ----

// The bound method obj.name of a str, dict, list or tuple, or nothing when obj has no such
// method; mutating methods come back as an unsafe undefined (SecurityError when called).
std::optional<Value> method(const Value& obj, std::string_view name);

// ---- formatting (format.cpp) ----

// str % args (args: one value, a tuple, or a dict for %(name)s).
std::string percent_format(std::string_view fmt, const Value& args);
// str.format(*args, **kwargs).
std::string str_format(std::string_view fmt, Args& args);

// ---- filters and tests (filters.cpp, filters_seq.cpp, tests.cpp) ----

bool filter_exists(std::string_view name);
bool test_exists(std::string_view name);
Value apply_filter(std::string_view name, const Value& v, Args& args);
bool apply_test(std::string_view name, const Value& v, Args& args);

// ---- globals (globals.cpp) ----

// range, dict, namespace, cycler, joiner, raise_exception and strftime_now (formatting `now`,
// or the local clock at each call when it is absent).
void add_globals(Dict& globals, std::optional<std::tm> now);

}  // namespace toy::jinja
