// Strict command-line values. CLI11's own conversions accept "2abc"-style leftovers in some
// types, wrap or saturate integers that do not fit, and take '' as 0; these helpers parse the
// whole value as a decimal number of the right type and check it against the flag's range,
// so a bad value is a usage error naming the flag and what it accepts:
//   toy: --dim must be an integer in 1..1048576, got '0'
#pragma once
#include <vector>

#include "toy/train/loop.h"
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "toy/core/device.h"

namespace toy::cli {

// Integers in [lo, hi].
CLI::Option* add_int(CLI::App* cmd, const std::string& names, int64_t& var, int64_t lo, int64_t hi,
                     const std::string& desc);
CLI::Option* add_int(CLI::App* cmd, const std::string& names, int& var, int64_t lo, int64_t hi,
                     const std::string& desc);
// Same, left empty when the flag is not given (model overrides on top of a preset).
CLI::Option* add_int(CLI::App* cmd, const std::string& names, std::optional<int64_t>& var, int64_t lo, int64_t hi,
                     const std::string& desc);
// Any unsigned 64-bit integer (seeds).
CLI::Option* add_u64(CLI::App* cmd, const std::string& names, uint64_t& var, const std::string& desc);

// Finite reals in a range; each end open or closed: "(0, 1]" is lo_open = true.
struct Range {
  double lo, hi;
  bool lo_open = false, hi_open = false;
};
CLI::Option* add_real(CLI::App* cmd, const std::string& names, float& var, Range r, const std::string& desc);
// --device cpu|sim: where the command's tensors live (sim: the simulated device that checks a
// run's device-neutrality; slower than cpu, bit-identical results).
CLI::Option* add_device(CLI::App* cmd, Device& var);
CLI::Option* add_real(CLI::App* cmd, const std::string& names, double& var, Range r, const std::string& desc);
// Data-parallel runs (mpirun -np N): --zero, --dp-bucket-mb, --dp-overlap, --dp-timeout.
void add_data_parallel_flags(CLI::App* cmd, LoopOptions& o);
// Their names (the trainers' resume rules: they apply to one invocation).
const std::vector<std::string>& data_parallel_flag_names();
CLI::Option* add_real(CLI::App* cmd, const std::string& names, std::optional<float>& var, Range r,
                      const std::string& desc);

// The same path (both exist and are one file or folder), or the same string: how a --resume
// compares the paths a run was started with to the ones given again.
bool same_path(const std::string& a, const std::string& b);

// The exit code and message shape of every toy error: "toy: <message>" on stderr; usage
// errors (bad flags) exit 2, runtime errors exit 1.
constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

}  // namespace toy::cli
