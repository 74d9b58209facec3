// Rotary position embedding (ggml rope_ext semantics, both layouts, YaRN, Llama 3 factors).
// The backward is the same rotation by -theta applied to the gradient.
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::Rope> k_rope("rope");
}

Tensor rope(const Tensor& x, const Tensor& positions, const RopeOptions& o) {
  OpSpan span("rope", {&x, &positions});
  check_float(x, "rope", "x");
  TOY_CHECK(x.ndim() == 4, "[rope] x must be [B, T, H, D], got {}", x.shape().str());
  const int64_t B = x.size(0), T = x.size(1), D = x.size(3);
  check_dtype(positions, DType::I32, "rope", "positions");
  TOY_CHECK((positions.ndim() == 1 && positions.size(0) == T) ||
                (positions.ndim() == 2 && positions.size(0) == B && positions.size(1) == T),
            "[rope] positions must be [T] = [{}] or [B, T] = [{}, {}], got {}", T, B, T, positions.shape().str());
  kern::RopeArgs a;
  a.n_dims = o.n_dims ? o.n_dims : int(D);
  TOY_CHECK(a.n_dims > 0 && a.n_dims <= D && a.n_dims % 2 == 0,
            "[rope] n_dims must be even and in (0, {}], got {}", D, a.n_dims);
  TOY_CHECK(o.freq_base > 0.0f && o.freq_scale > 0.0f, "[rope] freq_base and freq_scale must be > 0, got {} and {}",
            o.freq_base, o.freq_scale);
  TOY_CHECK(o.ext_factor == 0.0f || o.n_ctx_orig > 0, "[rope] YaRN (ext_factor {}) needs n_ctx_orig > 0",
            o.ext_factor);
  if (o.freq_factors.defined()) {
    check_dtype(o.freq_factors, DType::F32, "rope", "freq_factors");
    TOY_CHECK(o.freq_factors.numel() == a.n_dims / 2, "[rope] freq_factors must have n_dims/2 = {} values, got {}",
              a.n_dims / 2, o.freq_factors.numel());
  }
  const int64_t H = x.size(2);
  a.heads_begin = o.heads_begin;
  a.heads_end = o.heads_end < 0 ? H : o.heads_end;
  TOY_CHECK(a.heads_begin >= 0 && a.heads_begin <= a.heads_end && a.heads_end <= H,
            "[rope] head range [{}, {}) is outside the {} heads", o.heads_begin, o.heads_end, H);
  a.neox = o.neox;
  a.freq_base = o.freq_base;
  a.freq_scale = o.freq_scale;
  a.ext_factor = o.ext_factor;
  a.attn_factor = o.attn_factor;
  a.beta_fast = o.beta_fast;
  a.beta_slow = o.beta_slow;
  a.n_ctx_orig = o.n_ctx_orig;
  Tensor pos = contiguous_nograd(positions);
  Tensor ff = o.freq_factors.defined() ? contiguous_nograd(o.freq_factors) : Tensor();
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  k_rope(x.device())(x, pos, ff, a, y);
  if (needs_grad({&x})) {
    record("rope", y, {x}, [pos, ff, a](const Tensor& g) -> Grads {
      kern::RopeArgs inv = a;
      inv.inverse = true;
      Tensor dx = empty(g.shape(), g.dtype(), g.device());
      k_rope(g.device())(g, pos, ff, inv, dx);
      return {dx};
    });
  }
  return y;
}

namespace detail {
void define_rope_ops(Registry& r) {
  r.define_op(primitive_op("rope", {"rope"},
                           "rotary embedding: normal/neox, freq base/scale/factors, YaRN, explicit positions"));
}
}  // namespace detail

}  // namespace toy
