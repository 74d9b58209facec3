#include "toy/chat/lexer.h"

#include <fmt/core.h>

#include <cerrno>
#include <cstdlib>

#include "toy/chat/pystr.h"
#include "toy/core/error.h"

namespace toy::jinja {
namespace {

// Python's \s: the whitespace a `-` strips and an lstrip may remove.
bool space_at(std::string_view s, size_t i, size_t* n) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    *n = 1;
    return py::is_space(b);
  }
  std::vector<char32_t> one = py::decode(s.substr(i, std::min<size_t>(4, s.size() - i)));
  std::string enc;
  py::append_utf8(enc, one[0]);
  *n = enc.size();
  return py::is_space(one[0]);
}

size_t skip_spaces(std::string_view s, size_t i) {
  size_t n;
  while (i < s.size() && space_at(s, i, &n)) i += n;
  return i;
}

std::string rstrip_spaces(std::string_view s) { return py::strip(s, std::nullopt, false, true); }

bool all_spaces(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n;
    if (!space_at(s, i, &n)) return false;
    i += n;
  }
  return true;
}

bool ident_start(char c) { return c == '_' || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c & 0x80); }
bool ident_char(char c) { return ident_start(c) || (c >= '0' && c <= '9'); }
bool digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (digit(c)) return c - '0';
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) lex_data();
    push(Token::Type::End, "");
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const { throw toy::Error(where(line_) + msg); }

  void push(Token::Type t, std::string text) {
    Token tok;
    tok.type = t;
    tok.text = std::move(text);
    tok.line = line_;
    out_.push_back(std::move(tok));
  }

  void advance_to(size_t to) {
    for (size_t i = pos_; i < to; ++i) line_ += src_[i] == '\n';
    pos_ = to;
  }

  // Text up to the next tag, then the tag. `line_starting`: the text begins a line (the
  // template start, or the previous tag's match ended with a newline), which lstrip needs.
  void lex_data() {
    size_t tag = src_.size();
    for (size_t i = src_.find('{', pos_); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        tag = i;
        break;
      }
    }
    std::string text = src_.substr(pos_, tag - pos_);
    if (tag == src_.size()) {
      push(Token::Type::Text, text);
      advance_to(tag);
      return;
    }
    const char kind = src_[tag + 1];
    const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
    const bool is_raw = kind == '%' && raw_begin(tag);
    if (sign == '-') {
      text = rstrip_spaces(text);
    } else if (sign != '+' && kind != '{') {
      const size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() && all_spaces(std::string_view(text).substr(l_pos)))
        text.resize(l_pos);
    }
    const int text_line = line_;
    advance_to(tag);
    if (!text.empty()) {
      push(Token::Type::Text, std::move(text));
      out_.back().line = text_line;
    }
    if (is_raw) return lex_raw();
    advance_to(tag + 2 + (sign == '-' || sign == '+'));
    if (kind == '#') return lex_comment();
    push(kind == '{' ? Token::Type::VarBegin : Token::Type::BlockBegin, kind == '{' ? "{{" : "{%");
    lex_tag(kind == '{');
  }

  // `{% raw %}` / `{%- raw -%}` at `at`; on a match remembers where its end is.
  bool raw_begin(size_t at) {
    size_t i = at + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    i = skip_spaces(src_, i);
    if (src_.compare(i, 3, "raw") != 0) return false;
    i = skip_spaces(src_, i + 3);
    if (src_.compare(i, 3, "-%}") == 0) {
      raw_body_ = skip_spaces(src_, i + 3);
    } else if (src_.compare(i, 2, "%}") == 0) {
      raw_body_ = i + 2;  // jinja2 applies no trim_blocks after {% raw %}
    } else {
      return false;
    }
    return true;
  }

  void lex_raw() {
    const bool line_start = src_[raw_body_ - 1] == '\n';
    advance_to(raw_body_);
    for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t j = i + 2;
      const char sign = j < src_.size() ? src_[j] : '\0';
      if (sign == '-' || sign == '+') ++j;
      j = skip_spaces(src_, j);
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j = skip_spaces(src_, j + 6);
      size_t end;
      if (src_.compare(j, 3, "+%}") == 0) end = j + 3;
      else if (src_.compare(j, 3, "-%}") == 0) end = skip_spaces(src_, j + 3);
      else if (src_.compare(j, 2, "%}") == 0) end = j + 2 + (j + 2 < src_.size() && src_[j + 2] == '\n');
      else continue;
      std::string text = src_.substr(pos_, i - pos_);
      if (sign == '-') {
        text = rstrip_spaces(text);
      } else if (sign != '+') {
        const size_t l_pos = text.rfind('\n') + 1;
        if ((l_pos > 0 || line_start) && l_pos < text.size() && all_spaces(std::string_view(text).substr(l_pos)))
          text.resize(l_pos);
      }
      if (!text.empty()) push(Token::Type::Text, std::move(text));
      advance_to(end);
      line_starting_ = src_[end - 1] == '\n';
      return;
    }
    fail("Missing end of raw directive");
  }

  void lex_comment() {
    const size_t body = pos_;
    size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail("Missing end of comment tag");
    size_t end = close + 2;
    const char sign = close > body ? src_[close - 1] : '\0';
    if (sign == '-') end = skip_spaces(src_, end);
    else if (sign != '+' && end < src_.size() && src_[end] == '\n') ++end;  // trim_blocks
    advance_to(end);
    line_starting_ = src_[end - 1] == '\n';
  }

  // Tokens inside {{ }} or {% %} up to the closing tag (not inside brackets, as jinja2).
  void lex_tag(bool variable) {
    std::vector<char> brackets;
    while (true) {
      if (pos_ >= src_.size()) fail(variable ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      if (brackets.empty() && close_tag(variable)) return;
      size_t n;
      if (space_at(src_, pos_, &n)) {
        advance_to(pos_ + n);
        continue;
      }
      const char c = src_[pos_];
      if (digit(c)) {
        lex_number();
      } else if (ident_start(c)) {
        size_t e = pos_;
        while (e < src_.size() && ident_char(src_[e])) ++e;
        push(Token::Type::Name, src_.substr(pos_, e - pos_));
        advance_to(e);
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        lex_operator(brackets);
      }
    }
  }

  bool close_tag(bool variable) {
    const char* close = variable ? "}}" : "%}";
    size_t end;
    if (src_.compare(pos_, 3, std::string("-") + close) == 0) {
      end = skip_spaces(src_, pos_ + 3);
    } else if (!variable && src_.compare(pos_, 3, "+%}") == 0) {
      end = pos_ + 3;
    } else if (src_.compare(pos_, 2, close) == 0) {
      end = pos_ + 2;
      if (!variable && end < src_.size() && src_[end] == '\n') ++end;  // trim_blocks
    } else {
      return false;
    }
    push(variable ? Token::Type::VarEnd : Token::Type::BlockEnd, close);
    advance_to(end);
    line_starting_ = src_[end - 1] == '\n';
    return true;
  }

  void lex_number() {
    // Python literals as jinja2 reads them: 0b/0o/0x integers, `_` between digits, floats need
    // digits after the point or an exponent.
    size_t e = pos_;
    auto digits = [&](size_t i, int (*val)(char), int base) {
      size_t j = i;
      while (j < src_.size() && ((val(src_[j]) >= 0 && val(src_[j]) < base) || (src_[j] == '_' && j > i))) ++j;
      return j;
    };
    auto dec = [](char ch) { return digit(ch) ? ch - '0' : -1; };
    std::string lit;
    if (src_[pos_] == '0' && pos_ + 1 < src_.size() && std::string_view("bBoOxX").find(src_[pos_ + 1]) != std::string_view::npos) {
      const char p = static_cast<char>(src_[pos_ + 1] | 0x20);
      const int base = p == 'b' ? 2 : p == 'o' ? 8 : 16;
      e = digits(pos_ + 2, hex_value, base);
      for (size_t i = pos_ + 2; i < e; ++i)
        if (src_[i] != '_') lit += src_[i];
      push(Token::Type::Int, src_.substr(pos_, e - pos_));
      out_.back().int_value = std::strtoll(lit.c_str(), nullptr, base);
      advance_to(e);
      return;
    }
    e = digits(pos_, dec, 10);
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && digit(src_[e + 1])) {
      e = digits(e + 1, dec, 10);
      is_float = true;
    }
    if (e < src_.size() && (src_[e] | 0x20) == 'e') {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && digit(src_[x])) {
        e = digits(x, dec, 10);
        is_float = true;
      }
    }
    for (size_t i = pos_; i < e; ++i)
      if (src_[i] != '_') lit += src_[i];
    push(is_float ? Token::Type::Float : Token::Type::Int, src_.substr(pos_, e - pos_));
    if (is_float) {
      out_.back().float_value = std::strtod(lit.c_str(), nullptr);
    } else {
      errno = 0;
      out_.back().int_value = std::strtoll(lit.c_str(), nullptr, 10);
      if (errno == ERANGE) fail(fmt::format("integer literal {} does not fit in 64 bits", lit));
    }
    advance_to(e);
  }

  // Python's string escapes (jinja2 decodes literals with "unicode-escape").
  void lex_string(char quote) {
    std::string value;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= src_.size()) fail("unexpected end of template inside a string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) fail("unexpected end of template inside a string literal");
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n': break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'n': value += '\n'; break;
        case 'r': value += '\r'; break;
        case 't': value += '\t'; break;
        case 'v': value += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (int k = 0; k < n; ++k, ++i) {
            const int h = i < src_.size() ? hex_value(src_[i]) : -1;
            if (h < 0) fail(fmt::format("truncated \\{} escape in a string literal", e));
            cp = cp * 16 + static_cast<char32_t>(h);
          }
          if (cp > 0x10FFFF) fail("illegal Unicode character in a string literal");
          py::append_utf8(value, cp);
          break;
        }
        case 'N': fail("\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = e - '0';
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i)
              cp = cp * 8 + static_cast<char32_t>(src_[i] - '0');
            py::append_utf8(value, cp);
          } else {
            value += '\\';  // Python keeps unknown escapes as written
            value += e;
          }
      }
    }
    push(Token::Type::String, std::move(value));
    advance_to(i + 1);
  }

  void lex_operator(std::vector<char>& brackets) {
    static constexpr std::string_view kTwo[] = {"**", "//", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwo)
      if (src_.compare(pos_, 2, op) == 0) {
        push(Token::Type::Op, std::string(op));
        advance_to(pos_ + 2);
        return;
      }
    const char c = src_[pos_];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos)
      fail(fmt::format("unexpected char '{}'", c));
    if (c == '(' || c == '[' || c == '{') brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) fail(fmt::format("unexpected '{}'", c));
      if (brackets.back() != c) fail(fmt::format("unexpected '{}', expected '{}'", c, brackets.back()));
      brackets.pop_back();
    }
    push(Token::Type::Op, std::string(1, c));
    advance_to(pos_ + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  size_t raw_body_ = 0;
  std::vector<Token> out_;
};

// "\r\n" and "\r" become "\n"; one trailing newline goes (keep_trailing_newline is off).
std::string normalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::string where(int line) { return fmt::format("[template] line {}: ", line); }

std::vector<Token> tokenize(std::string_view source) { return Lexer(normalize(source)).run(); }

}  // namespace toy::jinja
