// Python's two string formatting languages, which templates reach through `"..." % x`,
// |format and str.format: printf-style (%s %d %05.2f %x %r, %(name)s) and the format-spec
// mini-language ({}, {0}, {name}, {:>8}, {:.2f}, {:,}, {!r}). Floats go through the C library's
// printf, which rounds exactly as CPython does; integers and padding are done here because
// Python's differ from C's (%x of a negative number, %#o, '=' alignment).
#include <cmath>
#include <cstdio>

#include "toy/chat/builtins.h"
#include "toy/chat/pystr.h"

namespace toy::jinja {
namespace {

// Widths and precisions beyond this are refused rather than allocated ('{:>999999999}').
constexpr int kMaxWidth = 1 << 20;

std::string c_format_float(const std::string& flags, int width, int precision, char type, double x) {
  std::string f = fmt::format("%{}", flags);
  if (width >= 0) f += fmt::format("{}", width);
  if (precision >= 0) f += fmt::format(".{}", precision);
  f += type;
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, f.c_str(), x);
  if (n < 0) failf("cannot format {}", x);
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, n);
  std::string big(n + 1, '\0');
  std::snprintf(big.data(), big.size(), f.c_str(), x);
  big.resize(n);
  return big;
}

char32_t code_point(int64_t n) {
  if (n < 0 || n > 0x10FFFF) failf("%c arg not in range(0x110000)");
  return static_cast<char32_t>(n);
}

std::string to_base(uint64_t u, int base, bool upper) {
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  std::string s;
  do {
    s.insert(s.begin(), digits[u % base]);
    u /= base;
  } while (u);
  return s;
}

uint64_t magnitude(int64_t v) { return v < 0 ? uint64_t(0) - static_cast<uint64_t>(v) : static_cast<uint64_t>(v); }

// Pads `body` (after `sign`+`prefix`) to width: left/right with spaces, or zeros after the sign.
std::string pad(const std::string& sign, const std::string& prefix, const std::string& body, int width, bool left,
                bool zeros) {
  const int64_t len = static_cast<int64_t>(sign.size() + prefix.size()) + py::length(body);
  if (width <= len) return sign + prefix + body;
  const std::string fill(width - len, zeros && !left ? '0' : ' ');
  if (left) return sign + prefix + body + fill;
  if (zeros) return sign + prefix + fill + body;
  return fill + sign + prefix + body;
}

double float_arg(const Value& v, char type) {
  if (v.is_number()) return v.number();
  failf("%{} format: a real number is required, not {}", type, type_name(v));
}

// One printf-style conversion.
std::string percent_one(const std::string& flags, int width, int precision, char type, const Value& v) {
  const bool left = flags.find('-') != std::string::npos;
  const bool zeros = flags.find('0') != std::string::npos;
  const bool alt = flags.find('#') != std::string::npos;
  std::string plus = flags.find('+') != std::string::npos ? "+" : flags.find(' ') != std::string::npos ? " " : "";
  switch (type) {
    case 's':
    case 'r':
    case 'a': {
      std::string s = type == 's' ? to_str(v) : repr(v);
      if (precision >= 0) s = s.substr(0, py::byte_offset(s, precision));
      return pad("", "", s, width, left, false);
    }
    case 'd':
    case 'i':
    case 'u':
    case 'o':
    case 'x':
    case 'X': {
      int64_t n;
      if (v.is_float()) {
        if (type != 'd' && type != 'i' && type != 'u') failf("%{} format: an integer is required, not float", type);
        n = float_to_int(v.number());
      } else if (v.is_int() || v.is_bool()) {
        n = v.integer();
      } else {
        failf("%{} format: a real number is required, not {}", type, type_name(v));
      }
      const int base = type == 'o' ? 8 : (type == 'x' || type == 'X') ? 16 : 10;
      std::string digits = to_base(magnitude(n), base, type == 'X');
      if (precision > static_cast<int>(digits.size())) digits.insert(0, precision - digits.size(), '0');
      const char* prefix = !alt || base == 10 ? "" : base == 8 ? "0o" : type == 'X' ? "0X" : "0x";
      return pad(n < 0 ? "-" : plus, prefix, digits, width, left, zeros);
    }
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G': {
      std::string cflags;
      for (char c : flags)
        if (std::string_view("-+ #0").find(c) != std::string_view::npos) cflags += c;
      return c_format_float(cflags, width, precision, type, float_arg(v, type));
    }
    case 'c': {
      std::string s;
      if (v.is_string() && py::length(v.str()) == 1) s = v.str();
      else if (v.is_int()) py::append_utf8(s, code_point(v.integer()));
      else failf("%c requires int or char");
      return pad("", "", s, width, left, false);
    }
    default: failf("unsupported format character '{}'", type);
  }
}

// ---- str.format ----

struct Spec {
  char fill = ' ', align = 0, sign = 0, type = 0, grouping = 0;
  bool alt = false, zero = false;
  int width = -1, precision = -1;
};

Spec parse_spec(std::string_view s) {
  Spec sp;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  std::vector<char32_t> cps = py::decode(s);
  if (cps.size() >= 2 && is_align(static_cast<char>(cps[1])) && cps[1] < 0x80) {
    if (cps[0] >= 0x80) failf("toy supports only ASCII fill characters in format specs");
    sp.fill = static_cast<char>(cps[0]);
    sp.align = static_cast<char>(cps[1]);
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    sp.align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sp.sign = s[i++];
  if (i < s.size() && s[i] == '#') sp.alt = true, ++i;
  if (i < s.size() && s[i] == '0') {
    sp.zero = true;
    ++i;
  }
  auto number = [&] {
    int n = 0;
    size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      n = n * 10 + (s[i++] - '0');
      if (n > kMaxWidth) failf("format width or precision too large");
    }
    return i > start ? n : -1;
  };
  sp.width = number();
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) sp.grouping = s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    sp.precision = number();
    if (sp.precision < 0) failf("Format specifier missing precision");
  }
  if (i < s.size()) sp.type = s[i++];
  if (i != s.size()) failf("Invalid format specifier '{}'", s);
  return sp;
}

std::string group_digits(const std::string& digits, char sep, int every) {
  std::string out;
  const int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i && (n - i) % every == 0) out += sep;
    out += digits[i];
  }
  return out;
}

std::string align_text(const std::string& sign, const std::string& body, const Spec& sp, char default_align) {
  const char align = sp.align ? sp.align : (sp.zero ? '=' : default_align);
  const char fill = sp.align ? sp.fill : (sp.zero ? '0' : ' ');
  const int64_t len = static_cast<int64_t>(sign.size()) + py::length(body);
  if (sp.width <= len) return sign + body;
  const int64_t gap = sp.width - len;
  const std::string one(1, fill);
  auto fills = [&](int64_t n) {
    std::string f;
    for (int64_t k = 0; k < n; ++k) f += one;
    return f;
  };
  switch (align) {
    case '<': return sign + body + fills(gap);
    case '^': return fills(gap / 2) + sign + body + fills(gap - gap / 2);
    case '=': return sign + fills(gap) + body;
    default: return fills(gap) + sign + body;
  }
}

std::string format_value(const Value& v, std::string_view spec_text) {
  if (spec_text.empty()) return to_str(v);
  const Spec sp = parse_spec(spec_text);
  if (v.is_string()) {
    if (sp.type && sp.type != 's') failf("Unknown format code '{}' for object of type 'str'", sp.type);
    std::string s = v.str();
    if (sp.precision >= 0) s = s.substr(0, py::byte_offset(s, sp.precision));
    return align_text("", s, sp, '<');
  }
  if (!v.is_number()) failf("unsupported format string passed to {}.__format__", type_name(v));
  const bool as_int = !v.is_float() && (sp.type == 0 || std::string_view("bcdoxXn").find(sp.type) != std::string_view::npos);
  if (as_int) {
    const int64_t n = v.integer();
    std::string sign = n < 0 ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
    if (sp.type == 'c') {
      std::string s;
      py::append_utf8(s, code_point(n));
      return align_text("", s, sp, '<');
    }
    const int base = sp.type == 'b' ? 2 : sp.type == 'o' ? 8 : (sp.type == 'x' || sp.type == 'X') ? 16 : 10;
    std::string digits = to_base(magnitude(n), base, sp.type == 'X');
    if (sp.grouping) digits = group_digits(digits, sp.grouping, base == 10 ? 3 : 4);
    if (sp.alt && base != 10) sign += base == 2 ? "0b" : base == 8 ? "0o" : sp.type == 'X' ? "0X" : "0x";
    return align_text(sign, digits, sp, '>');
  }
  if (std::string_view("eEfFgG%").find(sp.type ? sp.type : 'g') == std::string_view::npos)
    failf("Unknown format code '{}' for object of type 'float'", sp.type);
  double x = v.number();
  std::string body;
  if (sp.type == 0 && sp.precision < 0) {
    body = py::float_repr(std::fabs(x));
  } else {
    char type = sp.type ? sp.type : 'g';
    int precision = sp.precision >= 0 ? sp.precision : 6;
    if (type == '%') {
      type = 'f';
      x *= 100;
    }
    std::string flags = sp.alt ? "#" : "";
    body = c_format_float(flags, -1, precision, type, std::fabs(x));
    if (sp.type == 0 && body.find_first_of(".e") == std::string::npos && std::isfinite(x)) body += ".0";
    if (sp.type == '%') body += '%';
  }
  if (sp.grouping && std::isfinite(x)) {
    size_t end = body.find_first_of(".e%");
    if (end == std::string::npos) end = body.size();
    body = group_digits(body.substr(0, end), sp.grouping, 3) + body.substr(end);
  }
  std::string sign = std::signbit(x) && !std::isnan(x) ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
  return align_text(sign, body, sp, '>');
}

// `0.name[key]` → the value it names among the arguments.
Value resolve_field(std::string_view field, Args& args, size_t& auto_index) {
  size_t end = field.find_first_of(".[");
  std::string_view head = field.substr(0, end);
  Value v;
  if (head.empty()) {
    if (auto_index >= args.pos.size()) failf("Replacement index {} out of range for positional args tuple", auto_index);
    v = args.pos[auto_index++];
  } else if (head.find_first_not_of("0123456789") == std::string_view::npos) {
    const size_t i = std::stoul(std::string(head));
    if (i >= args.pos.size()) failf("Replacement index {} out of range for positional args tuple", i);
    v = args.pos[i];
  } else {
    bool found = false;
    for (auto& [k, val] : args.kw)
      if (k == head) v = val, found = true;
    if (!found) failf("KeyError: '{}'", head);
  }
  while (end != std::string_view::npos && end < field.size()) {
    if (field[end] == '.') {
      size_t next = field.find_first_of(".[", end + 1);
      v = get_attr(v, field.substr(end + 1, next - end - 1));
      end = next;
    } else {
      size_t close = field.find(']', end);
      if (close == std::string_view::npos) failf("Missing ']' in format string");
      std::string key(field.substr(end + 1, close - end - 1));
      Value k = key.find_first_not_of("0123456789") == std::string::npos && !key.empty() ? Value(int64_t(std::stoll(key)))
                                                                                         : Value(key);
      v = get_item(v, k);
      end = close + 1;
    }
    if (v.is_undefined()) v.fail_undefined();
  }
  return v;
}

}  // namespace

std::string percent_format(std::string_view fmt, const Value& args) {
  std::vector<Value> items;
  const bool tuple = args.is_list() && args.list().seq == Seq::Tuple;
  if (tuple) items = args.list().items;
  else items.push_back(args);
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) failf("incomplete format");
    Value key_value;
    bool keyed = false;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string_view::npos) failf("incomplete format key");
      if (!args.is_dict()) failf("format requires a mapping");
      const Value* v = args.dict().find(fmt.substr(i + 1, close - i - 1));
      if (!v) failf("KeyError: '{}'", fmt.substr(i + 1, close - i - 1));
      key_value = *v;
      keyed = used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) flags += fmt[i++];
    auto take_arg = [&]() -> Value {
      if (next >= items.size()) failf("not enough arguments for format string");
      return items[next++];
    };
    auto number = [&]() {
      if (i < fmt.size() && fmt[i] == '*') {
        ++i;
        const int64_t n = to_index(take_arg(), "* width");
        if (n < 0 || n > kMaxWidth) failf("toy supports * widths 0..{}", kMaxWidth);
        return static_cast<int>(n);
      }
      int n = -1;
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
        n = (n < 0 ? 0 : n * 10) + (fmt[i++] - '0');
        if (n > kMaxWidth) failf("format width or precision too large");
      }
      return n;
    };
    int width = number();
    int precision = -1;
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      precision = std::max(0, number());
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) failf("incomplete format");
    const char type = fmt[i];
    if (type == '%') {
      out += '%';
      continue;
    }
    const Value v = keyed ? key_value : take_arg();
    out += percent_one(flags, width, precision, type, v);
  }
  if (!used_mapping && (tuple ? next < items.size() : next == 0 && !args.is_dict()))
    failf("not all arguments converted during string formatting");
  return out;
}

std::string str_format(std::string_view fmt, Args& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      else failf("Single '}}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    // {field!conv:spec}, where spec may hold {nested} fields
    size_t j = i + 1;
    int depth = 1;
    while (j < fmt.size() && depth > 0) {
      if (fmt[j] == '{') ++depth;
      else if (fmt[j] == '}') --depth;
      if (depth > 0) ++j;
    }
    if (j >= fmt.size()) failf("expected '}}' before end of string");
    std::string_view inner = fmt.substr(i + 1, j - i - 1);
    size_t colon = inner.find(':'), bang = inner.find('!');
    if (bang != std::string_view::npos && colon != std::string_view::npos && bang > colon) bang = std::string_view::npos;
    std::string_view field = inner.substr(0, std::min(colon, bang));
    char conv = 0;
    if (bang != std::string_view::npos) {
      if (bang + 1 >= inner.size()) failf("end of string while looking for conversion specifier");
      conv = inner[bang + 1];
    }
    std::string spec = colon == std::string_view::npos ? "" : std::string(inner.substr(colon + 1));
    if (spec.find('{') != std::string::npos) spec = str_format(spec, args);
    Value v = resolve_field(field, args, auto_index);
    if (conv == 'r' || conv == 'a') v = Value(repr(v));
    else if (conv == 's') v = Value(to_str(v));
    else if (conv) failf("Unknown conversion specifier {}", conv);
    out += format_value(v, spec);
    i = j;
  }
  return out;
}

}  // namespace toy::jinja
