#include "toy/data/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "toy/core/error.h"

namespace fs = std::filesystem;

namespace toy {

std::string default_corpus_dir() { return "/usr/share/common-licenses"; }

namespace {
std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  TOY_CHECK(in.good(), "[data] cannot read '{}'", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  TOY_CHECK(!in.bad(), "[data] error reading '{}'", p.string());
  return ss.str();
}

void collect(const fs::path& p, std::vector<fs::path>& out) {
  std::error_code ec;
  auto st = fs::status(p, ec);
  TOY_CHECK(!ec && fs::exists(st), "[data] '{}' does not exist", p.string());
  if (fs::is_directory(st)) {
    std::vector<fs::path> found;
    for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      const fs::path& q = it->path();
      if (q.filename().string().rfind('.', 0) == 0) {  // hidden: skip (and do not descend)
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file()) found.push_back(q);
    }
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  } else {
    out.push_back(p);
  }
}
}  // namespace

Corpus read_corpus(const std::vector<std::string>& paths) {
  std::vector<fs::path> files;
  if (paths.empty())
    collect(default_corpus_dir(), files);
  else
    for (const auto& p : paths) collect(p, files);
  Corpus c;
  std::vector<fs::path> seen;  // canonical paths: a symlink to a file already read is skipped
  for (const auto& f : files) {
    std::error_code ec;
    fs::path canon = fs::canonical(f, ec);
    if (!ec) {
      if (std::find(seen.begin(), seen.end(), canon) != seen.end()) continue;
      seen.push_back(canon);
    }
    std::string t = read_file(f);
    if (t.empty()) continue;
    if (!c.text.empty() && c.text.back() != '\n') c.text += '\n';
    c.text += t;
    c.files.push_back(f.string());
  }
  TOY_CHECK(!c.text.empty(), "[data] no text found in {}", paths.empty() ? default_corpus_dir() : paths.front());
  return c;
}

}  // namespace toy
