// Text that came from outside (file keys, tensor names, vocabulary pieces, paths) made safe to
// echo: control characters, DEL and bytes that are not UTF-8 become visible escapes (\x1b, \0),
// so a file cannot clear the terminal or cut a message short with a NUL, and very long
// strings are shortened with a note of their length.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace toy {

std::string printable(std::string_view s, size_t max_bytes = 200);
// Same, but keeps newlines and tabs (for whole messages printed to a terminal).
std::string printable_message(std::string_view s);

// Strict number parsing for flags and environment variables: the whole string must be the
// number (no spaces, no trailing text, no empty string), decimal only, and it must fit the
// type (no wrapping or saturation). false when it does not.
bool parse_int64(std::string_view s, int64_t& out);
bool parse_uint64(std::string_view s, uint64_t& out);
bool parse_double(std::string_view s, double& out);  // accepts inf / nan: callers check range

}  // namespace toy
