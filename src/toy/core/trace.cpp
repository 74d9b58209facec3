#include "toy/core/trace.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <cerrno>
#include <cstring>

#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/core/files.h"

namespace toy::trace {

bool g_enabled = false;

namespace {

struct Writer {
  std::mutex mu;
  std::FILE* file = nullptr;
  bool first = true;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
};

Writer& writer() {
  static Writer* w = new Writer();
  return *w;
}

int thread_index() {
  static std::atomic<int> next{0};
  thread_local int idx = next++;
  return idx;
}

void json_escape(std::string& out, const char* s) {
  for (; *s; ++s) {
    char c = *s;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
}


}  // namespace

void open(const std::string& path) {
  close();
  Writer& w = writer();
  std::lock_guard<std::mutex> lock(w.mu);
  check_output_file(path, "[trace]", true);  // a FIFO would block the open forever; /dev/stderr is fine
  w.file = std::fopen(path.c_str(), "w");
  TOY_CHECK(w.file != nullptr, "[trace] cannot write trace file '{}': {}", printable(path), std::strerror(errno));
  // JSON array form: viewers accept it even if the process dies before the closing bracket.
  std::fputs("[\n", w.file);
  w.first = true;
  w.t0 = std::chrono::steady_clock::now();
  g_enabled = true;
  static bool registered = false;
  if (!registered) {
    registered = true;
    std::atexit([] { close(); });
  }
}

void open_from_env() {
  if (const char* p = std::getenv("TOY_TRACE"); p && *p) {
    try {
      open(p);
    } catch (const Error& e) {
      fail("TOY_TRACE: {}", e.what());
    }
  }
}

void close() {
  Writer& w = writer();
  std::lock_guard<std::mutex> lock(w.mu);
  g_enabled = false;
  if (!w.file) return;
  std::fputs("\n]\n", w.file);
  std::fclose(w.file);
  w.file = nullptr;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - writer().t0)
      .count();
}

void emit(const char* name, const char* category, int64_t start_us, int64_t dur_us, const std::string& args_json) {
  std::string line;
  line.reserve(128 + args_json.size());
  line += R"({"name":")";
  json_escape(line, name);
  line += R"(","cat":")";
  json_escape(line, category);
  line += R"(","ph":"X","pid":1,"tid":)";
  line += std::to_string(thread_index());
  line += R"(,"ts":)";
  line += std::to_string(start_us);
  line += R"(,"dur":)";
  line += std::to_string(dur_us);
  if (!args_json.empty()) {
    line += R"(,"args":{)";
    line += args_json;
    line += '}';
  }
  line += '}';
  Writer& w = writer();
  std::lock_guard<std::mutex> lock(w.mu);
  if (!w.file) return;
  if (!w.first) std::fputs(",\n", w.file);
  w.first = false;
  std::fputs(line.c_str(), w.file);
}

}  // namespace toy::trace
