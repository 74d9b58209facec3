// Attribute, item and slice access, and calls, as jinja2's sandboxed environment performs them.
// A missing attribute or item of a defined value is an undefined carrying jinja2's message
// ("'dict object' has no attribute 'x'"); touching anything of an undefined raises that message.
#include <algorithm>

#include "toy/chat/builtins.h"
#include "toy/chat/pystr.h"

namespace toy::jinja {
namespace {

// jinja2's object_type_repr: how undefined messages name the object.
std::string object_name(const Value& obj) {
  if (obj.is_none()) return "None";
  return type_name(obj) + " object";
}

Value missing_attr(const Value& obj, std::string_view name) {
  if (obj.is_none()) return Value::undefined(fmt::format("'None' has no attribute '{}'", name));
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_name(obj), name));
}

Value missing_item(const Value& obj, const Value& key) {
  if (key.is_string()) return missing_attr(obj, key.str());
  return Value::undefined(fmt::format("{} has no element {}", object_name(obj), repr(key)));
}

// Python's slice.indices(): clamps start/stop for a sequence of length n.
void slice_indices(int64_t n, const Value& start, const Value& stop, int64_t step, int64_t& lo, int64_t& hi) {
  auto bound = [&](const Value& v, int64_t dflt) {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t i = to_index(v, "slice indices");
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  lo = bound(start, step < 0 ? n - 1 : 0);
  hi = bound(stop, step < 0 ? -1 : n);
}

template <class T>
std::vector<T> take_slice(const std::vector<T>& xs, const Value& start, const Value& stop, int64_t step) {
  int64_t lo, hi;
  slice_indices(static_cast<int64_t>(xs.size()), start, stop, step, lo, hi);
  std::vector<T> out;
  // Steps as big as int64 allows must not overflow i: stop before stepping past the end.
  if (step > 0)
    for (int64_t i = lo; i < hi; i = hi - i > step ? i + step : hi) out.push_back(xs[i]);
  else
    for (int64_t i = lo; i > hi; i = i - hi > -step ? i + step : hi) out.push_back(xs[i]);
  return out;
}

}  // namespace

Value get_attr(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) obj.fail_undefined();
  // Python objects have dunder attributes, which the sandbox hides; a plain `_x` is no
  // attribute, so it falls through to the key lookup as it does in jinja2.
  if (name.size() > 4 && name.substr(0, 2) == "__" && name.substr(name.size() - 2) == "__")
    return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)), true);
  if (std::optional<Value> m = method(obj, name)) return *m;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(name)) return *v;
  } else if (obj.is_object()) {
    if (const Value* v = obj.object().attrs.find(name)) return *v;
  } else if (obj.is_list() && !obj.list().fields.empty()) {
    const auto& f = obj.list().fields;
    for (size_t i = 0; i < f.size() && i < obj.list().items.size(); ++i)
      if (f[i] == name) return obj.list().items[i];
  }
  return missing_attr(obj, name);
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.fail_undefined();
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(key)) return *v;
  } else if (obj.is_list() && (key.is_int() || key.is_bool())) {
    const List& l = obj.list();
    if (l.seq == Seq::List || l.seq == Seq::Tuple || l.seq == Seq::Range) {
      int64_t i = key.integer();
      const int64_t n = static_cast<int64_t>(l.items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return l.items[i];
    }
  } else if (obj.is_string() && (key.is_int() || key.is_bool())) {
    const std::string& s = obj.str();
    int64_t i = key.integer();
    const int64_t n = py::length(s);
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      const size_t b = py::byte_offset(s, i);
      return Value(s.substr(b, py::byte_offset(s, i + 1) - b));
    }
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return missing_item(obj, key);
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step_v) {
  if (obj.is_undefined()) obj.fail_undefined();
  int64_t step = step_v.is_none() || step_v.is_undefined() ? 1 : to_index(step_v, "slice indices");
  if (step == 0) failf("slice step cannot be zero");
  step = std::max(step, -INT64_MAX);  // so that -step exists
  if (obj.is_string()) {
    std::vector<char32_t> cps = py::decode(obj.str());
    return Value(py::encode(take_slice(cps, start, stop, step)));
  }
  if (obj.is_list()) {
    const List& l = obj.list();
    if (l.seq == Seq::List || l.seq == Seq::Tuple)
      return make_list(take_slice(l.items, start, stop, step), l.seq);
    if (l.seq == Seq::Range) {  // a range again, as Python's range slicing gives
      int64_t lo, hi;
      slice_indices(static_cast<int64_t>(l.items.size()), start, stop, step, lo, hi);
      Value r = make_list(take_slice(l.items, start, stop, step), Seq::Range);
      using i128 = __int128;
      const i128 new_start = i128(l.start) + i128(lo) * l.step, new_stop = i128(l.start) + i128(hi) * l.step;
      const i128 new_step = i128(l.step) * step;
      for (i128 x : {new_start, new_stop, new_step})
        if (x > INT64_MAX || x < INT64_MIN) failf("range slice out of 64-bit range");
      r.list().start = static_cast<int64_t>(new_start);
      r.list().stop = static_cast<int64_t>(new_stop);
      r.list().step = static_cast<int64_t>(new_step);
      return r;
    }
  }
  // Python raises TypeError here, which jinja2 turns into an undefined.
  return Value::undefined(fmt::format("{} cannot be sliced", object_name(obj)));
}

Value call_value(const Value& callee, Args& args) {
  if (callee.is_function()) return callee.function().call(args);
  if (callee.is_object())  // (a recursive loop's `loop`)
    if (const Value* call = callee.object().attrs.find(Value("__call__")); call && call->is_function())
      return call->function().call(args);
  if (callee.is_undefined()) callee.fail_undefined();
  failf("'{}' object is not callable", type_name(callee));
}

}  // namespace toy::jinja
