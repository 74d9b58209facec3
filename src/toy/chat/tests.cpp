// jinja2's tests (`x is defined`, `x is string`, `x is divisibleby 3`...), with Python's
// notion of each type: bool is a number and an int but not an `integer` test pass, a dict is a
// sequence (it has len() and []), an undefined is iterable, a sequence and callable (jinja2's
// Undefined defines __iter__, __len__, __getitem__ and __call__, which raise when used).
#include <map>

#include "toy/chat/builtins.h"
#include "toy/chat/pystr.h"

namespace toy::jinja {
namespace {

using TestFn = bool (*)(const Value& v, Args& a);

Value one_arg(std::string_view name, Args& a) {
  ArgReader r(name, a);
  Value x = r.next("other");
  r.done();
  return x;
}

void no_args(std::string_view name, Args& a) { ArgReader(name, a).done(); }

bool t_defined(const Value& v, Args& a) { return no_args("defined", a), !v.is_undefined(); }
bool t_undefined(const Value& v, Args& a) { return no_args("undefined", a), v.is_undefined(); }
bool t_none(const Value& v, Args& a) { return no_args("none", a), v.is_none(); }
bool t_boolean(const Value& v, Args& a) { return no_args("boolean", a), v.is_bool(); }
bool t_true(const Value& v, Args& a) { return no_args("true", a), v.is_bool() && v.boolean(); }
bool t_false(const Value& v, Args& a) { return no_args("false", a), v.is_bool() && !v.boolean(); }
bool t_integer(const Value& v, Args& a) { return no_args("integer", a), v.is_int(); }
bool t_float(const Value& v, Args& a) { return no_args("float", a), v.is_float(); }
bool t_number(const Value& v, Args& a) { return no_args("number", a), v.is_number(); }
bool t_string(const Value& v, Args& a) { return no_args("string", a), v.is_string(); }
bool t_mapping(const Value& v, Args& a) { return no_args("mapping", a), v.is_dict(); }
bool t_escaped(const Value& v, Args& a) { return no_args("escaped", a), v.markup(); }

bool t_callable(const Value& v, Args& a) {
  no_args("callable", a);
  return v.is_function() || v.is_undefined() || (v.is_object() && v.object().type == "LoopContext");
}

bool t_sequence(const Value& v, Args& a) {
  no_args("sequence", a);
  if (v.is_string() || v.is_dict() || v.is_undefined()) return true;
  if (v.is_list()) return v.list().seq == Seq::List || v.list().seq == Seq::Tuple || v.list().seq == Seq::Range;
  return false;
}

bool t_iterable(const Value& v, Args& a) {
  no_args("iterable", a);
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}

bool t_lower(const Value& v, Args& a) {
  no_args("lower", a);
  Args none;
  return truthy(call_value(get_attr(Value(to_str(v)), "islower"), none));
}

bool t_upper(const Value& v, Args& a) {
  no_args("upper", a);
  Args none;
  return truthy(call_value(get_attr(Value(to_str(v)), "isupper"), none));
}

bool t_odd(const Value& v, Args& a) {
  no_args("odd", a);
  return equal(binary_op("%", v, Value(2)), Value(1));
}

bool t_even(const Value& v, Args& a) {
  no_args("even", a);
  return equal(binary_op("%", v, Value(2)), Value(0));
}

bool t_divisibleby(const Value& v, Args& a) {
  ArgReader r("divisibleby", a);
  const Value n = r.next("num");
  r.done();
  return equal(binary_op("%", v, n), Value(0));
}

// `is sameas`: Python's identity. Scalars compare by value (CPython shares None, True, False
// and small ints); containers and functions by object.
bool t_sameas(const Value& v, Args& a) {
  const Value other = one_arg("sameas", a);
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::None:
    case Value::Kind::Undefined: return true;
    case Value::Kind::Bool: return v.boolean() == other.boolean();
    case Value::Kind::Int: return v.integer() == other.integer() && v.integer() >= -5 && v.integer() <= 256;
    case Value::Kind::Float:
    case Value::Kind::String: failf("toy cannot tell whether two {} values are the same object", type_name(v));
    default: return v.identity() == other.identity();
  }
}

bool t_in(const Value& v, Args& a) {
  ArgReader r("in", a);
  const Value seq = r.next("seq");
  r.done();
  return contains(seq, v);
}

bool t_eq(const Value& v, Args& a) { return equal(v, one_arg("eq", a)); }
bool t_ne(const Value& v, Args& a) { return !equal(v, one_arg("ne", a)); }
bool t_gt(const Value& v, Args& a) { return ordered(v, one_arg("gt", a), ">"); }
bool t_ge(const Value& v, Args& a) { return ordered(v, one_arg("ge", a), ">="); }
bool t_lt(const Value& v, Args& a) { return ordered(v, one_arg("lt", a), "<"); }
bool t_le(const Value& v, Args& a) { return ordered(v, one_arg("le", a), "<="); }

bool t_filter(const Value& v, Args& a) {
  no_args("filter", a);
  return v.is_string() && filter_exists(v.str());
}

bool t_test(const Value& v, Args& a) {
  no_args("test", a);
  return v.is_string() && test_exists(v.str());
}

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> table = {
      {"odd", t_odd},           {"even", t_even},         {"divisibleby", t_divisibleby},
      {"defined", t_defined},   {"undefined", t_undefined}, {"filter", t_filter},
      {"test", t_test},         {"none", t_none},         {"boolean", t_boolean},
      {"false", t_false},       {"true", t_true},         {"integer", t_integer},
      {"float", t_float},       {"lower", t_lower},       {"upper", t_upper},
      {"string", t_string},     {"mapping", t_mapping},   {"number", t_number},
      {"sequence", t_sequence}, {"iterable", t_iterable}, {"callable", t_callable},
      {"sameas", t_sameas},     {"escaped", t_escaped},   {"in", t_in},
      {"==", t_eq},             {"eq", t_eq},             {"equalto", t_eq},
      {"!=", t_ne},             {"ne", t_ne},             {">", t_gt},
      {"gt", t_gt},             {"greaterthan", t_gt},    {">=", t_ge},
      {"ge", t_ge},             {"<", t_lt},              {"lt", t_lt},
      {"lessthan", t_lt},       {"<=", t_le},             {"le", t_le},
  };
  return table;
}

}  // namespace

bool test_exists(std::string_view name) { return tests().count(name) > 0; }

bool apply_test(std::string_view name, const Value& v, Args& args) {
  auto it = tests().find(name);
  if (it == tests().end()) failf("unknown test '{}'", name);
  return it->second(v, args);
}

}  // namespace toy::jinja
