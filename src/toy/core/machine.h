// What the machine has, for checks made before a run starts (so that a run that cannot fit is
// refused up front instead of dying at step 1 or being killed by the OOM killer).
#pragma once
#include <cstdint>
#include <string>

namespace toy {

// Memory that can be given to this process without swapping: the kernel's MemAvailable, or
// less when a memory cgroup (a container's limit) allows less.
uint64_t available_memory_bytes();
// Human-readable bytes: "1.5 GiB", "320 MiB".
std::string format_bytes(double bytes);

}  // namespace toy
