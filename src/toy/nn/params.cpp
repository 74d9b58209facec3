#include "toy/nn/params.h"

#include "toy/core/error.h"

namespace toy {

Tensor& ParamStore::add(const std::string& name, Tensor t, bool trainable) {
  const bool decay = trainable && t.ndim() >= 2;
  return add(name, std::move(t), trainable, decay);
}

Tensor& ParamStore::add(const std::string& name, Tensor t, bool trainable, bool decay) {
  TOY_CHECK(!has(name), "[params] parameter '{}' added twice", name);
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
      params_.erase(it);
      return;
    }
  fail("[params] no parameter named '{}'", name);
}

void ParamStore::set_trainable(const std::string& name, bool trainable) {
  Param& p = record(name);
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
  for (Param& p : params_) {
    move_to_device_(p.value, d);
    if (p.compute.defined() && !p.compute.is_same(p.value)) move_to_device_(p.compute, d);
    if (p.m.defined()) move_to_device_(p.m, d);
    if (p.v.defined()) move_to_device_(p.v, d);
  }
}

}  // namespace toy
