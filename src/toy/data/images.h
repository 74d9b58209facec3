// Image classification data: a set of equally sized 8-bit images with class labels, and the
// readers that make one.
//   IDX (MNIST / Fashion-MNIST layout, gzip or not): an images file (magic 0x803, [N, H, W])
//     and a labels file (0x801, [N]); the labels file is found beside the images file
//     ("train-images-idx3-ubyte.gz" -> "train-labels-idx1-ubyte.gz").
//   CSV (gzip or not): one image per row, the pixels then the label; a square image; values
//     0..16 (the 8x8 digits), 0..1 or 0..255, scaled to 0..255.
//   A folder of images, one sub-folder per class (PNG, JPEG, BMP, GIF, TGA read by stb_image);
//     sub-folder names are the class names, in sorted order; every image of a set must have
//     the first one's size and channel count.
// Every reader checks everything it reads: a truncated file, counts that disagree, an image of
// another size, an empty class folder, an unreadable image are toy::Error naming the file.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace toy {

struct ImageSet {
  int64_t channels = 1, height = 0, width = 0;
  std::vector<uint8_t> pixels;        // per image C x H x W (planar), images one after another
  std::vector<int32_t> labels;        // one per image, in [0, classes.size())
  std::vector<std::string> classes;   // class names
  std::string source;                 // where it was read from (messages, events)

  int64_t size() const { return int64_t(labels.size()); }
  int64_t image_bytes() const { return channels * height * width; }
  const uint8_t* image(int64_t i) const { return pixels.data() + i * image_bytes(); }
  // The images at `idx`, in that order (same classes and geometry).
  ImageSet subset(std::span<const int64_t> idx) const;
};

// Fashion-MNIST's ten class names, in label order.
const std::vector<std::string>& fashion_mnist_classes();

// IDX readers. labels_path empty: found beside images_path (idx_labels_beside).
ImageSet read_idx(const std::string& images_path, const std::string& labels_path = "");
std::string idx_labels_beside(const std::string& images_path);
ImageSet read_image_csv(const std::string& path);
ImageSet read_image_folder(const std::string& dir);

// One image file as 8-bit pixels, converted to `channels` (1: luminance, 3: RGB; 0: as stored)
// and resized (bilinear) to height x width (0: as stored). Planar C x H x W.
struct Image {
  int64_t channels = 0, height = 0, width = 0;
  std::vector<uint8_t> pixels;
};
Image read_image_file(const std::string& path, int64_t channels = 0, int64_t height = 0, int64_t width = 0);
// PNG bytes of one planar image (1 or 3 channels), for reports.
std::string encode_png(const uint8_t* planar, int64_t channels, int64_t height, int64_t width);

// A data set for training: train, validation (for the best-model rule; never the test set)
// and test.
//   "fashion-mnist"            Debian's dataset-fashion-mnist (TOY_FASHION_MNIST overrides the
//                              folder): 60,000 train (of which `val_count` held out), t10k test
//   a folder with IDX files    train-images-idx3-ubyte[.gz] and t10k-... the same way
//   a folder with train/ and test/ class folders: those
//   an IDX images file, a CSV file or a class folder: split by seed, 80% train / 20% test
// The validation part is min(val_count, train / 10) images held out of train by seed.
struct VisionData {
  ImageSet train, val, test;
  std::string name;       // the data spec as given
  bool seed_split = false;  // test came from splitting one set by seed
};
VisionData load_vision_data(const std::string& spec, uint64_t seed, int64_t val_count = 5000);
// The set `toy vision eval --data` means: fashion-mnist and IDX folders -> their t10k test
// set; folders with test/ -> that; an IDX images file, a CSV or a class folder -> all of it.
ImageSet load_eval_data(const std::string& spec);
// The folder Debian's dataset-fashion-mnist installs (or TOY_FASHION_MNIST).
std::string fashion_mnist_dir();

// A seeded permutation of 0..n-1 (the counter-based RNG: the same on every machine).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream);

}  // namespace toy
