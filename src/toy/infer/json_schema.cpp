#include "toy/infer/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/infer/gbnf.h"

namespace toy {

namespace {

using Json = nlohmann::ordered_json;

// The building blocks every schema's grammar shares (JSON's own syntax; whitespace bounded, and
// exponents to two digits: every number a double holds, none that overflows one).
const char* const kSpace = R"(space ::= | " " | "\n" [ \t]{0,20}
)";
// A string's escapes: \uXXXX a code point (surrogates only as a high-low pair: JSON parsers
// refuse a lone one).
const char* const kEscape =
    R"([\\] (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2})))";
const std::string kStrings = std::string(R"(char ::= [^"\\\x7F\x00-\x1F] | )") + kEscape + R"(
string ::= "\"" char* "\"" space
)";
const char* const kMorePrimitives = R"(integral-part ::= [0] | [1-9] [0-9]{0,15}
decimal-part ::= [0-9]{1,16}
number ::= ("-"? integral-part) ("." decimal-part)? ([eE] [-+]? [0-9]{1,2})? space
integer ::= ("-"? integral-part) space
boolean ::= ("true" | "false") space
null ::= "null" space
value ::= object | array | string | number | boolean | null
object ::= "{" space ( string ":" space value ("," space string ":" space value)* )? "}" space
array ::= "[" space ( value ("," space value)* )? "]" space
)";

// A JSON string's raw characters (and its escapes, which no marker's text is part of).
GbnfTextAlphabet json_string_alphabet() {
  GbnfTextAlphabet a;
  a.excluded = "\"\\\\\\x7F\\x00-\\x1F";
  a.allows = [](uint32_t c) { return c != '"' && c != '\\' && c >= 0x20 && c != 0x7F; };
  a.escape = kEscape;
  return a;
}

std::string literal(const std::string& text) { return gbnf_literal(text); }

// Non-negative integers of exactly len(x) digits in [x, y] (decimal strings of equal length).
std::string same_length(const std::string& x, const std::string& y) {
  if (x.empty()) return "";
  if (x == y) return literal(x);
  if (x[0] == y[0]) return literal(x.substr(0, 1)) + " " + same_length(x.substr(1), y.substr(1));
  const size_t rest = x.size() - 1;
  const std::string zeros(rest, '0'), nines(rest, '9');
  std::vector<std::string> alts;
  auto digits = [&](char a, char b) { return a == b ? literal(std::string(1, a)) : fmt::format("[{}-{}]", a, b); };
  auto any = [&](size_t n) { return n == 0 ? std::string() : fmt::format(" [0-9]{{{}}}", n); };
  char lo = x[0], hi = y[0];
  if (x.substr(1) != zeros) {
    alts.push_back(literal(std::string(1, lo)) + " " + same_length(x.substr(1), nines));
    ++lo;
  }
  const bool top_partial = y.substr(1) != nines;
  const char mid_hi = top_partial ? char(hi - 1) : hi;
  if (lo <= mid_hi) alts.push_back(digits(lo, mid_hi) + any(rest));
  if (top_partial) alts.push_back(literal(std::string(1, hi)) + " " + same_length(zeros, y.substr(1)));
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

// Non-negative integers in [a, b] (b < 0: no upper bound), without leading zeros.
std::string non_negative(int64_t a, int64_t b) {
  std::vector<std::string> alts;
  const std::string as = std::to_string(a);
  const size_t max_len = b < 0 ? 16 : std::to_string(b).size();
  for (size_t len = as.size(); len <= max_len; ++len) {
    std::string first = as;
    if (len != as.size()) first = std::string(len, '0'), first[0] = '1';
    const std::string last = b >= 0 && len == max_len ? std::to_string(b) : std::string(len, '9');
    if (len == 1 && first == "0" && last == "0") alts.push_back("\"0\"");
    else if (b < 0 && len > as.size() && len == max_len) alts.push_back("[1-9] [0-9]{" + std::to_string(len - 1) + "}");
    else alts.push_back(same_length(first, last));
  }
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

}  // namespace

class JsonSchemaRules::Impl {
 public:
  explicit Impl(JsonSpelling spelling) : sp_(std::move(spelling)) {}

  std::string add(const Json& schema, const std::string& hint) {
    root_ = &schema;
    refs_.clear();  // ($refs are the schema's own)
    try {
      const std::string top = visit(schema, hint, "");
      return is_name(top) ? top : rule(hint, top);
    } catch (const nlohmann::json::exception& e) {  // a value of the wrong type somewhere: an error, not a crash
      fail("[json-schema] {}", printable(e.what(), 200));
    }
  }

  std::string text() const {
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    out += kSpace;
    if (sp_.forbidden.empty()) {
      out += kStrings;
    } else {  // strings in which no marker of the reply's format can occur
      const GbnfTextAlphabet a = json_string_alphabet();
      out += "char ::= " + gbnf_char_starting_no(sp_.forbidden, a) + " | " + a.escape + "\n";
      out += "string ::= \"\\\"\" js-text \"\\\"\" space\n" + gbnf_text_without("js-text", sp_.forbidden, a);
    }
    out += kMorePrimitives;
    if (sp_.gemma) {
      out += "g-string ::= " + sp_.quote_gbnf + " g-text " + sp_.quote_gbnf + " space\n";
      out += gbnf_text_without("g-text", gemma_forbidden());
      out += R"(g-key ::= [a-zA-Z_] [a-zA-Z0-9_-]{0,63} space
g-value ::= g-object | g-array | g-string | number | boolean | null
g-object ::= "{" space ( g-key ":" space g-value ("," space g-key ":" space g-value)* )? "}" space
g-array ::= "[" space ( g-value ("," space g-value)* )? "]" space
)";
    }
    return out;
  }

 private:
  JsonSpelling sp_;
  const Json* root_ = nullptr;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> names_;
  std::map<std::string, std::string> refs_;  // $ref -> rule name

  static bool is_name(const std::string& e) {
    return !e.empty() && std::all_of(e.begin(), e.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; });
  }

  std::vector<std::string> gemma_forbidden() const {
    std::vector<std::string> f = sp_.forbidden;
    f.push_back(sp_.quote);
    return f;
  }

  // The primitive rule of that name in this spelling.
  std::string prim(const char* name) const {
    const std::string n = name;
    return sp_.gemma && (n == "string" || n == "value" || n == "object" || n == "array") ? "g-" + n : n;
  }

  // A GBNF expression for exactly the value v (const, enum), in this spelling.
  std::string spelled(const Json& v) const {
    if (!sp_.gemma) return literal(v.dump());
    if (v.is_string()) return sp_.quote_gbnf + " " + literal(v.get<std::string>()) + " " + sp_.quote_gbnf;
    if (v.is_object()) {
      std::vector<std::pair<std::string, const Json*>> items;
      for (const auto& [k, x] : v.items()) items.emplace_back(k, &x);
      std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return lower(a.first) < lower(b.first); });
      std::string out = "\"{\"";
      for (size_t i = 0; i < items.size(); ++i)
        out += (i ? " \",\" " : " ") + literal(items[i].first + ":") + " " + spelled(*items[i].second);
      return out + " \"}\"";
    }
    if (v.is_array()) {
      std::string out = "\"[\"";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? " \",\" " : " ") + spelled(v[i]);
      return out + " \"]\"";
    }
    return literal(v.dump());
  }

  static std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }

  std::string rule(const std::string& hint, const std::string& body) {
    std::string name;
    for (char c : hint) name += std::isalnum(static_cast<unsigned char>(c)) ? char(std::tolower(c)) : '-';
    // (the prefixes "g-" and "js-" belong to the primitives: a hint spelled so, like a tool
    // named "g=t", gets "r-" in front, or no numbered suffix could ever make it unique)
    if (name.empty() || !std::isalpha(static_cast<unsigned char>(name[0])) || name.starts_with("g-") ||
        name.starts_with("js-"))
      name = "r-" + name;
    std::string unique = name;
    for (int i = 2; names_.count(unique) || unique == "root" || is_primitive(unique); ++i) unique = name + std::to_string(i);
    names_.insert(unique);
    rules_.emplace_back(unique, body);
    return unique;
  }

  static bool is_primitive(const std::string& n) {
    static const std::set<std::string> p = {"space", "char", "string", "integral-part", "decimal-part", "number",
                                            "integer", "boolean", "null", "value", "object", "array"};
    return p.count(n) > 0 || n.starts_with("g-") || n.starts_with("js-");
  }

  [[noreturn]] static void unsupported(const std::string& keyword, const std::string& at) {
    fail("[json-schema] '{}' is not supported (at {})", printable(keyword, 60), at.empty() ? "/" : at);
  }

  // An integer keyword's value, within ±10^15 (what the grammars spell; no overflow past it).
  int64_t integer_of(const Json& v, const std::string& key, const std::string& at) {
    constexpr double kLimit = 1e15;
    const bool whole = v.is_number_integer() ||
                       (v.is_number_float() && std::fabs(v.get<double>()) <= kLimit && std::trunc(v.get<double>()) == v.get<double>());
    TOY_CHECK(whole, "[json-schema] '{}' must be an integer (at {})", key, at.empty() ? "/" : at);
    const double d = v.is_number_unsigned() ? double(v.get<uint64_t>()) : v.is_number_integer() ? double(v.get<int64_t>())
                                                                                                : v.get<double>();
    TOY_CHECK(std::fabs(d) <= kLimit, "[json-schema] '{}' is beyond 15 digits (at {})", key, at.empty() ? "/" : at);
    return int64_t(d);
  }

  // An expression (a rule name or a parenthesised alternative) for `s`.
  std::string visit(const Json& s, const std::string& hint, const std::string& at) {
    if (s.is_boolean()) {
      TOY_CHECK(s.get<bool>(), "[json-schema] the schema false accepts nothing (at {})", at.empty() ? "/" : at);
      return prim("value");
    }
    TOY_CHECK(s.is_object(), "[json-schema] a schema must be an object or a boolean (at {})", at.empty() ? "/" : at);
    static const std::set<std::string> annotations = {"title", "description", "default", "examples", "$schema",
                                                      "$id", "$comment", "$defs", "definitions", "strict", "name",
                                                      "format"};  // (an annotation unless asserted: JSON Schema 2020-12)
    static const std::set<std::string> known = {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
        "maxLength", "enum", "const", "anyOf", "oneOf", "$ref", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum"};
    for (const auto& [k, v] : s.items())
      if (!annotations.count(k) && !known.count(k)) unsupported(k, at);
    if (s.contains("$ref")) return reference(s["$ref"], at);
    if (s.contains("const")) return "(" + spelled(s["const"]) + ") space";
    if (s.contains("enum")) {
      TOY_CHECK(s["enum"].is_array() && !s["enum"].empty(), "[json-schema] 'enum' must be a non-empty list (at {})",
                at.empty() ? "/" : at);
      std::string out = "(";
      for (size_t i = 0; i < s["enum"].size(); ++i) out += (i ? " | " : "") + spelled(s["enum"][i]);
      return out + ") space";
    }
    for (const char* key : {"anyOf", "oneOf"})
      if (s.contains(key)) {
        TOY_CHECK(s[key].is_array() && !s[key].empty(), "[json-schema] '{}' must be a non-empty list (at {})", key,
                  at.empty() ? "/" : at);
        std::string out = "(";
        for (size_t i = 0; i < s[key].size(); ++i)
          out += (i ? " | " : "") + visit(s[key][i], hint + "-" + std::to_string(i), fmt::format("{}/{}/{}", at, key, i));
        return out + ")";
      }
    if (!s.contains("type")) {
      if (s.contains("properties")) return object(s, hint, at);
      if (s.contains("items")) return array(s, hint, at);
      return prim("value");
    }
    const Json& type = s["type"];
    if (type.is_array()) {
      std::string out = "(";
      for (size_t i = 0; i < type.size(); ++i) {
        Json one = s;
        one["type"] = type[i];
        out += (i ? " | " : "") + visit(one, hint, at);
      }
      return out + ")";
    }
    TOY_CHECK(type.is_string(), "[json-schema] 'type' must be a string or a list (at {})", at.empty() ? "/" : at);
    const std::string t = type.get<std::string>();
    if (t == "object") return object(s, hint, at);
    if (t == "array") return array(s, hint, at);
    if (t == "string") return string(s, hint, at);
    if (t == "integer") return integer(s, hint, at);
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(k)) unsupported(std::string(k) + "' on a 'number (only on integers)", at);
    if (t == "number" || t == "boolean" || t == "null") return t;
    fail("[json-schema] unknown type '{}' (at {})", printable(t, 40), at.empty() ? "/" : at);
  }

  std::string reference(const Json& ref, const std::string& at) {
    TOY_CHECK(ref.is_string(), "[json-schema] '$ref' must be a string (at {})", at.empty() ? "/" : at);
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    std::string section, name;
    for (const char* prefix : {"#/$defs/", "#/definitions/"})
      if (r.starts_with(prefix)) section = std::string(prefix).substr(2, std::string(prefix).size() - 3), name = r.substr(std::string(prefix).size());
    if (r == "#") {
      const std::string rule_name = rule("root-ref", "");
      refs_[r] = rule_name;
      set_body(rule_name, visit(*root_, "root-ref", "/"));
      return rule_name;
    }
    const Json& root = *root_;
    TOY_CHECK(!section.empty() && root.contains(section) && root[section].contains(name),
              "[json-schema] '$ref' {} does not name a definition of this schema (only #/$defs/... and "
              "#/definitions/...; at {})", printable(r, 80), at.empty() ? "/" : at);
    const std::string rule_name = rule(name, "");  // named first: a definition may refer to itself
    refs_[r] = rule_name;
    set_body(rule_name, visit(root[section][name], name, "/" + section + "/" + name));
    return rule_name;
  }

  void set_body(const std::string& name, const std::string& body) {
    for (auto& [n, b] : rules_)
      if (n == name) b = body;
  }

  std::string object(const Json& s, const std::string& hint, const std::string& at) {
    std::vector<std::pair<std::string, std::string>> props;  // (key literal with colon, value expression)
    std::set<std::string> required;
    if (s.contains("required")) {
      TOY_CHECK(s["required"].is_array(), "[json-schema] 'required' must be a list (at {})", at.empty() ? "/" : at);
      for (const Json& r : s["required"]) {
        TOY_CHECK(r.is_string(), "[json-schema] 'required' must list property names (at {})", at.empty() ? "/" : at);
        required.insert(r.get<std::string>());
      }
    }
    std::vector<bool> is_required;
    if (s.contains("properties")) {
      TOY_CHECK(s["properties"].is_object(), "[json-schema] 'properties' must be an object (at {})", at.empty() ? "/" : at);
      std::vector<std::pair<std::string, const Json*>> listed;
      for (const auto& [key, sub] : s["properties"].items()) listed.emplace_back(key, &sub);
      if (sp_.gemma)  // (its template writes arguments | dictsort)
        std::stable_sort(listed.begin(), listed.end(), [](const auto& a, const auto& b) { return lower(a.first) < lower(b.first); });
      for (const auto& [key, sub_ptr] : listed) {
        const Json& sub = *sub_ptr;
        const std::string name = sp_.gemma ? literal(key) : literal(Json(key).dump());
        const std::string kv = name + " space \":\" space " + visit(sub, hint + "-" + key, at + "/properties/" + key);
        props.emplace_back(key, rule(hint + "-" + key + "-kv", kv));
        is_required.push_back(required.count(key) > 0);
      }
    }
    bool extra = true;
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (a.is_boolean()) extra = a.get<bool>();
      else unsupported("additionalProperties' as a schema (use true or false)", at);
    }
    for (const std::string& r : required) {
      const bool listed = std::any_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r; });
      TOY_CHECK(listed || extra, "[json-schema] '{}' is required but not among the properties (at {})", printable(r, 40),
                at.empty() ? "/" : at);
    }
    const std::string any_kv = sp_.gemma ? "g-key \":\" space g-value" : "string \":\" space value";
    // first(i): properties i.. with none written yet; after(i): with something written before.
    const size_t n = props.size();
    std::vector<std::string> first(n + 1), after(n + 1);
    after[n] = extra ? rule(hint + "-rest", "(\",\" space " + any_kv + ")*") : "";
    first[n] = extra ? rule(hint + "-any", "(" + any_kv + " (\",\" space " + any_kv + ")*)?") : "";
    for (size_t i = n; i-- > 0;) {
      const std::string& kv = props[i].second;
      const std::string& a_next = after[i + 1];
      const std::string& f_next = first[i + 1];
      const std::string write_after = "\",\" space " + kv + (a_next.empty() ? "" : " " + a_next);
      const std::string write_first = kv + (a_next.empty() ? "" : " " + a_next);
      if (is_required[i]) {
        after[i] = rule(hint + "-after", write_after);
        first[i] = rule(hint + "-first", write_first);
      } else {  // written, or skipped
        // (an empty alternative is written as "( ... )?": a trailing "|" would join the next line)
        after[i] = rule(hint + "-after", a_next.empty() ? "(" + write_after + ")?" : write_after + " | " + a_next);
        first[i] = rule(hint + "-first", f_next.empty() ? "(" + write_first + ")?" : write_first + " | " + f_next);
      }
    }
    return "\"{\" space " + (first[0].empty() ? "" : first[0] + " ") + "\"}\" space";
  }

  std::string array(const Json& s, const std::string& hint, const std::string& at) {
    const std::string item = s.contains("items") ? visit(s["items"], hint + "-item", at + "/items") : prim("value");
    const int64_t lo = s.contains("minItems") ? integer_of(s["minItems"], "minItems", at) : 0;
    const int64_t hi = s.contains("maxItems") ? integer_of(s["maxItems"], "maxItems", at) : -1;
    TOY_CHECK(lo >= 0 && (hi < 0 || hi >= lo) && lo <= 1000 && hi <= 1000,
              "[json-schema] minItems/maxItems out of range (at {})", at.empty() ? "/" : at);
    const std::string it = rule(hint + "-item", item);
    if (hi == 0) return "\"[\" space \"]\" space";
    const std::string more = hi < 0 ? fmt::format("(\",\" space {}){{{},}}", it, std::max<int64_t>(lo - 1, 0))
                                    : fmt::format("(\",\" space {}){{{},{}}}", it, std::max<int64_t>(lo - 1, 0), hi - 1);
    const std::string body = it + " " + more;
    return "\"[\" space " + (lo == 0 ? "(" + body + ")?" : body) + " \"]\" space";
  }

  std::string string(const Json& s, const std::string&, const std::string& at) {
    const int64_t lo = s.contains("minLength") ? integer_of(s["minLength"], "minLength", at) : 0;
    const int64_t hi = s.contains("maxLength") ? integer_of(s["maxLength"], "maxLength", at) : -1;
    TOY_CHECK(lo >= 0 && (hi < 0 || hi >= lo) && lo <= 10000 && hi <= 10000,
              "[json-schema] minLength/maxLength out of range (at {})", at.empty() ? "/" : at);
    if (lo == 0 && hi < 0) return prim("string");
    if (sp_.gemma)  // (bounded: no character that begins a marker, the quote mark's included)
      return fmt::format("{} {}{{{},{}}} {} space", sp_.quote_gbnf, gbnf_char_starting_no(gemma_forbidden(), {}), lo,
                         hi < 0 ? std::string() : std::to_string(hi), sp_.quote_gbnf);
    return hi < 0 ? fmt::format("\"\\\"\" char{{{},}} \"\\\"\" space", lo)
                  : fmt::format("\"\\\"\" char{{{},{}}} \"\\\"\" space", lo, hi);
  }

  std::string integer(const Json& s, const std::string& hint, const std::string& at) {
    constexpr int64_t kMax = 999999999999999;  // integral-part's 16 digits, and then some room
    bool has_lo = false, has_hi = false;
    int64_t lo = -kMax, hi = kMax;
    if (s.contains("minimum")) lo = std::max(lo, integer_of(s["minimum"], "minimum", at)), has_lo = true;
    if (s.contains("exclusiveMinimum")) lo = std::max(lo, integer_of(s["exclusiveMinimum"], "exclusiveMinimum", at) + 1), has_lo = true;
    if (s.contains("maximum")) hi = std::min(hi, integer_of(s["maximum"], "maximum", at)), has_hi = true;
    if (s.contains("exclusiveMaximum")) hi = std::min(hi, integer_of(s["exclusiveMaximum"], "exclusiveMaximum", at) - 1), has_hi = true;
    if (!has_lo && !has_hi) return "integer";
    TOY_CHECK(lo <= hi, "[json-schema] no integer lies between the minimum and the maximum (at {})", at.empty() ? "/" : at);
    TOY_CHECK(lo >= -kMax && hi <= kMax, "[json-schema] minimum/maximum beyond 15 digits (at {})", at.empty() ? "/" : at);
    std::vector<std::string> alts;
    if (hi >= 0) alts.push_back(non_negative(std::max<int64_t>(lo, 0), has_hi ? hi : -1));
    if (lo < 0) alts.push_back("\"-\" " + non_negative(std::max<int64_t>(hi < 0 ? -hi : 1, 1), has_lo ? -lo : -1));
    std::string body = "(";
    for (size_t i = 0; i < alts.size(); ++i) body += (i ? " | " : "") + alts[i];
    return rule(hint + "-int", body + ") space");
  }
};

JsonSchemaRules::JsonSchemaRules(JsonSpelling spelling) : impl_(std::make_unique<Impl>(std::move(spelling))) {}
JsonSchemaRules::~JsonSchemaRules() = default;
std::string JsonSchemaRules::add(const nlohmann::ordered_json& schema, const std::string& hint) {
  return impl_->add(schema, hint);
}
std::string JsonSchemaRules::text() const { return impl_->text(); }

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  JsonSchemaRules rules;
  const std::string top = rules.add(schema, "root-value");
  return "root ::= " + top + "\n" + rules.text();
}

std::string json_object_gbnf() { return "root ::= object\n" + std::string(kSpace) + kStrings + kMorePrimitives; }

}  // namespace toy
