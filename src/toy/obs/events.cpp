#include "toy/obs/events.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <ctime>
#include <fstream>

#include "toy/core/runtime.h"
#include "toy/core/error.h"
#include "toy/version.h"

namespace toy {

EventLog::EventLog(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;  // a log that writes nothing (a data-parallel rank other than 0)
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  TOY_CHECK(f_ != nullptr, "[events] cannot write '{}'", path);
}

EventLog::~EventLog() {
  if (f_) std::fclose(f_);
}

void EventLog::emit(const std::string& event, nlohmann::json j) {
  if (!f_) return;
  nlohmann::json line = {{"event", event}, {"time", iso8601_now()}};
  line.update(j);
  const std::string s = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  TOY_CHECK(std::fputs(s.c_str(), f_) >= 0 && std::fflush(f_) == 0, "[events] cannot write '{}'", path_);
}

std::string iso8601_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json provenance() {
  nlohmann::json p;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  p["host"] = host;
  struct utsname u {};
  if (uname(&u) == 0) p["os"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line))
    if (line.rfind("model name", 0) == 0) {
      p["cpu"] = line.substr(line.find(':') + 2);
      break;
    }
  p["openblas_core"] = openblas_core();
  p["kernel_variant"] = kernel_variant_name();
  p["cores"] = sysconf(_SC_NPROCESSORS_ONLN);
  p["threads"] = num_threads();
  p["git_commit"] = TOY_GIT_COMMIT;
  p["compiler"] = __VERSION__;
  return p;
}

}  // namespace toy
