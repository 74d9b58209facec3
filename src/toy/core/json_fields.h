// Typed, strict reads of JSON objects that came from a file (model configs, checkpoint state):
// a missing key, a value of another type, or a number that does not fit ("dim": 32.7, -1 for
// an unsigned, 1e300 for a float) is a toy::Error naming where it came from and the key —
// never nlohmann's bare "[json.exception.type_error.302]" or a silent conversion.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace toy::json_fields {

// `where` names the source in messages, e.g. "[model] 'run/model.gguf' key toy.config".
int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where);
uint64_t get_uint(const nlohmann::json& j, const char* key, const std::string& where);
double get_double(const nlohmann::json& j, const char* key, const std::string& where);  // finite
float get_float(const nlohmann::json& j, const char* key, const std::string& where);    // finite, fits a float
bool get_bool(const nlohmann::json& j, const char* key, const std::string& where);
std::string get_string(const nlohmann::json& j, const char* key, const std::string& where);
const nlohmann::json& get_object(const nlohmann::json& j, const char* key, const std::string& where);
const nlohmann::json& get_array(const nlohmann::json& j, const char* key, const std::string& where);
// Parses text as a JSON object; a syntax error names `where`.
nlohmann::json parse_object(const std::string& text, const std::string& where);

}  // namespace toy::json_fields
