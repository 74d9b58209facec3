#include "toy/core/machine.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <fmt/core.h>

namespace toy {

uint64_t available_memory_bytes() {
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

std::string format_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.0f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.0f} KiB", b / 1024.0);
  return fmt::format("{:.0f} bytes", b);
}

}  // namespace toy
