#include "toy/data/labels.h"

#include <vector>

#include "toy/core/error.h"

namespace toy::labels {

namespace {
// Target k is the token after position k (the last position repeats its own token). An
// id outside the vocabulary is an error, or with `guarded` a position the loss ignores.
Tensor shifted_targets(std::span<const int32_t> seq, int64_t vocab, bool guarded, const char* name) {
  TOY_CHECK(!seq.empty(), "[labels] {}: empty sequence", name);
  TOY_CHECK(vocab > 0, "[labels] {}: vocabulary size must be > 0, got {}", name, vocab);
  std::vector<int32_t> t(seq.size());
  for (size_t k = 0; k < seq.size(); ++k) {
    const size_t at = k + 1 < seq.size() ? k + 1 : k;
    const int32_t target = seq[at];
    const bool known = target >= 0 && target < vocab;
    TOY_CHECK(known || guarded, "[labels] {}: id {} at position {} is out of the vocabulary [0, {})", name, target, at,
              vocab);
    t[k] = known ? target : kIgnore;
  }
  return from_vector(t, Shape{int64_t(t.size())});
}
}  // namespace

Tensor next_token(std::span<const int32_t> seq, int64_t vocab) {
  return shifted_targets(seq, vocab, false, "next_token");
}

Tensor next_token_guarded(std::span<const int32_t> seq, int64_t vocab) {
  return shifted_targets(seq, vocab, true, "next_token_guarded");
}

Tensor masked_next_token(std::span<const int32_t> seq, std::span<const uint8_t> trained, int64_t vocab) {
  TOY_CHECK(seq.size() >= 2, "[labels] masked_next_token: needs at least 2 tokens, got {}", seq.size());
  TOY_CHECK(trained.size() == seq.size(), "[labels] masked_next_token: {} tokens but {} mask entries", seq.size(),
            trained.size());
  Tensor t = empty(Shape{int64_t(seq.size()) - 1}, DType::I32);
  int32_t* d = t.data<int32_t>();
  for (size_t i = 1; i < seq.size(); ++i) {
    TOY_CHECK(seq[i] >= 0 && seq[i] < vocab, "[labels] masked_next_token: id {} at position {} is out of the "
              "vocabulary [0, {})", seq[i], i, vocab);
    d[i - 1] = trained[i] ? seq[i] : kIgnore;
  }
  return t;
}

Tensor fixed_target(int64_t vocab, int64_t context, int32_t target) {
  TOY_CHECK(target >= 0 && target < vocab, "[labels] fixed_target: target id {} out of the vocabulary [0, {})", target,
            vocab);
  TOY_CHECK(context > 0, "[labels] fixed_target: context must be > 0, got {}", context);
  return full(Shape{context}, target, DType::I32);
}

Tensor one_hot_class(int64_t classes, int32_t label) {
  TOY_CHECK(classes > 0, "[labels] one_hot_class: class count must be > 0, got {}", classes);
  TOY_CHECK(label >= 0 && label < classes, "[labels] one_hot_class: label {} out of range [0, {})", label, classes);
  Tensor t = zeros(Shape{1, classes});
  t.data<float>()[label] = 1.0f;
  return t;
}

Tensor class_ids(std::span<const int32_t> labels, int64_t classes) {
  TOY_CHECK(classes > 0, "[labels] class_ids: class count must be > 0, got {}", classes);
  for (size_t i = 0; i < labels.size(); ++i)
    TOY_CHECK(labels[i] >= 0 && labels[i] < classes, "[labels] class_ids: label {} (image {}) out of range [0, {})",
              labels[i], i, classes);
  return from_vector(std::vector<int32_t>(labels.begin(), labels.end()), Shape{int64_t(labels.size())});
}

Tensor one_hot(const Tensor& ids, int64_t vocab) {
  TOY_CHECK(ids.dtype() == DType::I32 && ids.ndim() == 1, "[labels] one_hot: ids must be i32 [N], got {}",
            describe(ids));
  std::vector<int32_t> v = ids.to_i32_vector();
  Tensor t = zeros(Shape{int64_t(v.size()), vocab});
  float* p = t.data<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == kIgnore) continue;
    TOY_CHECK(v[i] >= 0 && v[i] < vocab, "[labels] one_hot: id {} at position {} out of range [0, {})", v[i], i, vocab);
    p[int64_t(i) * vocab + v[i]] = 1.0f;
  }
  return t;
}

}  // namespace toy::labels
