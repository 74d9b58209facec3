// The text corpus reader: a folder of files (arbitrary bytes, empty files, hidden files, a
// sub-folder) listed and read as `toy train --data` does, hashed, then a char vocabulary
// trained on the text must encode and decode it exactly.
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
  // Files are separated by 0xff 0xfe; names: a.txt, sub/b.txt, .hidden, c.txt, ...
  const char* names[] = {"a.txt", "sub/b.txt", ".hidden", "c.txt", "sub/d.md"};
  std::string_view rest(reinterpret_cast<const char*>(data), size);
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
