// The image data readers: IDX (raw and gzip), CSV, class folders of PNG files, and each kind of
// bad input as an error naming the file.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "helpers.h"
#include "requirements.h"
#include "toy/core/error.h"
#include "toy/data/images.h"
#include "toy/data/labels.h"
#include "toy/train/vision.h"

using namespace toy;
using toy::test::error_of;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("toy_images_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void put_be32(std::string& s, uint32_t v) {
  for (int k = 3; k >= 0; --k) s.push_back(char((v >> (8 * k)) & 0xff));
}

std::string idx_images(int n, int h, int w) {
  std::string s;
  put_be32(s, 0x803), put_be32(s, uint32_t(n)), put_be32(s, uint32_t(h)), put_be32(s, uint32_t(w));
  for (int i = 0; i < n * h * w; ++i) s.push_back(char(i % 251));
  return s;
}

std::string idx_labels(int n) {
  std::string s;
  put_be32(s, 0x801), put_be32(s, uint32_t(n));
  for (int i = 0; i < n; ++i) s.push_back(char(i % 10));
  return s;
}

void write_file(const fs::path& p, const std::string& bytes, bool gzip = false) {
  if (gzip) {
    gzFile f = gzopen(p.c_str(), "wb");
    gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(p, std::ios::binary) << bytes;
  }
}

#define EXPECT_ERROR_MENTIONS(call, a, b)                                          \
  do {                                                                             \
    const std::string msg_ = error_of([&] { call; });                              \
    EXPECT_NE(msg_.find(a), std::string::npos) << "message: " << msg_;             \
    EXPECT_NE(msg_.find(b), std::string::npos) << "message: " << msg_;             \
  } while (0)

// A w x h planar grey PNG of one value.
void write_png(const fs::path& p, int w, int h, uint8_t value, int channels = 1) {
  std::vector<uint8_t> px(size_t(w * h * channels), value);
  const std::string png = encode_png(px.data(), channels, h, w);
  write_file(p, png);
}

}  // namespace

TEST(Images, ReadsIdxRawAndGzipWithLabelsFoundBeside) {
  const fs::path d = scratch("idx");
  write_file(d / "train-images-idx3-ubyte.gz", idx_images(12, 3, 4), true);
  write_file(d / "train-labels-idx1-ubyte.gz", idx_labels(12), true);
  write_file(d / "t10k-images-idx3-ubyte", idx_images(5, 3, 4));
  write_file(d / "t10k-labels-idx1-ubyte", idx_labels(5));
  ImageSet s = read_idx((d / "train-images-idx3-ubyte.gz").string());
  EXPECT_EQ(s.size(), 12);
  EXPECT_EQ(s.height, 3);
  EXPECT_EQ(s.width, 4);
  EXPECT_EQ(s.image(2)[1], uint8_t(2 * 12 + 1));
  EXPECT_EQ(s.labels[7], 7);
  ImageSet t = read_idx((d / "t10k-images-idx3-ubyte").string());
  EXPECT_EQ(t.size(), 5);
  // A folder of IDX files: train (minus a validation part) and the official test set.
  VisionData v = load_vision_data(d.string(), 1, 5000);
  EXPECT_EQ(v.test.size(), 5);
  EXPECT_EQ(v.val.size(), 1);  // min(5000, 12 / 10)
  EXPECT_EQ(v.train.size(), 11);
  EXPECT_FALSE(v.seed_split);
  EXPECT_EQ(load_eval_data(d.string()).size(), 5);  // a folder evaluates its t10k set
  fs::remove_all(d);
}

TEST(Images, BadIdxFilesAreErrorsNamingTheFile) {
  const fs::path d = scratch("idxbad");
  std::string img = idx_images(10, 4, 4);
  write_file(d / "a-images-idx3-ubyte", img.substr(0, img.size() - 7));
  write_file(d / "a-labels-idx1-ubyte", idx_labels(10));
  EXPECT_ERROR_MENTIONS(read_idx((d / "a-images-idx3-ubyte").string()), "a-images-idx3-ubyte", "truncated");
  // A gzip stream cut short.
  std::string gz;
  {
    write_file(d / "full.gz", img, true);
    std::ifstream f(d / "full.gz", std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(f), {});
  }
  write_file(d / "b-images-idx3-ubyte.gz", gz.substr(0, gz.size() / 2));
  write_file(d / "b-labels-idx1-ubyte.gz", idx_labels(10), true);
  EXPECT_ERROR_MENTIONS(read_idx((d / "b-images-idx3-ubyte.gz").string()), "b-images-idx3-ubyte.gz", "truncated");
  write_file(d / "c-images-idx3-ubyte", img);
  write_file(d / "c-labels-idx1-ubyte", idx_labels(9));
  EXPECT_ERROR_MENTIONS(read_idx((d / "c-images-idx3-ubyte").string()), "c-images-idx3-ubyte", "count mismatch");
  write_file(d / "e-images-idx3-ubyte", idx_labels(10));  // a labels file where images belong
  write_file(d / "e-labels-idx1-ubyte", idx_labels(10));
  EXPECT_ERROR_MENTIONS(read_idx((d / "e-images-idx3-ubyte").string()), "e-images-idx3-ubyte", "magic");
  write_file(d / "f-images-idx3-ubyte", img);
  EXPECT_ERROR_MENTIONS(read_idx((d / "f-images-idx3-ubyte").string()), "f-images-idx3-ubyte", "no labels file");
  EXPECT_ERROR_MENTIONS(read_idx((d / "missing-images-idx3-ubyte").string()), "missing-images-idx3-ubyte", "");
  fs::remove_all(d);
}

TEST(Images, ReadsCsvScalesPixelsAndRejectsBadRows) {
  const fs::path d = scratch("csv");
  write_file(d / "a.csv", "0,16,8,4,3\n16,0,0,0,1\n");
  ImageSet s = read_image_csv((d / "a.csv").string());
  EXPECT_EQ(s.size(), 2);
  EXPECT_EQ(s.height, 2);
  EXPECT_EQ(s.image(0)[1], 255);  // the 0..16 scale of the 8x8 digits
  EXPECT_EQ(s.image(0)[2], 128);
  EXPECT_EQ(s.labels[0], 3);
  EXPECT_EQ(s.classes.size(), 4u);
  write_file(d / "b.csv", "0,1,2,3,1\n0,1,2,1\n");
  EXPECT_ERROR_MENTIONS(read_image_csv((d / "b.csv").string()), "b.csv", "line 2");
  write_file(d / "c.csv", "0,1,2,1\n");
  EXPECT_ERROR_MENTIONS(read_image_csv((d / "c.csv").string()), "c.csv", "not a square");
  write_file(d / "e.csv", "p0,p1,p2,p3,label\n0,1,2,3,1\n0,1,x,3,1\n");  // a header row is allowed
  EXPECT_ERROR_MENTIONS(read_image_csv((d / "e.csv").string()), "e.csv", "line 3: 'x' is not a number");
  fs::remove_all(d);
}

TEST(Images, ReadsClassFoldersAndNamesEveryBadFile) {
  const fs::path d = scratch("folder");
  fs::create_directories(d / "cat");
  fs::create_directories(d / "dog");
  for (int i = 0; i < 3; ++i) write_png(d / "cat" / ("c" + std::to_string(i) + ".png"), 6, 5, 10);
  for (int i = 0; i < 2; ++i) write_png(d / "dog" / ("d" + std::to_string(i) + ".png"), 6, 5, 200);
  ImageSet s = read_image_folder(d.string());
  EXPECT_EQ(s.size(), 5);
  EXPECT_EQ(s.classes, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(s.width, 6);
  EXPECT_EQ(s.height, 5);
  EXPECT_EQ(s.labels[4], 1);
  EXPECT_EQ(s.image(4)[0], 200);
  // An image of another size.
  write_png(d / "dog" / "big.png", 7, 5, 1);
  EXPECT_ERROR_MENTIONS(read_image_folder(d.string()), "big.png", "7x5");
  fs::remove(d / "dog" / "big.png");
  // An unreadable image.
  write_file(d / "dog" / "broken.png", "not a png at all");
  EXPECT_ERROR_MENTIONS(read_image_folder(d.string()), "broken.png", "cannot read image");
  fs::remove(d / "dog" / "broken.png");
  // An empty class folder.
  fs::create_directories(d / "emu");
  EXPECT_ERROR_MENTIONS(read_image_folder(d.string()), "emu", "holds no images");
  fs::remove_all(d);
}

TEST(Images, ReadImageFileConvertsChannelsAndResizes) {
  const fs::path d = scratch("file");
  write_png(d / "rgb.png", 16, 16, 90, 3);
  Image im = read_image_file((d / "rgb.png").string(), 1, 8, 8);
  EXPECT_EQ(im.channels, 1);
  EXPECT_EQ(im.height, 8);
  EXPECT_EQ(im.pixels.size(), 64u);
  EXPECT_NEAR(im.pixels[10], 90, 1);
  fs::remove_all(d);
}

// Files stb_image would take wrongly or crash on are errors naming the file and the fault: a
// PNM of zero width or height (stb_image_resize asserted: SIGABRT), a PNM maxval of 0, a PNG
// chunk with a wrong checksum (wrong pixels, silently), a PNG larger than toy reads (stb said
// "unknown image type").
TEST(Images, EmptyDamagedAndHugeImagesAreErrorsNamingTheFault) {
  const fs::path d = scratch("bad_files");
  auto error_for = [&](const std::string& name, const std::string& bytes) {
    write_file(d / name, bytes);
    return error_of([&] { read_image_file((d / name).string(), 1, 8, 8); });
  };
  for (const char* pnm : {"P5\n0 0\n255\n", "P5\n4 0\n255\n", "P2\n0 3\n255\n"}) {
    const std::string e = error_for("empty.pgm", pnm);
    EXPECT_NE(e.find("empty.pgm"), std::string::npos) << e;
    EXPECT_NE(e.find("at least one pixel"), std::string::npos) << e;
  }
  std::string e = error_for("maxval.pgm", std::string("P5\n2 2\n0\n") + std::string(4, '\0'));
  EXPECT_NE(e.find("maxval 0"), std::string::npos) << e;
  write_png(d / "good.png", 4, 4, 100);
  std::string png;
  {
    std::ifstream in(d / "good.png", std::ios::binary);
    png.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_EQ(read_image_file((d / "good.png").string(), 1, 4, 4).pixels[0], 100) << "a whole PNG reads";
  std::string damaged = png;
  damaged[damaged.size() - 20] ^= 0x01;  // a byte of the image data (IDAT), its checksum unchanged
  e = error_for("damaged.png", damaged);
  EXPECT_NE(e.find("damaged.png"), std::string::npos) << e;
  EXPECT_NE(e.find("checksum"), std::string::npos) << e;
  std::string huge = png;  // IHDR says 100000 x 100000 (and its checksum is made to match)
  const std::string side("\x00\x01\x86\xa0", 4);
  huge.replace(16, 4, side), huge.replace(20, 4, side);
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(huge.data() + 12), 17);
  for (int k = 0; k < 4; ++k) huge[size_t(29 + k)] = char(crc >> (24 - 8 * k) & 0xff);
  e = error_for("huge.png", huge);
  EXPECT_NE(e.find("100000x100000"), std::string::npos) << e;
  EXPECT_NE(e.find("larger than"), std::string::npos) << e;
  // Sides whose product overflows 64 bits (the check once wrapped negative and let it pass).
  const std::string widest("\xff\xff\xff\xff", 4);
  huge.replace(16, 4, widest), huge.replace(20, 4, widest);
  const uLong crc2 = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(huge.data() + 12), 17);
  for (int k = 0; k < 4; ++k) huge[size_t(29 + k)] = char(crc2 >> (24 - 8 * k) & 0xff);
  e = error_for("widest.png", huge);
  EXPECT_NE(e.find("4294967295x4294967295"), std::string::npos) << e;
  EXPECT_NE(e.find("larger than"), std::string::npos) << e;
  e = error_for("widest.pgm", "P5\n99999999999999 99999999999999\n255\n");
  EXPECT_NE(e.find("larger than"), std::string::npos) << e;
  fs::remove_all(d);
}

// Labels that are mostly not classes are refused before training: IDX labels all 255 made a
// 256-class model that scored 100%. One empty class (1-based labels leave class 0 empty) is
// counted and only warned about.
TEST(Images, TrainingLabelsThatAreMostlyNotClassesAreRefused) {
  ImageSet s;
  s.classes = std::vector<std::string>(256, "c");
  s.labels = {255, 255, 255};
  s.source = "all255";
  const std::string e = error_of([&] { check_training_classes(s, "all255.idx"); });
  EXPECT_NE(e.find("256 classes"), std::string::npos) << e;
  EXPECT_NE(e.find("only 1 of them"), std::string::npos) << e;
  s.classes = {"0", "1", "2", "3"};
  s.labels = {1, 2, 3, 3};
  EXPECT_EQ(check_training_classes(s, "one_based.csv"), 1);
}

TEST(Images, DigitsSplitEightyTwentyBySeed) {
  const std::string path = test::shared_path("digits.csv.gz");
  TOY_REQUIRE_FILE(path);
  VisionData a = load_vision_data(path, 5), b = load_vision_data(path, 5), c = load_vision_data(path, 6);
  EXPECT_EQ(a.train.size() + a.val.size() + a.test.size(), 1797);
  EXPECT_EQ(a.test.size(), 359);
  EXPECT_TRUE(a.seed_split);
  EXPECT_EQ(a.test.labels, b.test.labels);
  EXPECT_EQ(a.test.pixels, b.test.pixels);
  EXPECT_NE(a.test.pixels, c.test.pixels);
}

TEST(Images, FashionMnistHasItsOfficialSplitAndNames) {
  TOY_REQUIRE_FILE(fashion_mnist_dir() + "/t10k-images-idx3-ubyte.gz");
  VisionData d = load_vision_data("fashion-mnist", 1);
  EXPECT_EQ(d.train.size(), 55000);
  EXPECT_EQ(d.val.size(), 5000);
  EXPECT_EQ(d.test.size(), 10000);
  EXPECT_EQ(d.test.classes[9], "Ankle boot");
}

TEST(Images, ClassIdsFailLoudlyOnAnOutOfRangeClass) {
  const std::vector<int32_t> ok = {0, 2, 1};
  EXPECT_EQ(labels::class_ids(ok, 3).to_i32_vector(), ok);
  const std::vector<int32_t> bad = {0, 3};
  EXPECT_ERROR_MENTIONS(labels::class_ids(bad, 3), "label 3 (image 1) out of range", "[labels]");
}
