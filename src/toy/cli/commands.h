// The toy program's subcommands. Each registers its options on the CLI11 app and returns
// the function to run when it is chosen.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace toy::cli {

using Run = std::function<int()>;

Run add_ops_command(CLI::App& app);
Run add_bench_command(CLI::App& app);
Run add_demo_command(CLI::App& app);
Run add_train_command(CLI::App& app);
Run add_finetune_command(CLI::App& app);
Run add_generate_command(CLI::App& app);
Run add_inspect_command(CLI::App& app);
Run add_eval_command(CLI::App& app);
Run add_tokenize_command(CLI::App& app);
Run add_init_command(CLI::App& app);
Run add_chat_command(CLI::App& app);
Run add_perplexity_command(CLI::App& app);
Run add_quantize_command(CLI::App& app);
Run add_vision_command(CLI::App& app);
Run add_classify_command(CLI::App& app);
Run add_serve_command(CLI::App& app);
Run add_template_command(CLI::App& app);

}  // namespace toy::cli
