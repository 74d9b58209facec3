// Reader for the tensor fixture files written by tests/fixtures/make_torch_fixtures.py.
// Format (little-endian): magic "TOYFIX01", u32 record count, then per record: u32 name
// length, name, u8 dtype (0 = f32, 1 = f64, 2 = i32), u8 ndim, ndim x i64 dims, raw data.
// A missing, truncated or malformed file throws toy::Error naming the path and the command
// that regenerates it.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "toy/core/error.h"
#include "toy/core/tensor.h"

namespace toy::test {

class Fixture {
 public:
  enum class Type : uint8_t { F32 = 0, F64 = 1, I32 = 2 };
  struct Record {
    Type type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> bytes;  // raw little-endian elements
    int64_t numel() const {
      int64_t n = 1;
      for (int64_t d : dims) n *= d;
      return n;
    }
  };

  static constexpr const char* kRegenerate = "/usr/bin/python3 tests/fixtures/make_torch_fixtures.py";

  explicit Fixture(std::string path) : path_(std::move(path)) {
    std::ifstream f(path_, std::ios::binary);
    if (!f) bad("cannot open the file");
    const std::vector<uint8_t> d((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t at = 0;
    auto take = [&](void* dst, size_t n, const char* what) {
      if (d.size() - at < n) bad(fmt::format("truncated at byte {} reading {}", at, what));
      std::memcpy(dst, d.data() + at, n);
      at += n;
    };
    char magic[8];
    take(magic, 8, "the magic");
    if (std::memcmp(magic, "TOYFIX01", 8) != 0) bad("bad magic (expected TOYFIX01)");
    uint32_t count = 0;
    take(&count, 4, "the record count");
    for (uint32_t r = 0; r < count; ++r) {
      uint32_t len = 0;
      take(&len, 4, "a name length");
      if (len == 0 || len > 4096) bad(fmt::format("record {} has a name length of {}", r, len));
      std::string name(len, '\0');
      take(name.data(), len, "a name");
      uint8_t type = 0, ndim = 0;
      take(&type, 1, "a dtype");
      take(&ndim, 1, "ndim");
      if (type > 2) bad(fmt::format("record '{}' has unknown dtype {}", name, type));
      if (ndim > kMaxDims) bad(fmt::format("record '{}' has {} dims", name, ndim));
      Record rec{Type(type), std::vector<int64_t>(ndim), {}};
      for (auto& dim : rec.dims) {
        take(&dim, 8, "a dim");
        if (dim < 0) bad(fmt::format("record '{}' has dim {}", name, dim));
      }
      // Element count, checked against what is left of the file (no overflow).
      const size_t esize = rec.type == Type::F64 ? 8 : 4, left = (d.size() - at) / esize;
      size_t n = 1;
      for (int64_t dim : rec.dims) {
        if (dim == 0) n = 0;
        if (n != 0 && size_t(dim) > left / n) bad(fmt::format("truncated at byte {} reading '{}'", at, name));
        n *= size_t(dim);
      }
      const size_t bytes = n * esize;
      rec.bytes.resize(bytes);
      take(rec.bytes.data(), bytes, "tensor data");
      if (!records_.emplace(name, std::move(rec)).second) bad(fmt::format("record '{}' appears twice", name));
    }
    if (at != d.size()) bad(fmt::format("{} trailing bytes after {} records", d.size() - at, count));
  }

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return records_.count(name) != 0; }
  size_t size() const { return records_.size(); }

  const Record& get(const std::string& name) const {
    auto it = records_.find(name);
    if (it == records_.end()) bad(fmt::format("no record named '{}'", name));
    return it->second;
  }
  Shape shape(const std::string& name) const { return Shape(get(name).dims); }

  // An f32 record as a fresh contiguous F32 tensor.
  Tensor f32(const std::string& name) const {
    const Record& r = typed(name, Type::F32, "f32");
    std::vector<float> v(size_t(r.numel()));
    if (!v.empty()) std::memcpy(v.data(), r.bytes.data(), r.bytes.size());
    return from_vector(v, Shape(r.dims));
  }
  // An i32 record as an I32 tensor.
  Tensor i32(const std::string& name) const {
    const Record& r = typed(name, Type::I32, "i32");
    std::vector<int32_t> v(size_t(r.numel()));
    if (!v.empty()) std::memcpy(v.data(), r.bytes.data(), r.bytes.size());
    return from_vector(v, Shape(r.dims));
  }
  // Any float record's values widened to double (f32 or f64).
  std::vector<double> f64(const std::string& name) const {
    const Record& r = get(name);
    std::vector<double> v(size_t(r.numel()));
    if (r.type == Type::F64) {
      if (!v.empty()) std::memcpy(v.data(), r.bytes.data(), r.bytes.size());
    } else if (r.type == Type::F32) {
      for (size_t i = 0; i < v.size(); ++i) {
        float x;
        std::memcpy(&x, r.bytes.data() + 4 * i, 4);
        v[i] = x;
      }
    } else {
      bad(fmt::format("record '{}' is i32, not a float tensor", name));
    }
    return v;
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    throw Error(fmt::format("[fixture] {}: {}; regenerate it with `{}` (from the repository root)", path_, why,
                            kRegenerate));
  }
  const Record& typed(const std::string& name, Type t, const char* what) const {
    const Record& r = get(name);
    if (r.type != t) bad(fmt::format("record '{}' is not {}", name, what));
    return r;
  }

  std::string path_;
  std::map<std::string, Record> records_;
};

}  // namespace toy::test
