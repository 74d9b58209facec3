// Label builders (the seed's Toy::Labels): targets for the training objectives, failing loudly
// on out-of-range ids instead of writing outside a row.
//   next_token         — target k = id k+1 (the last position targets itself); every id must
//                        be in the vocabulary (from-scratch data is known-good)
//   next_token_guarded — the same, but out-of-vocabulary targets are left out (ignore index)
//                        instead of failing: for streamed, unchecked corpora
//   masked_next_token  — SFT: inputs seq[0..n-1), target t = id t+1 where that token is
//                        trained (a completion or assistant token), else the ignore index
//   fixed_target       — every position targets one id
//   one_hot_class      — a single-row one-hot [1, classes] (image classification)
//   class_ids          — a batch's class labels as I32 [N] targets (image classification)
// Targets are I32 ids ([T]) for cross_entropy; one_hot() turns ids into F32 one-hot rows.
#pragma once
#include <cstdint>
#include <span>

#include "toy/core/tensor.h"

namespace toy::labels {

inline constexpr int32_t kIgnore = -100;

Tensor next_token(std::span<const int32_t> seq, int64_t vocab);
Tensor next_token_guarded(std::span<const int32_t> seq, int64_t vocab);
// [n - 1] targets for the inputs seq[0..n-1); trained[i] says whether token i is a target.
Tensor masked_next_token(std::span<const int32_t> seq, std::span<const uint8_t> trained, int64_t vocab);
Tensor fixed_target(int64_t vocab, int64_t context, int32_t target);
Tensor one_hot_class(int64_t classes, int32_t label);
Tensor class_ids(std::span<const int32_t> labels, int64_t classes);
// [N] ids -> [N, vocab] F32 one-hot; ignored ids give all-zero rows.
Tensor one_hot(const Tensor& ids, int64_t vocab);

}  // namespace toy::labels
