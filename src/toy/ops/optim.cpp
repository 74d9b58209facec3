// Optimizer steps as ops: in place on F32 parameters and their state, never recorded.
// lr and step are scalar tensors so a device backend can update them without a host sync.
#include "toy/ops/common.h"

namespace toy {

using namespace detail;

namespace {
const KernelRef<kern::Sgd> k_sgd("sgd");
const KernelRef<kern::AdamW> k_adamw("adamw");
const KernelRef<kern::AdamWRanges> k_adamw_ranges("adamw_ranges");
const KernelRef<kern::SquareNormsRanges> k_square_norms_ranges("square_norms_ranges");
const KernelRef<kern::OptimizerClock> k_clock("optimizer_clock");
const KernelRef<kern::StepClock> k_step_clock("step_clock");

void check_state(const Tensor& t, const Tensor& param, const char* op, const char* what) {
  check_dtype(t, DType::F32, op, what);
  TOY_CHECK(t.is_contiguous(), "[{}] {} must be contiguous", op, what);
  TOY_CHECK(t.shape() == param.shape(), "[{}] {} has shape {}, parameter {} has {}", op, what, t.shape().str(),
            param.name(), param.shape().str());
  check_same_device(t, param, op);
}

void check_scalar(const Tensor& t, const char* op, const char* what) {
  check_dtype(t, DType::F32, op, what);
  TOY_CHECK(t.numel() == 1, "[{}] {} must be a one-element tensor, got shape {}", op, what, t.shape().str());
}
void check_step_clock(const Tensor& t, const char* op) {
  check_dtype(t, DType::I32, op, "step clock");
  TOY_CHECK(t.numel() == 1 && t.is_contiguous(), "[{}] the step clock must be a one-element tensor, got shape {}", op,
            t.shape().str());
}
}  // namespace

void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const Tensor& lr, const SgdOptions& o) {
  const char* op = "sgd";
  OpSpan span(op, {&param});
  check_dtype(param, DType::F32, op, "parameter");
  TOY_CHECK(param.is_contiguous(), "[sgd] parameter {} must be contiguous", param.name());
  check_state(grad, param, op, "gradient");
  check_scalar(lr, op, "lr");
  TOY_CHECK(o.momentum >= 0.0f && o.weight_decay >= 0.0f, "[sgd] momentum and weight decay must be >= 0");
  TOY_CHECK(!o.nesterov || o.momentum > 0.0f, "[sgd] nesterov needs momentum > 0");
  if (o.momentum > 0.0f) check_state(momentum_buf, param, op, "momentum buffer");
  kern::SgdArgs a{o.momentum, o.weight_decay, o.nesterov};
  Tensor none;
  k_sgd(param.device())(param, grad, o.momentum > 0.0f ? momentum_buf : none, lr, a);
}

namespace {
void check_adamw_options(const AdamWOptions& o) {
  TOY_CHECK(o.beta1 >= 0.0f && o.beta1 < 1.0f && o.beta2 >= 0.0f && o.beta2 < 1.0f,
            "[adamw] betas must be in [0, 1), got {} and {}", o.beta1, o.beta2);
  TOY_CHECK(o.eps > 0.0f && o.weight_decay >= 0.0f, "[adamw] eps must be > 0 and weight decay >= 0");
}
void check_adamw_step(const Tensor& step) {
  check_scalar(step, "adamw", "step");
  if (step.device() == Device::CPU)
    TOY_CHECK(step.item() >= 1.0, "[adamw] step must be >= 1 (bias correction), got {}", step.item());
}
// What both forms check: the gradient and moments shaped like the parameter (or the arena:
// `suffix` " arena"), lr and step scalars, the options.
void check_adamw_state(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& lr,
                       const Tensor& step, const AdamWOptions& o, const char* suffix) {
  check_state(grad, param, "adamw", fmt::format("gradient{}", suffix).c_str());
  check_state(m, param, "adamw", fmt::format("first moment{}", suffix).c_str());
  check_state(v, param, "adamw", fmt::format("second moment{}", suffix).c_str());
  check_scalar(lr, "adamw", "lr");
  check_adamw_step(step);
  check_adamw_options(o);
}
}  // namespace

void advance_optimizer_clock(Tensor& step, Tensor& lr, const Tensor& position, const LrSchedule& s) {
  OpSpan span("optimizer_clock", {&step, &lr, &position});
  check_scalar(step, "optimizer_clock", "step");
  check_scalar(lr, "optimizer_clock", "lr");
  check_step_clock(position, "optimizer_clock");
  check_same_device(step, lr, "optimizer_clock");
  check_same_device(step, position, "optimizer_clock");
  TOY_CHECK(s.warmup >= 0 && s.total >= 1 && std::isfinite(s.lr) && std::isfinite(s.min_lr),
            "[optimizer_clock] schedule warmup {} total {} lr {} min_lr {} makes no sense", s.warmup, s.total, s.lr,
            s.min_lr);
  k_clock(step.device())(step, lr, position, s);
}

void advance_step_clock(Tensor& step) {
  OpSpan span("step_clock", {&step});
  check_step_clock(step, "step_clock");
  k_step_clock(step.device())(step);
}

void adamw_step_ranges(Tensor& values, const Tensor& grads, Tensor& m, Tensor& v, const Tensor& lr,
                       const Tensor& step, const AdamWOptions& o, const std::vector<ArenaRange>& ranges) {
  const char* op = "adamw";
  OpSpan span(op, {&values});
  check_dtype(values, DType::F32, op, "arena values");
  TOY_CHECK(values.is_contiguous() && values.ndim() == 1, "[adamw] the arena's values must be contiguous [n], got {}",
            describe(values));
  check_adamw_state(values, grads, m, v, lr, step, o, " arena");
  int64_t at = 0;
  for (const ArenaRange& r : ranges) {
    TOY_CHECK(r.begin >= at && r.begin < r.end && r.end <= values.numel(),
              "[adamw] arena range [{}, {}) is empty, out of order or outside [0, {})", r.begin, r.end,
              values.numel());
    at = r.end;
  }
  kern::AdamWArgs a{o.beta1, o.beta2, o.eps, o.weight_decay};
  k_adamw_ranges(values.device())(values, grads, m, v, lr, step, a, ranges);
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& lr, const Tensor& step,
                const AdamWOptions& o) {
  const char* op = "adamw";
  OpSpan span(op, {&param});
  check_dtype(param, DType::F32, op, "parameter");
  TOY_CHECK(param.is_contiguous(), "[adamw] parameter {} must be contiguous", param.name());
  check_adamw_state(param, grad, m, v, lr, step, o, "");
  kern::AdamWArgs a{o.beta1, o.beta2, o.eps, o.weight_decay};
  k_adamw(param.device())(param, grad, m, v, lr, step, a);
}

Tensor square_norms(const Tensor& x, const std::vector<ArenaRange>& ranges) {
  OpSpan span("square_norms", {&x});
  NoGradGuard ng;
  check_dtype(x, DType::F32, "square_norms", "x");
  TOY_CHECK(x.is_contiguous() && x.ndim() == 1, "[square_norms] x must be contiguous [n], got {}", describe(x));
  for (const ArenaRange& r : ranges)
    TOY_CHECK(r.begin >= 0 && r.begin < r.end && r.end <= x.numel(),
              "[square_norms] range [{}, {}) is empty or outside [0, {})", r.begin, r.end, x.numel());
  if (!k_square_norms_ranges.available(x.device())) {
    std::vector<Tensor> parts;
    for (const ArenaRange& r : ranges) parts.push_back(reshape(sum(square(slice(x, 0, r.begin, r.end))), Shape{1}));
    return parts.empty() ? empty(Shape{0}, DType::F32, x.device()) : concat(parts, 0);
  }
  Tensor out = empty(Shape{int64_t(ranges.size())}, DType::F32, x.device());
  if (!ranges.empty()) k_square_norms_ranges(x.device())(x, ranges, out);
  return out;
}

namespace detail {
void define_optim_ops(Registry& r) {
  r.define_op(primitive_op("sgd", {"sgd"}, "in-place SGD step (momentum, nesterov, weight decay)", false));
  r.define_op(primitive_op("optimizer_clock", {"optimizer_clock"},
                           "step += 1, lr = the warmup + cosine schedule at the loop's step (device scalars)", false));
  r.define_op(primitive_op("step_clock", {"step_clock"}, "a training loop's step += 1 (I32 device scalar)", false));
  r.define_op(primitive_op("adamw", {"adamw", "adamw_ranges"}, "in-place AdamW step (decoupled decay, bias correction)", false));
}
}  // namespace detail

}  // namespace toy
