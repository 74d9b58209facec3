// Chrome Trace Format spans for every op. Set TOY_TRACE=path.json for the toy program (its
// main calls open_from_env), or call trace::open, and
// each op and backward rule writes a complete event ("ph":"X") that Perfetto or
// chrome://tracing opens. When tracing is off a span is one predictable branch.
#pragma once
#include <cstdint>
#include <string>

namespace toy::trace {

extern bool g_enabled;
inline bool enabled() { return g_enabled; }

// Starts writing to path (replacing it); throws toy::Error if it cannot be created.
void open(const std::string& path);
// Opens TOY_TRACE when it is set; throws toy::Error naming it when it cannot be written.
void open_from_env();
// Finishes the file (also done at exit).
void close();
// Microseconds since the trace started.
int64_t now_us();
void emit(const char* name, const char* category, int64_t start_us, int64_t dur_us, const std::string& args_json);

// The outermost op or backward rule running on this thread (OpSpan and the backward engine
// set it; null outside any): what TOY_CUDA_PROFILE names a kernel's launch after, so that a
// copy inside linear's backward reads "linear (backward): copy".
struct Scope {
  const char* name = nullptr;
  bool backward = false;
};
inline thread_local Scope t_scope;
class ScopeGuard {
 public:
  ScopeGuard(const char* name, bool backward) : owner_(t_scope.name == nullptr) {
    if (owner_) t_scope = {name, backward};
  }
  ~ScopeGuard() {
    if (owner_) t_scope = {};
  }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  bool owner_;
};

class Span {
 public:
  explicit Span(const char* name, const char* category = "op") {
    if (g_enabled) {
      name_ = name;
      category_ = category;
      start_ = now_us();
    }
  }
  ~Span() {
    if (name_) emit(name_, category_, start_, now_us() - start_, args_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  bool active() const { return name_ != nullptr; }
  // Raw JSON members for "args", e.g. R"("shape": "[2, 3]")"; only call when active().
  void set_args(std::string args_json) { args_ = std::move(args_json); }

 private:
  const char* name_ = nullptr;
  const char* category_ = nullptr;
  int64_t start_ = 0;
  std::string args_;
};

}  // namespace toy::trace

#define TOY_CONCAT_INNER(a, b) a##b
#define TOY_CONCAT(a, b) TOY_CONCAT_INNER(a, b)
#define TOY_TRACE_SPAN(name) ::toy::trace::Span TOY_CONCAT(toy_span_, __LINE__)(name)
