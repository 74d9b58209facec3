// Helpers shared by the op files: argument checks that throw toy::Error naming the op,
// no-record views used internally, and the trace span every op opens.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "toy/autograd/node.h"
#include "toy/backend/kernels.h"
#include "toy/core/registry.h"
#include "toy/core/trace.h"
#include "toy/ops/ops.h"

namespace toy::detail {

// Kernels more than one op file calls.
inline const KernelRef<kern::ScatterAddRows> k_scatter_add_rows("get_rows_backward");  // rows, reduce, moe

void check_defined(const Tensor& t, const char* op, const char* what);
void check_float(const Tensor& t, const char* op, const char* what = "input");
void check_dtype(const Tensor& t, DType d, const char* op, const char* what);
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op);
void check_same_device(const Tensor& a, const Tensor& b, const char* op);
void check_ndim(const Tensor& t, int n, const char* op, const char* what);
void check_shape(const Tensor& t, const Shape& s, const char* op, const char* what);
// Every id in [0, limit); names the op, the position and the value otherwise.
void check_ids(const Tensor& ids, int64_t limit, const char* op, const char* what);
// Whether ids carry a host check (check_and_mark_ids in ops.h) that covers [0, limit) and,
// if given, the ignore index: an op on a device then need not read them back.
bool ids_known_in_range(const Tensor& ids, int64_t limit, const int32_t* ignore = nullptr);
// An in-place write: whatever was known of dst's ids no longer holds.
void clear_ids_mark(Tensor& t);

// Broadcast view with zero strides (no tape record).
Tensor expand_view(const Tensor& x, const Shape& s);
// Contiguous tensor with x's values (x itself if already contiguous), no tape record.
Tensor contiguous_nograd(const Tensor& x);
// x as contiguous f32 (x itself when it already is), no tape record: the input form of
// kernels that compute in f32 only.
Tensor contiguous_f32_nograd(const Tensor& x);

// Trace span that records the op's input shapes when tracing is on.
class OpSpan {
 public:
  OpSpan(const char* op, std::initializer_list<const Tensor*> inputs);

 private:
  trace::ScopeGuard scope_;
  trace::Span span_;
};

// The composite forms of the fused ops (ops/fallbacks.cpp): what runs on a device without the
// fused kernels. Arguments already checked by the op.
Tensor rms_norm_composite(const Tensor& x, const Tensor& w, float eps);
Tensor layer_norm_composite(const Tensor& x, const Tensor& w, const Tensor& b, float eps);
Tensor l2_norm_composite(const Tensor& x, float eps);
Tensor softmax_composite(bool log_form, const Tensor& x, float scale, const Tensor& mask);
Tensor swiglu_composite(const Tensor& a, const Tensor& b);
Tensor attention_composite(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o);
// The kernels the composite forms run (a fused op's fallback_uses).
inline const std::vector<std::string> kCompositeKernels = {"copy", "fill", "unary", "binary", "reduce"};

// "rms_norm" op table entries are defined next to each op family.
void define_elementwise_ops(Registry& r);
void define_matmul_ops(Registry& r);
void define_reduce_ops(Registry& r);
void define_norm_ops(Registry& r);
void define_softmax_ops(Registry& r);
void define_rope_ops(Registry& r);
void define_attention_ops(Registry& r);
void define_shape_ops(Registry& r);
void define_rows_ops(Registry& r);
void define_loss_ops(Registry& r);
void define_conv_ops(Registry& r);
void define_moe_ops(Registry& r);
void define_ssm_ops(Registry& r);
void define_optim_ops(Registry& r);

// Shorthand for op table entries; grad_test is "OpGrad.<name>".
OpInfo primitive_op(const char* name, std::vector<std::string> kernels, const char* summary, bool backward = true);
OpInfo composite_op(const char* name, std::vector<std::string> uses, const char* summary, bool backward = true);
// A primitive with a composite form that runs on a device without its kernels.
OpInfo fused_op(const char* name, std::vector<std::string> kernels, std::vector<std::string> fallback_uses,
                const char* summary);

}  // namespace toy::detail
