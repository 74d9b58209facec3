// toy: train, fine-tune and run small language models and vision transformers.
// The CPU check comes first and this file is built without AVX flags, so an old CPU gets a
// message instead of an illegal instruction.
// Every error looks alike: "toy: <message>" on stderr (control characters escaped); usage
// errors (unknown or bad flags) exit 2, everything else 1.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include <unistd.h>

#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/core/runtime.h"
#include "toy/core/build_info.h"
#include "toy/core/pending_files.h"
#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/core/trace.h"
#include "toy/dist/comm.h"

namespace {

int report(const char* what, int code, const char* hint = nullptr) {
  std::string msg = toy::printable_message(what);
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  std::fprintf(stderr, "toy: %s\n", msg.c_str());
  if (hint) std::fprintf(stderr, "%s\n", hint);
  return code;
}

// "train", "vision train", "bench train": the subcommands parsed.
std::string command_path(const CLI::App& app) {
  std::string path;
  const CLI::App* at = &app;
  while (true) {
    const auto subs = at->get_subcommands();
    if (subs.empty()) break;
    at = subs.front();
    path += (path.empty() ? "" : " ") + at->get_name();
  }
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS fell back to kernels older than this CPU: run again with the right ones (it reads
  // OPENBLAS_CORETYPE only as it loads; see core/blas_core.h). If the exec fails, go on.
  toy::reexec_with_openblas_core(argv);
  using toy::cli::kExitRuntime;
  using toy::cli::kExitUsage;
  CLI::App app{"toy: train, fine-tune and run small language models and vision transformers"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every command");
  app.set_version_flag("--version", [] { return toy::version_text(); }, "Print the version, commit, compiler and CPU features");
  std::map<CLI::App*, toy::cli::Run> runs;
  auto reg = [&](toy::cli::Run r) { runs[app.get_subcommands({}).back()] = std::move(r); };
  reg(toy::cli::add_train_command(app));
  reg(toy::cli::add_finetune_command(app));
  reg(toy::cli::add_vision_command(app));
  reg(toy::cli::add_classify_command(app));
  reg(toy::cli::add_serve_command(app));
  reg(toy::cli::add_generate_command(app));
  reg(toy::cli::add_chat_command(app));
  reg(toy::cli::add_perplexity_command(app));
  reg(toy::cli::add_eval_command(app));
  reg(toy::cli::add_tokenize_command(app));
  reg(toy::cli::add_template_command(app));
  reg(toy::cli::add_inspect_command(app));
  reg(toy::cli::add_init_command(app));
  reg(toy::cli::add_quantize_command(app));
  reg(toy::cli::add_ops_command(app));
  reg(toy::cli::add_bench_command(app));
  reg(toy::cli::add_demo_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return report(e.what(), kExitUsage, "Run 'toy --help' or 'toy COMMAND --help' for usage.");
  } catch (const toy::Error& e) {  // a flag's own check (--device cuda without a GPU)
    return report(e.what(), kExitUsage);
  }
  const std::string missing = toy::missing_cpu_features();
  if (!missing.empty()) {
    std::fprintf(stderr, "toy: this CPU lacks%s; toy needs AVX2, FMA and F16C (Intel Haswell / AMD Zen or newer)\n",
                 missing.c_str());
    return kExitRuntime;
  }
  toy::remove_pending_files_on_signals();  // (the trainers' stop signals take over theirs)
  // Several processes (mpirun): one run of a trainer; a failure on any rank ends them all
  // (the others would wait for it until --dp-timeout).
  auto fail_run = [](int code) {
    if (toy::dist::world().size() > 1) toy::dist::world().abort(code);
    return code;
  };
  try {
    toy::env_threads();  // a bad TOY_THREADS is an error before anything runs
    toy::dist::init(&argc, &argv);
    if (toy::dist::world().size() > 1) {
      const std::string command = command_path(app);
      TOY_CHECK(command == "train" || command == "finetune" || command == "vision train" || command == "bench train",
                "toy {} runs as one process; mpirun -np N runs toy train, toy finetune, toy vision train and toy bench "
                "train (data-parallel)", command);
      // Each rank's threads: its share of the CPUs it may run on.
      if (!toy::env_threads())
        toy::set_default_threads(std::max(1, toy::dist::affinity_cpus() / toy::dist::world().local_size()));
    }
    toy::trace::open_from_env();
    for (auto& [cmd, run] : runs)
      if (cmd->parsed()) {
        const int rc = run();
        if (rc != 0 && toy::dist::world().size() > 1) return fail_run(rc);
        toy::dist::finalize();
        return rc;
      }
  } catch (const toy::Error& e) {
    return fail_run(report(e.what(), kExitRuntime));
  } catch (const std::exception& e) {
    return fail_run(report((std::string("internal error: ") + e.what()).c_str(), kExitRuntime));
  }
  return 0;
}
