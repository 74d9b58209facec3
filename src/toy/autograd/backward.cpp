#include "toy/autograd/backward.h"

#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "toy/core/rng.h"
#include "toy/core/trace.h"
#include "toy/ops/ops.h"

namespace toy {

namespace {

// Post-order over the non-leaf tensors reachable from root; reversed it is a valid order
// for the backward pass (every consumer before its producers).
// Holds a reference to each tensor so that freeing a processed node's inputs cannot destroy
// a tensor (and its node) that is still to be processed.
std::vector<std::shared_ptr<TensorImpl>> topo_order(const std::shared_ptr<TensorImpl>& root) {
  std::vector<std::shared_ptr<TensorImpl>> order;
  std::unordered_set<TensorImpl*> seen;
  struct Frame {
    std::shared_ptr<TensorImpl> t;
    size_t next;
  };
  std::vector<Frame> stack{{root, 0}};
  seen.insert(root.get());
  while (!stack.empty()) {
    Frame& f = stack.back();
    Node* node = f.t->grad_fn.get();
    if (node && f.next < node->inputs.size()) {
      const std::shared_ptr<TensorImpl>& in = node->inputs[f.next++].impl_ptr();
      if (in && in->requires_grad && in->grad_fn && seen.insert(in.get()).second) stack.push_back({in, 0});
      continue;
    }
    order.push_back(f.t);
    stack.pop_back();
  }
  return order;
}

// Adds g into slot, never modifying a tensor that someone else may hold.
void accumulate(Tensor& slot, const Tensor& g) {
  if (!slot.defined())
    slot = g;
  else
    slot = add(slot, g);
}

// A leaf's .grad is contiguous, in the leaf's dtype, and owns its storage alone, so that
// optimizers and gradient clipping may update it in place. `caller` is the storage of the
// gradient the caller passed in (rules may hand it through unchanged), which the caller
// still holds.
Tensor as_leaf_grad(DType leaf_dtype, const Tensor& g, const Storage* caller) {
  if (g.dtype() != leaf_dtype) return cast(g, leaf_dtype);
  if (!g.is_contiguous() || g.storage().use_count() > 1 || g.storage().get() == caller) return contiguous_copy(g);
  return g.detach();  // a handle of its own; a second leaf given g now sees a shared storage
}

// The gradients of one backward() pass on their way to the leaves' .grad: each leaf's
// contributions are summed in its slot, and the sum is added to .grad once, when the last
// contribution the pass can bring has arrived. Each node's edges to leaves are counted
// before the pass; a node that is visited (whether a gradient reached it or not) settles its
// edges. A node that may reach leaves it does not list (a recomputation region) holds every
// leaf back until it has run.
class LeafSlots {
 public:
  LeafSlots(const std::vector<std::shared_ptr<TensorImpl>>& order, std::function<void(const Tensor&)> ready)
      : ready_(std::move(ready)) {
    for (const auto& t : order) {
      const Node* node = t->grad_fn.get();
      if (!node) continue;
      if (node->reaches_hidden_leaves) ++hidden_pending_;
      for (const Tensor& in : node->inputs)
        if (leaf_edge(in)) ++slot(in).pending;
    }
  }
  // A contribution g (already in the leaf's dtype, and owned when it starts the sum).
  void add(const Tensor& leaf, const Tensor& g) {
    Slot& s = slot(leaf);
    if (s.finished) {  // not expected: the counts say nothing more comes; keep it anyway
      add_to_grad(leaf, g);
      return;
    }
    s.sum = s.sum.defined() ? toy::add(s.sum, g) : g;
    maybe_finish(s);
  }
  // Node `node` has been visited: its edges to leaves bring nothing more.
  void node_done(const Node& node) {
    for (const Tensor& in : node.inputs)
      if (leaf_edge(in)) {
        Slot& s = slots_[index_.at(in.impl())];
        --s.pending;
        maybe_finish(s);
      }
    if (node.reaches_hidden_leaves && --hidden_pending_ == 0)
      for (Slot& s : slots_) maybe_finish(s);
  }
  // The end of the pass: whatever is still held (nothing, when the counts are right).
  void finish_all() {
    hidden_pending_ = 0;
    for (Slot& s : slots_) {
      s.pending = 0;
      maybe_finish(s);
    }
  }

 private:
  struct Slot {
    Tensor leaf, sum;
    int64_t pending = 0;
    bool finished = false;
  };
  static bool leaf_edge(const Tensor& in) { return in.defined() && in.requires_grad() && !in.impl()->grad_fn; }
  // .grad += sum: in the leaf's gradient home (a parameter arena's range) in place when it
  // has one, else as a fresh tensor (the sum itself, first).
  static void add_to_grad(const Tensor& leaf, const Tensor& sum) {
    TensorImpl* t = leaf.impl();
    Tensor cur(t->grad), home(t->grad_home);
    if (home.defined() && home.shape() == sum.shape() && home.dtype() == sum.dtype()) {
      if (!cur.defined()) {
        copy_(home, sum);
        t->grad = t->grad_home;
        return;
      }
      if (cur.is_same(home)) {
        add_(home, sum);
        return;
      }
    }
    t->grad = (cur.defined() ? toy::add(cur, sum) : sum).impl_ptr();
  }
  Slot& slot(const Tensor& leaf) {
    auto [it, fresh] = index_.try_emplace(leaf.impl(), slots_.size());
    if (fresh) slots_.push_back({leaf, Tensor(), 0, false});
    return slots_[it->second];
  }
  void maybe_finish(Slot& s) {
    if (s.finished || s.pending > 0 || hidden_pending_ > 0 || !s.sum.defined()) return;
    s.finished = true;
    add_to_grad(s.leaf, s.sum);
    s.sum = Tensor();
    if (ready_) ready_(s.leaf);
  }
  std::vector<Slot> slots_;  // in the order leaves first appear: finish_all is deterministic
  std::unordered_map<TensorImpl*, size_t> index_;
  int64_t hidden_pending_ = 0;
  std::function<void(const Tensor&)> ready_;
};

// One backward pass in progress. A checkpoint region runs a nested pass inside its
// rule; gradients reaching leaves it does not capture itself are handed to the pass
// around it, so backward() fills .grad and grad() stays free of side effects.
struct Pass {
  std::unordered_map<TensorImpl*, Tensor>* capture;  // null: none
  bool fill_leaf_grads;                               // true for backward(), false for grad()
  const Storage* caller_grad;                         // storage of the caller's grad_output
  const Pass* outer;
  LeafSlots* slots;                                   // the outermost backward()'s
};
thread_local const Pass* active_pass = nullptr;

class ActivePass {
 public:
  explicit ActivePass(const Pass* p) : prev_(active_pass) { active_pass = p; }
  ~ActivePass() { active_pass = prev_; }
  ActivePass(const ActivePass&) = delete;
  ActivePass& operator=(const ActivePass&) = delete;

 private:
  const Pass* prev_;
};

// Delivers a finished gradient for t: to the innermost pass capturing t, else to the
// outermost backward()'s slot for t (its .grad once the pass has brought all of it).
void deliver(const Pass* pass, const Tensor& t, const Tensor& g) {
  for (const Pass* p = pass; p; p = p->outer) {
    if (p->capture) {
      auto it = p->capture->find(t.impl());
      if (it != p->capture->end()) {
        accumulate(it->second, g);
        return;
      }
    }
    if (!p->outer && !p->fill_leaf_grads) return;
  }
  if (t.impl()->grad_fn && !t.impl()->retains_grad) return;
  const Pass* outermost = pass;
  while (outermost->outer) outermost = outermost->outer;
  outermost->slots->add(t, as_leaf_grad(t.dtype(), g, outermost->caller_grad));
}

bool captured(const Pass* pass, TensorImpl* t) {
  for (const Pass* p = pass; p; p = p->outer)
    if (p->capture && p->capture->count(t)) return true;
  return false;
}

void run(const Tensor& root, const Tensor& grad_output, BackwardOptions opts,
         std::unordered_map<TensorImpl*, Tensor>* capture, bool fill_leaf_grads) {
  TOY_CHECK(root.defined(), "[backward] undefined tensor");
  TOY_CHECK(root.requires_grad(), "[backward] the tensor does not require grad (no recorded op leads to it)");
  Tensor g0 = grad_output;
  if (!g0.defined()) {
    TOY_CHECK(root.numel() == 1, "[backward] root has shape {}: pass a gradient or reduce it to a scalar",
              root.shape().str());
    g0 = full(root.shape(), 1.0, root.dtype(), root.device());
  }
  TOY_CHECK(g0.shape() == root.shape(), "[backward] gradient shape {} does not match output shape {}",
            g0.shape().str(), root.shape().str());

  NoGradGuard no_grad;
  std::vector<std::shared_ptr<TensorImpl>> order = topo_order(root.impl_ptr());
  // The outermost backward() sums each leaf's contributions of the pass in its own slots.
  std::optional<LeafSlots> slots;
  if (fill_leaf_grads && !active_pass) slots.emplace(order, opts.on_grad_ready);
  const Pass pass{capture, fill_leaf_grads, grad_output.defined() ? grad_output.storage().get() : nullptr,
                  active_pass, slots ? &*slots : nullptr};
  ActivePass scope(&pass);
  std::unordered_map<TensorImpl*, Tensor> grads;
  grads[root.impl()] = g0;
  auto leaf_done = [&](const Tensor& t, const Tensor& g) { deliver(&pass, t, g); };

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    // Taking the reference out lets the tensor go as soon as its node has run.
    const Tensor keep(std::move(*it));
    TensorImpl* t = keep.impl();
    Node* node = t->grad_fn.get();
    auto git = grads.find(t);
    if (git == grads.end()) {
      if (slots && node) slots->node_done(*node);  // no gradient reached it: its leaf edges bring nothing
      continue;
    }
    Tensor g = std::move(git->second);
    grads.erase(git);
    if (node && (t->retains_grad || captured(&pass, t))) leaf_done(keep, g);
    if (!node) {  // the root itself is a leaf
      leaf_done(keep, g);
      continue;
    }
    TOY_CHECK(!node->released, "[backward] the graph through '{}' was already freed by an earlier backward(); "
              "pass retain_graph to run backward twice", node->op);
    // Rules may assume a contiguous incoming gradient (broadcast views are materialized here).
    if (!g.is_contiguous()) g = contiguous_copy(g);
    Grads gin;
    {
      trace::ScopeGuard scope(node->op, true);
      trace::Span span(node->op, "backward");
      gin = node->backward(g);
    }
    TOY_CHECK(gin.size() == node->inputs.size(), "[backward] rule of '{}' returned {} gradients for {} inputs",
              node->op, gin.size(), node->inputs.size());
    for (size_t i = 0; i < gin.size(); ++i) {
      const Tensor& in = node->inputs[i];
      if (!in.defined() || !in.requires_grad() || !gin[i].defined()) continue;
      TOY_CHECK(gin[i].shape() == in.shape(), "[backward] rule of '{}' gave input {} a gradient of shape {}, "
                "expected {}", node->op, i, gin[i].shape().str(), in.shape().str());
      if (in.impl()->grad_fn)
        accumulate(grads[in.impl()], gin[i]);
      else
        leaf_done(in, gin[i]);
    }
    if (slots) slots->node_done(*node);
    if (!opts.retain_graph) {
      node->backward = nullptr;
      node->inputs.clear();
      node->released = true;
    }
  }
  if (slots) slots->finish_all();
}

}  // namespace

void backward(const Tensor& root, const Tensor& grad_output, BackwardOptions opts) {
  run(root, grad_output, opts, nullptr, true);
}

void Tensor::backward(const Tensor& grad_output) const { toy::backward(*this, grad_output); }

std::vector<Tensor> grad(const Tensor& root, const std::vector<Tensor>& inputs, const Tensor& grad_output,
                         BackwardOptions opts) {
  std::unordered_map<TensorImpl*, Tensor> capture;
  for (const Tensor& t : inputs) {
    TOY_CHECK(t.defined() && t.requires_grad(), "[grad] every input must require grad");
    capture[t.impl()];
  }
  run(root, grad_output, opts, &capture, false);
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    Tensor g = capture[t.impl()];
    out.push_back(g.defined() ? g : zeros(t.shape(), t.dtype(), t.device()));
  }
  return out;
}

namespace {

// Puts the default generator at `offset` for the replay and back where it was afterwards,
// also when the replay throws.
class GeneratorReplay {
 public:
  explicit GeneratorReplay(uint64_t offset) : saved_(default_generator().offset()) {
    default_generator().set_offset(offset);
  }
  ~GeneratorReplay() { default_generator().set_offset(saved_); }
  GeneratorReplay(const GeneratorReplay&) = delete;
  GeneratorReplay& operator=(const GeneratorReplay&) = delete;

 private:
  uint64_t saved_;
};

}  // namespace

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs) {
  if (!needs_grad(inputs) && !grad_enabled()) return fn(inputs);
  const uint64_t rng_offset = default_generator().offset();
  Tensor out;
  {
    NoGradGuard no_grad;
    // detach: fn may return one of its inputs, whose own history must stay as it is.
    out = fn(inputs).detach();
  }
  // Parameters captured by fn (not in inputs) also need the recomputation, so record
  // whenever grad mode is on.
  record("checkpoint", out, inputs, [fn, inputs, rng_offset](const Tensor& g) {
    std::vector<Tensor> detached;
    for (const Tensor& t : inputs) {
      Tensor d = t.detach();
      if (t.requires_grad()) d.requires_grad_();
      detached.push_back(d);
    }
    Tensor re;
    {
      GeneratorReplay replay(rng_offset);
      GradModeGuard on(true);
      re = fn(detached);
    }
    Grads gin(inputs.size());
    if (!re.requires_grad()) return gin;
    std::unordered_map<TensorImpl*, Tensor> capture;
    for (const Tensor& d : detached)
      if (d.requires_grad()) capture[d.impl()];
    run(re, g, {}, &capture, true);
    for (size_t i = 0; i < inputs.size(); ++i)
      if (detached[i].requires_grad()) gin[i] = capture[detached[i].impl()];
    return gin;
  });
  out.grad_fn()->reaches_hidden_leaves = true;  // the parameters fn captures
  return out;
}

}  // namespace toy
