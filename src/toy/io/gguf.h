// GGUF files (../shared/docs/GGUF.md): metadata key/values and tensors, little-endian, v3.
// The reader maps the file and hands out tensors as zero-copy views of the mapping; the
// writer follows llama.cpp's stricter rules (typed keys, names < 64 bytes, at most 4 dims,
// tensors packed in order at 32-byte alignment) and writes through a temporary file that is
// renamed into place, so a crash never leaves half a file.
// Shapes: GGUF's ne[] is innermost-first; toy's shapes are row-major. They are reversed here
// and nowhere else.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "toy/core/tensor.h"

namespace toy::gguf {

enum class Type : int32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
const char* type_name(Type t);

// One metadata value. Scalars keep their exact GGUF type (llama.cpp checks it); arrays hold
// their element type and the elements converted to the widest host type of their kind.
struct Value {
  Type type = Type::U32;
  Type elem = Type::U32;          // arrays: element type
  uint64_t u = 0;                 // U8..U64, BOOL
  int64_t i = 0;                  // I8..I64
  double f = 0;                   // F32, F64
  std::string s;                  // STRING
  std::vector<uint64_t> au;       // array of unsigned / bool
  std::vector<int64_t> ai;        // array of signed
  std::vector<double> af;         // array of floats
  std::vector<std::string> as;    // array of strings

  static Value u32(uint32_t v);
  static Value i32(int32_t v);
  static Value f32(float v);
  static Value u64(uint64_t v);
  static Value boolean(bool v);
  static Value str(std::string v);
  static Value str_array(std::vector<std::string> v);
  static Value f32_array(std::vector<float> v);
  static Value i32_array(std::vector<int32_t> v);
  static Value u32_array(std::vector<uint32_t> v);
  static Value bool_array(std::vector<bool> v);
};

struct TensorInfo {
  std::string name;
  Shape shape;         // row-major (reversed ne)
  DType dtype;
  uint64_t offset;     // from the start of the data section
  size_t bytes;
};

class Reader {
 public:
  // Maps and parses path; throws toy::Error naming the file and what is wrong.
  explicit Reader(const std::string& path);
  // Parses a copy of size bytes at data (for bytes that are not a file: fuzzing, tests);
  // `name` stands for the path in messages.
  Reader(std::string name, const void* data, size_t size);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Typed getters: throw when the key is missing or has another type.
  uint32_t get_u32(const std::string& key) const;
  float get_f32(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_str(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  std::optional<uint32_t> find_u32(const std::string& key) const;
  std::optional<float> find_f32(const std::string& key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;
  // A CPU tensor viewing the mapped bytes (keeps the mapping alive); throws if missing.
  Tensor tensor(const std::string& name) const;

 private:
  void parse();  // the header, metadata and tensor table of map_ (size_ bytes)

  std::string path_;
  uint32_t version_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<TensorInfo> tensors_;
  std::shared_ptr<void> map_;  // the mapping; tensors hold a reference
  size_t size_ = 0;
  size_t data_start_ = 0;
};

class Writer {
 public:
  // Keys keep insertion order; setting a key twice replaces it.
  void set(const std::string& key, Value v);
  bool has(const std::string& key) const;
  // Adds a tensor (any layout; F32/F16/BF16/I32 or block types, at most 4 dims). The data
  // is read when write() runs.
  void add_tensor(const std::string& name, const Tensor& t);
  // A tensor made only when write() reaches its data (then written and dropped): a file of many
  // gigabytes is written holding one tensor at a time. `make` must return this shape and dtype.
  void add_tensor(const std::string& name, const Shape& shape, DType dtype, std::function<Tensor()> make);
  // Writes path atomically (temporary file + rename). Throws toy::Error on any failure.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    Tensor tensor;                 // or undefined: made by `make`
    Shape shape;
    DType dtype;
    std::function<Tensor()> make;
  };
  void check_new(const std::string& name, int ndim) const;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<Entry> tensors_;
};

}  // namespace toy::gguf
