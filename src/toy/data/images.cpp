#include "toy/data/images.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/core.h>

#include "toy/core/error.h"
#include "toy/core/files.h"
#include "toy/core/rng.h"
#include "toy/core/text.h"

#include "stb_image.h"
#include "stb_image_resize.h"
#include "stb_image_write.h"

namespace fs = std::filesystem;

namespace toy {

namespace {

constexpr uint64_t kMaxDataFile = uint64_t(4) << 30;  // 4 GiB of (uncompressed) data

std::string shown(const std::string& p) { return printable(p); }

// The file's bytes, inflated when it is gzip (by its magic, not its name).
std::string read_maybe_gzip(const std::string& path) {
  std::string raw = read_regular_file(path, "[data]", kMaxDataFile);
  if (raw.size() < 2 || uint8_t(raw[0]) != 0x1f || uint8_t(raw[1]) != 0x8b) return raw;
  z_stream zs{};
  TOY_CHECK(inflateInit2(&zs, 15 + 32) == Z_OK, "[data] '{}': cannot start zlib", shown(path));
  std::string out;
  out.resize(std::max<size_t>(raw.size() * 4, 1 << 16));
  zs.next_in = reinterpret_cast<Bytef*>(raw.data());
  zs.avail_in = uInt(raw.size());
  int rc = Z_OK;
  size_t have = 0;
  while (rc != Z_STREAM_END) {
    if (have == out.size()) {
      TOY_CHECK(out.size() < kMaxDataFile, "[data] '{}' inflates to more than {} bytes", shown(path), kMaxDataFile);
      out.resize(out.size() * 2);
    }
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + have);
    zs.avail_out = uInt(std::min<size_t>(out.size() - have, 1u << 30));
    const uInt before = zs.avail_out;
    rc = inflate(&zs, Z_NO_FLUSH);
    have += before - zs.avail_out;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) rc = Z_DATA_ERROR;  // input ended mid-stream
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      const std::string why = zs.msg ? zs.msg : "the compressed stream ends early";
      inflateEnd(&zs);
      fail("[data] '{}' is a damaged or truncated gzip file ({}, after {} bytes)", shown(path), why, have);
    }
  }
  inflateEnd(&zs);
  out.resize(have);
  return out;
}

uint32_t be32(const std::string& d, size_t at) {
  const auto* p = reinterpret_cast<const uint8_t*>(d.data() + at);
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// An IDX file of unsigned bytes with `ndim` dims: returns the dims; data starts after them.
std::vector<int64_t> idx_header(const std::string& d, const std::string& path, int ndim, const char* what) {
  TOY_CHECK(d.size() >= 4, "[data] '{}' is truncated: {} bytes, too short for an IDX header", shown(path), d.size());
  const uint32_t magic = be32(d, 0);
  TOY_CHECK(magic == 0x800u + uint32_t(ndim),
            "[data] '{}' is not an IDX {} file: magic 0x{:08x}, expected 0x{:08x} (unsigned bytes, {} dims)",
            shown(path), what, magic, 0x800u + ndim, ndim);
  TOY_CHECK(d.size() >= 4 + 4 * size_t(ndim), "[data] '{}' is truncated inside its IDX header", shown(path));
  std::vector<int64_t> dims;
  uint64_t n = 1;
  for (int i = 0; i < ndim; ++i) {
    dims.push_back(be32(d, 4 + 4 * size_t(i)));
    n *= uint64_t(dims.back());
    TOY_CHECK(n <= kMaxDataFile, "[data] '{}': IDX dims are implausibly large", shown(path));
  }
  const uint64_t have = d.size() - 4 - 4 * size_t(ndim);
  TOY_CHECK(have >= n, "[data] '{}' is truncated: its header says {} bytes of data, the file has {}", shown(path), n,
            have);
  TOY_CHECK(have == n, "[data] '{}' has {} bytes after the data its header describes (not an IDX file?)",
            shown(path), have - n);
  return dims;
}

std::vector<std::string> digit_classes(int64_t n) {
  std::vector<std::string> c;
  for (int64_t i = 0; i < n; ++i) c.push_back(std::to_string(i));
  return c;
}

bool is_image_name(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return e == ".png" || e == ".jpg" || e == ".jpeg" || e == ".bmp" || e == ".gif" || e == ".tga" || e == ".pgm" ||
         e == ".ppm" || e == ".pnm";
}

// An IDX images file in dir named `stem`-images-idx3-ubyte(.gz), or "".
std::string find_idx(const fs::path& dir, const std::string& stem) {
  for (const char* ext : {"", ".gz"}) {
    const fs::path p = dir / (stem + "-images-idx3-ubyte" + ext);
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

bool has_class_folders(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec)) return true;
  return false;
}

void split_holdout(const ImageSet& all, uint64_t seed, uint64_t stream, double fraction, ImageSet& keep,
                   ImageSet& held) {
  const std::vector<int64_t> perm = seeded_permutation(all.size(), seed, stream);
  const int64_t n_held = int64_t(std::llround(double(all.size()) * fraction));
  std::vector<int64_t> a(perm.begin() + n_held, perm.end()), b(perm.begin(), perm.begin() + n_held);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  keep = all.subset(a);
  held = all.subset(b);
}

}  // namespace

ImageSet ImageSet::subset(std::span<const int64_t> idx) const {
  ImageSet s;
  s.channels = channels, s.height = height, s.width = width, s.classes = classes, s.source = source;
  const int64_t ib = image_bytes();
  s.pixels.resize(size_t(ib) * idx.size());
  s.labels.reserve(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    std::memcpy(s.pixels.data() + int64_t(k) * ib, image(idx[k]), size_t(ib));
    s.labels.push_back(labels[size_t(idx[k])]);
  }
  return s;
}

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

std::string idx_labels_beside(const std::string& images_path) {
  const fs::path p(images_path);
  std::string name = p.filename().string();
  for (auto [from, to] : {std::pair<const char*, const char*>{"images-idx3-ubyte", "labels-idx1-ubyte"},
                          {"images.idx3-ubyte", "labels.idx1-ubyte"},
                          {"images", "labels"}}) {
    const size_t at = name.find(from);
    if (at == std::string::npos) continue;
    std::string cand = name;
    cand.replace(at, std::strlen(from), to);
    for (const std::string& c : {cand, cand + ".gz", cand.size() > 3 && cand.ends_with(".gz")
                                                         ? cand.substr(0, cand.size() - 3) : cand}) {
      std::error_code ec;
      if (fs::exists(p.parent_path() / c, ec)) return (p.parent_path() / c).string();
    }
    fail("[data] no labels file beside '{}': expected '{}' in the same folder", shown(images_path), cand);
  }
  fail("[data] cannot tell the labels file of '{}': an IDX images file is named like train-images-idx3-ubyte[.gz] "
       "and its labels beside it (train-labels-idx1-ubyte[.gz])", shown(images_path));
}

ImageSet read_idx(const std::string& images_path, const std::string& labels_path_in) {
  const std::string labels_path = labels_path_in.empty() ? idx_labels_beside(images_path) : labels_path_in;
  const std::string img = read_maybe_gzip(images_path), lab = read_maybe_gzip(labels_path);
  const std::vector<int64_t> di = idx_header(img, images_path, 3, "images");
  const std::vector<int64_t> dl = idx_header(lab, labels_path, 1, "labels");
  TOY_CHECK(di[0] == dl[0], "[data] image/label count mismatch: '{}' holds {} images but '{}' {} labels",
            shown(images_path), di[0], shown(labels_path), dl[0]);
  TOY_CHECK(di[0] > 0 && di[1] > 0 && di[2] > 0, "[data] '{}' holds no images ({} x {} x {})", shown(images_path),
            di[0], di[1], di[2]);
  ImageSet s;
  s.channels = 1, s.height = di[1], s.width = di[2];
  s.source = images_path;
  s.pixels.assign(img.begin() + 16, img.end());
  int32_t max_label = 0;
  s.labels.reserve(size_t(dl[0]));
  for (int64_t i = 0; i < dl[0]; ++i) {
    const int32_t l = uint8_t(lab[8 + size_t(i)]);
    max_label = std::max(max_label, l);
    s.labels.push_back(l);
  }
  s.classes = digit_classes(std::max(10, max_label + 1));
  return s;
}

ImageSet read_image_csv(const std::string& path) {
  const std::string text = read_maybe_gzip(path);
  ImageSet s;
  s.source = path;
  std::vector<double> values;
  std::vector<double> row;
  int64_t width = -1, line_no = 0;
  double vmax = 0;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    row.clear();
    size_t p = 0;
    while (p <= line.size()) {
      size_t q = line.find(',', p);
      if (q == std::string_view::npos) q = line.size();
      std::string_view cell = line.substr(p, q - p);
      while (!cell.empty() && cell.front() == ' ') cell.remove_prefix(1);
      while (!cell.empty() && cell.back() == ' ') cell.remove_suffix(1);
      double v = 0;
      if (!parse_double(cell, v) || !std::isfinite(v)) {
        // A header row (names, not numbers) is allowed as the first line.
        if (line_no == 1 && s.labels.empty()) goto next_line;
        fail("[data] '{}' line {}: '{}' is not a number", shown(path), line_no, printable(cell, 40));
      }
      row.push_back(v);
      p = q + 1;
    }
    TOY_CHECK(row.size() >= 2, "[data] '{}' line {}: a row needs pixels and a label", shown(path), line_no);
    if (width < 0) {
      width = int64_t(row.size()) - 1;
      const int64_t side = int64_t(std::llround(std::sqrt(double(width))));
      TOY_CHECK(side * side == width, "[data] '{}' line {}: {} pixels per row is not a square image", shown(path),
                line_no, width);
      s.height = s.width = side;
    }
    TOY_CHECK(int64_t(row.size()) - 1 == width, "[data] '{}' line {}: {} pixels, the first row had {}", shown(path),
              line_no, row.size() - 1, width);
    {
      const double label = row.back();
      TOY_CHECK(label >= 0 && label < 100000 && label == std::floor(label),
                "[data] '{}' line {}: the label (last column) must be a class number >= 0, got {}", shown(path),
                line_no, label);
      for (size_t k = 0; k + 1 < row.size(); ++k) {
        TOY_CHECK(row[k] >= 0 && row[k] <= 255, "[data] '{}' line {}: pixel {} is {}, outside 0..255", shown(path),
                  line_no, k, row[k]);
        vmax = std::max(vmax, row[k]);
        values.push_back(row[k]);
      }
      s.labels.push_back(int32_t(label));
    }
  next_line:;
  }
  TOY_CHECK(!s.labels.empty(), "[data] '{}' holds no rows", shown(path));
  // The scale the values were written in: 0..1, 0..16 (the 8x8 digits) or 0..255.
  const double full = vmax <= 1 ? 1 : vmax <= 16 ? 16 : 255;
  s.pixels.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) s.pixels[i] = uint8_t(std::lround(values[i] / full * 255));
  const int32_t max_label = *std::max_element(s.labels.begin(), s.labels.end());
  s.classes = digit_classes(max_label + 1);
  return s;
}

namespace {

constexpr int64_t kMaxImagePixels = int64_t(1) << 26;

uint32_t big_endian32(const std::string& b, size_t at) {
  return uint32_t(uint8_t(b[at])) << 24 | uint32_t(uint8_t(b[at + 1])) << 16 | uint32_t(uint8_t(b[at + 2])) << 8 |
         uint32_t(uint8_t(b[at + 3]));
}

// What stb_image does not check: a PNG's chunk checksums (a damaged file would decode to
// wrong pixels silently) and its size before decoding (stb says "unknown image type" for one
// too large); a PNM's maxval (0 divides by zero in the scale). Throws naming the file.
void check_image_header(const std::string& b, const std::string& path) {
  static const char kPng[8] = {'\x89', 'P', 'N', 'G', '\r', '\n', '\x1a', '\n'};
  if (b.size() >= 8 && std::memcmp(b.data(), kPng, 8) == 0) {
    size_t at = 8;
    bool first = true;
    while (at + 12 <= b.size()) {
      const uint32_t len = big_endian32(b, at);
      TOY_CHECK(len <= b.size() - at - 12, "[data] PNG '{}': chunk at byte {} runs past the end of the file",
                shown(path), at);
      const std::string type = b.substr(at + 4, 4);
      if (first) {
        TOY_CHECK(type == "IHDR" && len >= 8, "[data] PNG '{}': the first chunk is not IHDR", shown(path));
        const uint32_t w = big_endian32(b, at + 8), h = big_endian32(b, at + 12);
        TOY_CHECK(w >= 1 && h >= 1, "[data] PNG '{}' is {}x{}: an image needs at least one pixel", shown(path), w, h);
        TOY_CHECK(uint64_t(w) * uint64_t(h) <= uint64_t(kMaxImagePixels), "[data] PNG '{}' is {}x{}: larger than the {} pixels "
                  "toy reads", shown(path), w, h, kMaxImagePixels);
        first = false;
      }
      const uint32_t want = big_endian32(b, at + 8 + len);
      const uLong got = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(b.data() + at + 4), uInt(len + 4));
      TOY_CHECK(uint32_t(got) == want, "[data] PNG '{}': the checksum of chunk '{}' at byte {} is wrong (a damaged "
                "file)", shown(path), printable(type), at);
      at += 12 + size_t(len);
      if (type == "IEND") break;
    }
    return;
  }
  if (b.size() >= 2 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6') {
    // P1..P6: magic, width, height and (except bitmaps) maxval, separated by white space
    // and # comments.
    size_t at = 2;
    auto number = [&](const char* what) -> int64_t {
      while (at < b.size()) {
        if (std::isspace(uint8_t(b[at]))) {
          ++at;
        } else if (b[at] == '#') {
          while (at < b.size() && b[at] != '\n') ++at;
        } else {
          break;
        }
      }
      TOY_CHECK(at < b.size() && std::isdigit(uint8_t(b[at])), "[data] PNM '{}': its {} is not a number", shown(path),
                what);
      int64_t v = 0;
      while (at < b.size() && std::isdigit(uint8_t(b[at])) && v < (int64_t(1) << 40)) v = v * 10 + (b[at++] - '0');
      return v;
    };
    const int64_t w = number("width"), h = number("height");
    TOY_CHECK(w >= 1 && h >= 1, "[data] PNM '{}' is {}x{}: an image needs at least one pixel", shown(path), w, h);
    TOY_CHECK(w <= kMaxImagePixels / h, "[data] PNM '{}' is {}x{}: larger than the {} pixels toy reads", shown(path),
              w, h, kMaxImagePixels);
    if (b[1] != '1' && b[1] != '4') {
      const int64_t maxval = number("maxval");
      TOY_CHECK(maxval >= 1 && maxval <= 65535, "[data] PNM '{}': maxval {} is outside 1..65535", shown(path), maxval);
    }
  }
}

}  // namespace

Image read_image_file(const std::string& path, int64_t channels, int64_t height, int64_t width) {
  const std::string bytes = read_regular_file(path, "[data]", kMaxDataFile);
  int w = 0, h = 0, c = 0;
  const auto* buf = reinterpret_cast<const stbi_uc*>(bytes.data());
  TOY_CHECK(bytes.size() <= size_t(INT32_MAX), "[data] '{}' is too large for an image", shown(path));
  check_image_header(bytes, path);
  TOY_CHECK(stbi_info_from_memory(buf, int(bytes.size()), &w, &h, &c),
            "[data] cannot read image '{}': {}", shown(path), stbi_failure_reason());
  // (stb_image_resize asserts on an empty image: a crash, not an error)
  TOY_CHECK(w >= 1 && h >= 1, "[data] image '{}' is {}x{}: an image needs at least one pixel", shown(path), w, h);
  TOY_CHECK(int64_t(w) * h <= kMaxImagePixels, "[data] image '{}' is {}x{}: too large", shown(path), w, h);
  const int want = channels == 1 ? 1 : channels == 3 ? 3 : c <= 2 ? 1 : 3;
  // Grey(+alpha) images read as grey and colour as RGB; stb converts between the two.
  stbi_uc* px = stbi_load_from_memory(buf, int(bytes.size()), &w, &h, &c, want);
  TOY_CHECK(px != nullptr, "[data] cannot read image '{}': {}", shown(path), stbi_failure_reason());
  if (w < 1 || h < 1) {
    stbi_image_free(px);
    fail("[data] image '{}' is {}x{}: an image needs at least one pixel", shown(path), w, h);
  }
  std::vector<uint8_t> inter(px, px + size_t(w) * size_t(h) * size_t(want));
  stbi_image_free(px);
  Image im;
  im.channels = want;
  im.height = height > 0 ? height : h;
  im.width = width > 0 ? width : w;
  if (im.height != h || im.width != w) {
    std::vector<uint8_t> out(size_t(im.height * im.width * want));
    TOY_CHECK(stbir_resize_uint8(inter.data(), w, h, 0, out.data(), int(im.width), int(im.height), 0, want),
              "[data] cannot resize image '{}'", shown(path));
    inter = std::move(out);
  }
  // Interleaved HWC -> planar CHW.
  im.pixels.resize(inter.size());
  const int64_t hw = im.height * im.width;
  for (int64_t i = 0; i < hw; ++i)
    for (int k = 0; k < want; ++k) im.pixels[size_t(k * hw + i)] = inter[size_t(i * want + k)];
  return im;
}

std::string encode_png(const uint8_t* planar, int64_t channels, int64_t height, int64_t width) {
  const int64_t hw = height * width;
  std::vector<uint8_t> inter(size_t(hw * channels));
  for (int64_t i = 0; i < hw; ++i)
    for (int64_t k = 0; k < channels; ++k) inter[size_t(i * channels + k)] = planar[k * hw + i];
  std::string out;
  auto sink = [](void* ctx, void* data, int size) { static_cast<std::string*>(ctx)->append((const char*)data, size); };
  stbi_write_png_to_func(sink, &out, int(width), int(height), int(channels), inter.data(), int(width * channels));
  return out;
}

ImageSet read_image_folder(const std::string& dir) {
  std::error_code ec;
  TOY_CHECK(fs::is_directory(dir, ec), "[data] '{}' is not a folder", shown(dir));
  std::vector<fs::path> class_dirs;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec)) class_dirs.push_back(e.path());
  TOY_CHECK(!ec, "[data] cannot list '{}': {}", shown(dir), ec.message());
  std::sort(class_dirs.begin(), class_dirs.end());
  TOY_CHECK(!class_dirs.empty(), "[data] '{}' has no class folders (one sub-folder of images per class)", shown(dir));
  ImageSet s;
  s.source = dir;
  s.height = -1;
  for (size_t c = 0; c < class_dirs.size(); ++c) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(class_dirs[c], ec))
      if (is_image_name(e.path())) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    TOY_CHECK(!files.empty(), "[data] class folder '{}' holds no images (PNG, JPEG, BMP, GIF, TGA, PNM)",
              shown(class_dirs[c].string()));
    s.classes.push_back(class_dirs[c].filename().string());
    for (const fs::path& f : files) {
      Image im = read_image_file(f.string(), s.height < 0 ? 0 : s.channels);
      if (s.height < 0) s.channels = im.channels, s.height = im.height, s.width = im.width;
      TOY_CHECK(im.height == s.height && im.width == s.width,
                "[data] image '{}' is {}x{}, but the first image of '{}' is {}x{}: every image of a set has one size",
                shown(f.string()), im.width, im.height, shown(dir), s.width, s.height);
      s.pixels.insert(s.pixels.end(), im.pixels.begin(), im.pixels.end());
      s.labels.push_back(int32_t(c));
    }
  }
  return s;
}

std::string fashion_mnist_dir() {
  const char* env = std::getenv("TOY_FASHION_MNIST");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> p(size_t(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = i;
  Generator g(seed, stream);
  shuffle(p, g);
  return p;
}

namespace {
constexpr uint64_t kSplitStream = 0x5e17, kValStream = 0x5e18;

// A folder of IDX files: {train images, t10k images}, or empty.
std::pair<std::string, std::string> idx_folder(const std::string& dir) {
  return {find_idx(dir, "train"), find_idx(dir, "t10k")};
}

ImageSet read_set(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return read_image_folder(path);
  std::string lower = path;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  if (lower.ends_with(".csv") || lower.ends_with(".csv.gz")) return read_image_csv(path);
  return read_idx(path);
}

void name_fashion(ImageSet& s) {
  if (s.classes.size() == 10) s.classes = fashion_mnist_classes();
}
}  // namespace

VisionData load_vision_data(const std::string& spec, uint64_t seed, int64_t val_count) {
  VisionData d;
  d.name = spec;
  const bool fashion = spec == "fashion-mnist";
  const std::string path = fashion ? fashion_mnist_dir() : spec;
  std::error_code ec;
  if (fashion)
    TOY_CHECK(fs::exists(path, ec), "[data] Fashion-MNIST is not installed in '{}': apt-get install "
              "dataset-fashion-mnist (or set TOY_FASHION_MNIST to a folder holding its four IDX files)", shown(path));
  TOY_CHECK(fs::exists(path, ec), "[data] '{}' does not exist", shown(path));
  ImageSet train;
  if (fs::is_directory(path, ec)) {
    const auto [tr, te] = idx_folder(path);
    if (!tr.empty() || !te.empty()) {
      TOY_CHECK(!tr.empty() && !te.empty(), "[data] '{}' holds only part of an IDX data set: it needs "
                "train-images-idx3-ubyte[.gz] and t10k-images-idx3-ubyte[.gz] with their labels files", shown(path));
      train = read_idx(tr);
      d.test = read_idx(te);
    } else if (fs::is_directory(fs::path(path) / "train", ec) && fs::is_directory(fs::path(path) / "test", ec)) {
      train = read_image_folder((fs::path(path) / "train").string());
      d.test = read_image_folder((fs::path(path) / "test").string());
      TOY_CHECK(d.test.classes == train.classes, "[data] '{}': train/ and test/ have different class folders",
                shown(path));
    }
  }
  if (train.size() == 0) {
    const ImageSet all = read_set(path);
    split_holdout(all, seed, kSplitStream, 0.2, train, d.test);
    d.seed_split = true;
  }
  if (fashion || fs::path(path).filename() == "fashion-mnist") name_fashion(train), name_fashion(d.test);
  TOY_CHECK(d.test.channels == train.channels && d.test.height == train.height && d.test.width == train.width,
            "[data] the test images ({}x{}x{}) differ in size from the training images ({}x{}x{})", d.test.channels,
            d.test.height, d.test.width, train.channels, train.height, train.width);
  if (d.test.classes.size() != train.classes.size()) {  // labels seen in one part only
    const auto& more = d.test.classes.size() > train.classes.size() ? d.test.classes : train.classes;
    d.test.classes = train.classes = more;
  }
  const int64_t n_val = std::min<int64_t>(val_count, train.size() / 10);
  TOY_CHECK(train.size() - n_val >= 1 && n_val >= 1, "[data] '{}' has {} training images: too few to hold out a "
            "validation set", shown(path), train.size());
  split_holdout(train, seed, kValStream, double(n_val) / double(train.size()), d.train, d.val);
  return d;
}

ImageSet load_eval_data(const std::string& spec) {
  const bool fashion = spec == "fashion-mnist";
  const std::string path = fashion ? fashion_mnist_dir() : spec;
  std::error_code ec;
  TOY_CHECK(fs::exists(path, ec), "[data] '{}' does not exist{}", shown(path),
            fashion ? " (apt-get install dataset-fashion-mnist)" : "");
  ImageSet s;
  if (fs::is_directory(path, ec)) {
    const std::string te = find_idx(path, "t10k");
    if (!te.empty())
      s = read_idx(te);
    else if (fs::is_directory(fs::path(path) / "test", ec) && !fs::is_directory(fs::path(path) / "test" / "test", ec) &&
             has_class_folders(fs::path(path) / "test"))
      s = read_image_folder((fs::path(path) / "test").string());
  }
  if (s.size() == 0) s = read_set(path);
  if (fashion || fs::path(path).filename() == "fashion-mnist" ||
      fs::path(path).parent_path().filename() == "fashion-mnist")
    name_fashion(s);
  return s;
}

}  // namespace toy
