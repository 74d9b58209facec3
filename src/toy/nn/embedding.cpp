#include "toy/nn/embedding.h"

#include "toy/ops/ops.h"

namespace toy::nn {

Tensor Embedding::operator()(const Tensor& ids) const {
  Tensor rows = get_rows(weight, ids);  // block tables already come back as f32
  return rows.dtype() == DType::F32 ? rows : cast(rows, DType::F32);
}

}  // namespace toy::nn
