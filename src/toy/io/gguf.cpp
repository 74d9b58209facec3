#include "toy/io/gguf.h"

#include <algorithm>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unordered_set>

#include "toy/core/error.h"
#include "toy/core/pending_files.h"
#include "toy/core/text.h"
#include "toy/core/files.h"
#include "toy/ops/ops.h"

namespace toy::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr size_t kAlignment = 32;
constexpr uint64_t kMaxString = uint64_t(1) << 30;
constexpr uint64_t kMaxArray = uint64_t(1) << 30;

size_t scalar_size(Type t) {
  switch (t) {
    case Type::U8: case Type::I8: case Type::BOOL: return 1;
    case Type::U16: case Type::I16: return 2;
    case Type::U32: case Type::I32: case Type::F32: return 4;
    case Type::U64: case Type::I64: case Type::F64: return 8;
    default: return 0;
  }
}

// The alignment an element of t needs in memory: its size for plain types, that of the f16
// scales inside ggml's block structs for block types.
size_t element_alignment(DType t) {
  const DTypeInfo& i = dtype_info(t);
  return i.block_size == 1 ? size_t(i.block_bytes) : 2;
}

bool is_signed(Type t) { return t == Type::I8 || t == Type::I16 || t == Type::I32 || t == Type::I64; }
bool is_float_type(Type t) { return t == Type::F32 || t == Type::F64; }

// Bounds-checked cursor over the mapped file.
struct Cursor {
  const uint8_t* base;
  size_t size;
  size_t pos = 0;
  const std::string& path;

  void need(size_t n, const char* what) const {
    TOY_CHECK(n <= size && pos <= size - n, "[gguf] {}: truncated file reading {} at byte {} (file has {} bytes)", path,
              what, pos, size);
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    uint64_t n = read<uint64_t>(what);
    TOY_CHECK(n <= kMaxString, "[gguf] {}: {} string of {} bytes is implausible (corrupt file?)", path, what, n);
    need(size_t(n), what);
    std::string s(reinterpret_cast<const char*>(base + pos), size_t(n));
    pos += size_t(n);
    return s;
  }
};

// `key` is the key as shown in messages (already escaped).
void read_scalar(Cursor& c, Type t, Value& v, const std::string& key) {
  switch (t) {
    case Type::U8: v.u = c.read<uint8_t>(key.c_str()); break;
    case Type::I8: v.i = c.read<int8_t>(key.c_str()); break;
    case Type::U16: v.u = c.read<uint16_t>(key.c_str()); break;
    case Type::I16: v.i = c.read<int16_t>(key.c_str()); break;
    case Type::U32: v.u = c.read<uint32_t>(key.c_str()); break;
    case Type::I32: v.i = c.read<int32_t>(key.c_str()); break;
    case Type::F32: v.f = c.read<float>(key.c_str()); break;
    case Type::BOOL: v.u = c.read<uint8_t>(key.c_str()) != 0; break;
    case Type::STRING: v.s = c.string(key.c_str()); break;
    case Type::U64: v.u = c.read<uint64_t>(key.c_str()); break;
    case Type::I64: v.i = c.read<int64_t>(key.c_str()); break;
    case Type::F64: v.f = c.read<double>(key.c_str()); break;
    default: fail("[gguf] {}: key '{}' has unknown value type {}", c.path, key, int(t));
  }
}

// --- writing ---------------------------------------------------------------------------------

struct Out {
  std::FILE* f;
  const std::string& path;
  uint64_t written = 0;
  void bytes(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f) != n) fail("[gguf] cannot write '{}' (disk full?)", path);
    written += n;
  }
  template <class T>
  void pod(T v) {
    bytes(&v, sizeof v);
  }
  void string(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(size_t align) {
    static const char zeros[64] = {};
    while (written % align) bytes(zeros, std::min<size_t>(sizeof zeros, align - written % align));
  }
};

void write_scalar(Out& o, Type t, const Value& v, size_t idx, bool array) {
  auto U = [&] { return array ? v.au[idx] : v.u; };
  auto I = [&] { return array ? v.ai[idx] : v.i; };
  auto F = [&] { return array ? v.af[idx] : v.f; };
  switch (t) {
    case Type::U8: o.pod<uint8_t>(uint8_t(U())); break;
    case Type::I8: o.pod<int8_t>(int8_t(I())); break;
    case Type::U16: o.pod<uint16_t>(uint16_t(U())); break;
    case Type::I16: o.pod<int16_t>(int16_t(I())); break;
    case Type::U32: o.pod<uint32_t>(uint32_t(U())); break;
    case Type::I32: o.pod<int32_t>(int32_t(I())); break;
    case Type::F32: o.pod<float>(float(F())); break;
    case Type::BOOL: o.pod<uint8_t>(U() ? 1 : 0); break;
    case Type::STRING: o.string(array ? v.as[idx] : v.s); break;
    case Type::U64: o.pod<uint64_t>(U()); break;
    case Type::I64: o.pod<int64_t>(I()); break;
    case Type::F64: o.pod<double>(F()); break;
    default: fail("[gguf] cannot write value type {}", int(t));
  }
}

}  // namespace

const char* type_name(Type t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  int i = int(t);
  return i >= 0 && i <= 12 ? names[i] : "unknown";
}

namespace {
Value typed(Type t, Type elem = Type::U32) {
  Value x;
  x.type = t;
  x.elem = elem;
  return x;
}
}  // namespace

Value Value::u32(uint32_t v) { Value x = typed(Type::U32); x.u = v; return x; }
Value Value::i32(int32_t v) { Value x = typed(Type::I32); x.i = v; return x; }
Value Value::f32(float v) { Value x = typed(Type::F32); x.f = v; return x; }
Value Value::u64(uint64_t v) { Value x = typed(Type::U64); x.u = v; return x; }
Value Value::boolean(bool v) { Value x = typed(Type::BOOL); x.u = v; return x; }
Value Value::str(std::string v) { Value x = typed(Type::STRING); x.s = std::move(v); return x; }
Value Value::str_array(std::vector<std::string> v) { Value x = typed(Type::ARRAY, Type::STRING); x.as = std::move(v); return x; }
Value Value::f32_array(std::vector<float> v) { Value x = typed(Type::ARRAY, Type::F32); x.af.assign(v.begin(), v.end()); return x; }
Value Value::i32_array(std::vector<int32_t> v) { Value x = typed(Type::ARRAY, Type::I32); x.ai.assign(v.begin(), v.end()); return x; }
Value Value::u32_array(std::vector<uint32_t> v) { Value x = typed(Type::ARRAY, Type::U32); x.au.assign(v.begin(), v.end()); return x; }
Value Value::bool_array(std::vector<bool> v) { Value x = typed(Type::ARRAY, Type::BOOL); x.au.assign(v.begin(), v.end()); return x; }

// --- Reader ------------------------------------------------------------------------------------

Reader::Reader(const std::string& path) : path_(path) {
  uint64_t file_bytes = 0;
  const int fd = open_regular_file(path, "[gguf]", &file_bytes);
  size_ = size_t(file_bytes);
  if (size_ < 24) {
    ::close(fd);
    fail("[gguf] '{}' is not a GGUF file ({} bytes; a header alone is 24)", printable(path), size_);
  }
  // Private and writable: tensors viewing the file behave like any other (an in-place op
  // copies the touched pages; the file never changes).
  void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  TOY_CHECK(p != MAP_FAILED, "[gguf] cannot map '{}': {}", printable(path), std::strerror(map_errno));
  const size_t sz = size_;
  map_ = std::shared_ptr<void>(p, [sz](void* q) { ::munmap(q, sz); });
  parse();
}

Reader::Reader(std::string name, const void* data, size_t size) : path_(std::move(name)), size_(size) {
  TOY_CHECK(size_ >= 24, "[gguf] '{}' is not a GGUF file ({} bytes; a header alone is 24)", printable(path_), size_);
  // An owned, 64-byte aligned copy, so tensor views are aligned as in a mapped file.
  void* p = std::aligned_alloc(64, (size_ + 63) / 64 * 64);
  TOY_CHECK(p != nullptr, "[gguf] '{}': out of memory for {} bytes", printable(path_), size_);
  std::memcpy(p, data, size_);
  map_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  parse();
}

void Reader::parse() {
  const std::string& path = path_;
  void* p = map_.get();
  const std::string shown = printable(path);
  Cursor c{static_cast<const uint8_t*>(p), size_, 0, shown};
  const uint32_t magic = c.read<uint32_t>("magic");
  TOY_CHECK(magic == kMagic, "[gguf] '{}' is not a GGUF file (magic {:#010x}, expected 0x46554747 \"GGUF\")", shown,
            magic);
  version_ = c.read<uint32_t>("version");
  TOY_CHECK((version_ & 0xffff) != 0, "[gguf] '{}' looks big-endian (version {:#x}); only little-endian is supported",
            shown, version_);
  TOY_CHECK(version_ == 2 || version_ == 3, "[gguf] '{}' has version {}; supported are 2 and 3", shown, version_);
  const int64_t n_tensors = c.read<int64_t>("tensor count");
  const int64_t n_kv = c.read<int64_t>("metadata count");
  TOY_CHECK(n_tensors >= 0 && n_kv >= 0 && uint64_t(n_tensors) < kMaxArray && uint64_t(n_kv) < kMaxArray,
            "[gguf] '{}': implausible counts ({} tensors, {} keys)", shown, n_tensors, n_kv);

  std::unordered_set<std::string> keys_seen, names_seen;
  for (int64_t k = 0; k < n_kv; ++k) {
    std::string key = c.string("key");
    TOY_CHECK(!key.empty(), "[gguf] '{}': empty key at entry {}", shown, k);
    TOY_CHECK(keys_seen.insert(key).second, "[gguf] '{}': duplicate key '{}'", shown, printable(key));
    // Messages name the key escaped (it comes from the file).
    const std::string what = printable(key);
    Value v;
    v.type = Type(c.read<int32_t>(what.c_str()));
    if (v.type == Type::ARRAY) {
      v.elem = Type(c.read<int32_t>(what.c_str()));
      TOY_CHECK(v.elem != Type::ARRAY, "[gguf] '{}': key '{}' is an array of arrays (not allowed)", shown, printable(key));
      TOY_CHECK(v.elem == Type::STRING || scalar_size(v.elem) > 0, "[gguf] '{}': key '{}' has unknown element type {}",
                shown, printable(key), int(v.elem));
      const uint64_t n = c.read<uint64_t>(what.c_str());
      TOY_CHECK(n <= kMaxArray, "[gguf] '{}': key '{}' array of {} elements is implausible", shown, printable(key), n);
      if (v.elem != Type::STRING) c.need(size_t(n) * scalar_size(v.elem), what.c_str());
      for (uint64_t j = 0; j < n; ++j) {
        Value e;
        read_scalar(c, v.elem, e, what);
        if (v.elem == Type::STRING)
          v.as.push_back(std::move(e.s));
        else if (is_float_type(v.elem))
          v.af.push_back(e.f);
        else if (is_signed(v.elem))
          v.ai.push_back(e.i);
        else
          v.au.push_back(e.u);
      }
    } else {
      read_scalar(c, v.type, v, what);
    }
    kv_.emplace_back(std::move(key), std::move(v));
  }

  size_t alignment = kAlignment;
  if (const Value* a = find("general.alignment")) {
    TOY_CHECK(a->type == Type::U32 && a->u > 0 && (a->u & (a->u - 1)) == 0,
              "[gguf] '{}': general.alignment must be a power-of-two u32", shown);
    alignment = size_t(a->u);
  }

  for (int64_t t = 0; t < n_tensors; ++t) {
    TensorInfo ti;
    ti.name = c.string("tensor name");
    TOY_CHECK(names_seen.insert(ti.name).second, "[gguf] '{}': duplicate tensor '{}'", shown, printable(ti.name));
    const uint32_t nd = c.read<uint32_t>("tensor dims");
    TOY_CHECK(nd >= 1 && nd <= 4, "[gguf] '{}': tensor '{}' has {} dims (1..4 allowed)", shown, printable(ti.name), nd);
    int64_t ne[4] = {1, 1, 1, 1};
    for (uint32_t d = 0; d < nd; ++d) {
      ne[d] = c.read<int64_t>("tensor dim");
      TOY_CHECK(ne[d] >= 0, "[gguf] '{}': tensor '{}' has a negative dimension", shown, printable(ti.name));
    }
    const int32_t code = c.read<int32_t>("tensor type");
    try {
      ti.dtype = dtype_from_ggml(code);
    } catch (const Error&) {
      fail("[gguf] '{}': tensor '{}' has type {} which toy does not support", shown, printable(ti.name), code);
    }
    ti.offset = c.read<uint64_t>("tensor offset");
    TOY_CHECK(ne[0] % dtype_info(ti.dtype).block_size == 0, "[gguf] '{}': tensor '{}': ne[0] = {} is not a multiple of "
              "the {} block size {}", shown, printable(ti.name), ne[0], name(ti.dtype), dtype_info(ti.dtype).block_size);
    for (int d = int(nd) - 1; d >= 0; --d) ti.shape.push_back(ne[d]);
    // Sizes come from the file: the element count is overflow-checked and bounded (2^56
    // elements is far past any file) before bytes are computed from it.
    uint64_t rows = 1, elements = 0;
    const bool overflow = __builtin_mul_overflow(uint64_t(ne[1]), uint64_t(ne[2]), &rows) ||
                          __builtin_mul_overflow(rows, uint64_t(ne[3]), &rows) ||
                          __builtin_mul_overflow(uint64_t(ne[0]), rows, &elements) || elements > (uint64_t(1) << 56);
    TOY_CHECK(!overflow, "[gguf] '{}': tensor '{}' has an impossible size (dimensions overflow)", shown, printable(ti.name));
    const uint64_t bytes = uint64_t(row_bytes(ti.dtype, ne[0])) * rows;
    ti.bytes = size_t(bytes);
    TOY_CHECK(ti.offset % alignment == 0, "[gguf] '{}': tensor '{}' offset {} is not aligned to {}", shown, printable(ti.name),
              ti.offset, alignment);
    tensors_.push_back(std::move(ti));
  }
  data_start_ = n_tensors > 0 ? (c.pos + alignment - 1) / alignment * alignment : c.pos;
  for (const TensorInfo& ti : tensors_) {
    // In this order so that nothing wraps: offset and size come from the file.
    const bool inside = data_start_ <= size_ && ti.offset <= size_ - data_start_ &&
                        ti.bytes <= size_ - data_start_ - ti.offset;
    TOY_CHECK(inside, "[gguf] '{}': tensor '{}' ({} bytes at offset {}) runs past the end of the file ({} bytes): "
              "truncated or corrupt?", shown, printable(ti.name), ti.bytes, ti.offset, size_);
    // The mapping starts on a page, so this is the data's address alignment: an f32 at an odd
    // address (possible with general.alignment 1) cannot be read as a float.
    const size_t need = element_alignment(ti.dtype);
    TOY_CHECK((data_start_ + ti.offset) % need == 0, "[gguf] '{}': tensor '{}' data at byte {} is not aligned to the "
              "{} bytes a {} element needs (general.alignment {})", shown, printable(ti.name), data_start_ + ti.offset,
              need, name(ti.dtype), alignment);
  }
  // Two tensors sharing bytes is a corrupt (or crafted) table: an in-place edit of one would
  // change the other. llama.cpp refuses it too (it wants them packed in order).
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& ti : tensors_) by_offset.push_back(&ti);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    TOY_CHECK(a.offset + a.bytes <= b.offset || a.bytes == 0 || b.bytes == 0,
              "[gguf] '{}': tensors '{}' (bytes {}..{}) and '{}' (from byte {}) overlap", shown, printable(a.name),
              a.offset, a.offset + a.bytes, printable(b.name), b.offset);
  }
}

Reader::~Reader() = default;

const Value* Reader::find(const std::string& key) const {
  for (const auto& [k, v] : kv_)
    if (k == key) return &v;
  return nullptr;
}

namespace {
const Value& typed(const Reader& r, const std::string& key, Type t) {
  const Value* v = r.find(key);
  TOY_CHECK(v != nullptr, "[gguf] '{}': missing key '{}'", printable(r.path()), key);
  TOY_CHECK(v->type == t, "[gguf] '{}': key '{}' has type {}, expected {}", printable(r.path()), key, type_name(v->type),
            type_name(t));
  return *v;
}
}  // namespace

uint32_t Reader::get_u32(const std::string& key) const { return uint32_t(typed(*this, key, Type::U32).u); }
float Reader::get_f32(const std::string& key) const { return float(typed(*this, key, Type::F32).f); }
bool Reader::get_bool(const std::string& key) const { return typed(*this, key, Type::BOOL).u != 0; }
const std::string& Reader::get_str(const std::string& key) const { return typed(*this, key, Type::STRING).s; }
uint64_t Reader::get_u64(const std::string& key) const { return typed(*this, key, Type::U64).u; }
std::optional<uint32_t> Reader::find_u32(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_u32(key);
}
std::optional<float> Reader::find_f32(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_f32(key);
}

const TensorInfo* Reader::find_tensor(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

Tensor Reader::tensor(const std::string& name) const {
  const TensorInfo* ti = find_tensor(name);
  TOY_CHECK(ti != nullptr, "[gguf] '{}': missing tensor '{}'", printable(path_), printable(name));
  char* p = static_cast<char*>(map_.get()) + data_start_ + ti->offset;
  auto keep = map_;
  auto storage = std::make_shared<Storage>(p, ti->bytes, Device::CPU, [keep]() {});
  auto impl = new_tensor_impl();
  impl->shape = ti->shape;
  impl->strides = contiguous_strides(ti->shape);
  impl->dtype = ti->dtype;
  impl->storage = std::move(storage);
  impl->name = name;
  return Tensor(std::move(impl));
}

// --- Writer ------------------------------------------------------------------------------------

bool Writer::has(const std::string& key) const {
  for (const auto& kv : kv_)
    if (kv.first == key) return true;
  return false;
}

void Writer::set(const std::string& key, Value v) {
  TOY_CHECK(!key.empty(), "[gguf] empty metadata key");
  for (auto& [k, old] : kv_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}

void Writer::check_new(const std::string& name, int ndim) const {
  TOY_CHECK(!name.empty() && name.size() < 64, "[gguf] tensor name '{}' must have 1 to 63 bytes (llama.cpp limit)", name);
  TOY_CHECK(ndim >= 1 && ndim <= 4, "[gguf] tensor '{}' has {} dims; GGUF allows 1 to 4", name, ndim);
  for (const Entry& e : tensors_) TOY_CHECK(e.name != name, "[gguf] tensor '{}' added twice", name);
}

void Writer::add_tensor(const std::string& name, const Tensor& t) {
  TOY_CHECK(t.defined(), "[gguf] tensor '{}' is undefined", name);
  check_new(name, t.ndim());
  // A device's tensor is copied back now (explicitly, counted): the file is written from host memory.
  Tensor host = is_host(t.device()) ? t : transfer(contiguous(t.detach()), Device::CPU);
  tensors_.push_back({name, host, t.shape(), t.dtype(), nullptr});
}

void Writer::add_tensor(const std::string& name, const Shape& shape, DType dtype, std::function<Tensor()> make) {
  TOY_CHECK(make != nullptr, "[gguf] tensor '{}' has no maker", name);
  check_new(name, shape.ndim());
  tensors_.push_back({name, Tensor(), shape, dtype, std::move(make)});
}

void Writer::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  const PendingFile pending(tmp);  // a signal that ends the process removes it
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TOY_CHECK(f != nullptr, "[gguf] cannot create '{}': {}", tmp, std::strerror(errno));
  try {
    Out o{f, tmp};
    o.pod<uint32_t>(kMagic);
    o.pod<uint32_t>(3);
    o.pod<int64_t>(int64_t(tensors_.size()));
    o.pod<int64_t>(int64_t(kv_.size()));
    for (const auto& [key, v] : kv_) {
      o.string(key);
      o.pod<int32_t>(int32_t(v.type));
      if (v.type == Type::ARRAY) {
        o.pod<int32_t>(int32_t(v.elem));
        size_t n = v.elem == Type::STRING ? v.as.size() : is_float_type(v.elem) ? v.af.size()
                   : is_signed(v.elem)    ? v.ai.size() : v.au.size();
        o.pod<uint64_t>(n);
        for (size_t j = 0; j < n; ++j) write_scalar(o, v.elem, v, j, true);
      } else {
        write_scalar(o, v.type, v, 0, false);
      }
    }
    // Tensor infos with packed, aligned offsets in the same order as the data.
    uint64_t offset = 0;
    for (const Entry& e : tensors_) {
      o.string(e.name);
      o.pod<uint32_t>(uint32_t(e.shape.ndim()));
      for (int d = e.shape.ndim() - 1; d >= 0; --d) o.pod<int64_t>(e.shape[d]);
      o.pod<int32_t>(dtype_info(e.dtype).ggml_type);
      o.pod<uint64_t>(offset);
      const uint64_t bytes = row_bytes(e.dtype, e.shape[e.shape.ndim() - 1]) * uint64_t(e.shape.numel() / e.shape[e.shape.ndim() - 1]);
      offset += (bytes + kAlignment - 1) / kAlignment * kAlignment;
    }
    if (!tensors_.empty()) o.pad_to(kAlignment);
    for (const Entry& e : tensors_) {
      const Tensor t = e.make ? e.make() : e.tensor;
      TOY_CHECK(t.defined() && t.shape() == e.shape && t.dtype() == e.dtype, "[gguf] tensor '{}' was made as {} {}, "
                "declared {} {}", e.name, t.defined() ? name(t.dtype()) : "undefined", t.defined() ? t.shape().str() : "",
                name(e.dtype), e.shape.str());
      const Tensor c = t.is_contiguous() ? t : contiguous_copy(t);
      o.bytes(c.raw_data(), c.nbytes());
      o.pad_to(kAlignment);
    }
    TOY_CHECK(std::fflush(f) == 0 && ::fsync(fileno(f)) == 0, "[gguf] cannot flush '{}' (disk full?)", tmp);
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  std::fclose(f);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail("[gguf] cannot rename '{}' to '{}': {}", tmp, path, ec.message());
  }
}

}  // namespace toy::gguf
