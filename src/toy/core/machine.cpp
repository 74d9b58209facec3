#include "toy/core/machine.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <fmt/core.h>

namespace toy {

namespace {

// A number from a cgroup file ("max" or a missing file: none).
bool read_cgroup_value(const char* path, uint64_t& out) {
  std::FILE* f = std::fopen(path, "r");
  if (!f) return false;
  unsigned long long v = 0;
  const bool ok = std::fscanf(f, "%llu", &v) == 1;
  std::fclose(f);
  out = v;
  return ok;
}

// What this process's memory cgroup still allows (a container's limit), or UINT64_MAX.
uint64_t cgroup_headroom() {
  uint64_t limit = 0, used = 0;
  if (read_cgroup_value("/sys/fs/cgroup/memory.max", limit) && read_cgroup_value("/sys/fs/cgroup/memory.current", used))
    return limit > used ? limit - used : 0;  // cgroup v2
  if (read_cgroup_value("/sys/fs/cgroup/memory/memory.limit_in_bytes", limit) &&
      read_cgroup_value("/sys/fs/cgroup/memory/memory.usage_in_bytes", used) && limit < (uint64_t(1) << 60))
    return limit > used ? limit - used : 0;  // cgroup v1 ("no limit" is a huge number there)
  return UINT64_MAX;
}

uint64_t system_available() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        found = true;
        break;
      }
    std::fclose(f);
    if (found) return uint64_t(kb) * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : UINT64_MAX;
}

}  // namespace

uint64_t available_memory_bytes() { return std::min(system_available(), cgroup_headroom()); }

std::string format_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.0f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.0f} KiB", b / 1024.0);
  return fmt::format("{:.0f} bytes", b);
}

}  // namespace toy
