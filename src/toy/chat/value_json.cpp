// JSON in and out of template values. Out is Python's json.dumps, byte for byte, because HF's
// tojson filter is json.dumps(x, ensure_ascii=False, indent=...): ", " and ": " separators
// without an indent, "," and newlines with one, floats as repr(), NaN/Infinity unquoted.
#include <cmath>

#include <nlohmann/json.hpp>

#include "toy/chat/pystr.h"
#include "toy/chat/value.h"

namespace toy::jinja {
namespace {

void dump_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : py::decode(s)) {
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {  // a surrogate pair, as Python writes it
        const char32_t v = c - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      }
    } else {
      py::append_utf8(out, c);
    }
  }
  out += '"';
}

std::string float_json(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x < 0 ? "-Infinity" : "Infinity";
  return py::float_repr(x);
}

// A dict key as json.dumps turns it into a string.
std::string key_text(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::String: return k.str();
    case Value::Kind::Bool: return k.boolean() ? "true" : "false";
    case Value::Kind::None: return "null";
    case Value::Kind::Int: return std::to_string(k.integer());
    case Value::Kind::Float: return float_json(k.number());
    default: failf("keys must be str, int, float, bool or None, not {}", type_name(k));
  }
}

// Deeper than any real document; only a namespace that holds itself gets there.
constexpr int kMaxDepth = 500;

class Dumper {
 public:
  explicit Dumper(const JsonStyle& s) : style_(s) {
    item_sep_ = !s.item_sep.empty() ? s.item_sep : s.has_indent ? "," : ", ";
    key_sep_ = !s.key_sep.empty() ? s.key_sep : ": ";
  }

  void dump(std::string& out, const Value& v, int depth) {
    if (depth > kMaxDepth) failf("Circular reference detected");
    switch (v.kind()) {
      case Value::Kind::None: out += "null"; return;
      case Value::Kind::Bool: out += v.boolean() ? "true" : "false"; return;
      case Value::Kind::Int: out += std::to_string(v.integer()); return;
      case Value::Kind::Float: out += float_json(v.number()); return;
      case Value::Kind::String: dump_string(out, v.str(), style_.ensure_ascii); return;
      case Value::Kind::List:
        if (v.list().seq == Seq::List || v.list().seq == Seq::Tuple) return dump_list(out, v.list().items, depth);
        break;
      case Value::Kind::Dict: return dump_dict(out, v.dict(), depth);
      default: break;
    }
    failf("Object of type {} is not JSON serializable", type_name(v));
  }

 private:
  void newline(std::string& out, int depth) {
    out += '\n';
    for (int i = 0; i < depth; ++i) out += style_.indent;
  }

  void dump_list(std::string& out, const std::vector<Value>& items, int depth) {
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep_;
      if (style_.has_indent) newline(out, depth + 1);
      dump(out, items[i], depth + 1);
    }
    if (style_.has_indent) newline(out, depth);
    out += ']';
  }

  void dump_dict(std::string& out, const Dict& d, int depth) {
    if (d.size() == 0) {
      out += "{}";
      return;
    }
    std::vector<std::pair<std::string, const Value*>> items;
    for (const auto& [k, v] : d.entries) items.emplace_back(key_text(k), &v);
    if (style_.sort_keys)
      std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.first < b.first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep_;
      if (style_.has_indent) newline(out, depth + 1);
      dump_string(out, items[i].first, style_.ensure_ascii);
      out += key_sep_;
      dump(out, *items[i].second, depth + 1);
    }
    if (style_.has_indent) newline(out, depth);
    out += '}';
  }

  const JsonStyle& style_;
  std::string item_sep_, key_sep_;
};

}  // namespace

namespace {

template <class Json>
Value from_json_at(const Json& j, int depth) {
  if (depth > kMaxDepth) failf("JSON nested deeper than {} levels", kMaxDepth);
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value(j.template get<bool>());
    case Json::value_t::number_integer: return Value(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) failf("integer {} does not fit in 64 bits", u);
      return Value(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float: return Value(j.template get<double>());
    case Json::value_t::string: return Value(j.template get<std::string>());
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json_at(x, depth + 1));
      return make_list(std::move(items));
    }
    case Json::value_t::object: {
      Value d = make_dict();
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict().entries.emplace_back(Value(it.key()), from_json_at(it.value(), depth + 1));
      return d;
    }
    default: failf("cannot use a JSON {} in a template", j.type_name());
  }
}

}  // namespace

Value from_json(const nlohmann::json& j) { return from_json_at(j, 0); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

nlohmann::json to_json(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::None: return nullptr;
    case Value::Kind::Bool: return v.boolean();
    case Value::Kind::Int: return v.integer();
    case Value::Kind::Float: return v.number();
    case Value::Kind::String: return v.str();
    case Value::Kind::List: {
      nlohmann::json a = nlohmann::json::array();
      if (v.list().seq == Seq::Iterator) failf("cannot convert a generator to JSON");
      for (const Value& x : v.list().items) a.push_back(to_json(x));
      return a;
    }
    case Value::Kind::Dict: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [k, x] : v.dict().entries) o[key_text(k)] = to_json(x);
      return o;
    }
    default: failf("Object of type {} is not JSON serializable", type_name(v));
  }
}

std::string dump_json(const Value& v, const JsonStyle& style) {
  std::string out;
  Dumper(style).dump(out, v, 0);
  return out;
}

}  // namespace toy::jinja
