#include "toy/autograd/node.h"

#include <memory>

namespace toy {

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record(const char* op, Tensor& output, std::vector<Tensor> inputs, BackwardFn fn) {
  auto node = std::make_shared<Node>();
  node->op = op;
  node->inputs = std::move(inputs);
  node->backward = std::move(fn);
  TensorImpl* impl = output.impl();
  impl->grad_fn = std::move(node);
  impl->requires_grad = true;
}

}  // namespace toy
