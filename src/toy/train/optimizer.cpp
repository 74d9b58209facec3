#include "toy/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "toy/autograd/grad_mode.h"
#include "toy/ops/ops.h"

namespace toy {

AdamW::AdamW(ParamStore& params, AdamWConfig cfg) : params_(params), cfg_(cfg) { params.pack(); }

namespace {
// Brings every gradient into its arena range: the engine accumulates there already; a
// gradient set by hand (set_grad) is copied in and the parameter's grad becomes that range.
void gather_grads_into_arena(ParamStore& params) {
  NoGradGuard ng;
  for (Param& p : params.all()) {
    if (p.arena_offset < 0) continue;
    Tensor g = p.value.grad(), home = p.value.grad_home();
    if (g.defined() && !g.is_same(home)) {
      copy_(home, g);
      p.value.set_grad(home);
    }
  }
}
}  // namespace

void AdamW::step(float lr) {
  NoGradGuard ng;
  params_.pack();  // again after a parameter was added, replaced or (un)frozen
  clock_on(params_.arena()->values.device());
  ++steps_;
  fill_(lr_, lr);
  fill_(step_, double(steps_));
  update();
}

void AdamW::step_on_schedule(const LrSchedule& s, const Tensor& position) {
  NoGradGuard ng;
  params_.pack();
  clock_on(params_.arena()->values.device());
  ++steps_;
  advance_optimizer_clock(step_, lr_, position, s);  // step_ = steps_, lr_ = the schedule at position
  update();
}

void AdamW::clock_on(Device d) {
  // lr and step live on the parameters' device; step holds the steps taken so far.
  if (!lr_.defined() || lr_.device() != d) {
    lr_ = zeros(Shape{}, DType::F32, d), step_ = zeros(Shape{}, DType::F32, d);
    clock_synced_ = false;
  }
  if (!clock_synced_) fill_(step_, double(steps_));
  clock_synced_ = true;
}

void AdamW::update() {
  const ParamArena& a = *params_.arena();
  gather_grads_into_arena(params_);
  // The ranges of the parameters that have a gradient (one with none is left as it is).
  // (A data-parallel rank keeps moments for its shard only: the arena's elements from
  // moment_begin; parameters without moments here are updated by the rank that owns them.)
  const int64_t mb = a.moment_begin, me = a.moment_end;
  std::vector<ArenaRange> ranges;
  for (const Param& p : params_.all()) {
    if (p.arena_offset < 0 || !p.value.grad().defined() || !p.m.defined()) continue;
    const int64_t b = p.arena_offset - mb, e = b + p.value.numel();
    if (!ranges.empty() && ranges.back().end == b && ranges.back().decay == p.decay)
      ranges.back().end = e;
    else if (e > b)
      ranges.push_back({b, e, p.decay});
  }
  Tensor m = a.m, v = a.v;
  if (mb == 0 && me == a.numel()) {
    Tensor values = a.values;
    adamw_step_ranges(values, a.grads, m, v, lr_, step_, {cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay}, ranges);
    return;
  }
  const Shape s{me - mb};
  Tensor values = make_view(a.values, s, contiguous_strides(s), a.values.offset() + mb);
  const Tensor grads = make_view(a.grads, s, contiguous_strides(s), a.grads.offset() + mb);
  adamw_step_ranges(values, grads, m, v, lr_, step_, {cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay}, ranges);
}

bool DynamicLossScale::update(bool finite) {
  if (!finite) {
    scale_ = std::max(1.0f, scale_ / 2);
    good_ = 0;
    return false;
  }
  if (++good_ == interval_) scale_ = std::min(scale_ * 2, 16777216.0f), good_ = 0;
  return true;
}

Tensor grad_square_norms(ParamStore& params) {
  NoGradGuard ng;
  if (const ParamArena* a = params.arena()) {
    // Every gradient in its arena range: one call over the ranges (the same bits as below).
    std::vector<ArenaRange> ranges;
    bool in_arena = true;
    for (Param& p : params.all()) {
      if (!p.value.grad().defined()) continue;
      in_arena = in_arena && p.arena_offset >= 0 && p.value.numel() > 0;
      ranges.push_back({p.arena_offset, p.arena_offset + p.value.numel()});
    }
    if (in_arena && !ranges.empty()) {
      gather_grads_into_arena(params);
      return square_norms(a->grads, ranges);
    }
  }
  std::vector<Tensor> parts;
  for (Param& p : params.all()) {
    Tensor g = p.value.grad();
    if (g.defined()) parts.push_back(reshape(sum(square(g)), Shape{1}));
  }
  if (parts.empty()) return Tensor();
  return parts.size() == 1 ? parts[0] : concat(parts, 0);
}

double clip_grad_norm(ParamStore& params, double max_norm) {
  const Tensor parts = grad_square_norms(params);
  return clip_grad_norm_from(params, parts.defined() ? parts.to_f32_vector() : std::vector<float>{}, max_norm);
}

double clip_grad_norm_from(ParamStore& params, const std::vector<float>& square_norms, double max_norm) {
  NoGradGuard ng;
  double total = 0;
  for (float s : square_norms) total += s;
  const double norm = std::sqrt(total);
  if (max_norm > 0 && norm > max_norm) scale_grads(params, float(max_norm / (norm + 1e-6)));
  return norm;
}

void scale_grads(ParamStore& params, float s) {
  NoGradGuard ng;
  if (const ParamArena* a = params.arena()) {
    gather_grads_into_arena(params);
    Tensor grads = a->grads;
    scale_(grads, s);  // ranges without a gradient this step hold nothing anyone reads
  }
  for (Param& p : params.all())
    if (p.arena_offset < 0 && p.value.grad().defined()) p.value.set_grad(scale(p.value.grad(), s));
}

}  // namespace toy
