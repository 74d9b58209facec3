#include "toy/data/batches.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include <cerrno>

#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/core/files.h"

namespace toy {

TokenSplit split_tokens(const std::vector<int32_t>& tokens, double val_fraction) {
  TOY_CHECK(val_fraction >= 0 && val_fraction < 1, "[data] validation fraction must be in [0, 1), got {}",
            val_fraction);
  const size_t n_train = size_t(double(tokens.size()) * (1.0 - val_fraction));
  TokenSplit s;
  s.train.assign(tokens.begin(), tokens.begin() + std::ptrdiff_t(n_train));
  s.val.assign(tokens.begin() + std::ptrdiff_t(n_train), tokens.end());
  return s;
}

BatchSampler::BatchSampler(const std::vector<int32_t>* tokens, int64_t ctx, int64_t batch, const char* what)
    : tokens_(tokens), ctx_(ctx), batch_(batch) {
  TOY_CHECK(int64_t(tokens->size()) >= ctx + 1,
            "[data] the {} split has {} tokens: fewer than one window of ctx + 1 = {} tokens (use more text or a "
            "smaller --ctx)", what, tokens->size(), ctx + 1);
}

void BatchSampler::sample(Generator& gen, Tensor& inputs, Tensor& targets) const {
  inputs = empty(Shape{batch_, ctx_}, DType::I32);
  targets = empty(Shape{batch_, ctx_}, DType::I32);
  int32_t* x = inputs.data<int32_t>();
  int32_t* y = targets.data<int32_t>();
  const uint64_t n = uint64_t(windows());  // valid starts: [0, n)
  const uint64_t base = gen.reserve(uint64_t(batch_));
  for (int64_t b = 0; b < batch_; ++b) {
    auto u = gen.block(base + uint64_t(b));
    const uint64_t r = (uint64_t(u[0]) << 32) | u[1];
    const size_t start = size_t(r % n);
    std::memcpy(x + b * ctx_, tokens_->data() + start, size_t(ctx_) * 4);
    std::memcpy(y + b * ctx_, tokens_->data() + start + 1, size_t(ctx_) * 4);
  }
}

namespace {
// Header: magic, key (corpus + tokenizer), token count, FNV-1a of the token bytes; then the
// tokens as little-endian i32. The count must match the file's size and the hash its content,
// so a damaged cache is rebuilt instead of trusted.
constexpr char kMagic[8] = {'T', 'O', 'Y', 'T', 'O', 'K', '0', '2'};
constexpr uint64_t kHeaderBytes = 32;

uint64_t token_hash(const std::vector<int32_t>& t) {
  return fnv1a(std::string_view(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(int32_t)));
}
}  // namespace

bool load_token_cache(const std::string& path, uint64_t key, int64_t vocab, uint64_t max_tokens,
                      std::vector<int32_t>& tokens) {
  tokens.clear();
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return false;
  int fd = -1;
  uint64_t size = 0;
  try {
    fd = open_regular_file(path, "[data]", &size);
  } catch (const Error&) {
    return false;  // not a regular file: rebuilt (the rename replaces it)
  }
  std::FILE* f = fdopen(fd, "rb");
  if (!f) {
    ::close(fd);
    return false;
  }
  char magic[8];
  uint64_t k = 0, n = 0, h = 0;
  bool ok = size >= kHeaderBytes && std::fread(magic, 1, 8, f) == 8 && std::memcmp(magic, kMagic, 8) == 0 &&
            std::fread(&k, 8, 1, f) == 1 && std::fread(&n, 8, 1, f) == 1 && std::fread(&h, 8, 1, f) == 1 &&
            k == key && n == (size - kHeaderBytes) / 4 && (size - kHeaderBytes) % 4 == 0 && n <= max_tokens;
  if (ok) {
    tokens.resize(size_t(n));
    ok = std::fread(tokens.data(), 4, size_t(n), f) == size_t(n) && token_hash(tokens) == h;
    for (size_t i = 0; ok && i < tokens.size(); ++i) ok = tokens[i] >= 0 && tokens[i] < vocab;
  }
  std::fclose(f);
  if (!ok) tokens.clear();
  return ok;
}

void save_token_cache(const std::string& path, uint64_t key, const std::vector<int32_t>& tokens) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TOY_CHECK(f != nullptr, "[data] cannot write token cache '{}': {}", printable(tmp), std::strerror(errno));
  const uint64_t n = tokens.size(), h = token_hash(tokens);
  bool ok = std::fwrite(kMagic, 1, 8, f) == 8 && std::fwrite(&key, 8, 1, f) == 1 && std::fwrite(&n, 8, 1, f) == 1 &&
            std::fwrite(&h, 8, 1, f) == 1 && std::fwrite(tokens.data(), 4, tokens.size(), f) == tokens.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    fail("[data] cannot write token cache '{}' (disk full?)", printable(path));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail("[data] cannot write token cache '{}': {}", printable(path), ec.message());
  }
}

}  // namespace toy
