#include "toy/nn/moe.h"

#include <limits>

#include "toy/core/error.h"
#include "toy/ops/ops.h"

namespace toy::nn {

namespace {

// Expert e's matrix of w [E, N, K]: a [N, K] view (block types slice whole rows).
Tensor expert_matrix(const Tensor& w, int64_t e) { return view(slice(w, 0, e, e + 1), Shape{w.size(1), w.size(2)}); }

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
  Tensor g, u, h, y;  // [M, k, F] gate and up, the SwiGLU between, [M, k, D] each chosen expert's output
  if (gate.dtype() == DType::F32 && up.dtype() == DType::F32 && down.dtype() == DType::F32) {
    g = mul_mat_id(gate, x3, sel), u = mul_mat_id(up, x3, sel);
    h = swiglu(with_lora(g, gate_lora, x3, sel), with_lora(u, up_lora, x3, sel));
    y = with_lora(mul_mat_id(down, h, sel), down_lora, h, sel);
  } else {
    // Grouped by expert: the (token, slot) pairs of each, in order; one product per expert,
    // the results back in pair order.
    std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(E)), pairs(static_cast<size_t>(E));
    for (int64_t i = 0; i < M * k; ++i) {
      tokens[size_t(ids[i])].push_back(int32_t(i / k));
      pairs[size_t(ids[i])].push_back(int32_t(i));
    }
    std::vector<int32_t> where(size_t(M * k));  // pair -> its row in the concatenated outputs
    int32_t next = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int32_t i : pairs[size_t(e)]) where[size_t(i)] = next++;
    const Tensor back = i32_tensor(where, x.device());
    // Each expert's matrix of `stack` [E, N, K] times that expert's rows in[e], back in pair order: [M k, N].
    auto grouped = [&](const Tensor& stack, const std::vector<Tensor>& in) {
      std::vector<Tensor> outs;
      for (int64_t e = 0; e < E; ++e)
        if (in[size_t(e)].defined()) outs.push_back(linear(in[size_t(e)], expert_matrix(stack, e)));
      return get_rows(outs.size() == 1 ? outs[0] : concat(outs, 0), back);
    };
    auto gather = [&](const Tensor& in, const std::vector<std::vector<int32_t>>& rows) {
      std::vector<Tensor> out(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e)
        if (!rows[size_t(e)].empty()) out[size_t(e)] = get_rows(in, i32_tensor(rows[size_t(e)], x.device()));
      return out;
    };
    const std::vector<Tensor> xe = gather(x2, tokens);  // each expert's tokens, [n_e, D]
    const int64_t F = gate.size(1);
    g = reshape(grouped(gate, xe), Shape{M, k, F}), u = reshape(grouped(up, xe), Shape{M, k, F});
    h = swiglu(with_lora(g, gate_lora, x3, sel), with_lora(u, up_lora, x3, sel));
    const Tensor d = reshape(grouped(down, gather(reshape(h, Shape{M * k, F}), pairs)), Shape{M, k, D});
    y = with_lora(d, down_lora, h, sel);
  }
  Tensor out = sum(mul(y, reshape(w, Shape{M, k, 1})), 1);  // [M, D]
  if (shared.down.defined()) out = add(out, cast(shared(x2), DType::F32));
  return reshape(cast(out, x.dtype()), x.shape());
}

}  // namespace toy::nn
