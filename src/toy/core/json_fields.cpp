#include "toy/core/json_fields.h"

#include <cmath>
#include <limits>

#include "toy/core/error.h"
#include "toy/core/text.h"

namespace toy::json_fields {

namespace {

const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) {
  TOY_CHECK(j.is_object(), "{}: expected a JSON object, got {}", where, j.type_name());
  auto it = j.find(key);
  TOY_CHECK(it != j.end(), "{}: missing field '{}'", where, key);
  return *it;
}

[[noreturn]] void wrong(const nlohmann::json& v, const char* key, const std::string& where, const char* want) {
  fail("{}: field '{}' must be {}, got {}", where, key, want,
       printable(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 64));
}

}  // namespace

int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      wrong(v, key, where, "an integer that fits 64 bits");
    return v.get<int64_t>();
  }
  wrong(v, key, where, "an integer");
}

uint64_t get_uint(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  wrong(v, key, where, "a non-negative integer");
}

double get_double(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_number()) wrong(v, key, where, "a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) wrong(v, key, where, "a finite number");
  return d;
}

float get_float(const nlohmann::json& j, const char* key, const std::string& where) {
  const double d = get_double(j, key, where);
  if (!std::isfinite(float(d))) wrong(j.at(key), key, where, "a number that fits a float");
  return float(d);
}

bool get_bool(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_boolean()) wrong(v, key, where, "true or false");
  return v.get<bool>();
}

std::string get_string(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_string()) wrong(v, key, where, "a string");
  return v.get<std::string>();
}

const nlohmann::json& get_object(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_object()) wrong(v, key, where, "an object");
  return v;
}

const nlohmann::json& get_array(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_array()) wrong(v, key, where, "an array");
  return v;
}

nlohmann::json parse_object(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // A syntax error, or a number too large for a double (out_of_range.406); e.what() quotes
    // the offending bytes, so it is escaped.
    fail("{}: not valid JSON ({})", where, printable(e.what(), 160));
  }
  TOY_CHECK(j.is_object(), "{}: expected a JSON object, got {}", where, j.type_name());
  return j;
}

}  // namespace toy::json_fields
