#include <cmath>

#include "toy/chat/builtins.h"

namespace toy::jinja {

std::optional<Value> ArgReader::find(std::string_view name) {
  for (auto it = args_.kw.begin(); it != args_.kw.end(); ++it)
    if (it->first == name) {
      Value v = std::move(it->second);
      args_.kw.erase(it);
      return v;
    }
  return std::nullopt;
}

Value ArgReader::next(std::string_view name) {
  if (pos_ < args_.pos.size()) {
    if (find(name)) failf("{}() got multiple values for argument '{}'", fn_, name);
    return args_.pos[pos_++];
  }
  ++pos_;
  if (std::optional<Value> v = find(name)) return *v;
  failf("{}() missing required argument '{}'", fn_, name);
}

Value ArgReader::next(std::string_view name, Value fallback) {
  if (pos_ < args_.pos.size()) {
    if (find(name)) failf("{}() got multiple values for argument '{}'", fn_, name);
    return args_.pos[pos_++];
  }
  ++pos_;
  if (std::optional<Value> v = find(name)) return *v;
  return fallback;
}

std::vector<Value> ArgReader::rest() {
  std::vector<Value> out;
  for (; pos_ < args_.pos.size(); ++pos_) out.push_back(args_.pos[pos_]);
  return out;
}

std::vector<std::pair<std::string, Value>> ArgReader::rest_kw() { return std::exchange(args_.kw, {}); }

void ArgReader::done() {
  if (pos_ < args_.pos.size())
    failf("{}() takes at most {} positional argument(s) ({} given)", fn_, pos_, args_.pos.size());
  if (!args_.kw.empty()) failf("{}() got an unexpected keyword argument '{}'", fn_, args_.kw.front().first);
}

int64_t to_index(const Value& v, std::string_view what) {
  if (v.is_int() || v.is_bool()) return v.integer();
  if (v.is_undefined()) v.fail_undefined();
  failf("{}: '{}' object cannot be interpreted as an integer", what, type_name(v));
}

int64_t float_to_int(double x) {
  if (std::isnan(x)) failf("cannot convert float NaN to integer");
  if (std::isinf(x)) failf("cannot convert float infinity to integer");
  // 2^63 is exactly representable; anything at or beyond it is a bigint in Python.
  if (x >= 9223372036854775808.0 || x < -9223372036854775808.0)
    failf("integer {} does not fit in 64 bits (toy's templates use 64-bit integers)", x);
  return static_cast<int64_t>(x);
}

std::string to_text(const Value& v, std::string_view what) {
  if (v.is_string()) return v.str();
  if (v.is_undefined()) v.fail_undefined();
  failf("{}: expected a string, not '{}'", what, type_name(v));
}

}  // namespace toy::jinja
