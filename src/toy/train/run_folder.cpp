#include "toy/train/run_folder.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include <fmt/core.h>

#include "toy/core/error.h"
#include "toy/core/files.h"
#include "toy/core/text.h"

namespace fs = std::filesystem;

namespace toy {

const std::vector<std::string>& run_file_names() {
  static const std::vector<std::string> names = {"model.gguf", "last.gguf",  "best.gguf",  "checkpoint.gguf",
                                                 "tokens.bin", "events.jsonl", "report.html", "adapter.gguf"};
  return names;
}

namespace {

bool is_run_file(const std::string& name) {
  for (const std::string& f : run_file_names())
    if (name == f || name == f + ".tmp") return true;
  return false;
}

std::string list_names(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  std::string out;
  for (size_t i = 0; i < names.size() && i < 6; ++i) out += (i ? ", " : "") + printable(names[i], 80);
  if (names.size() > 6) out += fmt::format(" and {} more", names.size() - 6);
  return out;
}

}  // namespace

void check_new_run_folder(const std::string& dir, bool force) {
  const std::string shown = printable(dir);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return;  // missing: it will be created
  TOY_CHECK(S_ISDIR(st.st_mode), "[train] --out '{}' is {}, not a folder", shown, file_kind(st.st_mode));
  std::vector<std::string> ours, others;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code tec;
    const bool regular = it->is_regular_file(tec) && !tec;
    (regular && is_run_file(name) ? ours : others).push_back(name);
  }
  TOY_CHECK(!ec, "[train] cannot list --out '{}': {}", shown, ec.message());
  // Every run starts its event log (and a stopped one leaves a checkpoint): without either,
  // files that carry a run file's name (a user's own model.gguf) are the user's, not a run.
  auto holds = [&](const std::string& f) {
    return std::find(ours.begin(), ours.end(), f) != ours.end() ||
           std::find(ours.begin(), ours.end(), f + ".tmp") != ours.end();
  };
  if (!holds("events.jsonl") && !holds("checkpoint.gguf")) {
    others.insert(others.end(), ours.begin(), ours.end());
    ours.clear();
  }
  TOY_CHECK(others.empty(),
            "[train] --out '{}' is not empty and holds files that are not toy's ({}): toy writes a new run only into a "
            "missing or empty folder, or replaces one of its own runs with --force; choose another --out",
            shown, list_names(others));
  const bool resumable = std::find(ours.begin(), ours.end(), "checkpoint.gguf") != ours.end();
  TOY_CHECK(ours.empty() || force, "[train] --out '{}' already holds a run ({}): {}replace it with --force, or choose "
            "another --out", shown, list_names(ours),
            resumable ? fmt::format("continue it with `toy train --resume {}`, ", shown)
                      : std::string("it has no checkpoint to continue from; "));
}

void prepare_new_run_folder(const std::string& dir, bool force) {
  check_new_run_folder(dir, force);  // again: nothing may have appeared since
  std::error_code ec;
  fs::create_directories(dir, ec);
  TOY_CHECK(!ec, "[train] cannot create the run folder '{}': {}", printable(dir), ec.message());
  if (!force) return;
  for (const std::string& f : run_file_names())
    for (const std::string& name : {f, f + ".tmp"}) {
      fs::remove(fs::path(dir) / name, ec);
      TOY_CHECK(!ec, "[train] cannot remove '{}' from the run folder '{}': {}", name, printable(dir), ec.message());
    }
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  for (const std::string& f : run_file_names()) {
    const fs::path tmp = fs::path(dir) / (f + ".tmp");
    std::error_code ec;
    if (fs::is_regular_file(fs::symlink_status(tmp, ec)) && fs::remove(tmp, ec)) removed.push_back(tmp.filename().string());
  }
  return removed;
}

}  // namespace toy
