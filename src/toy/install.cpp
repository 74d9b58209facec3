// Fills the registry: the op table of every op family, then each backend built in.
// This is the one place that knows all layers; core reaches it through install_all().
#include "toy/core/registry.h"
#include "toy/ops/common.h"

namespace toy {

void install_cpu_backend(Registry& r);   // backend/cpu/install.cpp
bool install_cuda_backend(Registry& r);  // backend/cuda (or its stub without CUDA)

void install_all(Registry& r) {
  using namespace detail;
  define_elementwise_ops(r);
  define_matmul_ops(r);
  define_reduce_ops(r);
  define_norm_ops(r);
  define_softmax_ops(r);
  define_rope_ops(r);
  define_attention_ops(r);
  define_shape_ops(r);
  define_rows_ops(r);
  define_loss_ops(r);
  define_conv_ops(r);
  define_moe_ops(r);
  define_ssm_ops(r);
  define_optim_ops(r);
  install_cpu_backend(r);
  r.mark_backend(Device::CPU);
  r.mark_backend(Device::SIM);  // the CPU kernels, registered for sim beside the CPU's
  if (install_cuda_backend(r)) r.mark_backend(Device::CUDA);
}

}  // namespace toy
