// Python's str semantics on UTF-8 bytes, for the template engine: chat templates index, slice,
// strip, split and case-map strings the way CPython does, so lengths and positions count code
// points, "whitespace" is Python's set (str.isspace), and floats print as repr() prints them.
// Invalid UTF-8 is never rejected: a stray byte counts as one code point and is kept as is.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toy::jinja::py {

std::vector<char32_t> decode(std::string_view s);
std::string encode(const std::vector<char32_t>& cps);
void append_utf8(std::string& out, char32_t c);
// Number of code points (len(s)).
int64_t length(std::string_view s);
// Byte offset of code point i (i in [0, length]).
size_t byte_offset(std::string_view s, int64_t i);

bool is_space(char32_t c);  // str.isspace
bool is_alpha(char32_t c);
bool is_digit(char32_t c);
bool is_alnum(char32_t c);
bool is_lower(char32_t c);
bool is_upper(char32_t c);
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // first code point upper, rest lower
std::string title(std::string_view s);       // str.title: cased runs start upper
std::string swapcase(std::string_view s);

// str.strip/lstrip/rstrip: chars absent = whitespace, else the set of code points in *chars.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split/rsplit: sep absent = runs of whitespace (empty pieces dropped); maxsplit < 0: all.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view rep, int64_t count);
// Code point index of sub in s[start:end] (-1 when absent), as str.find / str.rfind.
int64_t find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse);
int64_t count(std::string_view s, std::string_view sub, int64_t start, int64_t end);

// repr(str): quotes and escapes as CPython does.
std::string repr(std::string_view s);
// repr(float): the shortest text that reads back as x, with CPython's choice of notation.
std::string float_repr(double x);
// '&', '<', '>', '"', "'" as markupsafe.escape writes them.
std::string html_escape(std::string_view s);

}  // namespace toy::jinja::py
