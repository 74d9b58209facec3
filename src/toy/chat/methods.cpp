// The methods templates call on strings, dicts, lists and tuples (message.content.strip(),
// tool.get('name'), text.split('\n')...), with Python's argument rules and results. Under HF's
// immutable sandbox the mutating methods (list.append, dict.update, ...) exist but are unsafe:
// looking one up gives an undefined whose call raises jinja2's SecurityError message. A
// Python method toy does not implement is found, and fails by name when called, so a template
// never silently gets an undefined where Python would have worked.
#include <algorithm>
#include <array>

#include "toy/chat/builtins.h"
#include "toy/chat/pystr.h"

namespace toy::jinja {
namespace {

using Method = Value (*)(const Value& self, Args& args);

std::optional<std::string> opt_text(const Value& v, std::string_view what) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  return to_text(v, what);
}

int64_t opt_index(const Value& v, int64_t dflt) { return v.is_none() || v.is_undefined() ? dflt : to_index(v, "slice index"); }

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) items.emplace_back(std::move(p));
  return make_list(std::move(items));
}

const std::string& self_str(const Value& self) { return self.str(); }

// ---- str ----

Value s_strip(const Value& self, Args& a, bool left, bool right, const char* name) {
  ArgReader r(name, a);
  auto chars = opt_text(r.next("chars", Value::none()), "strip arg");
  r.done();
  return Value(py::strip(self_str(self), chars, left, right));
}

Value s_split_impl(const Value& self, Args& a, bool reverse) {
  ArgReader r(reverse ? "rsplit" : "split", a);
  auto sep = opt_text(r.next("sep", Value::none()), "separator");
  const int64_t maxsplit = to_index(r.next("maxsplit", Value(-1)), "maxsplit");
  r.done();
  if (sep && sep->empty()) failf("empty separator");
  return str_list(reverse ? py::rsplit(self_str(self), sep, maxsplit) : py::split(self_str(self), sep, maxsplit));
}

// startswith / endswith: a prefix or a tuple of them, optionally within [start:end].
Value s_affix(const Value& self, Args& a, bool ends) {
  ArgReader r(ends ? "endswith" : "startswith", a);
  const Value what = r.next(ends ? "suffix" : "prefix");
  const Value start = r.next("start", Value::none()), end = r.next("end", Value::none());
  r.done();
  std::string s = self_str(self);
  if (!start.is_none() || !end.is_none()) {
    s = to_str(get_slice(self, start, end, Value::none()));
  }
  std::vector<Value> options;
  if (what.is_list() && what.list().seq == Seq::Tuple) options = what.list().items;
  else if (what.is_string()) options.push_back(what);
  else
    failf("{} first arg must be str or a tuple of str, not {}", ends ? "endswith" : "startswith", type_name(what));
  for (const Value& o : options) {
    const std::string& x = to_text(o, "tuple for startswith/endswith must only contain str");
    if (x.size() <= s.size() && (ends ? s.compare(s.size() - x.size(), x.size(), x) : s.compare(0, x.size(), x)) == 0)
      return Value(true);
  }
  return Value(false);
}

Value s_find_impl(const Value& self, Args& a, bool reverse, bool raise, const char* name) {
  ArgReader r(name, a);
  const std::string sub = to_text(r.next("sub"), "must be str");
  const int64_t start = opt_index(r.next("start", Value::none()), 0);
  const int64_t end = opt_index(r.next("end", Value::none()), INT64_MAX / 2);
  r.done();
  const int64_t at = py::find(self_str(self), sub, start, end, reverse);
  if (at < 0 && raise) failf("substring not found");
  return Value(at);
}

Value s_count(const Value& self, Args& a) {
  ArgReader r("count", a);
  const std::string sub = to_text(r.next("sub"), "must be str");
  const int64_t start = opt_index(r.next("start", Value::none()), 0);
  const int64_t end = opt_index(r.next("end", Value::none()), INT64_MAX / 2);
  r.done();
  return Value(py::count(self_str(self), sub, start, end));
}

Value s_replace(const Value& self, Args& a) {
  ArgReader r("replace", a);
  const std::string old = to_text(r.next("old"), "replace() argument 1 must be str");
  const std::string rep = to_text(r.next("new"), "replace() argument 2 must be str");
  const int64_t count = to_index(r.next("count", Value(-1)), "count");
  r.done();
  return Value(py::replace(self_str(self), old, rep, count));
}

Value s_join(const Value& self, Args& a) {
  ArgReader r("join", a);
  const Value items = r.next("iterable");
  r.done();
  std::string out;
  int i = 0;
  for (const Value& v : iterate(items)) {
    if (!v.is_string()) failf("sequence item {}: expected str instance, {} found", i, type_name(v));
    if (i++) out += self_str(self);
    out += v.str();
  }
  return Value(out);
}

// center / ljust / rjust / zfill
Value s_pad(const Value& self, Args& a, char how) {
  const char* name = how == 'c' ? "center" : how == 'l' ? "ljust" : how == 'r' ? "rjust" : "zfill";
  ArgReader r(name, a);
  const int64_t width = to_index(r.next("width"), "width");
  std::string fill = how == 'z' ? "0" : to_text(r.next("fillchar", Value(" ")), "fill character");
  r.done();
  if (py::length(fill) != 1) failf("The fill character must be exactly one character long");
  if (width > (int64_t{1} << 24)) failf("{}() width too large", name);
  const std::string& s = self_str(self);
  const int64_t n = py::length(s);
  if (width <= n) return Value(s);
  const int64_t marg = width - n;
  auto fills = [&](int64_t k) {
    std::string f;
    for (int64_t i = 0; i < k; ++i) f += fill;
    return f;
  };
  switch (how) {
    case 'c': {
      const int64_t left = marg / 2 + (marg & width & 1);  // CPython's rounding
      return Value(fills(left) + s + fills(marg - left));
    }
    case 'l': return Value(s + fills(marg));
    case 'r': return Value(fills(marg) + s);
    default: {
      size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-');
      return Value(s.substr(0, sign) + fills(marg) + s.substr(sign));
    }
  }
}

Value s_partition(const Value& self, Args& a, bool reverse) {
  ArgReader r(reverse ? "rpartition" : "partition", a);
  const std::string sep = to_text(r.next("sep"), "must be str");
  r.done();
  if (sep.empty()) failf("empty separator");
  const std::string& s = self_str(self);
  const size_t at = reverse ? s.rfind(sep) : s.find(sep);
  if (at == std::string::npos)
    return make_list(reverse ? std::vector<Value>{Value(""), Value(""), Value(s)} : std::vector<Value>{Value(s), Value(""), Value("")},
                     Seq::Tuple);
  return make_list({Value(s.substr(0, at)), Value(sep), Value(s.substr(at + sep.size()))}, Seq::Tuple);
}

Value s_affix_remove(const Value& self, Args& a, bool suffix) {
  ArgReader r(suffix ? "removesuffix" : "removeprefix", a);
  const std::string x = to_text(r.next(suffix ? "suffix" : "prefix"), "must be str");
  r.done();
  const std::string& s = self_str(self);
  if (x.empty() || x.size() > s.size()) return Value(s);
  if (!suffix && s.compare(0, x.size(), x) == 0) return Value(s.substr(x.size()));
  if (suffix && s.compare(s.size() - x.size(), x.size(), x) == 0) return Value(s.substr(0, s.size() - x.size()));
  return Value(s);
}

// isalpha / isdigit / ...: every code point passes, and there is at least one.
Value s_is(const Value& self, Args& a, const char* name, bool (*pred)(char32_t)) {
  ArgReader(name, a).done();
  std::vector<char32_t> cps = py::decode(self_str(self));
  return Value(!cps.empty() && std::all_of(cps.begin(), cps.end(), pred));
}

// islower / isupper: some cased code point, and none of the other case.
Value s_case_is(const Value& self, Args& a, bool lower) {
  ArgReader(lower ? "islower" : "isupper", a).done();
  bool cased = false;
  for (char32_t c : py::decode(self_str(self))) {
    if (lower ? py::is_upper(c) : py::is_lower(c)) return Value(false);
    cased = cased || (lower ? py::is_lower(c) : py::is_upper(c));
  }
  return Value(cased);
}

Value s_istitle(const Value& self, Args& a) {
  ArgReader("istitle", a).done();
  const std::string& s = self_str(self);
  return Value(py::title(s) == s && (py::upper(s) != s || py::lower(s) != s));
}

Value s_splitlines(const Value& self, Args& a) {
  ArgReader r("splitlines", a);
  const bool keepends = truthy(r.next("keepends", Value(false)));
  r.done();
  return str_list(py::splitlines(self_str(self), keepends));
}

Value s_case(const Value& self, Args& a, const char* name, std::string (*f)(std::string_view)) {
  ArgReader(name, a).done();
  return Value(f(self_str(self)));
}

Value s_format(const Value& self, Args& a) { return Value(str_format(self_str(self), a)); }

Value str_method(std::string_view name, const Value& self, Args& a) {
  if (name == "strip") return s_strip(self, a, true, true, "strip");
  if (name == "lstrip") return s_strip(self, a, true, false, "lstrip");
  if (name == "rstrip") return s_strip(self, a, false, true, "rstrip");
  if (name == "split") return s_split_impl(self, a, false);
  if (name == "rsplit") return s_split_impl(self, a, true);
  if (name == "splitlines") return s_splitlines(self, a);
  if (name == "startswith") return s_affix(self, a, false);
  if (name == "endswith") return s_affix(self, a, true);
  if (name == "find") return s_find_impl(self, a, false, false, "find");
  if (name == "rfind") return s_find_impl(self, a, true, false, "rfind");
  if (name == "index") return s_find_impl(self, a, false, true, "index");
  if (name == "rindex") return s_find_impl(self, a, true, true, "rindex");
  if (name == "count") return s_count(self, a);
  if (name == "replace") return s_replace(self, a);
  if (name == "join") return s_join(self, a);
  if (name == "format") return s_format(self, a);
  if (name == "upper") return s_case(self, a, "upper", py::upper);
  if (name == "lower" || name == "casefold") return s_case(self, a, "lower", py::lower);
  if (name == "title") return s_case(self, a, "title", py::title);
  if (name == "capitalize") return s_case(self, a, "capitalize", py::capitalize);
  if (name == "swapcase") return s_case(self, a, "swapcase", py::swapcase);
  if (name == "center") return s_pad(self, a, 'c');
  if (name == "ljust") return s_pad(self, a, 'l');
  if (name == "rjust") return s_pad(self, a, 'r');
  if (name == "zfill") return s_pad(self, a, 'z');
  if (name == "partition") return s_partition(self, a, false);
  if (name == "rpartition") return s_partition(self, a, true);
  if (name == "removeprefix") return s_affix_remove(self, a, false);
  if (name == "removesuffix") return s_affix_remove(self, a, true);
  if (name == "isalpha") return s_is(self, a, "isalpha", py::is_alpha);
  if (name == "isalnum") return s_is(self, a, "isalnum", py::is_alnum);
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") return s_is(self, a, "isdigit", py::is_digit);
  if (name == "isspace") return s_is(self, a, "isspace", py::is_space);
  if (name == "isascii") {
    ArgReader("isascii", a).done();
    const std::string& s = self_str(self);
    return Value(std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }));
  }
  if (name == "islower") return s_case_is(self, a, true);
  if (name == "isupper") return s_case_is(self, a, false);
  if (name == "istitle") return s_istitle(self, a);
  failf("str.{}() is not supported by toy's template engine", name);
}

constexpr std::array<std::string_view, 47> kStrMethods = {
    "capitalize", "casefold",  "center",     "count",        "encode",       "endswith",   "expandtabs", "find",
    "format",     "format_map", "index",     "isalnum",      "isalpha",      "isascii",    "isdecimal",  "isdigit",
    "isidentifier", "islower", "isnumeric",  "isprintable",  "isspace",      "istitle",    "isupper",    "join",
    "ljust",      "lower",     "lstrip",     "maketrans",    "partition",    "removeprefix", "removesuffix", "replace",
    "rfind",      "rindex",    "rjust",      "rpartition",   "rsplit",       "rstrip",     "split",      "splitlines",
    "startswith", "strip",     "swapcase",   "title",        "translate",    "upper",      "zfill"};

// ---- dict ----

Value dict_method(std::string_view name, const Value& self, Args& a) {
  const Dict& d = self.dict();
  if (name == "get") {
    ArgReader r("get", a);
    const Value key = r.next("key");
    const Value dflt = r.next("default", Value::none());
    r.done();
    const Value* v = d.find(key);
    return v ? *v : dflt;
  }
  ArgReader(name, a).done();
  std::vector<Value> out;
  if (name == "keys" || name == "values" || name == "items") {
    for (const auto& [k, v] : d.entries)
      out.push_back(name == "keys" ? k : name == "values" ? v : make_list({k, v}, Seq::Tuple));
    return make_list(std::move(out), name == "keys" ? Seq::DictKeys : name == "values" ? Seq::DictValues : Seq::DictItems);
  }
  if (name == "copy") {
    auto copy = std::make_shared<Dict>(d);
    return Value(copy);
  }
  failf("dict.{}() is not supported by toy's template engine", name);
}

// ---- list and tuple ----

Value seq_method(std::string_view name, const Value& self, Args& a) {
  const std::vector<Value>& items = self.list().items;
  if (name == "count") {
    ArgReader r("count", a);
    const Value x = r.next("value");
    r.done();
    return Value(static_cast<int64_t>(std::count_if(items.begin(), items.end(), [&](const Value& v) { return equal(v, x); })));
  }
  if (name == "index") {
    ArgReader r("index", a);
    const Value x = r.next("value");
    const int64_t n = static_cast<int64_t>(items.size());
    int64_t start = opt_index(r.next("start", Value::none()), 0), end = opt_index(r.next("stop", Value::none()), n);
    r.done();
    if (start < 0) start = std::max<int64_t>(0, start + n);
    if (end < 0) end = std::max<int64_t>(0, end + n);
    for (int64_t i = start; i < std::min(end, n); ++i)
      if (equal(items[i], x)) return Value(i);
    failf("{} is not in {}", repr(x), type_name(self));
  }
  ArgReader(name, a).done();
  return make_list(items, self.list().seq);  // copy
}

bool one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

Value bound(const Value& self, std::string_view name, Value (*impl)(std::string_view, const Value&, Args&)) {
  std::string n(name);
  return make_function(type_name(self) + "." + n, [self, n, impl](Args& a) { return impl(n, self, a); });
}

Value unsafe(const Value& self, std::string_view name) {
  return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(self)), true);
}

}  // namespace

std::optional<Value> method(const Value& obj, std::string_view name) {
  if (obj.is_string()) {
    if (std::find(kStrMethods.begin(), kStrMethods.end(), name) == kStrMethods.end()) return std::nullopt;
    return bound(obj, name, str_method);
  }
  if (obj.is_dict()) {
    if (one_of(name, {"clear", "pop", "popitem", "setdefault", "update"})) return unsafe(obj, name);
    if (one_of(name, {"get", "keys", "values", "items", "copy", "fromkeys"})) return bound(obj, name, dict_method);
    return std::nullopt;
  }
  if (obj.is_list()) {
    const Seq seq = obj.list().seq;
    if (seq == Seq::List && one_of(name, {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"}))
      return unsafe(obj, name);
    if ((seq == Seq::List && name == "copy") ||
        ((seq == Seq::List || seq == Seq::Tuple || seq == Seq::Range) && one_of(name, {"count", "index"})))
      return bound(obj, name, seq_method);
  }
  return std::nullopt;
}

}  // namespace toy::jinja
