// Built when toy is configured without CUDA: no CUDA kernels are registered, so every op
// on a CUDA tensor fails with "[op] has no cuda kernel (toy was built without CUDA ...)".
#include "toy/core/registry.h"

namespace toy {

bool install_cuda_backend(Registry&) { return false; }

}  // namespace toy
