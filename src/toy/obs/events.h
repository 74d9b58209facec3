// events.jsonl: one JSON object per line, flushed as written, so a run can be followed live
// (tail -f) and survives a crash up to its last line. run_start carries provenance: host, OS,
// CPU, thread count, the git commit toy was built from, and the full configuration.
#pragma once
#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace toy {

class EventLog {
 public:
  // append = continue an existing log (resume); an empty path: a log that writes nothing.
  EventLog(const std::string& path, bool append);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  // Writes j plus "event" and "time" (ISO 8601) as one line.
  void emit(const std::string& event, nlohmann::json j);

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

// Host, OS, CPU model, cores, threads in use, toy's git commit, compiler.
nlohmann::json provenance();
// Current UTC time as "2026-11-30T12:34:56Z".
std::string iso8601_now();

}  // namespace toy
