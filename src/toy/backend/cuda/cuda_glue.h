// What the CUDA backend's glue files share (compiled by the C++ compiler): tensors turned into
// the kernels' plain views, the launch check, and one registration function per concern
// (glue_<concern>.cpp registers the kernels whose launchers live in <concern>.cu).
#pragma once
#include "toy/backend/cuda/cuda_launch.h"
#include "toy/core/registry.h"
#include "toy/core/tensor.h"

namespace toy::cuda {

// The tensor as a kernel walks it (F32, F16, BF16 and I32; block types are refused by name).
View view_of(const Tensor& t);
// The device address of a contiguous tensor's first element.
void* data_of(const Tensor& t);
// Throws "[cuda] the KERNEL kernel failed to launch: ..." when the last launch failed.
void launched(const char* kernel);
// TOY_CUDA_PROFILE=1: marks the end of `kernel`'s work on the stream (profile.cpp); a no-op
// otherwise. launched() calls it; so does each cuBLASLt product.
void profile_mark(const char* kernel);

// Argument checks the glue files share. The CPU kernels dispatch on F32, F16 and BF16 and refuse
// the rest; so do these ("[cuda] KERNEL needs a float WHAT ..."). out_view: an output the kernels
// index by its flat position, so it must be contiguous.
void need_float(const Tensor& t, const char* kernel, const char* what);
void need_type(const Tensor& t, DType d, const char* kernel, const char* what);
View out_view(const Tensor& t, const char* kernel, const char* what);

void register_elementwise(Registry& r);  // glue_elementwise.cpp: fill, copy, binary
void register_unary(Registry& r);        // glue_unary.cpp: unary(+backward), swiglu*, dropout, random_fill, arange
void register_reduce(Registry& r);       // glue_reduce.cpp: reduce, softmax(+backward), diag_mask_inf, norms, losses
void register_matmul(Registry& r);       // glue_matmul.cpp: matmul, matmul_weight(_t) through cuBLASLt
void register_train(Registry& r);        // glue_train.cpp: rows, rope, optimizers, clocks, sampling
void register_attention(Registry& r);    // glue_attention.cpp: attention(+backward)
void register_misc(Registry& r);         // glue_misc.cpp: im2col/col2im, ssm_conv, add_id, argsort, top_k, gdn_split_norm
void register_scan(Registry& r);         // glue_scan.cpp: ssm_scan, gated_delta_rule, mul_mat_id (+backwards)

}  // namespace toy::cuda
