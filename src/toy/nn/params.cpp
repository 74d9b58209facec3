#include "toy/nn/params.h"

#include "toy/core/error.h"

namespace toy {

Tensor& ParamStore::add(const std::string& name, Tensor t, bool trainable) {
  TOY_CHECK(!has(name), "[params] parameter '{}' added twice", name);
  t.set_name(name);
  if (trainable) t.requires_grad_();
  params_.push_back(std::move(t));
  return params_.back();
}

bool ParamStore::has(const std::string& name) const {
  for (const Tensor& p : params_)
    if (p.name() == name) return true;
  return false;
}

Tensor& ParamStore::get(const std::string& name) {
  for (Tensor& p : params_)
    if (p.name() == name) return p;
  fail("[params] no parameter named '{}'", name);
}

const Tensor& ParamStore::get(const std::string& name) const { return const_cast<ParamStore*>(this)->get(name); }

Tensor& ParamStore::get(const std::string& name, const Shape& expect) {
  Tensor& p = get(name);
  TOY_CHECK(p.shape() == expect, "[params] {}: expected {}, got {}", name, expect.str(), p.shape().str());
  return p;
}

int64_t ParamStore::numel() const {
  int64_t n = 0;
  for (const Tensor& p : params_) n += p.numel();
  return n;
}

void ParamStore::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

}  // namespace toy
