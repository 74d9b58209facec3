#include "toy/autograd/gradcheck.h"

#include <cmath>

#include <fmt/core.h>

#include "toy/autograd/backward.h"
#include "toy/core/rng.h"
#include "toy/ops/ops.h"

namespace toy {

namespace {

// sum(y * w) in double on the host.
double probe(const Tensor& y, const std::vector<float>& w) {
  std::vector<float> v = y.to_f32_vector();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += double(v[i]) * double(w[i]);
  return s;
}

// Reads / writes element i (row-major index) of a float tensor of any layout on the CPU.
int64_t element_offset(const Tensor& t, int64_t i) {
  int64_t off = 0;
  for (int d = t.ndim() - 1; d >= 0; --d) {
    off += (i % t.size(d)) * t.stride(d);
    i /= t.size(d);
  }
  return off;
}
float get_elem(const Tensor& t, int64_t i) {
  const int64_t o = element_offset(t, i);
  switch (t.dtype()) {
    case DType::F32: return static_cast<const float*>(t.raw_data())[o];
    case DType::F16: return to_f32(static_cast<const f16*>(t.raw_data())[o]);
    case DType::BF16: return to_f32(static_cast<const bf16*>(t.raw_data())[o]);
    default: fail("[gradcheck] inputs must be float tensors");
  }
}
void set_elem(const Tensor& t, int64_t i, float v) {
  const int64_t o = element_offset(t, i);
  switch (t.dtype()) {
    case DType::F32: static_cast<float*>(t.raw_data())[o] = v; break;
    case DType::F16: static_cast<f16*>(t.raw_data())[o] = from_f32<f16>(v); break;
    case DType::BF16: static_cast<bf16*>(t.raw_data())[o] = from_f32<bf16>(v); break;
    default: fail("[gradcheck] inputs must be float tensors");
  }
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                          GradcheckOptions opts) {
  GradcheckResult res;
  // Analytic gradients of L = sum(f(x) * w).
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    Tensor l = t.detach();
    if (t.requires_grad()) l.requires_grad_();
    leaves.push_back(l);
  }
  Tensor y = f(leaves);
  Generator gen(opts.seed);
  Tensor wt = rand(y.shape(), gen, -1.0f, 1.0f);
  std::vector<float> w = wt.to_f32_vector();
  std::vector<Tensor> analytic(inputs.size());
  {
    std::vector<Tensor> need;
    for (const Tensor& l : leaves)
      if (l.requires_grad()) need.push_back(l);
    TOY_CHECK(!need.empty(), "[gradcheck] no input requires grad");
    TOY_CHECK(y.requires_grad(), "[gradcheck] the output does not depend on any input that requires grad");
    Tensor gy = y.dtype() == DType::F32 ? wt : cast(wt, y.dtype());
    std::vector<Tensor> g = grad(y, need, gy);
    size_t k = 0;
    for (size_t i = 0; i < leaves.size(); ++i)
      if (leaves[i].requires_grad()) analytic[i] = g[k++];
  }
  // Numeric: central differences, one element at a time, with grad mode off.
  NoGradGuard ng;
  int failures = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    Tensor x = leaves[i].detach();  // shares storage with the leaf f sees
    std::vector<Tensor> args;
    for (const Tensor& l : leaves) args.push_back(l.detach());
    std::vector<float> an = analytic[i].to_f32_vector();
    const int64_t n = x.numel();
    const int64_t stride = std::max<int64_t>(1, n / std::max(1, opts.max_elements));
    for (int64_t e = 0; e < n; e += stride) {
      const float orig = get_elem(x, e);
      set_elem(x, e, float(orig + opts.eps));
      const float up = get_elem(x, e);
      const double fp = probe(f(args), w);
      set_elem(x, e, float(orig - opts.eps));
      const float down = get_elem(x, e);
      const double fm = probe(f(args), w);
      set_elem(x, e, orig);
      const double numeric = (fp - fm) / (double(up) - double(down));
      const double a = an[size_t(e)];
      const double err = std::fabs(a - numeric);
      const double rel = err / std::max(1e-12, std::fabs(numeric));
      res.max_abs_error = std::max(res.max_abs_error, err);
      if (std::fabs(numeric) > opts.atol) res.max_rel_error = std::max(res.max_rel_error, rel);
      if (err > opts.atol + opts.rtol * std::fabs(numeric)) {
        res.ok = false;
        if (failures++ < 8)
          res.report += fmt::format("input {} [{}]: analytic {:.6g} numeric {:.6g}\n", i, e, a, numeric);
      }
    }
  }
  return res;
}

}  // namespace toy
