// toy's Jinja engine against Python's jinja2: every chat template in ../shared/data/chat-templates
// rendered with every conversation in tests/fixtures/chat/conversations by
// toy::render_chat_template, compared with tests/fixtures/chat/expected.json, which
// tools/chat/render_reference.py writes from jinja2 set up as Hugging Face's apply_chat_template
// sets it up. An expected text must match byte for byte. An expected error must be a toy::Error:
// for raise_exception (kind TemplateError) its message must contain the template's message; for
// a Python-side failure (TypeError, UndefinedError, SecurityError: CPython's wording) throwing is
// enough. The agreement rate is printed first, then each case is checked on its own so a failure
// names its template and conversation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "requirements.h"
#include "toy/chat/chat_render.h"
#include "toy/core/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kRegenerate =
    "/usr/bin/python3 tools/chat/render_reference.py ../shared/data/chat-templates "
    "tests/fixtures/chat/conversations tests/fixtures/chat/expected.json";

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw toy::Error("cannot open " + p.string());
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The files in dir whose names end with ext, sorted by name.
std::vector<fs::path> files_with(const fs::path& dir, const std::string& ext) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ext) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Control characters escaped, so a snippet prints on one line.
std::string escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += char(c);
  }
  return out;
}

// Up to n bytes of s around `at`, not starting or ending inside a UTF-8 sequence.
std::string around(const std::string& s, size_t at, size_t n) {
  size_t b = at > n / 2 ? at - n / 2 : 0;
  size_t e = std::min(s.size(), b + n);
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  while (e < s.size() && (static_cast<unsigned char>(s[e]) & 0xC0) == 0x80) ++e;
  return escaped(s.substr(b, e - b));
}

// Where got and want first differ: byte offset, line, and both sides around it.
std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const long line = 1 + std::count(want.begin(), want.begin() + static_cast<long>(i), '\n');
  return "texts differ at byte " + std::to_string(i) + " (line " + std::to_string(line) + "; lengths got " +
         std::to_string(got.size()) + ", expected " + std::to_string(want.size()) + ")\n  got:      \"" +
         around(got, i, 80) + "\"\n  expected: \"" + around(want, i, 80) + "\"";
}

struct Case {
  std::string tmpl, conv;
  bool ok = false;
  bool expect_error = false;
  std::string why;  // what went wrong, when !ok
};

Case run_case(const std::string& tmpl_name, const std::string& tmpl_text, const std::string& conv_name,
              const nlohmann::ordered_json& conversation, const json& expected) {
  Case c{tmpl_name, conv_name};
  c.expect_error = expected.contains("error");
  std::string text;
  try {
    text = toy::render_chat_template(tmpl_text, conversation);
  } catch (const toy::Error& e) {
    if (!c.expect_error) {
      c.why = std::string("threw toy::Error \"") + e.what() + "\", expected text";
      return c;
    }
    const std::string want = expected["error"].get<std::string>();
    const std::string kind = expected.value("kind", "TemplateError");
    if (kind == "TemplateError" && std::string(e.what()).find(want) == std::string::npos) {
      c.why = std::string("threw \"") + e.what() + "\", expected a message containing \"" + want + "\"";
      return c;
    }
    c.ok = true;
    return c;
  } catch (const std::exception& e) {
    c.why = std::string("threw a std::exception that is not a toy::Error: \"") + e.what() + "\"";
    return c;
  } catch (...) {
    c.why = "threw something that is not a std::exception";
    return c;
  }
  if (c.expect_error) {
    c.why = "rendered " + std::to_string(text.size()) + " bytes, expected an error (" +
            expected.value("kind", "TemplateError") + ": " + expected["error"].get<std::string>() + ")";
    return c;
  }
  const std::string want = expected["text"].get<std::string>();
  if (text != want) {
    c.why = first_difference(text, want);
    return c;
  }
  c.ok = true;
  return c;
}

}  // namespace

TEST(ChatReference, TemplatesAgreeWithJinja2) {
  const std::string templates_dir = toy::test::shared_path("chat-templates");
  TOY_REQUIRE_FILE(templates_dir);
  const fs::path fixtures = fs::path(TOY_FIXTURE_DIR) / "chat";
  const json expected = json::parse(read_file(fixtures / "expected.json"));

  // Conversations keep their key order (ordered_json), as Python's dicts do.
  std::vector<std::pair<std::string, nlohmann::ordered_json>> conversations;
  for (const fs::path& p : files_with(fixtures / "conversations", ".json"))
    conversations.emplace_back(p.stem().string(), nlohmann::ordered_json::parse(read_file(p)));
  const std::vector<fs::path> templates = files_with(templates_dir, ".jinja");
  ASSERT_FALSE(conversations.empty());
  ASSERT_FALSE(templates.empty()) << "no *.jinja in " << templates_dir;

  std::vector<Case> cases;
  for (const fs::path& tp : templates) {
    const std::string name = tp.filename().string();
    const std::string text = read_file(tp);
    for (const auto& [conv_name, conv] : conversations) {
      if (!expected.contains(name) || !expected[name].contains(conv_name)) {
        cases.push_back({name, conv_name, false, false, std::string("no entry in expected.json; run ") + kRegenerate});
        continue;
      }
      cases.push_back(run_case(name, text, conv_name, conv, expected[name][conv_name]));
    }
  }

  int ok = 0, texts = 0, texts_ok = 0, errors = 0, errors_ok = 0;
  std::map<std::string, std::pair<int, int>> per_template;  // name -> (agreeing, total)
  for (const Case& c : cases) {
    ok += c.ok;
    (c.expect_error ? errors : texts) += 1;
    (c.expect_error ? errors_ok : texts_ok) += c.ok;
    per_template[c.tmpl].first += c.ok;
    per_template[c.tmpl].second += 1;
  }
  std::printf("template agreement: %d/%zu (texts %d/%d, errors %d/%d; %zu templates x %zu conversations)\n", ok,
              cases.size(), texts_ok, texts, errors_ok, errors, templates.size(), conversations.size());
  for (const auto& [name, counts] : per_template)
    if (counts.first != counts.second) std::printf("  %-55s %d/%d\n", name.c_str(), counts.first, counts.second);
  std::fflush(stdout);

  for (const Case& c : cases) EXPECT_TRUE(c.ok) << c.tmpl << " x " << c.conv << ": " << c.why;
}
