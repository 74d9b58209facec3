// Training text: one file, several files or folders (read recursively, sorted, hidden files
// skipped), concatenated. With no paths, a corpus every Debian/Ubuntu system has: the
// license texts in /usr/share/common-licenses.
// Listing and reading are separate steps so a caller can check the size against the memory
// the machine has before reading anything. Only regular files are read: FIFOs, devices and
// sockets named directly are refused; inside a folder they, symlink loops and broken links
// are skipped with a note.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace toy {

struct CorpusListing {
  std::vector<std::string> files;  // in reading order
  uint64_t bytes = 0;              // their total size
  std::vector<std::string> notes;  // what was skipped and why
};

// One file's identity in a corpus, for noticing that the data changed between sessions.
struct CorpusFile {
  std::string path;
  uint64_t bytes = 0;
  uint64_t hash = 0;  // FNV-1a of its bytes
};

struct Corpus {
  std::string text;
  std::vector<std::string> files;  // what was read, in order (empty files are skipped)
  std::vector<CorpusFile> identity;  // path, size and hash of every file read
  uint64_t hash = 0;                 // of the whole text
};

// Throws toy::Error for a missing path, a path that is not a regular file or folder, or a
// folder with no files.
CorpusListing list_corpus(const std::vector<std::string>& paths);
// Reads what list_corpus found; throws for an unreadable file (with the OS's reason) or an
// empty result.
Corpus read_corpus(const CorpusListing& listing);
Corpus read_corpus(const std::vector<std::string>& paths);
// The default corpus directory (used when no --data is given).
std::string default_corpus_dir();

}  // namespace toy
