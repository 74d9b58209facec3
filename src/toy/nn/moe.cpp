#include "toy/nn/moe.h"

#include <limits>

#include "toy/core/error.h"
#include "toy/ops/ops.h"

namespace toy::nn {

namespace {

Tensor i32_tensor(const std::vector<int32_t>& v, Device d) {
  return to(from_vector(v, Shape{int64_t(v.size())}), d);
}

// y [M, k, N] (the chosen experts' products of in [M, X, K]) plus an expert adapter's
// scale * B_e A_e in, on the input's dropout while training.
Tensor with_lora(const Tensor& y, const Lora& l, const Tensor& in, const Tensor& sel) {
  if (!l.defined()) return y;
  Generator* gen = TrainingScope::current();
  const Tensor x = l.dropout > 0 && gen ? dropout(in, l.dropout, true, *gen) : in;
  const Tensor low = mul_mat_id(l.b, mul_mat_id(l.a, x, sel), sel);
  return add(y, l.scale == 1.0f ? low : scale(low, l.scale));
}

}  // namespace

Tensor MoeBalance::loss() const {
  if (rows == 0 || !prob_sums.defined()) return Tensor();
  const int64_t E = int64_t(counts.size());
  std::vector<float> share(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) share[size_t(e)] = float(counts[size_t(e)] / double(rows));
  const Tensor f = to(from_vector(share, Shape{E}), prob_sums.device());
  return scale(sum(mul(f, prob_sums)), float(E) / float(rows));
}

Tensor Moe::operator()(const Tensor& x, MoeBalance* balance) const {
  const int64_t D = x.size(-1), M = x.numel() / D, E = experts(), k = used;
  TOY_CHECK(k >= 1 && k <= E, "[moe] {} experts per token of {}", k, E);
  const Tensor x2 = reshape(x, Shape{M, D});
  const Tensor logits = router(x2);                   // [M, E]
  const Tensor probs = softmax(cast(logits, DType::F32));  // [M, E]
  // The chosen experts, read on the host (their grouping decides which matrices are read).
  const Tensor chosen = to(contiguous(top_k(probs.detach(), k).second), Device::CPU);  // I32 [M, k]
  const int32_t* ids = chosen.data<int32_t>();
  std::vector<int32_t> flat(size_t(M * k));
  for (int64_t i = 0; i < M * k; ++i) flat[size_t(i)] = int32_t(i / k * E + ids[i]);
  // Their probabilities, differentiable to the router: [M, k].
  Tensor w = reshape(get_rows(reshape(probs, Shape{M * E, 1}), i32_tensor(flat, x.device())), Shape{M, k});
  if (norm_weights)
    w = div(w, clamp(sum(w, -1, true), 6.103515625e-5f, std::numeric_limits<float>::infinity()));
  if (weights_scale != 0.0f && weights_scale != 1.0f) w = scale(w, weights_scale);
  if (balance) {
    if (balance->counts.empty()) balance->counts.assign(size_t(E), 0.0);
    TOY_CHECK(int64_t(balance->counts.size()) == E, "[moe] layers with different expert counts in one balance");
    for (int64_t i = 0; i < M * k; ++i) balance->counts[size_t(ids[i])] += 1;
    const Tensor s = sum(probs, 0);
    balance->prob_sums = balance->prob_sums.defined() ? add(balance->prob_sums, s) : s;
    balance->rows += M;
  }
  const Tensor sel = to(chosen, x.device());
  const Tensor x3 = reshape(cast(x2, DType::F32), Shape{M, 1, D});
  // [M, k, F] gate and up, the SwiGLU between, [M, k, D] each chosen expert's output.
  const Tensor g = mul_mat_id(gate, x3, sel), u = mul_mat_id(up, x3, sel);
  const Tensor h = swiglu(with_lora(g, gate_lora, x3, sel), with_lora(u, up_lora, x3, sel));
  const Tensor y = with_lora(mul_mat_id(down, h, sel), down_lora, h, sel);
  Tensor out = sum(mul(y, reshape(w, Shape{M, k, 1})), 1);  // [M, D]
  if (shared.down.defined()) out = add(out, cast(shared(x2), DType::F32));
  return reshape(cast(out, x.dtype()), x.shape());
}

}  // namespace toy::nn
