// toy: train, fine-tune and run small language models and vision transformers.
// The CPU check comes first and this file is built without AVX flags, so an old CPU gets a
// message instead of an illegal instruction.
#include <cstdio>
#include <map>
#include <string>

#include "toy/cli/commands.h"
#include "toy/core/cpu_features.h"
#include "toy/core/error.h"

int main(int argc, char** argv) {
  const std::string missing = toy::missing_cpu_features();
  if (!missing.empty()) {
    std::fprintf(stderr, "toy: this CPU lacks%s; toy needs AVX2, FMA and F16C (Intel Haswell / AMD Zen or newer)\n",
                 missing.c_str());
    return 1;
  }
  CLI::App app{"toy: train, fine-tune and run small language models and vision transformers"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every command");
  std::map<CLI::App*, toy::cli::Run> runs;
  auto reg = [&](toy::cli::Run r) { runs[app.get_subcommands({}).back()] = std::move(r); };
  reg(toy::cli::add_train_command(app));
  reg(toy::cli::add_generate_command(app));
  reg(toy::cli::add_ops_command(app));
  reg(toy::cli::add_bench_command(app));
  reg(toy::cli::add_demo_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [cmd, run] : runs)
      if (cmd->parsed()) return run();
  } catch (const toy::Error& e) {
    std::fprintf(stderr, "toy: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "toy: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
