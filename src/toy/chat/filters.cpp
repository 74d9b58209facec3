// jinja2's string and number filters, as its filters.py behaves with autoescape off, plus
// Hugging Face's tojson (json.dumps with ensure_ascii=False, indent, separators, sort_keys),
// and the registry of every filter (the sequence filters live in filters_seq.cpp).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <map>

#include "toy/chat/builtins.h"
#include "toy/chat/filter_table.h"
#include "toy/chat/pystr.h"

namespace toy::jinja {
namespace {

// soft_str: str(v), but Markup stays Markup.
Value soft_str(const Value& v) { return v.is_string() ? v : Value(to_str(v)); }


// ---- strings ----

Value f_lower(const Value& v, Args& a) {
  ArgReader("lower", a).done();
  return Value(py::lower(to_str(v)), v.markup());
}

Value f_upper(const Value& v, Args& a) {
  ArgReader("upper", a).done();
  return Value(py::upper(to_str(v)), v.markup());
}

Value f_capitalize(const Value& v, Args& a) {
  ArgReader("capitalize", a).done();
  return Value(py::capitalize(to_str(v)), v.markup());
}

// jinja2's title: words start after '-', whitespace or an opening bracket.
Value f_title(const Value& v, Args& a) {
  ArgReader("title", a).done();
  std::string out;
  bool start = true;
  for (char32_t c : py::decode(to_str(v))) {
    std::string one;
    py::append_utf8(one, c);
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py::is_space(c);
    out += sep ? one : start ? py::upper(one) : py::lower(one);
    start = sep;
  }
  return Value(out, v.markup());
}

Value f_trim(const Value& v, Args& a) {
  ArgReader r("trim", a);
  const Value chars = r.next("chars", Value::none());
  r.done();
  std::optional<std::string> set;
  if (!chars.is_none()) set = to_text(chars, "trim chars");
  return Value(py::strip(to_str(v), set, true, true), v.markup());
}

Value f_replace(const Value& v, Args& a) {
  ArgReader r("replace", a);
  const Value old = r.next("old"), rep = r.next("new"), count = r.next("count", Value::none());
  r.done();
  return Value(py::replace(to_str(v), to_str(old), to_str(rep), count.is_none() ? -1 : to_index(count, "count")));
}

Value f_string(const Value& v, Args& a) {
  ArgReader("string", a).done();
  return soft_str(v);
}

Value f_safe(const Value& v, Args& a) {
  ArgReader("safe", a).done();
  return Value(to_str(v), true);
}

Value f_escape(const Value& v, Args& a) {
  ArgReader("escape", a).done();
  if (v.markup()) return v;
  return Value(py::html_escape(to_str(v)), true);
}

Value f_forceescape(const Value& v, Args& a) {
  ArgReader("forceescape", a).done();
  return Value(py::html_escape(to_str(v)), true);
}

Value f_center(const Value& v, Args& a) {
  ArgReader r("center", a);
  Args inner;
  inner.pos.push_back(r.next("width", Value(80)));
  r.done();
  return call_value(get_attr(Value(to_str(v)), "center"), inner);
}

Value f_indent(const Value& v, Args& a) {
  ArgReader r("indent", a);
  const Value width = r.next("width", Value(4));
  const bool first = truthy(r.next("first", Value(false))), blank = truthy(r.next("blank", Value(false)));
  r.done();
  const std::string unit = width.is_string() ? width.str() : std::string(std::max<int64_t>(0, to_index(width, "width")), ' ');
  // jinja2 appends a newline first so a trailing newline gives a last empty line.
  std::vector<std::string> lines = py::splitlines(to_str(v) + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    if (i > 0 && (blank || !lines[i].empty())) out += unit;
    out += lines[i];
  }
  if (first) out.insert(0, unit);
  return Value(out, v.markup());
}

Value f_truncate(const Value& v, Args& a) {
  ArgReader r("truncate", a);
  const int64_t length = to_index(r.next("length", Value(255)), "length");
  const bool killwords = truthy(r.next("killwords", Value(false)));
  const std::string end = to_str(r.next("end", Value("...")));
  const Value leeway_v = r.next("leeway", Value::none());
  r.done();
  const int64_t leeway = leeway_v.is_none() ? 5 : to_index(leeway_v, "leeway");
  const std::string s = to_str(v);
  const int64_t end_len = py::length(end);
  if (length < end_len) failf("expected length >= {}, got {}", end_len, length);
  if (leeway < 0) failf("expected leeway >= 0, got {}", leeway);
  if (py::length(s) <= length + leeway) return Value(s);
  const std::string head = s.substr(0, py::byte_offset(s, length - end_len));
  if (killwords) return Value(head + end);
  const size_t space = head.rfind(' ');
  return Value((space == std::string::npos ? head : head.substr(0, space)) + end);
}

Value f_wordcount(const Value& v, Args& a) {
  ArgReader("wordcount", a).done();
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : py::decode(to_str(v))) {
    const bool w = py::is_alnum(c) || c == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

// markupsafe's striptags: drop comments and tags, collapse whitespace, unescape entities.
Value f_striptags(const Value& v, Args& a) {
  ArgReader("striptags", a).done();
  std::string s = to_str(v), out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 4, "<!--") == 0) {
      size_t e = s.find("-->", i + 4);
      if (e != std::string::npos) {
        i = e + 3;
        continue;
      }
    }
    if (s[i] == '<') {
      size_t e = s.find('>', i + 1);
      if (e != std::string::npos) {
        i = e + 1;
        continue;
      }
    }
    out += s[i++];
  }
  std::vector<std::string> words = py::split(out, std::nullopt, -1);
  std::string joined;
  for (size_t i = 0; i < words.size(); ++i) joined += (i ? " " : "") + words[i];
  static const std::map<std::string, char32_t> kEntities = {{"amp", '&'},  {"lt", '<'},     {"gt", '>'},
                                                            {"quot", '"'}, {"apos", '\''}, {"nbsp", 0xA0}};
  std::string result;
  for (size_t i = 0; i < joined.size();) {
    if (joined[i] == '&') {
      size_t semi = joined.find(';', i + 1);
      if (semi != std::string::npos && semi - i <= 10) {
        std::string name = joined.substr(i + 1, semi - i - 1);
        char32_t cp = 0;
        if (name.size() > 1 && name[0] == '#') {
          const bool hex = name[1] == 'x' || name[1] == 'X';
          cp = static_cast<char32_t>(std::strtoul(name.c_str() + (hex ? 2 : 1), nullptr, hex ? 16 : 10));
        } else if (auto it = kEntities.find(name); it != kEntities.end()) {
          cp = it->second;
        }
        if (cp) {
          py::append_utf8(result, cp);
          i = semi + 1;
          continue;
        }
      }
    }
    result += joined[i++];
  }
  return Value(result);
}

Value f_format(const Value& v, Args& a) {
  if (!a.pos.empty() && !a.kw.empty()) failf("can't handle positional and keyword arguments at the same time");
  if (!a.kw.empty()) {
    Value d = make_dict();
    for (auto& [k, x] : a.kw) d.dict().set(Value(k), x);
    return Value(percent_format(to_str(v), d));
  }
  return Value(percent_format(to_str(v), make_list(a.pos, Seq::Tuple)));
}

Value f_tojson(const Value& v, Args& a) {
  ArgReader r("tojson", a);
  JsonStyle style;
  style.ensure_ascii = truthy(r.next("ensure_ascii", Value(false)));
  const Value indent = r.next("indent", Value::none());
  const Value separators = r.next("separators", Value::none());
  style.sort_keys = truthy(r.next("sort_keys", Value(false)));
  r.done();
  if (!indent.is_none()) {
    style.has_indent = true;
    style.indent = indent.is_string() ? indent.str() : std::string(std::max<int64_t>(0, to_index(indent, "indent")), ' ');
  }
  if (!separators.is_none()) {
    std::vector<Value> seps = iterate(separators);
    if (seps.size() != 2) failf("separators must be an (item_separator, key_separator) pair");
    style.item_sep = to_text(seps[0], "separator");
    style.key_sep = to_text(seps[1], "separator");
    if (style.item_sep.empty() || style.key_sep.empty()) failf("toy does not support empty JSON separators");
  }
  return Value(dump_json(v, style));
}

// ---- numbers ----

Value f_abs(const Value& v, Args& a) {
  ArgReader("abs", a).done();
  if (!v.is_number()) {
    if (v.is_undefined()) v.fail_undefined();
    failf("bad operand type for abs(): '{}'", type_name(v));
  }
  if (v.is_float()) return Value(std::fabs(v.number()));
  return v.integer() < 0 ? negate(v, true) : Value(v.integer());
}

// Python's int(str, base): surrounding whitespace, a sign, `_` between digits, a base prefix.
std::optional<int64_t> parse_int(std::string s, int base) {
  s = py::strip(s, std::nullopt, true, true);
  bool neg = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) neg = s[0] == '-', s.erase(0, 1);
  if (s.size() > 2 && s[0] == '0' && ((base == 16 && (s[1] | 0x20) == 'x') || (base == 8 && (s[1] | 0x20) == 'o') ||
                                      (base == 2 && (s[1] | 0x20) == 'b')))
    s.erase(0, 2);
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && s[i - 1] != '_') continue;
    digits += s[i];
  }
  if (digits.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(digits.c_str(), &end, base);
  if (*end || errno || digits[0] == '-' || digits[0] == '+' || digits.find(' ') != std::string::npos) return std::nullopt;
  return neg ? -n : n;
}

std::optional<double> parse_float(const std::string& text) {
  std::string s = py::strip(text, std::nullopt, true, true), clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1])))
      continue;
    clean += s[i];
  }
  if (clean.empty() || clean.find_first_of(" \t\n") != std::string::npos) return std::nullopt;
  const std::string low = py::lower(clean);
  if (low.find("0x") != std::string::npos) return std::nullopt;  // strtod reads hex, Python does not
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (*end) return std::nullopt;
  return d;
}

Value f_int(const Value& v, Args& a) {
  ArgReader r("int", a);
  const Value dflt = r.next("default", Value(0));
  const int64_t base = to_index(r.next("base", Value(10)), "base");
  r.done();
  if (v.is_undefined()) v.fail_undefined();
  if (v.is_int() || v.is_bool()) return Value(v.integer());
  // int(nan) is a ValueError, which jinja2 turns into the default; int(inf) an OverflowError,
  // which it does not.
  if (v.is_float()) return std::isnan(v.number()) ? dflt : Value(float_to_int(v.number()));
  if (v.is_string()) {
    if (auto n = parse_int(v.str(), static_cast<int>(base))) return Value(*n);
    if (auto d = parse_float(v.str()); d && !std::isnan(*d)) return Value(float_to_int(*d));
  }
  return dflt;
}

Value f_float(const Value& v, Args& a) {
  ArgReader r("float", a);
  const Value dflt = r.next("default", Value(0.0));
  r.done();
  if (v.is_undefined()) v.fail_undefined();
  if (v.is_number()) return Value(v.number());
  if (v.is_string()) {
    if (auto d = parse_float(v.str())) return Value(*d);
  }
  return dflt;
}

Value f_round(const Value& v, Args& a) {
  ArgReader r("round", a);
  const int64_t precision = to_index(r.next("precision", Value(0)), "precision");
  const std::string method = to_str(r.next("method", Value("common")));
  r.done();
  if (method != "common" && method != "ceil" && method != "floor") failf("method must be common, ceil or floor");
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_number()) failf("type {} doesn't define __round__ method", type_name(v));
  if (method == "common") {
    if (!v.is_float()) return Value(v.integer());  // round(int, n) stays an int
    if (precision < 0 || precision > 300) failf("toy supports round() precision 0..300");
    // printf rounds the exact binary value half-to-even, as CPython's round() does.
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), v.number());
    return Value(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.number() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

}  // namespace

// Python's urllib quote: unreserved bytes (and `safe`) kept, the rest %XX of its UTF-8.
std::string url_quote(const std::string& text, bool for_query) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || (c == '/' && !for_query)) out += char(c);
    else if (c == ' ' && for_query) out += '+';  // (jinja2 turns a query's %20 into +)
    else out += fmt::format("%{:02X}", c);
  }
  return out;
}

Value f_urlencode(const Value& v, Args& a) {
  ArgReader("urlencode", a).done();
  if (v.is_undefined()) v.fail_undefined();
  if (v.is_string()) return Value(url_quote(v.str(), false));
  if (!v.is_dict() && !v.is_list()) return Value(url_quote(to_str(v), false));
  std::vector<std::pair<Value, Value>> pairs;
  if (v.is_dict()) {
    pairs = v.dict().entries;
  } else {
    for (const Value& item : iterate(v)) {
      const std::vector<Value> kv = iterate(item);
      if (kv.size() != 2) failf("urlencode: a pair must have two items");
      pairs.emplace_back(kv[0], kv[1]);
    }
  }
  std::string out;
  for (const auto& [k, x] : pairs)
    out += (out.empty() ? "" : "&") + url_quote(to_str(k), true) + "=" + url_quote(to_str(x), true);
  return Value(out);
}

Value f_xmlattr(const Value& v, Args& a) {
  ArgReader r("xmlattr", a);
  const bool autospace = truthy(r.next("autospace", Value(true)));
  r.done();
  if (!v.is_dict()) failf("xmlattr needs a mapping, got {}", type_name(v));
  std::string out;
  for (const auto& [k, x] : v.dict().entries) {
    if (x.is_none() || x.is_undefined()) continue;
    const std::string key = to_str(k);
    if (key.find_first_of(" \t\n\r\f\v/>=") != std::string::npos)
      failf("Invalid character in attribute name: {}", repr(k));
    out += (out.empty() ? "" : " ") + py::html_escape(key) + "=\"" + (x.markup() ? x.str() : py::html_escape(to_str(x))) + "\"";
  }
  if (autospace && !out.empty()) out = " " + out;
  return Value(out, true);
}

Value f_filesizeformat(const Value& v, Args& a) {
  ArgReader r("filesizeformat", a);
  const bool binary = truthy(r.next("binary", Value(false)));
  r.done();
  std::optional<double> n;
  if (v.is_int() || v.is_bool() || v.is_float()) n = v.number();
  else if (v.is_string()) n = parse_float(v.str());
  if (!n) failf("filesizeformat needs a number, got {}", type_name(v));
  const double bytes = *n, base = binary ? 1024 : 1000;
  static const char* const kDecimal[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  static const char* const kBinary[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  if (bytes == 1) return Value(std::string("1 Byte"));
  if (bytes < base) return Value(fmt::format("{} Bytes", float_to_int(bytes)));
  double unit = base;
  for (int i = 0; i < 8; ++i) {
    unit = std::pow(base, i + 2);
    if (bytes < unit || i == 7) return Value(fmt::format("{:.1f} {}", base * bytes / unit, (binary ? kBinary : kDecimal)[i]));
  }
  return Value();
}

void add_text_filters(FilterTable& t) {
  t["abs"] = f_abs;
  t["capitalize"] = f_capitalize;
  t["center"] = f_center;
  t["e"] = f_escape;
  t["escape"] = f_escape;
  t["filesizeformat"] = f_filesizeformat;
  t["urlencode"] = f_urlencode;
  t["xmlattr"] = f_xmlattr;
  t["float"] = f_float;
  t["forceescape"] = f_forceescape;
  t["format"] = f_format;
  t["indent"] = f_indent;
  t["int"] = f_int;
  t["lower"] = f_lower;
  t["replace"] = f_replace;
  t["round"] = f_round;
  t["safe"] = f_safe;
  t["string"] = f_string;
  t["striptags"] = f_striptags;
  t["title"] = f_title;
  t["tojson"] = f_tojson;
  t["trim"] = f_trim;
  t["truncate"] = f_truncate;
  t["upper"] = f_upper;
  t["wordcount"] = f_wordcount;
}

namespace {

const FilterTable& filters() {
  static const FilterTable table = [] {
    FilterTable t;
    add_text_filters(t);
    add_sequence_filters(t);
    return t;
  }();
  return table;
}

}  // namespace

bool filter_exists(std::string_view name) { return filters().count(name) > 0; }

Value apply_filter(std::string_view name, const Value& v, Args& args) {
  auto it = filters().find(name);
  if (it == filters().end()) failf("unknown filter '{}'", name);
  return it->second(v, args);
}

}  // namespace toy::jinja
