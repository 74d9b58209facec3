#include "toy/chat/pystr.h"

#include <fmt/core.h>
#include <locale.h>
#include <wctype.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

namespace toy::jinja::py {
namespace {

// Case mapping and character classes come from glibc's C.UTF-8 locale, whose tables cover
// Unicode; where that locale is missing only ASCII letters change case.
locale_t utf8_locale() {
  static locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  return loc;
}

// A byte that does not start valid UTF-8 decodes to U+DC80..U+DCFF (Python's surrogateescape),
// so encode() gives the same bytes back.
constexpr char32_t kEscapeBase = 0xDC00;

bool is_escaped_byte(char32_t c) { return c >= 0xDC80 && c <= 0xDCFF; }

// Length of the UTF-8 sequence at s[i], or 0 when it is not valid UTF-8.
size_t sequence_length(std::string_view s, size_t i, char32_t* out) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    *out = b;
    return 1;
  }
  size_t n;
  char32_t c;
  if ((b & 0xE0) == 0xC0) n = 2, c = b & 0x1F;
  else if ((b & 0xF0) == 0xE0) n = 3, c = b & 0x0F;
  else if ((b & 0xF8) == 0xF0) n = 4, c = b & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto cb = static_cast<unsigned char>(s[i + k]);
    if ((cb & 0xC0) != 0x80) return 0;
    c = (c << 6) | (cb & 0x3F);
  }
  static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kMin[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  *out = c;
  return n;
}

// Python's str.isspace set.
constexpr char32_t kSpaces[] = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0,
                                0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007,
                                0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};

// Code points CPython's repr escapes although glibc may call them printable: spaces other than
// ' ', line/paragraph separators, and format characters (Cf).
bool repr_escapes(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return true;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return true;
  if ((c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB)) return true;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x180E) return true;
  if ((c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF)) return true;
  locale_t loc = utf8_locale();
  return loc && c >= 0x80 && !iswprint_l(static_cast<wint_t>(c), loc);
}

std::vector<char32_t> char_set(const std::string& chars) { return decode(chars); }

bool in_set(const std::vector<char32_t>& set, char32_t c) {
  return std::find(set.begin(), set.end(), c) != set.end();
}

// Python's slice bounds for str.find/count: negative counts from the end, then clamped.
void clamp_range(int64_t n, int64_t& start, int64_t& end) {
  if (start < 0) start = std::max<int64_t>(0, start + n);
  if (end < 0) end = std::max<int64_t>(0, end + n);
  end = std::min(end, n);
}

std::string map_chars(std::string_view s, char32_t (*f)(char32_t)) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decode(s)) append_utf8(out, f(c));
  return out;
}

}  // namespace

std::vector<char32_t> decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    size_t n = sequence_length(s, i, &c);
    if (n == 0) {
      out.push_back(kEscapeBase + static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.push_back(c);
      i += n;
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (is_escaped_byte(c)) {
    out.push_back(static_cast<char>(c - kEscapeBase));
  } else if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) append_utf8(out, c);
  return out;
}

int64_t length(std::string_view s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    size_t k = sequence_length(s, i, &c);
    i += k ? k : 1;
    ++n;
  }
  return n;
}

size_t byte_offset(std::string_view s, int64_t index) {
  size_t i = 0;
  for (int64_t n = 0; n < index && i < s.size(); ++n) {
    char32_t c;
    size_t k = sequence_length(s, i, &c);
    i += k ? k : 1;
  }
  return i;
}

bool is_space(char32_t c) { return std::find(std::begin(kSpaces), std::end(kSpaces), c) != std::end(kSpaces); }

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  locale_t loc = utf8_locale();
  return loc && !is_escaped_byte(c) && iswalpha_l(static_cast<wint_t>(c), loc);
}

bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool is_alnum(char32_t c) { return is_alpha(c) || is_digit(c); }

bool is_lower(char32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z';
  locale_t loc = utf8_locale();
  return loc && !is_escaped_byte(c) && iswlower_l(static_cast<wint_t>(c), loc);
}

bool is_upper(char32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z';
  locale_t loc = utf8_locale();
  return loc && !is_escaped_byte(c) && iswupper_l(static_cast<wint_t>(c), loc);
}

char32_t to_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  locale_t loc = utf8_locale();
  if (!loc || is_escaped_byte(c)) return c;
  return static_cast<char32_t>(towupper_l(static_cast<wint_t>(c), loc));
}

char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  locale_t loc = utf8_locale();
  if (!loc || is_escaped_byte(c)) return c;
  return static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), loc));
}

namespace {

// The few code points whose case mapping is longer than one code point (Unicode's
// SpecialCasing), which towupper cannot express: ß -> SS, the Latin ligatures, İ -> i̇.
const char* special_upper(char32_t c, bool title) {
  switch (c) {
    case 0xDF: return title ? "Ss" : "SS";
    case 0xFB00: return title ? "Ff" : "FF";
    case 0xFB01: return title ? "Fi" : "FI";
    case 0xFB02: return title ? "Fl" : "FL";
    case 0xFB03: return title ? "Ffi" : "FFI";
    case 0xFB04: return title ? "Ffl" : "FFL";
    case 0xFB05:
    case 0xFB06: return title ? "St" : "ST";
    default: return nullptr;
  }
}

void append_upper(std::string& out, char32_t c, bool title) {
  if (const char* s = special_upper(c, title)) out += s;
  else append_utf8(out, to_upper(c));
}

void append_lower(std::string& out, char32_t c) {
  if (c == 0x130) out += "i\u0307";
  else append_utf8(out, to_lower(c));
}

}  // namespace

std::string upper(std::string_view s) {
  std::string out;
  for (char32_t c : decode(s)) append_upper(out, c, false);
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  for (char32_t c : decode(s)) append_lower(out, c);
  return out;
}

std::string swapcase(std::string_view s) {
  return map_chars(s, [](char32_t c) { return is_upper(c) ? to_lower(c) : is_lower(c) ? to_upper(c) : c; });
}

std::string capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (char32_t c : decode(s)) {
    if (first) append_upper(out, c, true);
    else append_lower(out, c);
    first = false;
  }
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : decode(s)) {
    const bool cased = is_upper(c) || is_lower(c);
    if (prev_cased) append_lower(out, c);
    else append_upper(out, c, true);
    prev_cased = cased;
  }
  return out;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<char32_t> cps = decode(s);
  std::vector<char32_t> set;
  if (chars) set = char_set(*chars);
  auto strippable = [&](char32_t c) { return chars ? in_set(set, c) : is_space(c); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strippable(cps[b])) ++b;
  if (right)
    while (e > b && strippable(cps[e - 1])) --e;
  return encode(std::vector<char32_t>(cps.begin() + b, cps.begin() + e));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t at = s.find(*sep, pos);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, at - pos));
      pos = at + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::vector<char32_t> cps = decode(s);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && is_space(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t e = cps.size();  // the rest, leading whitespace dropped, trailing kept
      out.push_back(encode(std::vector<char32_t>(cps.begin() + i, cps.begin() + e)));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !is_space(cps[j])) ++j;
    out.push_back(encode(std::vector<char32_t>(cps.begin() + i, cps.begin() + j)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<char32_t> cps = decode(s);
  size_t e = cps.size();
  while (true) {
    while (e > 0 && is_space(cps[e - 1])) --e;
    if (e == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(encode(std::vector<char32_t>(cps.begin(), cps.begin() + e)));
      break;
    }
    size_t b = e;
    while (b > 0 && !is_space(cps[b - 1])) --b;
    out.push_back(encode(std::vector<char32_t>(cps.begin() + b, cps.begin() + e)));
    e = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<char32_t> cps = decode(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    char32_t c = cps[i];
    size_t brk = 0;
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') brk = 2;
    else if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
             c == 0x2028 || c == 0x2029)
      brk = 1;
    if (!brk) {
      ++i;
      continue;
    }
    size_t end = keepends ? i + brk : i;
    out.push_back(encode(std::vector<char32_t>(cps.begin() + start, cps.begin() + end)));
    i += brk;
    start = i;
  }
  if (start < cps.size()) out.push_back(encode(std::vector<char32_t>(cps.begin() + start, cps.end())));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view rep, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python puts rep before every code point and at the end
    std::vector<char32_t> cps = decode(s);
    int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) out += rep, ++done;
      append_utf8(out, c);
    }
    if (count < 0 || done < count) out += rep;
    return out;
  }
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    size_t at = s.find(old, pos);
    if (at == std::string_view::npos) break;
    out.append(s.substr(pos, at - pos));
    out.append(rep);
    pos = at + old.size();
  }
  out.append(s.substr(pos));
  return out;
}

int64_t find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse) {
  const int64_t n = length(s);
  clamp_range(n, start, end);
  if (start > end || end - start < length(sub)) return -1;
  const size_t b = byte_offset(s, start), e = byte_offset(s, end);
  std::string_view window = s.substr(b, e - b);
  size_t at = reverse ? window.rfind(sub) : window.find(sub);
  if (at == std::string_view::npos) return -1;
  return start + length(window.substr(0, at));
}

int64_t count(std::string_view s, std::string_view sub, int64_t start, int64_t end) {
  const int64_t n = length(s);
  clamp_range(n, start, end);
  if (start > end) return 0;
  if (sub.empty()) return end - start + 1;
  const size_t b = byte_offset(s, start), e = byte_offset(s, end);
  std::string_view window = s.substr(b, e - b);
  int64_t k = 0;
  for (size_t at = window.find(sub); at != std::string_view::npos; at = window.find(sub, at + sub.size())) ++k;
  return k;
}

std::string repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (is_escaped_byte(c) || repr_escapes(c)) {
      if (c < 0x100) out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
      else if (c < 0x10000) out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      else out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
    } else {
      append_utf8(out, c);
    }
  }
  out += quote;
  return out;
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  // Shortest round-trip digits from to_chars, then CPython's layout: positional notation when
  // the decimal exponent is in [-4, 16), else d.ddde+XX.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view sci(buf, res.ptr - buf);
  const bool negative = sci.front() == '-';
  if (negative) sci.remove_prefix(1);
  const size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos))
    if (c != '.') digits += c;
  const int exp10 = std::stoi(std::string(sci.substr(epos + 1)));
  std::string out = negative ? "-" : "";
  if (exp10 >= -4 && exp10 < 16) {
    const int point = exp10 + 1;  // digits before the decimal point
    if (point <= 0) {
      out += "0." + std::string(-point, '0') + digits;
    } else if (point >= static_cast<int>(digits.size())) {
      out += digits + std::string(point - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, point) + "." + digits.substr(point);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace toy::jinja::py
