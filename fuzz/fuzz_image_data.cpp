// The vision data readers on arbitrary bytes: the first byte picks the reader — an IDX images
// file with a labels file (the rest split at 0xff 0xfe), gzip-wrapped or not; a CSV file; one
// image file (stb_image) converted and resized to a model's input; a class folder of two
// such images. Either a clean toy::Error or a set whose sizes agree with each other.
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string_view>

#include "fuzz_common.h"
#include "toy/data/images.h"

namespace fs = std::filesystem;
using namespace toy;

namespace {
void write(const std::string& path, std::string_view bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  }
}

void check(const ImageSet& s) {
  FUZZ_ASSERT(int64_t(s.pixels.size()) == s.size() * s.image_bytes());
  for (int32_t l : s.labels) FUZZ_ASSERT(l >= 0 && size_t(l) < s.classes.size());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string root = fuzz::scratch_dir("image_data");
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string dir = root + "/d";
  fs::remove_all(dir);
  fs::create_directories(dir);
  try {
    switch (mode % 4) {
      case 0: {
        const size_t cut = rest.find("\xff\xfe");
        const bool gz = mode & 4;
        const std::string ext = gz ? ".gz" : "";
        write(dir + "/x-images-idx3-ubyte" + ext, rest.substr(0, cut), gz);
        write(dir + "/x-labels-idx1-ubyte" + ext, cut == std::string_view::npos ? "" : rest.substr(cut + 2), gz);
        check(read_idx(dir + "/x-images-idx3-ubyte" + ext));
        break;
      }
      case 1:
        write(dir + "/a.csv", rest, mode & 4);
        check(read_image_csv(dir + "/a.csv"));
        break;
      case 2: {
        write(dir + "/a.png", rest, false);
        const int64_t ch = (mode >> 2) % 4, side = (mode >> 4) % 8;  // 0: as stored
        const Image im = read_image_file(dir + "/a.png", ch, side, side);
        FUZZ_ASSERT(int64_t(im.pixels.size()) == im.channels * im.height * im.width);
        if (side) FUZZ_ASSERT(im.height == side && im.width == side);
        break;
      }
      case 3: {
        fs::create_directories(dir + "/c0");
        fs::create_directories(dir + "/c1");
        const size_t cut = rest.find("\xff\xfe");
        write(dir + "/c0/a.png", rest.substr(0, cut), false);
        write(dir + "/c1/b.bmp", cut == std::string_view::npos ? "" : rest.substr(cut + 2), false);
        check(read_image_folder(dir));
        break;
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
