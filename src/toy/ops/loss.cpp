// Cross-entropy fused with log-softmax (per-row log-sum-exp saved), with ignore index,
// per-position weights and an explicit normalizer; and its chunked form over a linear head.
#include "toy/autograd/backward.h"
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::CrossEntropy> k_ce("cross_entropy");
const KernelRef<kern::CrossEntropyBackward> k_ce_bwd("cross_entropy_backward");
const KernelRef<kern::CrossEntropyTotal> k_ce_total("cross_entropy_total");

void check_targets(const Tensor& targets, int64_t V, int32_t ignore, const char* op) {
  check_dtype(targets, DType::I32, op, "targets");
  if (ids_known_in_range(targets, V, &ignore)) return;  // checked on the host before it was uploaded
  Tensor t = transfer(contiguous_nograd(targets), Device::CPU);  // (a counted read on a device)
  const int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    TOY_CHECK(p[i] == ignore || (p[i] >= 0 && p[i] < V),
              "[{}] target [{}] = {} is out of range [0, {}) and is not the ignore index {}", op, i, p[i], V, ignore);
}
}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets, const CrossEntropyOptions& o) {
  OpSpan span("cross_entropy", {&logits_in, &targets});
  const char* op = "cross_entropy";
  check_float(logits_in, op, "logits");
  TOY_CHECK(logits_in.ndim() >= 1, "[cross_entropy] logits must be [..., V]");
  const int64_t V = logits_in.size(-1);
  Shape rows = logits_in.shape();
  rows.pop_back();
  check_defined(targets, op, "targets");
  TOY_CHECK(targets.shape() == rows, "[cross_entropy] targets must have shape {} for logits {}, got {}", rows.str(),
            logits_in.shape().str(), targets.shape().str());
  check_targets(targets, V, o.ignore_index, op);
  Tensor weights;
  if (o.weights.defined()) {
    check_dtype(o.weights, DType::F32, op, "weights");
    TOY_CHECK(o.weights.shape() == rows, "[cross_entropy] weights must have shape {}, got {}", rows.str(),
              o.weights.shape().str());
    weights = contiguous_nograd(o.weights);
  }
  TOY_CHECK(o.normalizer >= 0.0f, "[cross_entropy] normalizer must be >= 0, got {}", o.normalizer);
  Tensor logits = contiguous_nograd(logits_in);
  Tensor tg = contiguous_nograd(targets);
  const int64_t N = rows.numel();
  Tensor loss_rows = empty(Shape{N}, DType::F32, logits.device());
  Tensor lse = empty(Shape{N}, DType::F32, logits.device());
  k_ce(logits.device())(logits, tg, weights, o.ignore_index, loss_rows, lse);
  // The mean over the non-ignored rows (or their summed weight), on the device: no read.
  Tensor loss = empty(Shape{}, logits_in.dtype(), logits.device());
  Tensor inv = empty(Shape{}, DType::F32, logits.device());
  k_ce_total(logits.device())(loss_rows, tg, weights, o.ignore_index, o.normalizer, loss, inv);
  if (needs_grad({&logits_in})) {
    record(op, loss, {logits_in}, [logits, tg, weights, lse, inv, ignore = o.ignore_index](const Tensor& g) -> Grads {
      Tensor d = empty(logits.shape(), logits.dtype(), logits.device());
      k_ce_bwd(logits.device())(logits, tg, weights, ignore, lse, contiguous_nograd(g), inv, d);
      return {d};
    });
  }
  return loss;
}

Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets, int64_t chunk_rows,
                            const CrossEntropyOptions& o) {
  check_float(h, "linear_cross_entropy", "h");
  // (The weight may be stored as F16, BF16 or a block type — a quantized tied head: linear
  // reads it as stored.)
  TOY_CHECK(w.defined() && (is_float(w.dtype()) || is_block(w.dtype())),
            "[linear_cross_entropy] weight must be a float or block tensor, got {}", describe(w));
  TOY_CHECK(w.ndim() == 2 && h.ndim() >= 1 && h.size(-1) == w.size(1),
            "[linear_cross_entropy] h {} and weight {} disagree on D", h.shape().str(), w.shape().str());
  TOY_CHECK(chunk_rows > 0, "[linear_cross_entropy] chunk_rows must be > 0, got {}", chunk_rows);
  const int64_t D = h.size(-1);
  Tensor h2 = reshape(h, Shape{-1, D});
  Tensor t1 = reshape(targets, Shape{-1});
  const int64_t N = h2.size(0);
  TOY_CHECK(t1.numel() == N, "[linear_cross_entropy] {} targets for {} rows", t1.numel(), N);
  Tensor w1 = o.weights.defined() ? reshape(o.weights, Shape{-1}) : Tensor();
  // The normalizer of the whole batch, so that chunk losses add up to the batch mean.
  CrossEntropyOptions co = o;
  if (co.normalizer == 0.0f) {
    Tensor tc = transfer(contiguous_nograd(t1), Device::CPU);
    const int32_t* pt = tc.data<int32_t>();
    Tensor wc = w1.defined() ? transfer(contiguous_nograd(w1), Device::CPU) : Tensor();
    double count = 0;
    for (int64_t i = 0; i < N; ++i)
      if (pt[i] != o.ignore_index) count += wc.defined() ? wc.data<float>()[i] : 1.0;
    co.normalizer = count > 0 ? float(count) : 1.0f;
  }
  Tensor total;
  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
    const int64_t r1 = std::min(N, r0 + chunk_rows);
    Tensor tchunk = slice(t1, 0, r0, r1);
    CrossEntropyOptions ci = co;
    ci.weights = w1.defined() ? slice(w1, 0, r0, r1) : Tensor();
    Tensor part = checkpoint(
        [tchunk, ci](const std::vector<Tensor>& in) { return cross_entropy(linear(in[0], in[1]), tchunk, ci); },
        {slice(h2, 0, r0, r1), w});
    total = total.defined() ? add(total, part) : part;
  }
  return total.defined() ? total : zeros(Shape{}, h.dtype(), h.device());
}

namespace detail {
void define_loss_ops(Registry& r) {
  r.define_op(primitive_op("cross_entropy", {"cross_entropy", "cross_entropy_total", "cross_entropy_backward"},
                           "fused log-softmax + NLL: ignore index, weights, mean over counted positions"));
}
}  // namespace detail

}  // namespace toy
