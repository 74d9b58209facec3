// The run folder of a trainer (`toy train`, and later `toy finetune` and `toy vision train`):
// what may be written where, so that no run is ever lost by starting another on top of it.
//   - a new run goes into a missing or empty folder;
//   - a folder holding a run (only toy's own run files, among them the event log or a
//     checkpoint: a lone model.gguf is a user's file) is refused unless the user asks to
//     --force a replacement, and then only toy's own files are removed;
//   - a folder holding anything else is refused even with --force;
//   - a temporary file left by a killed write (checkpoint.gguf.tmp) is removed at the next
//     start.
// check_* only look; prepare_* write — callers validate everything in between.
#pragma once
#include <string>
#include <vector>

namespace toy {

// The files a trainer writes in its run folder (temporaries are these plus ".tmp").
const std::vector<std::string>& run_file_names();

// Throws toy::Error unless `dir` may receive a new run: missing, empty, or (with force) a
// folder that holds only run files. Writes nothing.
void check_new_run_folder(const std::string& dir, bool force);
// Creates `dir` (and parents) and, with force, removes the run files a previous run left.
void prepare_new_run_folder(const std::string& dir, bool force);
// Removes temporaries of run files (a write killed before its rename); returns their names.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

}  // namespace toy
