// Training text: one file, several files or folders (read recursively, sorted, hidden files
// skipped), concatenated. With no paths, a corpus every Debian/Ubuntu system has: the
// license texts in /usr/share/common-licenses.
#pragma once
#include <string>
#include <vector>

namespace toy {

struct Corpus {
  std::string text;
  std::vector<std::string> files;  // what was read, in order
};

// Throws toy::Error for a missing path, an unreadable file or an empty result.
Corpus read_corpus(const std::vector<std::string>& paths);
// The default corpus directory (used when no --data is given).
std::string default_corpus_dir();

}  // namespace toy
