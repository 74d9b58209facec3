// gradcheck: compares backward() against central differences. The probe is the scalar
// L = sum(f(x) * w) with fixed random weights w; L, the perturbed sums and the difference
// quotients are accumulated in double on the host (the op itself runs at its own precision).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "toy/core/tensor.h"

namespace toy {

struct GradcheckOptions {
  double eps = 1e-2;   // perturbation (f32 ops: larger than a double gradcheck would use)
  double atol = 1e-3;
  double rtol = 1e-2;
  int max_elements = 4096;  // per input; larger inputs are probed at a stride
  uint64_t seed = 1234;
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0;
  double max_rel_error = 0;
  std::string report;  // first failures, "input 1 [3]: analytic 0.5 numeric 0.49"
};

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, GradcheckOptions opts = {});

}  // namespace toy
