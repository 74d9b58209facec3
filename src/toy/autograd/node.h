// The tape: an op whose inputs need a gradient records a Node on its output. The node keeps
// its inputs (in the op's argument order) and a backward rule that, given the gradient of
// the output, returns one gradient per input (undefined where none is wanted).
// Backward rules run with grad mode off; they may use any op.
#pragma once
#include <functional>
#include <initializer_list>
#include <vector>

#include "toy/autograd/grad_mode.h"
#include "toy/core/tensor.h"

namespace toy {

using Grads = std::vector<Tensor>;
using BackwardFn = std::function<Grads(const Tensor& grad_output)>;

struct Node {
  const char* op = "";
  std::vector<Tensor> inputs;
  BackwardFn backward;
  bool released = false;  // saved state freed after a backward pass
  // The rule may deliver gradients to leaves that are not among `inputs` (a recomputation
  // region's parameters): until it has run, no leaf of the pass can be known to be finished.
  bool reaches_hidden_leaves = false;
};

// True when grad mode is on and any input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Attaches a node to `output` (which becomes a non-leaf requiring grad).
void record(const char* op, Tensor& output, std::vector<Tensor> inputs, BackwardFn fn);

// Does input i of a node want a gradient?
inline bool wants_grad(const Tensor& t) { return t.defined() && t.requires_grad(); }

}  // namespace toy
