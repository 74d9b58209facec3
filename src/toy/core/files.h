// Opening files named by a user or found in a folder, safely: only regular files (after
// following symlinks) are read — a FIFO, a device such as /dev/zero, a socket or a folder is
// refused by name instead of hanging or reading forever — and every failure says the OS's
// reason. Outputs that already exist must be regular files too.
#pragma once
#include <cstdint>
#include <string>

namespace toy {

// Opens `path` read-only without blocking (a FIFO with no writer cannot hang it) and checks it
// is a regular file; returns the descriptor (close it) and its size in *bytes. `who` names the
// caller in messages ("[data]", "[gguf]").
int open_regular_file(const std::string& path, const char* who, uint64_t* bytes = nullptr);
// The whole file; refuses files larger than max_bytes (naming both sizes).
std::string read_regular_file(const std::string& path, const char* who, uint64_t max_bytes = UINT64_MAX);
// For a file about to be written: fine when missing or a regular file (or, when allowed, a
// character device such as /dev/stderr, which never blocks an open), else an error.
void check_output_file(const std::string& path, const char* who, bool allow_char_device = false);
// What a checkpoint records of a file it depends on (a base model, a data file), to know on
// resume that it is still the same file.
struct FileIdentity {
  std::string path;
  uint64_t bytes = 0;
  uint64_t hash = 0;  // XXH3-64 of the bytes
};
// Reads the whole file (1 MiB at a time; xxHash runs at memory speed).
FileIdentity file_identity(const std::string& path, const char* who);

// "a folder", "a FIFO", "a character device", ... for the file type bits of st_mode.
const char* file_kind(unsigned mode);

}  // namespace toy
