// Reverse-mode differentiation over the tape.
#pragma once
#include <functional>
#include <vector>

#include "toy/autograd/node.h"

namespace toy {

struct BackwardOptions {
  bool retain_graph = false;  // keep saved tensors so backward can run again
};

// Accumulates d(root)/d(leaf) into every reachable leaf's grad(). root must be a scalar
// unless grad_output (same shape as root) is given.
void backward(const Tensor& root, const Tensor& grad_output = Tensor(), BackwardOptions opts = {});

// Gradients of root with respect to `inputs`, returned instead of accumulated
// (leaves' grad() untouched).
std::vector<Tensor> grad(const Tensor& root, const std::vector<Tensor>& inputs,
                         const Tensor& grad_output = Tensor(), BackwardOptions opts = {});

// Recomputation region (activation checkpointing): runs fn without recording, keeps only
// the inputs, and re-runs fn with recording during backward. The default generator's
// position is restored for the re-run, so dropout draws the same mask.
Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs);

}  // namespace toy
