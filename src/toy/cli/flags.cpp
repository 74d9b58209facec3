#include "toy/cli/flags.h"

#include <filesystem>

#include <cmath>

#include <fmt/core.h>

#include "toy/core/device_access.h"
#include "toy/core/text.h"

namespace toy::cli {

namespace {

// The flag's long name for messages ("--dim" from "-d,--dim").
std::string flag_name(const std::string& names) {
  std::string best;
  size_t start = 0;
  while (start <= names.size()) {
    size_t end = names.find(',', start);
    if (end == std::string::npos) end = names.size();
    const std::string n = names.substr(start, end - start);
    if (best.empty() || n.size() > best.size()) best = n;
    start = end + 1;
  }
  return best;
}

[[noreturn]] void bad(const std::string& flag, const std::string& what, const std::string& got) {
  throw CLI::ValidationError(fmt::format("{} must be {}, got '{}'", flag, what, printable(got, 64)));
}

int64_t parse_int_in(const std::string& flag, const std::string& s, int64_t lo, int64_t hi) {
  int64_t v = 0;
  if (!parse_int64(s, v) || v < lo || v > hi) bad(flag, fmt::format("an integer in {}..{}", lo, hi), s);
  return v;
}

std::string describe(const Range& r) {
  return fmt::format("a number in {}{}, {}{}", r.lo_open ? "(" : "[", r.lo, r.hi, r.hi_open ? ")" : "]");
}

double parse_real_in(const std::string& flag, const std::string& s, const Range& r) {
  double v = 0;
  const bool ok = parse_double(s, v) && std::isfinite(v) && (r.lo_open ? v > r.lo : v >= r.lo) &&
                  (r.hi_open ? v < r.hi : v <= r.hi) && std::isfinite(float(v));
  if (!ok) bad(flag, describe(r), s);
  return v;
}

template <class Fn>
CLI::Option* add_parsed(CLI::App* cmd, const std::string& names, Fn fn, const std::string& desc,
                        const char* type) {
  return cmd->add_option_function<std::string>(names, std::move(fn), desc)->type_name(type);
}

}  // namespace

CLI::Option* add_int(CLI::App* cmd, const std::string& names, int64_t& var, int64_t lo, int64_t hi,
                     const std::string& desc) {
  const std::string flag = flag_name(names);
  return add_parsed(cmd, names, [&var, flag, lo, hi](const std::string& s) { var = parse_int_in(flag, s, lo, hi); },
                    desc, "INT")
      ->default_str(std::to_string(var));
}

CLI::Option* add_int(CLI::App* cmd, const std::string& names, int& var, int64_t lo, int64_t hi,
                     const std::string& desc) {
  const std::string flag = flag_name(names);
  return add_parsed(cmd, names,
                    [&var, flag, lo, hi](const std::string& s) { var = int(parse_int_in(flag, s, lo, hi)); }, desc, "INT")
      ->default_str(std::to_string(var));
}

CLI::Option* add_int(CLI::App* cmd, const std::string& names, std::optional<int64_t>& var, int64_t lo, int64_t hi,
                     const std::string& desc) {
  const std::string flag = flag_name(names);
  return add_parsed(cmd, names, [&var, flag, lo, hi](const std::string& s) { var = parse_int_in(flag, s, lo, hi); },
                    desc, "INT");
}

CLI::Option* add_u64(CLI::App* cmd, const std::string& names, uint64_t& var, const std::string& desc) {
  const std::string flag = flag_name(names);
  return add_parsed(cmd, names,
                    [&var, flag](const std::string& s) {
                      if (!parse_uint64(s, var)) bad(flag, "an integer in 0..18446744073709551615", s);
                    },
                    desc, "UINT")
      ->default_str(std::to_string(var));
}

CLI::Option* add_real(CLI::App* cmd, const std::string& names, float& var, Range r, const std::string& desc) {
  const std::string flag = flag_name(names);
  return add_parsed(cmd, names, [&var, flag, r](const std::string& s) { var = float(parse_real_in(flag, s, r)); },
                    desc, "NUM")
      ->default_str(fmt::format("{}", var));
}

CLI::Option* add_real(CLI::App* cmd, const std::string& names, double& var, Range r, const std::string& desc) {
  const std::string flag = flag_name(names);
  return add_parsed(cmd, names, [&var, flag, r](const std::string& s) { var = parse_real_in(flag, s, r); }, desc, "NUM")
      ->default_str(fmt::format("{}", var));
}

CLI::Option* add_real(CLI::App* cmd, const std::string& names, std::optional<float>& var, Range r,
                      const std::string& desc) {
  const std::string flag = flag_name(names);
  return add_parsed(cmd, names, [&var, flag, r](const std::string& s) { var = float(parse_real_in(flag, s, r)); },
                    desc, "NUM");
}

bool same_path(const std::string& a, const std::string& b) {
  if (a == b) return true;
  std::error_code e1, e2;
  const std::filesystem::path ca = std::filesystem::weakly_canonical(a, e1), cb = std::filesystem::weakly_canonical(b, e2);
  return !e1 && !e2 && ca == cb;
}

CLI::Option* add_device(CLI::App* cmd, Device& var) {
  return cmd
      ->add_option_function<std::string>(
          "--device", [&var](const std::string& s) { var = select_device(s, "[device]"); },
          "Where tensors live and kernels run: cpu; sim (a simulated device: memory host code may not touch, "
          "every transfer counted; checks that a run is device-neutral; slower than cpu, bit-identical results); "
          "cuda or cuda:N (an NVIDIA GPU)")
      ->default_str("cpu");
}

void add_data_parallel_flags(CLI::App* cmd, LoopOptions& o) {
  auto* zero = cmd->add_option("--zero", o.zero, "Data-parallel (mpirun): 1 shards AdamW's moments over the processes "
                               "(ZeRO-1), 0 keeps them whole on each");
  zero->check(CLI::IsMember({0, 1}))->capture_default_str();
  add_real(cmd, "--dp-bucket-mb", o.dp_bucket_mb, {0, 4096, true},
           "Data-parallel: MB of gradients sent to their owner at once, while backward goes on (default 8)");
  cmd->add_option_function<std::string>(
         "--dp-overlap", [&o](const std::string& s) { o.dp_overlap = s == "on"; },
         "Data-parallel: send gradients while backward runs (on) or after it (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->default_str("on");
  add_real(cmd, "--dp-timeout", o.dp_timeout, {1, 86400},
           "Data-parallel: seconds to wait for another process before ending the run with a message (default 300)");
}

const std::vector<std::string>& data_parallel_flag_names() {
  static const std::vector<std::string> names = {"--zero", "--dp-bucket-mb", "--dp-overlap", "--dp-timeout"};
  return names;
}

}  // namespace toy::cli
