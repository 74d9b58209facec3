// GGUF reader against hand-made files: whatever the bytes say, a bad file is a toy::Error
// naming the file and the problem, never a crash or a view past the mapping.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/io/gguf.h"
#include "toy/ops/ops.h"

using namespace toy;

namespace {

// Little-endian GGUF v3 bytes, built field by field.
struct Bytes {
  std::string b;
  template <class T>
  Bytes& put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
    return *this;
  }
  Bytes& header(int64_t n_tensors, int64_t n_kv) {
    b += "GGUF";
    return put<uint32_t>(3).put<int64_t>(n_tensors).put<int64_t>(n_kv);
  }
  // Tensor info: dims innermost first, type 0 = f32.
  Bytes& tensor(const std::string& name, std::initializer_list<int64_t> ne, uint64_t offset, int32_t type = 0) {
    str(name).put<uint32_t>(uint32_t(ne.size()));
    for (int64_t d : ne) put<int64_t>(d);
    return put<int32_t>(type).put<uint64_t>(offset);
  }
  Bytes& pad_to(size_t align) {
    b.resize((b.size() + align - 1) / align * align, '\0');
    return *this;
  }
};

std::string temp_path(const std::string& tag) {
  return (std::filesystem::temp_directory_path() / ("toy_gguf_" + std::to_string(getpid()) + "_" + tag + ".gguf"))
      .string();
}

// Expects reading `bytes` to throw an Error whose message holds `needle`.
void expect_rejected(const std::string& tag, const std::string& bytes, const std::string& needle) {
  const std::string path = temp_path(tag);
  std::ofstream(path, std::ios::binary) << bytes;
  try {
    gguf::Reader r(path);
    ADD_FAILURE() << tag << ": no error (expected '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << tag << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << tag << ": message does not name the file";
  }
  std::remove(path.c_str());
}

}  // namespace

TEST(GgufReader, ReadsAHandMadeFile) {
  Bytes f;
  f.header(1, 1).str("general.architecture").put<int32_t>(8).str("toy");
  f.tensor("w", {3, 2}, 0).pad_to(32);
  for (int i = 0; i < 6; ++i) f.put<float>(float(i));
  const std::string path = temp_path("good");
  std::ofstream(path, std::ios::binary) << f.b;
  {
    gguf::Reader r(path);
    EXPECT_EQ(r.get_str("general.architecture"), "toy");
    Tensor w = r.tensor("w");
    EXPECT_EQ(w.shape(), (Shape{2, 3}));
    EXPECT_EQ(w.to_f32_vector(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
    // The mapping is private: an in-place update changes the tensor, never the file.
    NoGradGuard ng;
    copy_(w, zeros(Shape{2, 3}));
    EXPECT_EQ(w.to_f32_vector(), std::vector<float>(6, 0.0f));
  }
  EXPECT_EQ(gguf::Reader(path).tensor("w").to_f32_vector(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  std::remove(path.c_str());
}

TEST(GgufReader, RejectsCorruptFilesWithClearErrors) {
  expect_rejected("magic", "GGUX" + std::string(20, '\0'), "not a GGUF file");
  expect_rejected("short", "GGUF", "not a GGUF file");
  // Dimensions whose product overflows 64 bits.
  expect_rejected("overflow", Bytes().header(1, 0).tensor("w", {int64_t(1) << 40, int64_t(1) << 40}, 0).pad_to(32).b,
                  "impossible size");
  // An offset that would wrap the bounds check around.
  expect_rejected("wrap", Bytes().header(1, 0).tensor("w", {8}, ~uint64_t(31)).pad_to(32).b, "past the end");
  // Data missing: the header promises 64 floats, the file holds none.
  expect_rejected("truncated", Bytes().header(1, 0).tensor("w", {64}, 0).pad_to(32).b, "past the end");
  expect_rejected("dup_tensor", Bytes().header(2, 0).tensor("w", {1}, 0).tensor("w", {1}, 32).pad_to(32).b,
                  "duplicate tensor 'w'");
  expect_rejected("dup_key",
                  Bytes().header(0, 2).str("k").put<int32_t>(4).put<uint32_t>(1).str("k").put<int32_t>(4).put<uint32_t>(2).b,
                  "duplicate key 'k'");
  expect_rejected("dims", Bytes().header(1, 0).tensor("w", {1, 1, 1, 1, 1}, 0).b, "dims");
  expect_rejected("type", Bytes().header(1, 0).tensor("w", {1}, 0, 9999).b, "type 9999");
  expect_rejected("counts", Bytes().header(int64_t(1) << 60, 0).b, "implausible counts");
  // general.alignment 1 puts an f32 tensor at an odd address (found by fuzz_gguf_model: UB).
  {
    Bytes f;
    f.header(1, 1).str("general.alignment").put<int32_t>(4).put<uint32_t>(1).tensor("w", {2}, 1);
    f.b += std::string(1 + 8, '\0');
    expect_rejected("misaligned", f.b, "not aligned");
  }
  // A string whose length runs past the end.
  expect_rejected("string", Bytes().header(0, 1).put<uint64_t>(1000).b + "abc", "truncated");
}
