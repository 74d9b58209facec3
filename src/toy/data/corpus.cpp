#include "toy/data/corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "toy/core/error.h"
#include "toy/core/hash.h"
#include "toy/core/text.h"
#include "toy/core/files.h"

namespace fs = std::filesystem;

namespace toy {

std::string default_corpus_dir() { return "/usr/share/common-licenses"; }

namespace {

void collect_folder(const fs::path& dir, CorpusListing& out) {
  std::vector<fs::path> found;
  std::error_code ec;
  auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
  TOY_CHECK(!ec, "[data] cannot list the folder '{}': {}", printable(dir.string()), ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    TOY_CHECK(!ec, "[data] cannot list the folder '{}': {}", printable(dir.string()), ec.message());
    const fs::path& q = it->path();
    std::error_code sec;
    const fs::file_status st = it->status(sec);  // follows symlinks: a loop or a broken link fails here
    if (q.filename().string().rfind('.', 0) == 0) {  // hidden: skip (and do not descend)
      if (!sec && fs::is_directory(st)) it.disable_recursion_pending();
      continue;
    }
    if (sec) {
      out.notes.push_back(fmt::format("skipped '{}': {}", printable(q.string()), sec.message()));
    } else if (fs::is_regular_file(st)) {
      found.push_back(q);
    } else if (!fs::is_directory(st)) {
      out.notes.push_back(fmt::format("skipped '{}': not a regular file", printable(q.string())));
    }
  }
  std::sort(found.begin(), found.end());
  for (auto& f : found) out.files.push_back(f.string());
}

}  // namespace

CorpusListing list_corpus(const std::vector<std::string>& paths) {
  CorpusListing out;
  const std::vector<std::string> roots = paths.empty() ? std::vector<std::string>{default_corpus_dir()} : paths;
  for (const std::string& p : roots) {
    TOY_CHECK(!p.empty(), "[data] empty path given as data");
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      const int err = errno;
      fail("[data] '{}' {}", printable(p), err == ENOENT ? std::string("does not exist") : std::strerror(err));
    }
    if (S_ISDIR(st.st_mode)) {
      const size_t before = out.files.size();
      collect_folder(p, out);
      TOY_CHECK(out.files.size() > before, "[data] the folder '{}' holds no files to read", printable(p));
    } else {
      TOY_CHECK(S_ISREG(st.st_mode), "[data] '{}' is {}: give text files or folders", printable(p),
                file_kind(st.st_mode));
      out.files.push_back(p);
    }
  }
  // A file reached twice (named twice, or a symlink to a file already listed) is read once.
  std::vector<std::string> unique;
  std::vector<fs::path> seen;
  for (const std::string& f : out.files) {
    std::error_code ec;
    const fs::path canon = fs::canonical(f, ec);
    if (!ec) {
      if (std::find(seen.begin(), seen.end(), canon) != seen.end()) continue;
      seen.push_back(canon);
    }
    unique.push_back(f);
    struct stat st {};
    if (::stat(f.c_str(), &st) == 0) out.bytes += uint64_t(st.st_size);
  }
  out.files = std::move(unique);
  return out;
}

Corpus read_corpus(const CorpusListing& listing) {
  Corpus c;
  for (const std::string& f : listing.files) {
    std::string t = read_regular_file(f, "[data]");
    if (t.empty()) continue;
    c.identity.push_back({f, uint64_t(t.size()), fnv1a(t)});
    if (!c.text.empty() && c.text.back() != '\n') c.text += '\n';
    c.text += t;
    c.files.push_back(f);
  }
  TOY_CHECK(!c.text.empty(), "[data] no text found in {}",
            listing.files.empty() ? std::string("the given paths") : printable(listing.files.front()));
  c.hash = fnv1a(c.text);
  return c;
}

Corpus read_corpus(const std::vector<std::string>& paths) { return read_corpus(list_corpus(paths)); }

}  // namespace toy
