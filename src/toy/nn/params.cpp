#include "toy/nn/params.h"

#include <algorithm>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/ops/ops.h"

namespace toy {

Tensor& ParamStore::add(const std::string& name, Tensor t, bool trainable) {
  const bool decay = trainable && t.ndim() >= 2;
  return add(name, std::move(t), trainable, decay);
}

Tensor& ParamStore::add(const std::string& name, Tensor t, bool trainable, bool decay) {
  TOY_CHECK(!has(name), "[params] parameter '{}' added twice", name);
  if (trainable) unpack();
  t.set_name(name);
  if (trainable) t.requires_grad_();
  Param p;
  p.name = name;
  p.value = t;
  p.compute = std::move(t);
  p.trainable = trainable;
  p.decay = decay;
  params_.push_back(std::move(p));
  return params_.back().compute;
}

Tensor& ParamStore::replace(const std::string& name, Tensor t) {
  Param& p = record(name);
  if (p.trainable) unpack();
  t.set_name(name);
  if (p.trainable) t.requires_grad_();
  p.value = t;
  p.compute = std::move(t);
  p.m = Tensor(), p.v = Tensor();
  return p.compute;
}

void ParamStore::remove(const std::string& name) {
  for (auto it = params_.begin(); it != params_.end(); ++it)
    if (it->name == name) {
      if (it->trainable) unpack();
      params_.erase(it);
      return;
    }
  fail("[params] no parameter named '{}'", name);
}

void ParamStore::set_trainable(const std::string& name, bool trainable) {
  Param& p = record(name);
  if (p.trainable != trainable) unpack();
  p.trainable = trainable;
  p.value.requires_grad_(trainable);
  p.decay = trainable && p.value.ndim() >= 2;  // as add() decides
  if (!trainable) {
    p.value.set_grad(Tensor());
    p.m = Tensor(), p.v = Tensor();
  }
}

bool ParamStore::has(const std::string& name) const {
  for (const Param& p : params_)
    if (p.name == name) return true;
  return false;
}

Param& ParamStore::record(const std::string& name) {
  for (Param& p : params_)
    if (p.name == name) return p;
  fail("[params] no parameter named '{}'", name);
}

const Param& ParamStore::record(const std::string& name) const { return const_cast<ParamStore*>(this)->record(name); }

Tensor& ParamStore::get(const std::string& name, const Shape& expect) {
  Tensor& p = get(name);
  TOY_CHECK(p.shape() == expect, "[params] {}: expected {}, got {}", name, expect.str(), p.shape().str());
  return p;
}

int64_t ParamStore::numel() const {
  int64_t n = 0;
  for (const Param& p : params_) n += p.value.numel();
  return n;
}

int64_t ParamStore::trainable_numel() const {
  int64_t n = 0;
  for (const Param& p : params_)
    if (p.trainable) n += p.value.numel();
  return n;
}

void ParamStore::zero_grad() {
  for (Param& p : params_) p.value.zero_grad();
}

void ParamStore::move_to(Device d) {
  if (packed_ && arena_.values.device() != d) {
    // The arena moves whole; its views are re-pointed at the moved buffers.
    for (Tensor* b : {&arena_.values, &arena_.grads, &arena_.m, &arena_.v}) *b = transfer(*b, d);
    for (Param& p : params_) {
      if (p.arena_offset < 0) continue;
      alias_storage_(p.value, arena_.values, p.arena_offset);
      if (p.m.defined()) alias_storage_(p.m, arena_.m, p.arena_offset - arena_.moment_begin);
      if (p.v.defined()) alias_storage_(p.v, arena_.v, p.arena_offset - arena_.moment_begin);
      Tensor home = p.value.grad_home();
      const bool grad_at_home = p.value.grad().defined() && p.value.grad().is_same(home);
      alias_storage_(home, arena_.grads, p.arena_offset);
      if (p.value.grad().defined() && !grad_at_home) p.value.set_grad(transfer(p.value.grad(), d));
    }
  }
  for (Param& p : params_) {
    if (p.arena_offset >= 0) continue;
    move_to_device_(p.value, d);
    if (p.compute.defined() && !p.compute.is_same(p.value)) move_to_device_(p.compute, d);
    if (p.m.defined()) move_to_device_(p.m, d);
    if (p.v.defined()) move_to_device_(p.v, d);
  }
}

void ParamStore::pack() {
  if (packed_) return;
  int64_t n = 0;
  Device d = Device::CPU;
  bool first = true;
  for (const Param& p : params_) {
    if (!p.trainable) continue;
    TOY_CHECK(p.value.dtype() == DType::F32 && p.value.is_contiguous() && p.value.is_leaf(),
              "[params] '{}' trains but is {} {}: a trainable parameter is a contiguous F32 leaf", p.name,
              describe(p.value), p.value.is_contiguous() ? "" : "(strided)");
    TOY_CHECK(first || p.value.device() == d, "[params] '{}' is on {}, the parameters before it on {}", p.name,
              name(p.value.device()), name(d));
    d = p.value.device(), first = false;
    n += p.value.numel();
  }
  NoGradGuard ng;
  const int64_t mb = moment_begin_ < 0 ? 0 : std::min(moment_begin_, n);
  const int64_t me = moment_end_ < 0 ? n : std::clamp(moment_end_, mb, n);
  arena_.values = empty(Shape{n}, DType::F32, d);
  arena_.grads = zeros(Shape{n}, DType::F32, d);
  arena_.m = zeros(Shape{me - mb}, DType::F32, d);
  arena_.v = zeros(Shape{me - mb}, DType::F32, d);
  arena_.moment_begin = mb, arena_.moment_end = me;
  int64_t at = 0;
  auto view = [&](const Tensor& buffer, const Shape& s, int64_t from = 0) {
    return make_view(buffer, s, contiguous_strides(s), buffer.offset() + at - from);
  };
  for (Param& p : params_) {
    if (!p.trainable) continue;
    const Shape& s = p.value.shape();
    Tensor value = view(arena_.values, s);
    Tensor home = view(arena_.grads, s);
    copy_(value, p.value.detach());
    if (at >= mb && at + p.value.numel() <= me) {
      Tensor m = view(arena_.m, s, mb), v = view(arena_.v, s, mb);
      if (p.m.defined()) copy_(m, p.m);
      if (p.v.defined()) copy_(v, p.v);
      p.m = m, p.v = v;
    } else {
      p.m = p.v = Tensor();  // another rank keeps them
    }
    alias_storage_(p.value, arena_.values, at);  // the modules' handle, re-pointed
    if (Tensor g = p.value.grad(); g.defined()) {
      copy_(home, g);
      p.value.set_grad(home);
    }
    p.value.set_grad_home(home);
    p.arena_offset = at;
    at += p.value.numel();
  }
  packed_ = true;
}

void ParamStore::set_moment_range(int64_t begin, int64_t end) {
  if (begin == moment_begin_ && end == moment_end_) return;
  unpack();
  moment_begin_ = begin, moment_end_ = end;
  pack();
}

void ParamStore::unpack() {
  if (!packed_) return;
  for (Param& p : params_) {
    if (p.arena_offset < 0) continue;
    p.value.set_grad_home(Tensor());
    p.arena_offset = -1;
  }
  arena_ = ParamArena{};
  packed_ = false;
}

}  // namespace toy
