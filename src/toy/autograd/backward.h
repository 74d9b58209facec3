// Reverse-mode differentiation over the tape.
#pragma once
#include <functional>
#include <vector>

#include "toy/autograd/node.h"

namespace toy {

struct BackwardOptions {
  bool retain_graph = false;  // keep saved tensors so backward can run again
  // backward() only: called once per leaf that received a gradient in this pass, as soon as
  // its last contribution has arrived and been added to its .grad (data-parallel reduction
  // starts on it while the rest of the pass runs). Leaves reached inside a recomputation
  // region (checkpoint below) are known finished only once every region of the pass has run.
  std::function<void(const Tensor& leaf)> on_grad_ready;
};

// Accumulates d(root)/d(leaf) into every reachable leaf's grad(). The contributions of one
// pass are summed in a slot of the pass first and added to .grad once, when the leaf's last
// contribution arrives: with gradient accumulation a weight used twice (a tied embedding and
// head) gets grad = (c1 + c2) + (c1' + c2'), each pass's sum on its own, whatever came
// before. A pass that throws leaves every .grad as it was. root must be a scalar unless
// grad_output (same shape as root) is given.
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
