// Grad mode: while disabled (NoGradGuard), ops record nothing — no node, no saved tensors,
// one thread-local branch per op.
#pragma once

namespace toy {

namespace detail {
inline thread_local bool t_grad_enabled = true;
}

inline bool grad_enabled() { return detail::t_grad_enabled; }

class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : prev_(detail::t_grad_enabled) { detail::t_grad_enabled = enabled; }
  ~GradModeGuard() { detail::t_grad_enabled = prev_; }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

}  // namespace toy
