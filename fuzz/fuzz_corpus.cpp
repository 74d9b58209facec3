// The text corpus reader: a folder of files (arbitrary bytes, empty files, hidden files, a
// sub-folder, and as the first input byte chooses: a symlink loop, a dangling link, a FIFO,
// a link back to the folder) listed and read as `toy train --data` does, hashed, then a
// char vocabulary trained on the text must encode and decode it exactly.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string_view>

#include "fuzz_common.h"
#include "toy/data/corpus.h"
#include "toy/tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string root = fuzz::scratch_dir("corpus");
  const std::string dir = root + "/data";
  fs::remove_all(dir);
  fs::create_directories(dir + "/sub");
  if (size < 1) return 0;
  const uint8_t odd = data[0];
  if (odd & 1) fs::create_symlink("loop", dir + "/loop");
  if (odd & 2) fs::create_symlink(dir + "/missing", dir + "/dangling");
  if (odd & 4) mkfifo((dir + "/pipe").c_str(), 0644);
  if (odd & 8) fs::create_directory_symlink(dir, dir + "/sub/up");
  if (odd & 16) fs::create_symlink(dir + "/a.txt", dir + "/sub/same.txt");  // read once
  // Files are separated by 0xff 0xfe; names: a.txt, sub/b.txt, .hidden, c.txt, ...
  const char* names[] = {"a.txt", "sub/b.txt", ".hidden", "c.txt", "sub/d.md"};
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  for (size_t f = 0; f < 5 && !rest.empty(); ++f) {
    const size_t cut = rest.find("\xff\xfe");
    const std::string_view part = rest.substr(0, cut);
    std::ofstream(dir + "/" + names[f], std::ios::binary).write(part.data(), std::streamsize(part.size()));
    rest = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 2);
  }
  try {
    const CorpusListing listing = list_corpus({dir});
    for (const std::string& f : listing.files) FUZZ_ASSERT(f.find(".hidden") == std::string::npos);
    const Corpus c = read_corpus(listing);
    FUZZ_ASSERT(!c.text.empty() && c.identity.size() == c.files.size());
    auto tok = Tokenizer::train("char", c.text);
    FUZZ_ASSERT(tok->decode(tok->encode(c.text)) == c.text);
  } catch (const Error&) {
  }
  return 0;
}
