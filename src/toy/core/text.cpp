#include "toy/core/text.h"

#include <charconv>

#include <fmt/core.h>

namespace toy {

namespace {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when it is not one.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  if (n == 2 && c < 0xc2) return 0;  // overlong
  return n;
}

std::string escape(std::string_view s, size_t max_bytes, bool keep_lines) {
  std::string out;
  const size_t n = std::min(s.size(), max_bytes);
  for (size_t i = 0; i < n;) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (keep_lines && (c == '\n' || c == '\t')) {
      out += char(c);
      ++i;
    } else if (c < 0x20 || c == 0x7f) {
      out += c == 0 ? std::string("\\0") : fmt::format("\\x{:02x}", c);
      ++i;
    } else if (size_t len = utf8_length(s, i); len > 0) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    }
  }
  if (s.size() > max_bytes) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

}  // namespace

std::string printable(std::string_view s, size_t max_bytes) { return escape(s, max_bytes, false); }

bool parse_int64(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  const char* b = s.data() + (s[0] == '+' ? 1 : 0);  // a leading + is fine, "+-1" is not
  if (b != s.data() && (b == s.data() + s.size() || *b == '-')) return false;
  auto r = std::from_chars(b, s.data() + s.size(), out, 10);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool parse_uint64(std::string_view s, uint64_t& out) {
  if (s.empty() || s[0] == '-') return false;
  const char* b = s.data() + (s[0] == '+' ? 1 : 0);
  if (b == s.data() + s.size()) return false;
  auto r = std::from_chars(b, s.data() + s.size(), out, 10);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool parse_double(std::string_view s, double& out) {
  if (s.empty()) return false;
  const char* b = s.data() + (s[0] == '+' ? 1 : 0);
  if (b != s.data() && (b == s.data() + s.size() || *b == '-')) return false;
  auto r = std::from_chars(b, s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

std::string printable_message(std::string_view s) { return escape(s, s.size(), true); }

}  // namespace toy
